#!/usr/bin/env bash
# Build the local control plane (kube-apiserver, kube-scheduler, kube-controller-manager,
# kubectl, etcd), the kubelet peer, the real node's kubelet and its pause program from Go
# modules, for one Kubernetes version, into ../.cache/k8s/<version>/bin.
#
#   controlplane/build.sh                 # the default version, controlplane/k8s/default-version
#   K8S_VERSION=1.37.2 controlplane/build.sh
#
# Each version has its own module files, controlplane/k8s/<version>/go.mod and go.sum, written
# by genmod.sh (run here when missing) and used through -modfile; each version's binaries are
# cached apart, so switching costs nothing once built. ROCSHARE_BIN_DIR overrides the output.
# Cached: a stamp of the version's go.mod, go.sum and our own Go sources; a second run with the
# same stamp does nothing. Cold build on 2 cores: see README ("Set-up times").
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd .. && pwd)
default=$(cat k8s/default-version)
ver="${K8S_VERSION:-$default}"
ver="${ver#v}"
IFS=. read -r major minor patch <<<"$ver"
version="v$ver"
modfile="k8s/$ver/go.mod"
[ -f "$modfile" ] || ./genmod.sh "$ver"
out="${ROCSHARE_BIN_DIR:-$root/.cache/k8s/$ver/bin}"

# .cache/bin is a link to the default version's folder, for PATH=$PWD/.cache/bin:$PATH and
# older paths. Before versions were cached apart the default's binaries lived there: move them.
legacy="$root/.cache/bin"
if [ -z "${ROCSHARE_BIN_DIR:-}" ] && [ "$ver" = "$default" ]; then
  if [ -d "$legacy" ] && [ ! -L "$legacy" ] && [ ! -e "$out" ]; then
    mkdir -p "$(dirname "$out")" && mv "$legacy" "$out"
  fi
  if [ ! -e "$legacy" ] || [ -L "$legacy" ]; then mkdir -p "$root/.cache" && ln -sfn "k8s/$ver/bin" "$legacy"; fi
fi
mkdir -p "$out"

# The Go a version needs is its go.mod's go line (k8s.io/kubernetes's own). When the local Go
# is older, GOTOOLCHAIN names the newer one, fetched from the Go module proxy as the module
# golang.org/toolchain (the machine's Go is set to GOTOOLCHAIN=local, which would refuse).
need=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$modfile")
have=$(go env GOVERSION); have="${have#go}"
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  export GOTOOLCHAIN="go$need"
  [[ "$need" =~ ^[0-9]+\.[0-9]+$ ]] && GOTOOLCHAIN="go$need.0"
  echo "control plane: $version needs Go $need (local: $have), using GOTOOLCHAIN=$GOTOOLCHAIN"
fi

stamp=$( (echo "$ver"; cat "$modfile" "k8s/$ver/go.sum"; find cmd -name '*.go' | sort | xargs cat) \
  | sha256sum | cut -c1-16)
targets=(kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet etcd kubelet-peer pause)
all_there=yes
for t in "${targets[@]}"; do [ -x "$out/$t" ] || all_there=no; done
if [ "$all_there" = yes ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "control plane: $version cached in $out (stamp $stamp)"
  exit 0
fi
echo "control plane: building ${targets[*]} ($version) into $out — cold builds take a while on 2 cores"
start=$(date +%s)
# -checklinkname=0: the kubelet peer reaches the device manager's unexported constructor
# (which takes the socket path) through go:linkname (cmd/kubelet-peer/devicemanager.go). Go
# 1.26 checks pulled linknames only into the standard library, so the build passes without it
# today; the flag keeps it passing if the linker's check widens.
ldflags="-s -w -checklinkname=0"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
go build -modfile="$modfile" -ldflags "$ldflags" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubelet ./cmd/etcd
# The kubelet peer calls the device manager, whose Go API changes between minors: from 1.37 its
# calls take a logger or context (cmd/kubelet-peer/kubeletapi_*.go, chosen by this tag).
peer_tags=""
[ "$minor" -ge 37 ] && peer_tags="kubelet_contextual"
go build -modfile="$modfile" -tags "$peer_tags" -ldflags "$ldflags" -o "$out/" ./cmd/kubelet-peer
# The pod sandbox's process: static, so that its image is this one file.
CGO_ENABLED=0 go build -modfile="$modfile" -ldflags "-s -w" -o "$out/pause" ./cmd/pause
echo "$stamp" > "$out/.stamp"
echo "control plane: $version built in $(( $(date +%s) - start )) s"
