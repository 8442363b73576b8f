#!/usr/bin/env bash
# Build helm from its Go module (helm.sh/helm/v3, pinned in dev/helm/go.mod) into
# ../../.cache/helm/<version>/bin/helm, apart from the control plane's .cache/k8s/<version>/bin:
# helm's Kubernetes libraries follow helm's release, not K8S_VERSION.
#
#   dev/helm/build.sh        # prints the path of the helm binary on its last line
#
# Cached: a stamp of go.mod and go.sum; a second run with the same stamp does nothing.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
version=$(sed -n 's/^\thelm.sh\/helm\/v3 \(v[0-9.]*\).*$/\1/p' go.mod)
out="$root/.cache/helm/$version/bin"
stamp=$(cat build.sh go.mod go.sum | sha256sum | cut -c1-16)
if [ -x "$out/helm" ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$out/helm"
  exit 0
fi
mkdir -p "$out"
start=$(date +%s)
# As helm's own Makefile: the version, and the Kubernetes minor of its client libraries, which
# `helm template` and `helm lint` take as the cluster's version when they have none.
k8s_minor=$(sed -n 's/^\tk8s.io\/client-go v0\.\([0-9]*\)\..*$/\1/p' go.mod)
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
ldflags="$ldflags -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$out/helm" helm.sh/helm/v3/cmd/helm >&2
echo "$stamp" > "$out/.stamp"
echo "helm: $version built in $(( $(date +%s) - start )) s" >&2
echo "$out/helm"
