#!/usr/bin/env bash
# Host packages the Argo CD tests need, installed from Debian when missing
# (dev/install-debian-packages.sh): Redis (Argo CD's cache; the tests start their own on a free
# loopback port, and leave the system Redis that Debian's package starts alone) and git
# (`git daemon` serves the repository on loopback).
set -euo pipefail
exec "$(dirname "$0")/../install-debian-packages.sh" argocd redis-server git
