package main

// Many nodes in one process (--node-count N), for benchmarks at hundreds of nodes where one
// process per node would not fit the machine. Each node is the same peer as in single-node mode
// (its own device manager, pod informer limited to its node, serial admission worker, Node and
// Lease), sharing one API client. The only difference is where each device manager listens:
// the exported constructor hard-codes /var/lib/kubelet/device-plugins/kubelet.sock, so this mode
// reaches the package's own unexported constructor, which takes the socket path, through
// go:linkname (devicemanager.go; built with -ldflags=-checklinkname=0, see build.sh). Node i is named
// <prefix><i, 4 digits> and listens on <plugin-root>/<name>/kubelet.sock; its agent (or the
// baseline plugin of baseline.go) registers there. With --dra each node also runs the kubelet's
// DRA manager and plugin manager of its own (dra.go), as in single-node mode, on folders of its
// own: plugins register in <plugin-root>/<name>/plugins_registry, the DRA manager keeps its
// checkpoint in <plugin-root>/<name>/dra-state and CDI specs are read from <plugin-root>/<name>/cdi
// (the node's agent writes them there).

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

type multiOptions struct {
	nodeCount    int
	namePrefix   string
	pluginRoot   string
	baselineGPUs int
	qps          float64
	startSpread  time.Duration
	dra          bool
}

func addMultiFlags(m *multiOptions) {
	flag.IntVar(&m.nodeCount, "node-count", 0, "play this many nodes in one process (0: one node, --node-name)")
	flag.StringVar(&m.namePrefix, "node-name-prefix", "sim-", "with --node-count: node names are <prefix>0000, <prefix>0001, ...")
	flag.StringVar(&m.pluginRoot, "plugin-root", "", "with --node-count: node <name> listens on <plugin-root>/<name>/kubelet.sock")
	flag.IntVar(&m.baselineGPUs, "baseline-plugin-gpus", 0, "with --node-count: also run a plain amd.com/gpu device plugin with this many GPUs per node (no rocshare)")
	flag.Float64Var(&m.qps, "multi-qps", 2000, "with --node-count: API client QPS shared by all nodes (burst twice that)")
	flag.BoolVar(&m.dra, "dra", false, "with --node-count: each node runs the kubelet's DRA manager, plugins registering in <plugin-root>/<name>/plugins_registry, CDI specs read from <plugin-root>/<name>/cdi")
	flag.DurationVar(&m.startSpread, "start-spread", 5*time.Second, "with --node-count: node starts are spread over this long, so heartbeats do not all fall together")
}

func nodeName(prefix string, index int) string {
	return fmt.Sprintf("%s%04d", prefix, index)
}

func runMulti(o options) error {
	if o.multi.pluginRoot == "" {
		return fmt.Errorf("--node-count needs --plugin-root")
	}
	config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("reading kubeconfig: %w", err)
	}
	config.QPS, config.Burst = float32(o.multi.qps), int(2*o.multi.qps)
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, o.multi.nodeCount)
	for i := 0; i < o.multi.nodeCount; i++ {
		node := o
		node.nodeName = nodeName(o.multi.namePrefix, i)
		node.pluginDir = filepath.Join(o.multi.pluginRoot, node.nodeName)
		node.dra = draOptions{}
		if o.multi.dra {
			node.dra = nodeDRAOptions(node.pluginDir)
		}
		delay := o.multi.startSpread * time.Duration(i) / time.Duration(o.multi.nodeCount)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runOneOfMany(ctx, client, node, delay); err != nil {
				errs <- fmt.Errorf("node %s: %w", node.nodeName, err)
				stop() // one node failing fails the run: a benchmark must not go on with fewer nodes
			}
		}()
	}
	klog.InfoS("kubelet-peer serving many nodes", "count", o.multi.nodeCount, "root", o.multi.pluginRoot)
	wg.Wait()
	close(errs)
	return <-errs // nil when every node ended by the signal
}

func runOneOfMany(ctx context.Context, client kubernetes.Interface, o options, delay time.Duration) error {
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(delay):
	}
	if err := os.MkdirAll(o.pluginDir, 0o750); err != nil {
		return err
	}
	topology, err := newTopology()
	if err != nil {
		return err
	}
	socket := filepath.Join(o.pluginDir, "kubelet.sock")
	devices, err := newDeviceManager(socket, topology)
	if err != nil {
		return fmt.Errorf("creating the device manager: %w", err)
	}
	p, err := newPeerWith(client, o, devices)
	if err != nil {
		return err
	}
	if p.dra, err = newDynamicResources(client, o.dra); err != nil {
		return err
	}
	if o.multi.baselineGPUs > 0 {
		go runBaselinePlugin(ctx, o.pluginDir, o.multi.baselineGPUs)
	}
	return p.run(ctx)
}

// nodeDRAOptions: one node's DRA folders under its plugin folder (--dra).
func nodeDRAOptions(pluginDir string) draOptions {
	return draOptions{
		registryDir: filepath.Join(pluginDir, "plugins_registry"),
		stateDir:    filepath.Join(pluginDir, "dra-state"),
		cdiDirs:     filepath.Join(pluginDir, "cdi"),
	}
}
