//go:build kubelet_contextual

package main

// The device manager's and topology manager's calls from v1.37 on, which take a logger or a
// context (contextual logging), and Allocate an operation (add or, for in-place resize, resize).
// The peer only adds pods. See kubeletapi_logless.go for the earlier minors.

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// newTopology is the kubelet's default topology manager: policy none, container scope.
func newTopology() (topologymanager.Manager, error) {
	return topologymanager.NewManager(klog.Background(), nil, topologymanager.PolicyNone, "container", nil)
}

// deviceCapacity is the device manager's capacity, allocatable and removed resource names.
func deviceCapacity(m *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList, []string) {
	return m.GetCapacity(klog.Background())
}

// allocateDevices runs the device manager's Allocate for one container of a pod being added.
func allocateDevices(ctx context.Context, m *devicemanager.ManagerImpl, pod *v1.Pod, container *v1.Container) error {
	return m.Allocate(ctx, pod, container, lifecycle.AddOperation)
}

// nodeGetter is the DRA manager's GetNodeFunc as v1.37 declares it (with a context).
func nodeGetter(get func(context.Context) (*v1.Node, error)) dra.GetNodeFunc {
	return get
}
