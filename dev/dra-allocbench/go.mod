// The module path is controlplane/k8s/<version>/go.mod's: build with -modfile (see main.go).
module rocshare.io/controlplane
