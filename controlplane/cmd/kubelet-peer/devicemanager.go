package main

// The device manager's constructor, one code path for every supported Kubernetes minor.
//
// The exported devicemanager.NewManagerImpl differs between minors: v1.35 takes
// (topology []cadvisor/info/v1.Node, store); v1.37 takes (logger, topology
// []cadvisor/lib/model.Node, store), cadvisor's types having moved to the module
// github.com/google/cadvisor/lib. The unexported newManagerImpl(logger, socketPath, topology,
// store) keeps its shape in both, so the peer reaches it through go:linkname (build.sh links
// with -checklinkname=0) for the node's own socket (single-node mode, the kubelet's path
// /var/lib/kubelet/device-plugins/kubelet.sock, as NewManagerImpl passes on Linux) and for
// each simulated node's socket (multi.go).
//
// The topology argument is always nil (the kubelet's default "none" topology policy gives the
// device manager no NUMA nodes). Its element type is declared here as an opaque struct rather
// than cadvisor's Node: a nil slice has the same representation whatever its element, and
// importing either cadvisor package would make `go mod tidy` (controlplane/genmod.sh) pull
// the other minor's cadvisor module into each version's go.mod, changing the dependency set
// the Kubernetes release was tested with.

import (
	_ "unsafe" // go:linkname

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// kubeletSocket is where a real kubelet's device manager listens (and the single-node peer's,
// inside its own mount namespace).
const kubeletSocket = pluginapi.KubeletSocket

// numaNode stands for cadvisor's Node in newManagerImpl's signature; only nil slices of it
// are ever passed.
type numaNode struct{ _ [0]byte }

//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []numaNode,
	topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

// newDeviceManager makes the kubelet's device manager listening on socketPath.
func newDeviceManager(socketPath string, store topologymanager.Store) (*devicemanager.ManagerImpl, error) {
	return newManagerImpl(klog.Background(), socketPath, nil, store)
}
