#!/usr/bin/env bash
# The hook's test tools, installed from Debian when missing (dev/install-debian-packages.sh):
# musl-gcc (musl-tools) builds the musl program tests/hook/test_loadcheck.py shows refused, and runc
# runs the load check at createContainer as containerd's runtime does.
set -euo pipefail
exec "$(dirname "$0")/../install-debian-packages.sh" hook musl-tools runc
