// Command pause is the pod sandbox's process for the real-node rig: it holds the pod's
// namespaces and waits until it is told to stop. Built static (CGO_ENABLED=0) so that the image
// is this one file, committed with `buildah from scratch`.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			return
		}
		// PID 1 of a shared process namespace: reap orphans so that none stays a zombie.
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
