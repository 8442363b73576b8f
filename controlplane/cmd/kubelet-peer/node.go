package main

// The Node object: created once (labels set only at creation, so the operator's labels and
// annotations survive restarts), then its status is rewritten by the peer alone: Ready,
// cpu/memory/pods from flags, device resources from the device manager. A heartbeat refreshes
// the Ready condition and the node Lease, so the node lifecycle controller keeps the node.

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
)

const (
	heartbeatInterval  = 10 * time.Second
	leaseDurationS     = 40
	nodeLeaseNamespace = "kube-node-lease"
)

func parseLabels(text string) (map[string]string, error) {
	labels := map[string]string{}
	for _, pair := range strings.Split(text, ",") {
		if pair == "" {
			continue
		}
		key, value, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("label %q is not key=value", pair)
		}
		labels[key] = value
	}
	return labels, nil
}

func (p *peer) ensureNode(ctx context.Context) error {
	_, err := p.client.CoreV1().Nodes().Get(ctx, p.nodeName, metav1.GetOptions{})
	if err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	labels := map[string]string{
		"kubernetes.io/hostname": p.nodeName,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
	}
	for key, value := range p.extraLabels {
		labels[key] = value
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: p.nodeName, Labels: labels}}
	_, err = p.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// resources is what the node offers: flags plus every device-plugin resource.
func (p *peer) resources() (v1.ResourceList, v1.ResourceList) {
	capacity, allocatable, _ := deviceCapacity(p.devices)
	for name, quantity := range p.baseResources {
		capacity[name] = quantity
		allocatable[name] = quantity
	}
	return capacity, allocatable
}

func (p *peer) nodeConditions(now metav1.Time) []v1.NodeCondition {
	condition := func(kind v1.NodeConditionType, status v1.ConditionStatus, reason, message string) v1.NodeCondition {
		return v1.NodeCondition{Type: kind, Status: status, Reason: reason, Message: message,
			LastHeartbeatTime: now, LastTransitionTime: p.startTime}
	}
	return []v1.NodeCondition{
		condition(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet-peer has sufficient memory"),
		condition(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet-peer has no disk pressure"),
		condition(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID", "kubelet-peer has sufficient PID"),
		condition(v1.NodeReady, v1.ConditionTrue, "KubeletReady", "kubelet-peer is posting ready status"),
	}
}

// updateNodeStatus writes the whole status; returns the allocatable it wrote.
func (p *peer) updateNodeStatus(ctx context.Context) (v1.ResourceList, error) {
	capacity, allocatable := p.resources()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := p.client.CoreV1().Nodes().Get(ctx, p.nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Capacity = capacity
		node.Status.Allocatable = allocatable
		node.Status.Conditions = p.nodeConditions(metav1.Now())
		node.Status.Addresses = []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: p.nodeName}}
		node.Status.NodeInfo = v1.NodeSystemInfo{KubeletVersion: kubeletVersion(), OperatingSystem: "linux",
			Architecture: "amd64", ContainerRuntimeVersion: "kubelet-peer://0", OSImage: "kubelet-peer"}
		node.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250
		_, err = p.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	return allocatable, err
}

func (p *peer) renewLease(ctx context.Context) error {
	leases := p.client.CoordinationV1().Leases(nodeLeaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, p.nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		duration := int32(leaseDurationS)
		holder := p.nodeName
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: p.nodeName, Namespace: nodeLeaseNamespace},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, RenewTime: &now},
		}
		_, err = leases.Create(ctx, lease, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// syncNodeLoop publishes allocatable within a second of a device-manager change and sends a
// full heartbeat every p.heartbeat (--heartbeat-interval, heartbeatInterval by default).
func (p *peer) syncNodeLoop(ctx context.Context) {
	var written v1.ResourceList
	lastBeat := time.Time{}
	ticker := time.NewTicker(500 * time.Millisecond)
	defer ticker.Stop()
	for {
		_, allocatable := p.resources()
		if written == nil || !sameResources(written, allocatable) || time.Since(lastBeat) >= p.heartbeat {
			if wrote, err := p.updateNodeStatus(ctx); err != nil {
				klog.ErrorS(err, "Updating node status")
			} else {
				written, lastBeat = wrote, time.Now()
				if err := p.renewLease(ctx); err != nil {
					klog.ErrorS(err, "Renewing node lease")
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func sameResources(a, b v1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for name, quantity := range a {
		other, ok := b[name]
		if !ok || other.Cmp(quantity) != 0 {
			return false
		}
	}
	return true
}

func baseResources(o options) (v1.ResourceList, error) {
	list := v1.ResourceList{}
	for name, text := range map[v1.ResourceName]string{v1.ResourceCPU: o.cpu, v1.ResourceMemory: o.memory, v1.ResourcePods: o.pods} {
		quantity, err := resource.ParseQuantity(text)
		if err != nil {
			return nil, fmt.Errorf("--%s=%q: %w", name, text, err)
		}
		list[name] = quantity
	}
	return list, nil
}

// kubeletVersion is the Kubernetes version this peer was built from (build.sh sets it with
// -ldflags -X k8s.io/component-base/version.gitVersion), as a kubelet reports its own.
func kubeletVersion() string {
	return version.Get().GitVersion
}
