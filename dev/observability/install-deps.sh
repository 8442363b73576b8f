#!/usr/bin/env bash
# Debian packages the observability tests need, installed only when missing (quick when present):
#   prometheus     the server tests/e2e/test_dashboards.py starts on loopback (never as a service)
#   libdrm-common  /usr/share/libdrm/amdgpu.ids, the GPU marketing-name table discovery reads
# Needs root (apt-get) the first time; CI runs on a fresh machine.
set -euo pipefail

missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
[ -r /usr/share/libdrm/amdgpu.ids ] || missing+=(libdrm-common)
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing ${missing[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: no node exporter, nothing else started. The package's postinst may
# try to start the prometheus service; policy-rc.d or the lack of systemd stops it, and the
# tests run their own server on a free loopback port anyway.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
