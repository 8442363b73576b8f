#!/usr/bin/env bash
# Build containerd 2.x and its runc shim from their Go module (github.com/containerd/containerd/v2,
# pinned in dev/containerd/go.mod; fetched through the Go module proxy like the control plane)
# into ../../.cache/containerd/<version>/bin/{containerd,containerd-shim-runc-v2,ctr} (ctr: the
# client of the same version, for the rig's image imports). The real-node
# rig runs them with `--runtime containerd2` (rocshare_dev/realnode): Debian bookworm's
# containerd 1.6 cannot hand a container its devices through CDI, which DRA needs. runc stays
# Debian's (dev/realnode/install-deps.sh).
#
#   dev/containerd/build.sh        # prints the bin folder on its last line
#
# Cached: a stamp of build.sh, go.mod and go.sum; a second run with the same stamp does nothing.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
module=github.com/containerd/containerd/v2
version=$(sed -n 's/^require github.com\/containerd\/containerd\/v2 \(v[0-9.]*\)$/\1/p; s/^\tgithub.com\/containerd\/containerd\/v2 \(v[0-9.]*\)$/\1/p' go.mod)
[ -n "$version" ] || { echo "dev/containerd/build.sh: no $module version in go.mod" >&2; exit 1; }
out="$root/.cache/containerd/$version/bin"
stamp=$(cat build.sh go.mod go.sum | sha256sum | cut -c1-16)
if [ -x "$out/containerd" ] && [ -x "$out/containerd-shim-runc-v2" ] && [ -x "$out/ctr" ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out"
start=$(date +%s)
# cgo off, as containerd's Makefile builds its shim: static binaries, and the cgo-only btrfs
# snapshotter left out (the rig uses overlayfs). The version is what `containerd --version` and
# the CRI's runtime version report (the kubelet logs it).
ldflags="-s -w -X $module/version.Version=$version -X $module/version.Package=$module"
for command in containerd containerd-shim-runc-v2 ctr; do
  CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$out/$command" "$module/cmd/$command" >&2
done
echo "$stamp" > "$out/.stamp"
echo "containerd: $version built in $(( $(date +%s) - start )) s" >&2
echo "$out"
