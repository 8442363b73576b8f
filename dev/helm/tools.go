//go:build tools

// Package tools pins helm's command for dev/helm/build.sh; nothing imports it.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
