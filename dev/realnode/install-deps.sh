#!/usr/bin/env bash
# Host packages the real-node rig needs (containerd, runc, CNI plugins, image tools, network
# tools, and gcc/make: `make images` builds the hook's stub runtime and probe for the workload
# image on the host), installed from Debian when missing (dev/install-debian-packages.sh).
set -euo pipefail
exec "$(dirname "$0")/../install-debian-packages.sh" real-node \
  containerd runc containernetworking-plugins mmdebstrap buildah iptables conntrack socat \
  ethtool ebtables uidmap fuse-overlayfs iproute2 gcc make libc6-dev
