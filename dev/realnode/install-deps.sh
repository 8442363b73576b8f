#!/usr/bin/env bash
# Host packages the real-node rig needs (containerd, runc, CNI plugins, image tools, network
# tools, and gcc/make: `make images` builds the hook's stub runtime and probe for the workload
# image on the host), installed from Debian when missing. Idempotent: when every package is there it only
# asks dpkg (well under a second). Runs as root (CI and this machine do).
set -euo pipefail
pkgs=(containerd runc containernetworking-plugins mmdebstrap buildah iptables conntrack socat
      ethtool ebtables uidmap fuse-overlayfs iproute2 gcc make libc6-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "real-node deps: all installed"
  exit 0
fi
echo "real-node deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: buildah's and containerd's recommends pull in a second runtime and
# registries config we don't use.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "real-node deps: installed"
