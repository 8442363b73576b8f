"""Fit and allocation rules, one table row per rule of DESIGN.md section 3."""

from __future__ import annotations

import pytest

from rocshare.api.models import GpuPolicy, OmittedCores, Sharing, GpuInfo
from rocshare.core.allocate import allocate, plan_pod
from rocshare.core.cumask import mask_from_ranges
from rocshare.core.fit import FitFailure, Reason, format_reasons, may_fit, summarize
from rocshare.core.ids import PodKey
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare.core.policies import Policy
from rocshare.core.request import parse_pod

from .helpers import gpu, node, pod

POLICY = Policy()


def place(inventory, ledger, raw_pod, policy=POLICY, key="ns/p"):
    result = allocate(inventory, ledger.usage(inventory), parse_pod(raw_pod), policy)
    if not isinstance(result, FitFailure):
        ledger.apply(result, PodKey(key))
    return result


def reasons(result) -> list[str]:
    assert isinstance(result, FitFailure), result
    return result.summary()


def test_whole_gpu_takes_everything_and_blocks_the_gpu():
    inv, ledger = node(gpu(0)), Ledger()
    record = place(inv, ledger, pod({"amd.com/gpu": 1}))
    device = record.containers[0].devices[0]
    assert (device.whole, device.memory_mib, device.cu_ranges, device.cu_count) == (True, 65536, [], 104)
    assert reasons(place(inv, ledger, pod({"amd.com/gpumem": 1}), key="ns/q")) == ["1/1 ExclusiveDeviceAllocateConflict"]


def test_whole_request_conflicts_with_a_tenant():
    inv, ledger = node(gpu(0)), Ledger()
    place(inv, ledger, pod({"amd.com/gpumem": 10, "amd.com/gpucores": 10}))
    assert reasons(place(inv, ledger, pod({"amd.com/gpu": 1}), key="ns/q")) == ["1/1 ExclusiveDeviceAllocateConflict"]


def test_memory_and_core_slices_get_disjoint_ranges():
    inv, ledger = node(gpu(0)), Ledger()
    a = place(inv, ledger, pod({"amd.com/gpumem": 1000, "amd.com/gpucores": 25}), key="ns/a")
    b = place(inv, ledger, pod({"amd.com/gpumem-percentage": 50, "amd.com/gpucores": 50}), key="ns/b")
    da, db = a.containers[0].devices[0], b.containers[0].devices[0]
    assert (da.memory_mib, da.cu_ranges, da.cu_count) == (1000, [(0, 25)], 26)
    assert (db.memory_mib, db.cu_ranges, db.cu_count) == (32768, [(26, 77)], 52)
    assert ledger.gpu_usage(inv.name, da.gpu_id).memory_mib == 33768


def test_insufficient_memory_and_cores_are_reasons():
    inv, ledger = node(gpu(0), gpu(1)), Ledger()
    assert reasons(place(inv, ledger, pod({"amd.com/gpumem": 70000}))) == ["2/2 CardInsufficientMemory"]
    place(inv, ledger, pod({"amd.com/gpu": 2, "amd.com/gpumem": 10, "amd.com/gpucores": 90}), key="ns/a")
    assert reasons(place(inv, ledger, pod({"amd.com/gpumem": 10, "amd.com/gpucores": 20}), key="ns/b")) == [
        "2/2 CardInsufficientCore"]
    # gpucores alone asks for all the memory (HAMi default), so memory is what lacks
    assert reasons(place(inv, ledger, pod({"amd.com/gpucores": 5}), key="ns/c")) == ["2/2 CardInsufficientMemory"]


def test_rdna_rounds_up_to_whole_wgps():
    inv, ledger = node(gpu(0, cu_count=96, gfx=110000, cu_per_wgp=2, product="Radeon RX 7900 XTX")), Ledger()
    record = place(inv, ledger, pod({"amd.com/gpumem": 10, "amd.com/gpucores": 1}))
    assert record.containers[0].devices[0].cu_ranges == [(0, 1)]


@pytest.mark.parametrize(
    ("omitted", "second_fits"),
    [(OmittedCores.EXCLUSIVE, False), (OmittedCores.SHARED, True)],
)
def test_memory_only_slices_under_both_omitted_cores_settings(omitted, second_fits):
    inv, ledger = node(gpu(0), omitted=omitted), Ledger()
    first = place(inv, ledger, pod({"amd.com/gpumem": 1000}), key="ns/a")
    device = first.containers[0].devices[0]
    assert device.cu_ranges == [] and device.cu_count == 104
    assert device.reserves_all_cores is (omitted == OmittedCores.EXCLUSIVE)
    second = place(inv, ledger, pod({"amd.com/gpumem": 1000}), key="ns/b")
    assert (not isinstance(second, FitFailure)) is second_fits
    cores = place(inv, ledger, pod({"amd.com/gpumem": 10, "amd.com/gpucores": 10}), key="ns/c")
    assert (not isinstance(cores, FitFailure)) is second_fits


def test_split_count_limits_tenants():
    inv, ledger = node(gpu(0, split_count=2)), Ledger()
    for key in ("ns/a", "ns/b"):
        place(inv, ledger, pod({"amd.com/gpumem": 10, "amd.com/gpucores": 1}), key=key)
    assert reasons(place(inv, ledger, pod({"amd.com/gpumem": 10, "amd.com/gpucores": 1}), key="ns/c")) == [
        "1/1 CardTimeSlicingExhausted"]


def test_device_memory_scaling_registers_more_and_marks_oversubscribed():
    info = GpuInfo(id="GPU-1", index=0, gfxTargetVersion=90402, vramMiB=1000, cuCount=304, pciBDF="0000:01:00.0",
                   splitCount=10, healthy=True)
    inv = NodeInventory.from_gpu_infos("n1", [info], Sharing(deviceMemoryScaling=2.0))
    assert inv.gpus[0].memory_mib == 2000 and inv.oversubscribed
    record = place(inv, Ledger(), pod({"amd.com/gpumem": 1500, "amd.com/gpucores": 10}))
    assert record.oversubscribed


def test_partition_devices_are_whole_and_unshared():
    inv, ledger = node(gpu(0, partition=True, memory_mib=24000, cu_count=38)), Ledger()
    record = place(inv, ledger, pod({"amd.com/gpumem": 1000, "amd.com/gpucores": 10}))
    device = record.containers[0].devices[0]
    assert device.whole and device.memory_mib == 24000
    assert reasons(place(inv, ledger, pod({"amd.com/gpumem": 10}), key="ns/b")) == ["1/1 ExclusiveDeviceAllocateConflict"]


def test_health_type_and_uuid_filters():
    inv = node(gpu(0, healthy=False), gpu(1, product="AMD Instinct MI300X"), gpu(2))
    assert reasons(place(inv, Ledger(), pod({"amd.com/gpu": 3}))) == ["1/3 CardNotHealth", "2/3 NodeInsufficientGPUs"]
    typed = pod({"amd.com/gpu": 2}, annotations={"amd.com/use-gputype": "mi300x"})
    assert reasons(place(inv, Ledger(), typed)) == ["1/3 CardNotHealth", "1/3 CardTypeMismatch", "1/3 NodeInsufficientGPUs"]
    by_uuid = pod({"amd.com/gpu": 1}, annotations={"amd.com/nouse-gpu-uuid": "GPU-n1-0001,GPU-n1-0002"})
    assert reasons(place(inv, Ledger(), by_uuid)) == ["1/3 CardNotHealth", "2/3 CardUuidMismatch"]
    chosen = place(inv, Ledger(), pod({"amd.com/gpu": 1}, annotations={"amd.com/use-gpu-uuid": "gpu-n1-0002"}))
    assert chosen.containers[0].devices[0].gpu_id == "GPU-n1-0002"


def test_numa_bind():
    inv = node(gpu(0, numa=0), gpu(1, numa=1), gpu(2, numa=1))
    bound = pod({"amd.com/gpu": 2}, annotations={"amd.com/numa-bind": "true"})
    record = place(inv, Ledger(), bound)
    assert [d.gpu_id for d in record.containers[0].devices] == ["GPU-n1-0001", "GPU-n1-0002"]
    three = pod({"amd.com/gpu": 3}, annotations={"amd.com/numa-bind": "true"})
    assert reasons(place(inv, Ledger(), three)) == ["3/3 NumaNotFit"]


def test_link_bind_needs_every_pair_joined():
    unlinked = node(gpu(0), gpu(1))
    linked = pod({"amd.com/gpu": 2}, annotations={"amd.com/link-bind": "true"})
    assert reasons(place(unlinked, Ledger(), linked)) == ["2/2 LinkNotFit"]
    inv = node(gpu(0, peers=(2,)), gpu(1), gpu(2, peers=(0,)))
    record = place(inv, Ledger(), linked)
    assert [d.gpu_id for d in record.containers[0].devices] == ["GPU-n1-0000", "GPU-n1-0002"]


def test_topology_aware_prefers_linked_set():
    inv = node(gpu(0), gpu(1, peers=(3,)), gpu(2), gpu(3, peers=(1,)))
    policy = Policy(gpu=GpuPolicy.TOPOLOGY_AWARE)
    record = place(inv, Ledger(), pod({"amd.com/gpu": 2}), policy=policy)
    assert [d.gpu_id for d in record.containers[0].devices] == ["GPU-n1-0001", "GPU-n1-0003"]


def test_binpack_and_spread_choose_gpus():
    inv, ledger = node(gpu(0), gpu(1)), Ledger()
    place(inv, ledger, pod({"amd.com/gpumem": 1000, "amd.com/gpucores": 10}), key="ns/a")
    usage = ledger.usage(inv)
    slice_pod = parse_pod(pod({"amd.com/gpumem": 1000, "amd.com/gpucores": 10}))
    packed = plan_pod(inv, usage, slice_pod, Policy(gpu=GpuPolicy.BINPACK))
    spread = plan_pod(inv, usage, slice_pod, Policy(gpu=GpuPolicy.SPREAD))
    first = ledger.records()["ns/a"].containers[0].devices[0].gpu_id
    assert inv.gpus[packed.containers[0][0].position].gpu_id == first
    assert inv.gpus[spread.containers[0][0].position].gpu_id != first


def test_init_containers_listed_first_and_counted_as_kubernetes_counts_them():
    inv, ledger = node(gpu(0)), Ledger()
    raw = pod({"amd.com/gpumem": 1000, "amd.com/gpucores": 10}, init=({"amd.com/gpumem": 500, "amd.com/gpucores": 5},))
    record = place(inv, ledger, raw)
    assert [c.init for c in record.containers] == [True, False]
    usage = ledger.gpu_usage(inv.name, "GPU-n1-0000")
    # max(init, app) on the one GPU: the app's 1000 MiB and ceil(0.10 x 104) = 11 CUs, one slice;
    # the init container's ceil(0.05 x 104) = 6 CUs lie inside the app's.
    assert (usage.memory_mib, usage.slices, usage.cu_held) == (1000, 1, 11)
    init, app = (mask_from_ranges(c.devices[0].cu_ranges) for c in record.containers)
    assert init.bit_count() == 6 and app.bit_count() == 11 and init & ~app == 0


def test_an_init_container_larger_than_the_app_grows_the_pods_hold_to_its_own():
    inv, ledger = node(gpu(0)), Ledger()
    raw = pod({"amd.com/gpumem": 1000, "amd.com/gpucores": 10}, init=({"amd.com/gpumem": 3000, "amd.com/gpucores": 60},))
    record = place(inv, ledger, raw)
    usage = ledger.gpu_usage(inv.name, "GPU-n1-0000")
    assert (usage.memory_mib, usage.slices, usage.cu_held) == (3000, 1, 63)  # ceil(0.60 x 104) = 63 CUs
    init, app = (mask_from_ranges(c.devices[0].cu_ranges) for c in record.containers)
    assert init.bit_count() == 63 and app & ~init == 0  # the app's 11 CUs are among the init's 63


def test_reason_summary_format_and_quick_reject():
    inv, ledger = node(gpu(0), gpu(1)), Ledger()
    place(inv, ledger, pod({"amd.com/gpu": 1}))
    summary = summarize(inv, ledger.usage(inv).loads)
    assert (summary.free_whole, summary.open_gpus) == (1, 1)
    assert not may_fit(summary, parse_pod(pod({"amd.com/gpu": 2})))
    assert may_fit(summary, parse_pod(pod({"amd.com/gpumem": 1000})))
    assert format_reasons([(Reason.CARD_INSUFFICIENT_MEMORY, 2)], 8) == ["2/8 CardInsufficientMemory"]


def test_from_gpu_infos_maps_peers_by_pci_address():
    infos = [
        GpuInfo(id=f"GPU-{i}", index=i, gfxTargetVersion=90402, vramMiB=196608, cuCount=304,
                pciBDF=f"0000:0{i}:00.0", xgmiPeers=[f"0000:0{1 - i}:00.0"], splitCount=10, healthy=True, numa=i)
        for i in (1, 0)
    ]
    inv = NodeInventory.from_gpu_infos("n", infos, Sharing())
    assert [g.gpu_id for g in inv.gpus] == ["GPU-0", "GPU-1"]
    assert inv.links == (frozenset({1}), frozenset({0}))


def test_same_gpu_id_on_two_nodes_is_two_gpus():
    # APU and partition ids derive from PCI addresses and repeat across nodes; so do unique ids
    # on a simulated fleet built from one capture. The ledger must never add them up.
    first, second = node(gpu(0), name="n1"), node(gpu(0), name="n2")
    ledger = Ledger()
    place(first, ledger, pod({"amd.com/gpumem": 1000, "amd.com/gpucores": 25}), key="ns/a")
    assert ledger.gpu_usage("n1", "GPU-n1-0000").slices == 1
    assert ledger.usage(second).loads[0] == (0, 0, 0, 0)
