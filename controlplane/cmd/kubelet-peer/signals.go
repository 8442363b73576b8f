package main

import (
	"os"
	"os/signal"
	"syscall"
)

// forwardSignals passes SIGINT and SIGTERM on to the namespaced child, so stopping the outer
// process stops the peer cleanly (SIGKILL reaches the child through Pdeathsig).
func forwardSignals(child *os.Process) {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		for s := range signals {
			_ = child.Signal(s)
		}
	}()
}
