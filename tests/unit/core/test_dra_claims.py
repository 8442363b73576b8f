"""amd.com/* requests as DRA claims (rocshare.core.dra_claims): capacities per GPU shape worked out
here from the device plugin's rules (ceil(CUs x pct / 100), whole WGPs on RDNA, memory percent of the
registered MiB, floored), constraints for counts and NUMA/XGMI binding, and the refusals."""

from __future__ import annotations

import pytest

from rocshare.api.models import GpuInfo, OmittedCores, Partition, Sharing
from rocshare.core.dra_claims import claim_cost, claim_spec, partition_selector, shape_classes_of
from rocshare.core.holdings import Held, request_cost
from rocshare.core.ids import GpuId
from rocshare.core.inventory import GpuSpec, NodeInventory
from rocshare.core.request import ContainerRequest, RequestError, Selection, parse_pod

MI210 = GpuSpec(gpu_id=GpuId("GPU-a"), index=0, memory_mib=65520, cu_count=104, gfx_target_version=90010)
MI210_TWIN = GpuSpec(gpu_id=GpuId("GPU-b"), index=1, memory_mib=65520, cu_count=104, gfx_target_version=90010)
RX7900 = GpuSpec(gpu_id=GpuId("GPU-c"), index=0, memory_mib=24560, cu_count=96, gfx_target_version=110000,
                 cu_per_wgp=2)


def ask(gpus: int = 1, **asked) -> ContainerRequest:
    return ContainerRequest("main", False, gpus, **asked)


def test_whole_gpu_asks_no_capacity_and_mib_alone_needs_no_shapes():
    whole = claim_spec(ask(), [MI210])["devices"]["requests"][0]
    assert whole == {"name": "gpu", "exactly": {"deviceClassName": "gpu.rocshare.io", "allocationMode": "ExactCount",
                                                "count": 1}}
    mib = claim_spec(ask(memory_mib=3000), [MI210, RX7900])["devices"]["requests"][0]
    assert mib["exactly"]["capacity"] == {"requests": {"memory": "3000Mi"}}


def test_percentages_become_one_subrequest_per_shape_with_its_own_numbers():
    spec = claim_spec(ask(memory_pct=50, cores_pct=25), [MI210, RX7900, MI210_TWIN])
    [request] = spec["devices"]["requests"]
    subrequests = request["firstAvailable"]
    assert [s["name"] for s in subrequests] == ["shape0", "shape1"]  # twins are one shape
    by_cus = {s["capacity"]["requests"]["compute"]: s for s in subrequests}
    # RX 7900: ceil(96 x 25 / 100) = 24, already whole WGPs; MI210: ceil(104 x 25 / 100) = 26.
    assert by_cus["24"]["capacity"]["requests"]["memory"] == f"{24560 // 2}Mi"
    assert by_cus["26"]["capacity"]["requests"]["memory"] == f"{65520 // 2}Mi"
    # Each names its shape's class and carries no selector of its own (one CEL evaluation per device).
    assert by_cus["26"]["deviceClassName"] == "104cu-65520mi.gpu.rocshare.io" and "selectors" not in by_cus["26"]
    assert by_cus["24"]["deviceClassName"] == "96cu-24560mi.gpu.rocshare.io" and "selectors" not in by_cus["24"]


def test_a_shape_class_selects_the_driver_and_the_shape_the_claim_selected_before():
    spec = claim_spec(ask(memory_pct=50, cores_pct=25), [MI210, RX7900, MI210_TWIN])
    classes = shape_classes_of(spec, [MI210, RX7900, MI210_TWIN])
    assert [c["metadata"]["name"] for c in classes] == ["104cu-65520mi.gpu.rocshare.io", "96cu-24560mi.gpu.rocshare.io"]
    assert classes[0]["apiVersion"] == "resource.k8s.io/v1" and classes[0]["kind"] == "DeviceClass"
    assert classes[0]["spec"] == {"selectors": [{"cel": {"expression":
        'device.driver == "gpu.rocshare.io" && '
        "device.capacity['gpu.rocshare.io'].compute.compareTo(quantity('104')) == 0 && "
        "device.capacity['gpu.rocshare.io'].memory.compareTo(quantity('65520Mi')) == 0"}}]}
    # A request in MiB (no percentage) names gpu.rocshare.io itself and no shape class.
    assert shape_classes_of(claim_spec(ask(memory_mib=3000), [MI210, RX7900]), [MI210, RX7900]) == []


def test_product_filters_stay_on_the_subrequest_beside_its_shape_class():
    spec = claim_spec(ask(cores_pct=10), [MI210], selection=Selection(use_types=("mi210",)))
    [sub] = spec["devices"]["requests"][0]["firstAvailable"]
    assert sub["deviceClassName"] == "104cu-65520mi.gpu.rocshare.io"
    assert sub["selectors"] == [
        {"cel": {"expression": "device.attributes['gpu.rocshare.io'].productName.lowerAscii().contains('mi210')"}}]


def test_rdna_rounds_cores_up_to_whole_wgps():
    [sub] = claim_spec(ask(cores_pct=1), [RX7900])["devices"]["requests"][0]["firstAvailable"]
    assert sub["capacity"]["requests"] == {"compute": "2"}  # ceil(0.96) = 1 CU, a WGP is 2


def test_counts_are_distinct_gpus_and_bindings_are_constraints():
    selection = Selection(numa_bind=True, link_bind=True, use_types=("mi210",), nouse_uuids=frozenset({"gpu-x"}))
    spec = claim_spec(ask(gpus=2, memory_mib=1024), [MI210], selection=selection)
    assert spec["devices"]["constraints"] == [
        {"requests": ["gpu"], "distinctAttribute": "gpu.rocshare.io/uuid"},
        {"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/numaNode"},
        {"requests": ["gpu"], "matchAttribute": "gpu.rocshare.io/xgmiHive"}]
    exactly = spec["devices"]["requests"][0]["exactly"]
    assert exactly["count"] == 2
    assert exactly["selectors"] == [
        {"cel": {"expression": "device.attributes['gpu.rocshare.io'].productName.lowerAscii().contains('mi210')"}},
        {"cel": {"expression": "device.attributes['gpu.rocshare.io'].uuid.lowerAscii() != 'gpu-x'"}}]


def partitions(compute: str, memory: str | None, vram_mib: int, count: int) -> tuple[GpuSpec, ...]:
    """`count` partitions of one GPU in these modes, as the node model reads the agent's report."""
    infos = [GpuInfo(id=f"P-{compute}-{memory}-{n}", index=n, render_minor=128 + n, gfx_target_version=90402,
                     vram_mib=vram_mib, cu_count=38, pci_bdf=f"0000:05:00.{n}", split_count=1, healthy=True,
                     partition=Partition(computeMode=compute, memoryMode=memory, index=n, parentBDF="0000:05:00.0"))
             for n in range(count)]
    return NodeInventory.from_gpu_infos("n", infos, Sharing()).gpus


CPX_NPS4 = partitions("CPX", "NPS4", 24576, 2)
CPX_UNKNOWN = partitions("cpx", None, 16384, 1)


def test_a_partition_kind_is_n_whole_devices_selected_by_its_modes():
    kind = ContainerRequest("main", False, 2, resource="amd.com/cpx_nps4")
    spec = claim_spec(kind, [MI210, *CPX_NPS4, *CPX_UNKNOWN], selection=Selection(use_types=("mi300x",)))
    attributes = "device.attributes['gpu.rocshare.io']"
    assert spec["devices"]["requests"] == [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.rocshare.io", "allocationMode": "ExactCount", "count": 2, "selectors": [
            {"cel": {"expression": f"has({attributes}.computePartition) && "
                                   f"{attributes}.computePartition.lowerAscii() == 'cpx' && "
                                   f"has({attributes}.memoryPartition) && "
                                   f"{attributes}.memoryPartition.lowerAscii() == 'nps4'"}},
            {"cel": {"expression": f"{attributes}.productName.lowerAscii().contains('mi300x')"}}]}}]
    assert spec["devices"]["constraints"] == [{"requests": ["gpu"], "distinctAttribute": "gpu.rocshare.io/uuid"}]
    # A partition whose memory mode is unknown is amd.com/cpx, as mixed naming names it: no memoryPartition.
    assert partition_selector("amd.com/cpx") == (f"has({attributes}.computePartition) && "
                                                 f"{attributes}.computePartition.lowerAscii() == 'cpx' && "
                                                 f"!has({attributes}.memoryPartition)")
    assert [spec.partition_kind for spec in (MI210, *CPX_NPS4, *CPX_UNKNOWN)] == [
        "", "amd.com/cpx_nps4", "amd.com/cpx_nps4", "amd.com/cpx"]


def test_a_partition_kind_claim_costs_what_the_device_plugin_counts_for_it():
    # The device plugin's quota rule for N partitions (holdings.request_cost, whole devices): N x the
    # partition's registered memory, 100 % each. The MI210 in the pool is not a cpx_nps4: not its memory.
    pod = {"spec": {"containers": [{"name": "main", "resources": {"limits": {"amd.com/cpx_nps4": "2"}}}]}}
    request = parse_pod(pod)
    device_plugin = request_cost(request, gpu_memory_mib=CPX_NPS4[0].memory_mib, omitted=OmittedCores.SHARED,
                                 whole_devices=True)
    spec = claim_spec(request.containers[0], [MI210, *CPX_NPS4])
    assert claim_cost(requests_of(spec), [MI210, *CPX_NPS4], OmittedCores.SHARED) == device_plugin \
        == Held(2 * 24576, 200, 2)


def test_refusals_name_the_problem():
    with pytest.raises(RequestError, match=r"no amd.com/cpx_nps4 partition \(it has no partitions\)"):
        claim_spec(ContainerRequest("main", False, 1, resource="amd.com/cpx_nps4"), [MI210])
    with pytest.raises(RequestError, match=r"no amd.com/cpx_nps2 partition \(its partitions are amd.com/cpx, "
                                           r"amd.com/cpx_nps4\)"):
        claim_spec(ContainerRequest("main", False, 1, resource="amd.com/cpx_nps2"), [*CPX_NPS4, *CPX_UNKNOWN])
    shapes = [GpuSpec(gpu_id=GpuId(f"G{n}"), index=n, memory_mib=1024 * (n + 1), cu_count=64) for n in range(9)]
    with pytest.raises(RequestError, match="9 GPU shapes; a claim can list 8"):
        claim_spec(ask(cores_pct=10), shapes)


# ---- the most a claim can hold, for AmdGpuShare quota at creation -------------------------------



def requests_of(spec: dict) -> list[dict]:
    return spec["devices"]["requests"]


def test_a_translated_claim_costs_what_its_pod_would_on_the_shape_it_names():
    # 25 % of cores on either shape is 25 %: 26 of 104 CUs, 24 of 96. Memory: the larger half (32760 MiB).
    spec = claim_spec(ask(memory_pct=50, cores_pct=25), [MI210, RX7900])
    assert claim_cost(requests_of(spec), [MI210, RX7900], OmittedCores.EXCLUSIVE) == Held(65520 // 2, 25, 1)
    two = claim_spec(ask(gpus=2, memory_mib=3000, cores_pct=10), [MI210])
    # 10 % of 104 CUs is ceil(10.4) = 11 CUs, which is ceil(1100 / 104) = 11 % of the GPU, per GPU.
    assert claim_cost(requests_of(two), [MI210], OmittedCores.SHARED) == Held(6000, 22, 2)


def test_a_hand_written_claim_of_a_shape_class_is_counted_on_that_shape():
    # 10 % of cores asked as 24 CUs: on the RX 7900's class it is 25 % (24 of 96), not the MI210's 24 %.
    written = [{"name": "gpu", "exactly": {"deviceClassName": "96cu-24560mi.gpu.rocshare.io", "count": 1,
                                           "capacity": {"requests": {"compute": "24"}}}}]
    assert claim_cost(written, [MI210, RX7900], OmittedCores.SHARED).cores_pct == 25
    # No memory asked: the whole memory of that shape (24560), not the MI210's 65520.
    assert claim_cost(written, [MI210, RX7900], OmittedCores.SHARED).memory_mib == 24560
    # A name under gpu.rocshare.io that is no known shape is counted at its worst, never skipped.
    unknown = [{"name": "gpu", "exactly": {"deviceClassName": "1cu-1mi.gpu.rocshare.io", "count": 1}}]
    assert claim_cost(unknown, [MI210, RX7900], OmittedCores.SHARED) == Held(65520, 100, 1)


def test_a_hand_written_claim_is_counted_at_its_worst_on_any_gpu():
    written = [{"name": "gpu", "exactly": {"deviceClassName": "gpu.rocshare.io", "count": 1,
                                           "capacity": {"requests": {"memory": "4Gi", "compute": "24"}}}}]
    # 24 CUs: 25 % of an RX 7900 (96 CUs), ceil(23.08) = 24 % of an MI210; the larger counts.
    assert claim_cost(written, [MI210, RX7900], OmittedCores.SHARED) == Held(4096, 25, 1)
    assert claim_cost(written, [MI210], OmittedCores.SHARED) == Held(4096, 24, 1)
    whole = [{"name": "gpu", "exactly": {"deviceClassName": "gpu.rocshare.io", "count": 1}}]
    assert claim_cost(whole, [MI210, RX7900], OmittedCores.SHARED) == Held(65520, 100, 1)
    memory_only = [{"name": "gpu", "exactly": {"deviceClassName": "gpu.rocshare.io",
                                               "capacity": {"requests": {"memory": "1Gi"}}}}]
    assert claim_cost(memory_only, [MI210], OmittedCores.SHARED) == Held(1024, 0, 1)
    assert claim_cost(memory_only, [MI210], OmittedCores.EXCLUSIVE) == Held(1024, 100, 1)
    other = [{"name": "nic", "exactly": {"deviceClassName": "nic.example.com", "count": 4}}]
    assert claim_cost(other, [MI210], OmittedCores.SHARED) == Held()


def test_a_claim_that_cannot_be_counted_says_why():
    bad = [{"name": "gpu", "exactly": {"deviceClassName": "gpu.rocshare.io",
                                       "capacity": {"requests": {"memory": "lots"}}}}]
    with pytest.raises(RequestError, match="memory"):
        claim_cost(bad, [MI210], OmittedCores.SHARED)
    with pytest.raises(RequestError, match="no GPU of a pool serving DRA"):
        claim_cost([{"name": "gpu", "exactly": {"deviceClassName": "gpu.rocshare.io"}}], [], OmittedCores.SHARED)
