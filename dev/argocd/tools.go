//go:build tools

// Package tools pins Argo CD's command for dev/argocd/build.sh; nothing imports it.
package tools

import _ "github.com/argoproj/argo-cd/v3/cmd"
