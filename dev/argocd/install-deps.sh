#!/usr/bin/env bash
# Host packages the Argo CD e2e test needs: Redis (Argo CD's cache; the test starts its own on a
# free loopback port) and git (git daemon serves the repository on loopback). Installed from
# Debian when missing; when both are there it only asks dpkg. Runs as root (CI and this machine do).
set -euo pipefail
pkgs=(redis-server git)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "argocd deps: all installed"
  exit 0
fi
echo "argocd deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian's package starts a system Redis on 6379; the test runs its own, so leave that one be.
echo "argocd deps: installed"
