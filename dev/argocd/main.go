// Command argocd is Argo CD's application controller and repo server in one binary, chosen by
// the name it runs under (argv[0]) as in Argo CD's own cmd/main.go: argocd-application-controller
// or argocd-repo-server (dev/argocd/build.sh links both names to it). Only these two parts are
// built, so the build skips Argo CD's API server, CLI, ApplicationSet and notification
// controllers, which the e2e test does not run.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/util/log"
)

func init() {
	// As Argo CD's main: klog (client-go's logger) writes through Argo CD's configured logger.
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

func main() {
	var command *cobra.Command
	switch name := filepath.Base(os.Args[0]); name {
	case common.CommandApplicationController:
		command = appcontroller.NewCommand()
	case common.CommandRepoServer:
		command = reposerver.NewCommand()
	default:
		fmt.Fprintf(os.Stderr, "run me as %s or %s, not %s\n", common.CommandApplicationController,
			common.CommandRepoServer, name)
		os.Exit(2)
	}
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
