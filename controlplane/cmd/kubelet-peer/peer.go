package main

// The peer: a device manager, a pod informer limited to this node, and one worker that admits
// pods in order (the kubelet admits serially too). State that must survive a restart lives in
// the API server (pod phase) and in the device manager's own checkpoint in the plugin folder.

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

type peer struct {
	client        kubernetes.Interface
	nodeName      string
	extraLabels   map[string]string
	baseResources v1.ResourceList
	startTime     metav1.Time
	heartbeat     time.Duration
	devices       *devicemanager.ManagerImpl
	dra           *dynamicResources // nil: no DRA (multi-node mode, or no --dra-registry-dir)
	informer      cache.SharedIndexInformer
	pods          listersv1.PodLister
	queue         workqueue.TypedRateLimitingInterface[string]
	admitted      *uidSet // pods admitted (or rejected) by this process, until deleted
}

// uidSet is shared by the worker (adds) and the informer's delete handler (removes).
type uidSet struct {
	mutex sync.Mutex
	uids  sets.Set[types.UID]
}

func (s *uidSet) Has(uid types.UID) bool {
	s.mutex.Lock()
	defer s.mutex.Unlock()
	return s.uids.Has(uid)
}

func (s *uidSet) Insert(uid types.UID) {
	s.mutex.Lock()
	defer s.mutex.Unlock()
	s.uids.Insert(uid)
}

func (s *uidSet) Delete(uid types.UID) {
	s.mutex.Lock()
	defer s.mutex.Unlock()
	s.uids.Delete(uid)
}

// sourcesReady tells the device manager when the pod list is complete, as the kubelet's
// config sources do: until then it must not garbage-collect devices of pods it has not seen.
type sourcesReady struct{ synced func() bool }

func (s sourcesReady) AddSource(string) {}
func (s sourcesReady) AllReady() bool   { return s.synced() }

func newPeer(client kubernetes.Interface, o options) (*peer, error) {
	// The kubelet's default topology policy is "none": no NUMA hints reach the device manager.
	topology, err := newTopology()
	if err != nil {
		return nil, err
	}
	devices, err := newDeviceManager(kubeletSocket, topology)
	if err != nil {
		return nil, fmt.Errorf("creating the device manager: %w", err)
	}
	p, err := newPeerWith(client, o, devices)
	if err != nil {
		return nil, err
	}
	p.dra, err = newDynamicResources(client, o.dra)
	return p, err
}

// newPeerWith builds the peer around a device manager made by the caller (multi.go makes one
// per node, each on its own socket).
func newPeerWith(client kubernetes.Interface, o options, devices *devicemanager.ManagerImpl) (*peer, error) {
	labels, err := parseLabels(o.labels)
	if err != nil {
		return nil, err
	}
	base, err := baseResources(o)
	if err != nil {
		return nil, err
	}
	heartbeat := o.heartbeat
	if heartbeat <= 0 {
		heartbeat = heartbeatInterval
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(
		func(options *metav1.ListOptions) {
			options.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", o.nodeName).String()
		}))
	podInformer := factory.Core().V1().Pods()
	p := &peer{
		client: client, nodeName: o.nodeName, extraLabels: labels, baseResources: base,
		startTime: metav1.Now(), heartbeat: heartbeat, devices: devices,
		informer: podInformer.Informer(), pods: podInformer.Lister(),
		admitted: &uidSet{uids: sets.New[types.UID]()},
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
	}
	return p, nil
}

func (p *peer) run(ctx context.Context) error {
	if err := p.ensureNode(ctx); err != nil {
		return fmt.Errorf("creating node %s: %w", p.nodeName, err)
	}
	_, err := p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.enqueue,
		UpdateFunc: func(_, pod interface{}) { p.enqueue(pod) },
		DeleteFunc: p.forget,
	})
	if err != nil {
		return err
	}
	go p.informer.Run(ctx.Done())
	ready := sourcesReady{synced: p.informer.HasSynced}
	logger := klog.FromContext(ctx)
	if err := p.devices.Start(logger, p.activePods, ready, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return fmt.Errorf("starting the device manager: %w", err)
	}
	defer func() { _ = p.devices.Stop(logger) }()
	if p.dra != nil {
		if err := p.dra.start(ctx, p.activePods, p.getNode, ready); err != nil {
			return err
		}
	}
	klog.InfoS("kubelet-peer serving", "node", p.nodeName, "socket", kubeletPluginDir+"/kubelet.sock")
	go p.syncNodeLoop(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
		return ctx.Err()
	}
	go wait.UntilWithContext(ctx, p.work, time.Second)
	<-ctx.Done()
	p.queue.ShutDown()
	return nil
}

func (p *peer) forget(object interface{}) {
	if tombstone, ok := object.(cache.DeletedFinalStateUnknown); ok {
		object = tombstone.Obj
	}
	if pod, ok := object.(*v1.Pod); ok {
		p.admitted.Delete(pod.UID)
	}
}

func (p *peer) enqueue(object interface{}) {
	if key, err := cache.MetaNamespaceKeyFunc(object); err == nil {
		p.queue.Add(key)
	}
}

// activePods: the pods that still hold devices. Terminal pods and pods gone from the API server
// release theirs the next time the device manager garbage-collects.
func (p *peer) activePods() []*v1.Pod {
	all, err := p.pods.List(labels.Everything())
	if err != nil {
		return nil
	}
	active := make([]*v1.Pod, 0, len(all))
	for _, pod := range all {
		if pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed && pod.DeletionTimestamp == nil {
			active = append(active, pod)
		}
	}
	return active
}

func (p *peer) work(ctx context.Context) {
	for p.processNext(ctx) {
	}
}

func (p *peer) processNext(ctx context.Context) bool {
	key, quit := p.queue.Get()
	if quit {
		return false
	}
	defer p.queue.Done(key)
	if err := p.sync(ctx, key); err != nil {
		klog.ErrorS(err, "Syncing pod", "pod", key)
		p.queue.AddRateLimited(key)
		return true
	}
	p.queue.Forget(key)
	return true
}
