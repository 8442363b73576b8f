package main

// Admitting a pod the way the kubelet does for devices: Allocate for every init container, then
// every app container (the device manager relies on that order to reuse init containers'
// devices), then GetDeviceRunContainerOptions per container, which is what the runtime would be
// given. A refusal becomes the kubelet's own rejection: phase Failed, reason
// UnexpectedAdmissionError, message "Pod was rejected: Allocate failed due to ...".

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/admission"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// ContainersCondition is the pod condition whose message holds, per container name, what the
// container runtime would receive (JSON). It rides on the status write that moves the pod to
// Running: a real kubelet writes nothing else on the pod, so neither does the peer (an extra
// write would also pass through every admission policy and webhook that matches pods).
const ContainersCondition = v1.PodConditionType("kubelet-peer.rocshare.io/Containers")

type deviceMount struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	Permissions   string `json:"permissions"`
}

type volumeMount struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	ReadOnly      bool   `json:"readOnly"`
}

type containerRuntimeSpec struct {
	Envs        map[string]string   `json:"envs"`
	Devices     []deviceMount       `json:"devices"`
	Mounts      []volumeMount       `json:"mounts"`
	Annotations map[string]string   `json:"annotations,omitempty"`
	DeviceIDs   map[string][]string `json:"deviceIDs,omitempty"`
	CDIDevices  []string            `json:"cdiDevices,omitempty"` // from the pod's DRA claims
}

func allContainers(pod *v1.Pod) []v1.Container {
	return append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
}

func (p *peer) sync(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := p.pods.Pods(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case pod.DeletionTimestamp != nil:
		return p.removePod(ctx, pod)
	case pod.Status.Phase != "" && pod.Status.Phase != v1.PodPending:
		return nil
	case p.admitted.Has(pod.UID):
		return nil // our status update has not reached the informer yet
	}
	return p.admit(ctx, pod)
}

func (p *peer) admit(ctx context.Context, pod *v1.Pod) error {
	for _, container := range allContainers(pod) {
		if err := allocateDevices(ctx, p.devices, pod, &container); err != nil {
			result := admission.GetPodAdmitResult(err)
			p.admitted.Insert(pod.UID)
			return p.reject(ctx, pod, result.Reason, result.Message)
		}
	}
	// SyncPod, after admission: the claims are prepared before any container starts. A failure
	// leaves the pod Pending and is retried, with the kubelet's event.
	if err := p.dra.prepare(ctx, pod); err != nil {
		p.recordEvent(ctx, pod, "FailedPrepareDynamicResources", err.Error())
		return err
	}
	specs, err := p.runtimeSpecs(ctx, pod)
	if err != nil {
		p.admitted.Insert(pod.UID)
		return p.reject(ctx, pod, "CreateContainerConfigError", err.Error())
	}
	text, err := json.Marshal(specs)
	if err != nil {
		return err
	}
	p.admitted.Insert(pod.UID)
	klog.InfoS("Pod admitted", "pod", klog.KObj(pod))
	return p.updatePodStatus(ctx, pod, func(status *v1.PodStatus) {
		setRunning(pod, status)
		setCondition(status, v1.PodCondition{Type: ContainersCondition, Status: v1.ConditionTrue,
			LastTransitionTime: metav1.Now(), Reason: "RuntimeSpecs", Message: string(text)})
	})
}

func (p *peer) runtimeSpecs(ctx context.Context, pod *v1.Pod) (map[string]containerRuntimeSpec, error) {
	specs := map[string]containerRuntimeSpec{}
	for _, container := range allContainers(pod) {
		options, err := p.devices.GetDeviceRunContainerOptions(ctx, pod, &container)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", container.Name, err)
		}
		spec := specFromOptions(options)
		spec.DeviceIDs = deviceIDs(p.devices.GetDevices(string(pod.UID), container.Name))
		if err := p.addCDIDevices(pod, &container, &spec); err != nil {
			return nil, fmt.Errorf("container %s: %w", container.Name, err)
		}
		specs[container.Name] = spec
	}
	return specs, nil
}

// addCDIDevices: the container's CDI devices from its claims, and what the runtime's CDI specs
// make of them.
func (p *peer) addCDIDevices(pod *v1.Pod, container *v1.Container, spec *containerRuntimeSpec) error {
	names, err := p.dra.cdiDevices(pod, container)
	if err != nil || len(names) == 0 {
		return err
	}
	spec.CDIDevices = names
	edits, err := resolveCDI(p.dra.cdiDirs, names)
	if err != nil {
		return err
	}
	return applyCDI(spec, edits)
}

func specFromOptions(options *devicemanager.DeviceRunContainerOptions) containerRuntimeSpec {
	spec := containerRuntimeSpec{Envs: map[string]string{}, Devices: []deviceMount{}, Mounts: []volumeMount{}}
	if options == nil {
		return spec
	}
	for _, env := range options.Envs {
		spec.Envs[env.Name] = env.Value
	}
	for _, device := range options.Devices {
		spec.Devices = append(spec.Devices, deviceMount{device.PathOnHost, device.PathInContainer, device.Permissions})
	}
	for _, mount := range options.Mounts {
		spec.Mounts = append(spec.Mounts, volumeMount{mount.HostPath, mount.ContainerPath, mount.ReadOnly})
	}
	if len(options.Annotations) > 0 {
		spec.Annotations = map[string]string{}
		for _, annotation := range options.Annotations {
			spec.Annotations[annotation.Name] = annotation.Value
		}
	}
	return spec
}

func deviceIDs(instances devicemanager.ResourceDeviceInstances) map[string][]string {
	ids := map[string][]string{}
	for resource, devices := range instances {
		for id := range devices {
			ids[resource] = append(ids[resource], id)
		}
		sort.Strings(ids[resource])
	}
	return ids
}

func (p *peer) reject(ctx context.Context, pod *v1.Pod, reason, message string) error {
	klog.InfoS("Pod rejected", "pod", klog.KObj(pod), "reason", reason, "message", message)
	p.recordEvent(ctx, pod, reason, message)
	return p.updatePodStatus(ctx, pod, func(status *v1.PodStatus) {
		status.Phase = v1.PodFailed
		status.Reason = reason
		status.Message = "Pod was rejected: " + message
	})
}

func (p *peer) recordEvent(ctx context.Context, pod *v1.Pod, reason, message string) {
	now := metav1.Now()
	event := &v1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name,
			UID: pod.UID, APIVersion: "v1", ResourceVersion: pod.ResourceVersion},
		Reason: reason, Message: message, Type: v1.EventTypeWarning, Count: 1,
		FirstTimestamp: now, LastTimestamp: now,
		Source: v1.EventSource{Component: "kubelet", Host: p.nodeName},
	}
	if _, err := p.client.CoreV1().Events(pod.Namespace).Create(ctx, event, metav1.CreateOptions{}); err != nil {
		klog.ErrorS(err, "Recording event", "pod", klog.KObj(pod))
	}
}

func (p *peer) updatePodStatus(ctx context.Context, pod *v1.Pod, change func(*v1.PodStatus)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := p.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if current.UID != pod.UID {
			return nil // replaced by a namesake; nothing of ours to update
		}
		change(&current.Status)
		_, err = p.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, current, metav1.UpdateOptions{})
		return err
	})
}

// removePod: the kubelet stops the containers, unprepares the pod's claims, then removes the pod
// with grace 0. The devices are released when the device manager next sees the pod missing from
// activePods.
func (p *peer) removePod(ctx context.Context, pod *v1.Pod) error {
	if err := p.dra.unprepare(ctx, pod); err != nil {
		p.recordEvent(ctx, pod, "FailedUnprepareDynamicResources", err.Error())
		return err
	}
	grace := int64(0)
	uid := pod.UID
	err := p.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

func setRunning(pod *v1.Pod, status *v1.PodStatus) {
	now := metav1.Now()
	status.Phase = v1.PodRunning
	status.HostIP = "127.0.0.1"
	status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
	status.StartTime = &now
	for _, kind := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		setCondition(status, v1.PodCondition{Type: kind, Status: v1.ConditionTrue, LastTransitionTime: now})
	}
	status.InitContainerStatuses = nil
	for _, container := range pod.Spec.InitContainers {
		state := v1.ContainerState{Terminated: &v1.ContainerStateTerminated{Reason: "Completed", StartedAt: now, FinishedAt: now}}
		status.InitContainerStatuses = append(status.InitContainerStatuses, containerStatus(pod, container, state, false))
	}
	status.ContainerStatuses = nil
	for _, container := range pod.Spec.Containers {
		state := v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}}
		status.ContainerStatuses = append(status.ContainerStatuses, containerStatus(pod, container, state, true))
	}
}

func containerStatus(pod *v1.Pod, container v1.Container, state v1.ContainerState, running bool) v1.ContainerStatus {
	started := running
	return v1.ContainerStatus{
		Name: container.Name, Image: container.Image, ImageID: "sim://" + container.Image,
		ContainerID: fmt.Sprintf("sim://%s/%s", pod.UID, container.Name),
		State:       state, Ready: running, Started: &started,
	}
}

func setCondition(status *v1.PodStatus, condition v1.PodCondition) {
	for i := range status.Conditions {
		if status.Conditions[i].Type == condition.Type {
			status.Conditions[i] = condition
			return
		}
	}
	status.Conditions = append(status.Conditions, condition)
}
