//go:build !kubelet_contextual

package main

// The device manager's and topology manager's calls as v1.35 declares them (and v1.36; see
// kubeletapi_contextual.go for v1.37's). build.sh picks the file by the version's minor, through
// the build tag kubelet_contextual.

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// newTopology is the kubelet's default topology manager: policy none, container scope.
func newTopology() (topologymanager.Manager, error) {
	return topologymanager.NewManager(nil, topologymanager.PolicyNone, "container", nil)
}

// deviceCapacity is the device manager's capacity, allocatable and removed resource names.
func deviceCapacity(m *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList, []string) {
	return m.GetCapacity()
}

// allocateDevices runs the device manager's Allocate for one container of a pod being added.
func allocateDevices(_ context.Context, m *devicemanager.ManagerImpl, pod *v1.Pod, container *v1.Container) error {
	return m.Allocate(pod, container)
}

// nodeGetter is the DRA manager's GetNodeFunc as v1.35 declares it (no context).
func nodeGetter(get func(context.Context) (*v1.Node, error)) dra.GetNodeFunc {
	return func() (*v1.Node, error) { return get(context.Background()) }
}
