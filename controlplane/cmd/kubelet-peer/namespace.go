package main

// Private mount namespace: the device manager only knows kubelet.sock at kubeletPluginDir, so
// each simulated node sees its own folder there. Go cannot unshare a running multi-threaded
// process reliably (namespaces are per thread), so the peer re-executes itself with
// CLONE_NEWNS; Go's fork path makes the new namespace's mounts private before exec, so the bind
// mount below never leaks to the host.

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

const (
	kubeletPluginDir = "/var/lib/kubelet/device-plugins"
	reexecMarker     = "KUBELET_PEER_IN_NAMESPACE"
)

// enterPluginNamespace returns in the process that should run the peer: the same process when
// pluginDir already is the kubelet's folder, else a child in its own mount namespace (this
// process then waits for the child and exits with its status).
func enterPluginNamespace(pluginDir string) error {
	real, err := filepath.Abs(pluginDir)
	if err != nil {
		return err
	}
	if real == kubeletPluginDir {
		return nil
	}
	if os.Getenv(reexecMarker) == "" {
		os.Exit(reexecInNamespace())
	}
	if err := os.MkdirAll(real, 0o750); err != nil {
		return err
	}
	if err := os.MkdirAll(kubeletPluginDir, 0o750); err != nil {
		return err
	}
	if err := syscall.Mount(real, kubeletPluginDir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s (needs root): %w", real, kubeletPluginDir, err)
	}
	return nil
}

func reexecInNamespace() int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-peer: %v\n", err)
		return 1
	}
	attr := &os.ProcAttr{
		Env:   append(os.Environ(), reexecMarker+"=1"),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL},
	}
	child, err := os.StartProcess(self, os.Args, attr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-peer: entering a mount namespace (needs root): %v\n", err)
		return 1
	}
	forwardSignals(child)
	state, err := child.Wait()
	if err != nil {
		return 1
	}
	if state.ExitCode() < 0 {
		return 1
	}
	return state.ExitCode()
}
