package main

// Dynamic resource allocation the way the kubelet does it: the kubelet's own DRA manager
// (k8s.io/kubernetes/pkg/kubelet/cm/dra) and plugin manager (pkg/kubelet/pluginmanager). The
// plugin manager watches --dra-registry-dir (a kubelet's <root>/plugins_registry) for
// registration sockets, asks each plugin for its info and hands DRA plugins to the DRA manager,
// which connects to the plugin's own socket. For a pod with claims the peer then calls, as
// SyncPod does after admission, PrepareResources (NodePrepareResources over that socket) and,
// per container, GetResources (the CDI device IDs the CRI would be given); once the pod is
// deleted, UnprepareResources (NodeUnprepareResources) before the pod object goes. The DRA
// manager's own reconcile loop unprepares the claims of pods that went away unnoticed (a forced
// delete), as in the kubelet. The CDI devices are then resolved against the runtime's CDI spec
// folders (cdi.go), as containerd does when it creates the container.
//
// Multi-node mode (benchmarks) runs one DRA manager and one plugin manager per node with --dra,
// each on the node's own folders (multi.go); --dra-registry-dir is for single-node mode.

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

type draOptions struct {
	registryDir string
	stateDir    string
	cdiDirs     string
}

func addDRAFlags(o *draOptions) {
	flag.StringVar(&o.registryDir, "dra-registry-dir", "", "the kubelet's plugins_registry folder to watch for DRA plugins (empty: no DRA)")
	flag.StringVar(&o.stateDir, "dra-state-dir", "", "where the DRA manager keeps its checkpoint (default: dra-state beside --dra-registry-dir)")
	flag.StringVar(&o.cdiDirs, "cdi-dir", "/etc/cdi,/var/run/cdi", "the container runtime's CDI spec folders, comma-separated, later ones first")
}

type dynamicResources struct {
	manager *dra.Manager
	plugins pluginmanager.PluginManager
	cdiDirs []string
}

func newDynamicResources(client kubernetes.Interface, o draOptions) (*dynamicResources, error) {
	if o.registryDir == "" {
		return nil, nil
	}
	stateDir := o.stateDir
	if stateDir == "" {
		stateDir = filepath.Join(filepath.Dir(filepath.Clean(o.registryDir)), "dra-state")
	}
	manager, err := dra.NewManager(klog.Background(), client, stateDir)
	if err != nil {
		return nil, fmt.Errorf("creating the DRA manager: %w", err)
	}
	// The plugin manager records events only when a registration fails; its log says the same.
	plugins := pluginmanager.NewPluginManager(o.registryDir, &record.FakeRecorder{})
	var dirs []string
	for _, dir := range strings.Split(o.cdiDirs, ",") {
		if dir = strings.TrimSpace(dir); dir != "" {
			dirs = append(dirs, dir)
		}
	}
	return &dynamicResources{manager: manager, plugins: plugins, cdiDirs: dirs}, nil
}

// start: the DRA manager first (its watcher handler exists only once started), then the plugin
// manager with the DRA handler, as the kubelet's container manager and plugin manager do.
func (d *dynamicResources) start(ctx context.Context, activePods dra.ActivePodsFunc,
	getNode func(context.Context) (*v1.Node, error), ready config.SourcesReady) error {
	if err := d.manager.Start(ctx, activePods, nodeGetter(getNode), ready); err != nil {
		return fmt.Errorf("starting the DRA manager: %w", err)
	}
	d.plugins.AddHandler(pluginwatcherapi.DRAPlugin, d.manager.GetWatcherHandler())
	go d.plugins.Run(ctx, ready, ctx.Done())
	return nil
}

func hasClaims(pod *v1.Pod) bool {
	return len(pod.Spec.ResourceClaims) > 0 || pod.Status.ExtendedResourceClaimStatus != nil
}

// prepare: NodePrepareResources for the pod's claims (a no-op for a pod without any).
func (d *dynamicResources) prepare(ctx context.Context, pod *v1.Pod) error {
	if d == nil || !hasClaims(pod) {
		return nil
	}
	return d.manager.PrepareResources(ctx, pod)
}

// unprepare: NodeUnprepareResources for the pod's claims, idempotent.
func (d *dynamicResources) unprepare(ctx context.Context, pod *v1.Pod) error {
	if d == nil || !hasClaims(pod) {
		return nil
	}
	return d.manager.UnprepareResources(ctx, pod)
}

// cdiDevices: the fully qualified CDI device names the CRI would be given for the container.
func (d *dynamicResources) cdiDevices(pod *v1.Pod, container *v1.Container) ([]string, error) {
	if d == nil || !hasClaims(pod) {
		return nil, nil
	}
	info, err := d.manager.GetResources(pod, container)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(info.CDIDevices))
	for _, device := range info.CDIDevices {
		names = append(names, device.Name)
	}
	return names, nil
}

func (p *peer) getNode(ctx context.Context) (*v1.Node, error) {
	return p.client.CoreV1().Nodes().Get(ctx, p.nodeName, metav1.GetOptions{})
}
