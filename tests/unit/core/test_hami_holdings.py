"""Pods HAMi placed (rocshare.api.hami, rocshare.core.holdings.read_hami): HAMi's GPU ids read as
rocshare's, what such a pod holds before and after HAMi's plugin pinned its CUs, the ledger's
view of it, and the fail-closed cases. Formats are HAMi's (commit 4707fb0) and its AMD plugin's."""

from __future__ import annotations

import pytest

from rocshare.api.allocation import AllocationRecord
from rocshare.api.hami import (CU_ALLOCATED_ANNOTATION, POD_DEVICES_ANNOTATION, VGPU_NODE_ANNOTATION,
                               VGPU_TIME_ANNOTATION, HamiFormatError, companion_annotations, decode_cu_allocated,
                               hami_placement, rocshare_gpu_id)
from rocshare.core.cumask import full_mask
from rocshare.core.holdings import Held, read_hami
from rocshare.core.ledger import Ledger

from .helpers import gpu, node

# The AMD SMI UUID in HAMi's AMD plugin README: device id 0x74b5 (MI300X VF), partition byte 0xff,
# unique_id bytes 7..0 = 8e 1b b5 64 57 ad dd 1b (amd_smi_lib's amdsmi_uuid_gen layout).
PLUGIN_EXAMPLE = "8eff74b5-0000-1000-801b-b56457addd1b"


@pytest.mark.parametrize(("hami_id", "rocshare_id"), [
    (PLUGIN_EXAMPLE, "GPU-8e1bb56457addd1b"),
    (PLUGIN_EXAMPLE.upper(), "GPU-8e1bb56457addd1b"),
    ("8e0074b5-0000-1000-801b-b56457addd1b", "GPU-8e1bb56457addd1b"),  # newer amd_smi: partition 0 on SPX
    ("8e0374b5-0000-1000-801b-b56457addd1b", "GPU-8e1bb56457addd1b-p3"),
    ("GPU-1901ead3a2ecd4a6", "GPU-1901ead3a2ecd4a6"),  # rocshare's own id (a HAMi scheduler reading our register)
    ("GPU-pci-0000-c4-00-0", "GPU-pci-0000-c4-00-0"),
])
def test_hami_gpu_ids_read_as_rocshare_ids(hami_id: str, rocshare_id: str) -> None:
    assert rocshare_gpu_id(hami_id) == rocshare_id


def mi210(i: int):
    return gpu(i, memory_mib=65536, cu_count=104)


def placement(devices: str, *, vgpu_node: str = "n1", cu_allocated: str | None = None, init: int = 0,
              apps: int = 2):
    spec = {"initContainers": [{"name": f"i{k}"} for k in range(init)],
            "containers": [{"name": f"c{k}"} for k in range(apps)]}
    annotations = {POD_DEVICES_ANNOTATION: devices, VGPU_NODE_ANNOTATION: vgpu_node}
    if cu_allocated is not None:
        annotations[CU_ALLOCATED_ANNOTATION] = cu_allocated
    found = hami_placement(annotations, spec)
    assert found is not None
    return found


G0, G1 = "GPU-n1-0000", "GPU-n1-0001"


def test_before_hamis_plugin_pinned_cus_the_pod_holds_every_cu_and_its_memory() -> None:
    record, holding = read_hami(placement(f"{G0},AMD Instinct MI210,8192,26:;{G1},AMD Instinct MI210,4096,52:;"), "n1")
    assert holding.accountable and record is not None
    assert [c.name for c in record.containers] == ["c0", "c1"]
    assert holding.held({G0: 104, G1: 104}) == Held(8192 + 4096, 200, 2)  # CUs unknown: counted whole
    ledger = Ledger()
    ledger.apply(record, "ns/hami")
    usage = ledger.usage(node(mi210(0), mi210(1)))
    assert [g.cu_mask for g in usage.gpus] == [full_mask(104), full_mask(104)]  # clipped to the GPU
    assert [g.memory_mib for g in usage.gpus] == [8192, 4096]


def test_cus_hamis_plugin_pinned_are_held_exactly() -> None:
    pinned = '{"%s":"0-25","%s":"26-51,100"}' % (G0, G1)
    record, holding = read_hami(placement(f"{G0},MI210,8192,26:;{G1},MI210,4096,27:;", cu_allocated=pinned), "n1")
    assert record is not None
    ledger = Ledger()
    ledger.apply(record, "ns/hami")
    usage = ledger.usage(node(mi210(0), mi210(1)))
    assert [g.cu_held for g in usage.gpus] == [26, 27]
    assert usage.gpus[1].cu_mask == (full_mask(26) << 26) | (1 << 100)
    assert holding.held({G0: 104, G1: 104}) == Held(12288, 25 + 26, 2)  # ceil(26/104), ceil(27/104)


def test_amd_smi_uuids_and_pinned_cus_land_on_rocshares_gpu() -> None:
    pinned = '{"%s":"0-25"}' % PLUGIN_EXAMPLE
    record, _ = read_hami(placement(f"{PLUGIN_EXAMPLE},AMD Instinct MI300X VF,16384,26:;", cu_allocated=pinned,
                                    apps=1), "n1")
    device = record.containers[0].devices[0]
    assert (device.gpu_id, device.cu_ranges, device.memory_mib) == ("GPU-8e1bb56457addd1b", [(0, 25)], 16384)


def test_init_containers_and_empty_segments_keep_their_place() -> None:
    record, holding = read_hami(placement(f"{G0},MI210,1000,10:;;{G0},MI210,2000,10:;", init=1, apps=2), "")
    assert record is not None and record.node == "n1"  # unbound: the node HAMi chose
    assert [(c.name, c.init) for c in record.containers] == [("i0", True), ("c1", False)]
    assert holding.gpu_count == 1 and holding.memory_mib == 2000  # the init's 1000 MiB lie over the app's 2000


@pytest.mark.parametrize(("devices", "cu_allocated", "bound", "why"), [
    ("GPU-a,MI210,1000", None, "n1", "must end each container"),
    ("GPU-a,MI210,x,10:;", None, "n1", "non-integer"),
    ("GPU-a,MI210,1000,10:;", "[1]", "n1", "JSON object"),
    ("GPU-a,MI210,1000,10:;", '{"GPU-a":"9-3"}', "n1", "not a valid range"),
    (";;", None, "n1", "names no device"),
    ("GPU-a,MI210,1000,10:;", None, "n2", "names n1 but it is bound to n2"),
])
def test_an_undecodable_hami_record_holds_unknown_gpus(devices, cu_allocated, bound, why) -> None:
    record, holding = read_hami(placement(devices, cu_allocated=cu_allocated), bound)
    assert record is None and not holding.accountable and holding.node == bound
    assert why in (holding.problem or "")


def test_cu_allocated_decodes_hsa_id_lists() -> None:
    assert decode_cu_allocated('{"%s":"0-3,8,10-12"}' % PLUGIN_EXAMPLE) == {
        "GPU-8e1bb56457addd1b": [(0, 3), (8, 8), (10, 12)]}
    with pytest.raises(HamiFormatError):
        decode_cu_allocated('{"g":"a-b"}')


def test_companion_annotations_are_what_hamis_scheduler_reads() -> None:
    record = AllocationRecord.model_validate({"version": 1, "node": "n1", "containers": [
        {"name": "c1", "devices": [{"gpuId": G0, "memoryMiB": 4096, "cuCount": 26, "cuRanges": [[0, 25]]}]}]})
    found = companion_annotations(record, device_types={G0: "AMD Instinct MI210"}, container_names=["c0", "c1"],
                                  now_s=1700000000)
    assert found == {VGPU_NODE_ANNOTATION: "n1", VGPU_TIME_ANNOTATION: "1700000000",
                     POD_DEVICES_ANNOTATION: f";{G0},AMD Instinct MI210,4096,26:;"}
