#!/usr/bin/env bash
# Installs from Debian the packages of a list that are not installed yet; when every one is there
# it only asks dpkg (well under a second). Used by the dev/*/install-deps.sh scripts, which name
# the packages and the label of their messages. Runs as root (CI and this machine do).
#
#   dev/install-debian-packages.sh <label> <package>...
set -euo pipefail
label=$1
shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$label deps: all installed"
  exit 0
fi
echo "$label deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: recommends pull in services and runtimes the tests don't use (a
# second container runtime and registries config for buildah and containerd).
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "$label deps: installed"
