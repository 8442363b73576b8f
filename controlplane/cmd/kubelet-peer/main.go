// Command kubelet-peer plays the kubelet of one simulated node, for tests and the demo.
//
// It runs the kubelet's own device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager),
// so device plugins register, stream devices and answer Allocate exactly as they would with a
// real kubelet; everything else a kubelet does (containers, volumes, probes) is left out.
// The peer keeps its Node object Ready with capacity and allocatable from the device manager,
// admits the pods bound to its node through the device manager (Allocate, then
// GetDeviceRunContainerOptions per container), and moves the pod to Running -- its status then
// holds what each container would receive, in the condition kubelet-peer.rocshare.io/Containers --
// or to Failed with the kubelet's admission message.
//
// The device manager hard-codes its socket at /var/lib/kubelet/device-plugins/kubelet.sock. To
// run several nodes on one machine the peer re-executes itself in a private mount namespace
// (CLONE_NEWNS; needs root) and bind-mounts --plugin-dir there, so each node's agent points its
// --device-plugin-dir at the real path of that folder. Killing the peer and starting it again is
// a kubelet restart: the device manager removes every socket in the folder on start.
//
// With --dra-registry-dir the peer also runs the kubelet's DRA manager and plugin manager
// (dra.go): DRA plugins register there as with a kubelet, the peer prepares a pod's claims over
// the plugin's socket before it reports the pod Running, records the CDI devices each container
// got with their edits from the runtime's CDI specs (cdi.go), and unprepares them once the pod
// is deleted.
//
// With --node-count N the peer plays N nodes in one process instead (see multi.go): each node
// has its own device manager listening on its own folder under --plugin-root, so no mount
// namespace (and no root) is needed. Benchmarks use it to simulate hundreds of nodes.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

type options struct {
	kubeconfig string
	nodeName   string
	pluginDir  string
	cpu        string
	memory     string
	pods       string
	labels     string
	heartbeat  time.Duration
	multi      multiOptions
	dra        draOptions
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.StringVar(&o.nodeName, "node-name", "", "name of the simulated node")
	flag.StringVar(&o.pluginDir, "plugin-dir", kubeletPluginDir, "folder where kubelet.sock lives (bind-mounted on "+kubeletPluginDir+" when different)")
	flag.StringVar(&o.cpu, "cpu", "16", "node cpu capacity")
	flag.StringVar(&o.memory, "memory", "64Gi", "node memory capacity")
	flag.StringVar(&o.pods, "pods", "110", "node pod capacity")
	flag.StringVar(&o.labels, "labels", "", "extra node labels set at creation, k=v,k=v")
	flag.DurationVar(&o.heartbeat, "heartbeat-interval", heartbeatInterval, "how often the Node status and Lease are refreshed when nothing changed")
	addMultiFlags(&o.multi)
	addDRAFlags(&o.dra)
	klog.InitFlags(nil)
	flag.Parse()
	return o
}

func main() {
	o := parseFlags()
	if o.multi.nodeCount > 0 {
		if err := runMulti(o); err != nil {
			fmt.Fprintf(os.Stderr, "kubelet-peer: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if o.nodeName == "" {
		fmt.Fprintln(os.Stderr, "kubelet-peer: --node-name is required")
		os.Exit(2)
	}
	if err := enterPluginNamespace(o.pluginDir); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-peer: %v\n", err)
		os.Exit(1)
	}
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-peer: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("reading kubeconfig: %w", err)
	}
	config.QPS, config.Burst = 100, 200
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	peer, err := newPeer(client, o)
	if err != nil {
		return err
	}
	return peer.run(ctx)
}
