#!/usr/bin/env bash
# Build Argo CD's application controller and repo server from its Go module
# (github.com/argoproj/argo-cd/v3, pinned in dev/argocd/go.mod) as one binary (main.go) into
# ../../.cache/argocd/<version>/bin/argocd, with the names it dispatches on (argv[0]) linked beside
# it: argocd-application-controller and argocd-repo-server. Argo CD's CRDs are copied from the
# same module into .cache/argocd/<version>/crds, its git-verify-wrapper.sh into bin.
#
#   dev/argocd/build.sh      # prints the bin folder on its last line
#
# Why a module of our own: argo-cd's go.mod replaces the Kubernetes staging modules (which
# k8s.io/kubernetes requires at v0.0.0) with published versions, and its gitops-engine module
# with a local path (./gitops-engine). A module that requires argo-cd ignores those replaces, so
# `go get github.com/argoproj/argo-cd/gitops-engine/v3` alone fails on the v0.0.0 staging modules.
# dev/argocd/go.mod repeats argo-cd's replaces for the staging modules, and requires the published
# gitops-engine/v3 at the same release instead of the local path; `go mod tidy` wrote the rest.
# Argo CD 3.6 needs Go 1.27: GOTOOLCHAIN names it (fetched from the Go module proxy) when the
# local Go is older.
#
# Cached: a stamp of build.sh, main.go, go.mod and go.sum; a second run with the same stamp does
# nothing.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
version=$(sed -n 's/^\tgithub.com\/argoproj\/argo-cd\/v3 \(v[0-9.]*\).*$/\1/p' go.mod)
out="$root/.cache/argocd/$version"
stamp=$(cat build.sh main.go go.mod go.sum | sha256sum | cut -c1-16)
if [ -x "$out/bin/argocd" ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$out/bin"
  exit 0
fi
need=$(sed -n 's/^go \([0-9.]*\)$/\1/p' go.mod)
have=$(go env GOVERSION); have="${have#go}"
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  export GOTOOLCHAIN="go1.27.3"
  echo "argocd: $version needs Go $need (local: $have), using GOTOOLCHAIN=$GOTOOLCHAIN" >&2
fi
mkdir -p "$out/bin" "$out/crds"
start=$(date +%s)
# The version as Argo CD's own Makefile sets it (it reports it in the Application's status).
ldflags="-s -w -X github.com/argoproj/argo-cd/v3/common.version=${version#v}"
ldflags="$ldflags -X github.com/argoproj/argo-cd/v3/common.gitTreeState=clean"
CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$out/bin/argocd" . >&2
for name in argocd-application-controller argocd-repo-server; do ln -sfn argocd "$out/bin/$name"; done
src=$(go list -m -f '{{.Dir}}' github.com/argoproj/argo-cd/v3)
cp "$src"/manifests/crds/application-crd.yaml "$src"/manifests/crds/appproject-crd.yaml "$out/crds/"
chmod u+w "$out"/crds/*
# The repo server runs git-verify-wrapper.sh from PATH on every manifest generation (3.6 keeps the
# deprecated signature result for its API), as Argo CD's image installs it; from the same module.
install -m 0755 "$src/hack/git-verify-wrapper.sh" "$out/bin/"
echo "$stamp" > "$out/.stamp"
echo "argocd: $version built in $(( $(date +%s) - start )) s" >&2
echo "$out/bin"
