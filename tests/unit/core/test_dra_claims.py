"""amd.com/* requests as DRA claims (rocshare.core.dra_claims): capacities per GPU shape worked out
here from the device plugin's rules (ceil(CUs x pct / 100), whole WGPs on RDNA, memory percent of the
registered MiB, floored), constraints for counts and NUMA/XGMI binding, and the refusals."""

from __future__ import annotations

import pytest

from rocshare.core.dra_claims import claim_spec
from rocshare.core.ids import GpuId
from rocshare.core.inventory import GpuSpec
from rocshare.core.request import ContainerRequest, RequestError, Selection

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
    assert by_cus["26"]["selectors"] == [{"cel": {"expression":
        "device.capacity['gpu.rocshare.io'].compute.compareTo(quantity('104')) == 0 && "
        "device.capacity['gpu.rocshare.io'].memory.compareTo(quantity('65520Mi')) == 0"}}]


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


def test_refusals_name_the_problem():
    with pytest.raises(RequestError, match="partition kind"):
        claim_spec(ContainerRequest("main", False, 1, resource="amd.com/cpx_nps4"), [MI210])
    shapes = [GpuSpec(gpu_id=GpuId(f"G{n}"), index=n, memory_mib=1024 * (n + 1), cu_count=64) for n in range(9)]
    with pytest.raises(RequestError, match="9 GPU shapes; a claim can list 8"):
        claim_spec(ask(cores_pct=10), shapes)
