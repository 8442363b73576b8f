// dra-allocbench: the CPU kube-scheduler's DRA allocator spends per pod, on the product's
// ResourceSlice and claim, without a control plane. Per pod it does what the DRA plugin of
// kube-scheduler 1.37.2 does (pkg/scheduler/framework/plugins/dynamicresources): clone the
// allocated state, structured.NewAllocator once (PreFilter), then Allocate on one node after the
// other (Filter) until `-filter` nodes fit (kube-scheduler's percentageOfNodesToScore: 230 of 500
// nodes by default), and books the first node's result (spread). Features: 1.37's defaults.
// Used to weigh claim and slice shapes (CEL selectors, attributes) before a full `bench dra`.
//
//	.venv/bin/rocshare-dev bench dra --write-inputs /tmp/dra-inputs   # the product's slice and claim
//	cd dev/dra-allocbench && GOFLAGS=-mod=readonly GOPROXY=off \
//	  go run -modfile=../../controlplane/k8s/1.37.2/go.mod . -slice /tmp/dra-inputs/slice.json \
//	  -claim /tmp/dra-inputs/claim.json -nodes 500 -pods 300
//
// It prints the CPU time (user + system) per pod; compare variants of the inputs in one session.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type classLister struct{ class *resourceapi.DeviceClass }

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	return []*resourceapi.DeviceClass{l.class}, nil
}
func (l classLister) Get(string) (*resourceapi.DeviceClass, error) { return l.class, nil }

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "dra-allocbench:", err)
		os.Exit(1)
	}
}

func readJSON(path string, into any) {
	raw, err := os.ReadFile(path)
	must(err)
	must(json.Unmarshal(raw, into))
}

func cpuTime() time.Duration {
	var usage syscall.Rusage
	must(syscall.Getrusage(syscall.RUSAGE_SELF, &usage))
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}

func main() {
	slicePath := flag.String("slice", "slice.json", "one node's ResourceSlice (JSON), copied for every node")
	claimPath := flag.String("claim", "claim.json", "the claim spec (JSON) every pod gets from its template")
	className := flag.String("class-name", "gpu.rocshare.io", "the DeviceClass the claim names")
	classSelector := flag.String("class-selector", `device.driver == "gpu.rocshare.io"`, "its CEL selector ('' for none)")
	nodes := flag.Int("nodes", 500, "nodes, each with one copy of the slice")
	pods := flag.Int("pods", 300, "pods, one claim each")
	filter := flag.Int("filter", 230, "feasible nodes kube-scheduler looks for per pod")
	profile := flag.String("cpuprofile", "", "write a Go CPU profile here")
	flag.Parse()

	var slice resourceapi.ResourceSlice
	readJSON(*slicePath, &slice)
	var spec resourceapi.ResourceClaimSpec
	readJSON(*claimPath, &spec)
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: *className}}
	if *classSelector != "" {
		class.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: *classSelector}}}
	}
	slices := make([]*resourceapi.ResourceSlice, 0, *nodes)
	nodeObjects := make([]*v1.Node, 0, *nodes)
	for index := 0; index < *nodes; index++ {
		name := fmt.Sprintf("dra-%05d", index)
		copied := slice.DeepCopy()
		copied.Name = name + "-" + copied.Spec.Driver
		copied.Spec.NodeName = &name
		copied.Spec.Pool.Name = name
		slices = append(slices, copied)
		nodeObjects = append(nodeObjects, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	features := structured.Features{AdminAccess: true, ConsumableCapacity: true, DeviceBindingAndStatus: true,
		DeviceTaints: true, FractionalCapacityRange: true, PartitionableDevices: true, PrioritizedList: true}
	celCache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	booked := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection()}

	if *profile != "" {
		file, err := os.Create(*profile)
		must(err)
		must(pprof.StartCPUProfile(file))
		defer pprof.StopCPUProfile()
	}
	ctx := context.Background()
	cpuStart := cpuTime()
	unplaced := 0
	for pod := 0; pod < *pods; pod++ {
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", pod),
			Namespace: "bench", UID: types.UID(fmt.Sprintf("uid-%d", pod))}, Spec: *spec.DeepCopy()}
		state := structured.AllocatedState{AllocatedDevices: booked.AllocatedDevices.Clone(),
			AllocatedSharedDeviceIDs: booked.AllocatedSharedDeviceIDs.Clone(),
			AggregatedCapacity:       booked.AggregatedCapacity.Clone()}
		allocator, err := structured.NewAllocator(ctx, features, state, classLister{class}, slices, celCache)
		must(err)
		var chosen []resourceapi.AllocationResult
		feasible := 0
		for tried := 0; tried < *nodes && feasible < *filter; tried++ {
			result, err := allocator.Allocate(ctx, nodeObjects[(pod+tried)%*nodes], []*resourceapi.ResourceClaim{claim})
			must(err)
			if result != nil {
				feasible++
				if chosen == nil {
					chosen = result
				}
			}
		}
		if chosen == nil {
			unplaced++
			continue
		}
		for _, device := range chosen[0].Devices.Results {
			id := structured.MakeDeviceID(device.Driver, device.Pool, device.Device)
			if device.ShareID == nil {
				booked.AllocatedDevices.Insert(id)
				continue
			}
			booked.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, device.ShareID))
			booked.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, device.ConsumedCapacity))
		}
	}
	spent := cpuTime() - cpuStart
	fmt.Printf("pods=%d nodes=%d filter=%d unplaced=%d cpu_ms_per_pod=%.2f\n", *pods, *nodes, *filter, unplaced,
		float64(spent.Microseconds())/1000/float64(*pods))
}
