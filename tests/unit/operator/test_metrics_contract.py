"""The metrics contract: docs/metrics.md lists every series the extender and the agent's monitor
export — name, type, labels, unit — in HAMi's names (see that file). This test collects both
exporters on a small, fully populated state (a node with two GPUs, a pod whose two containers
share one GPU, a whole-GPU pod, a namespace quota; a capture copy with KFD per-process files)
and fails when the code emits a name, label set, type or unit the document does not list, or
misses one it does. Units are checked by value, not only by suffix: a 26-CU slice of a 104-CU
GPU must read 25 (percent), not 0.25.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rocshare.api.allocation import ALLOCATED_ANNOTATION, ALLOCATION_ANNOTATION, AllocationRecord, encode_record
from rocshare.core.ids import claim_key
from rocshare.api.container_account import USAGE_FILE, USAGE_FILE_BYTES, SliceLimits
from rocshare_agent.accounts import AccountStore
from rocshare_agent.monitor import GpuMetricsCollector
from rocshare_operator.extender.metrics import ExtenderMetrics
from rocshare_operator.extender.state import SchedulerState

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "metrics.md"
SYSFS = (ROOT / ".." / "shared" / "fixtures" / "sysfs").resolve()
MIB = 2**20
UNIT_SUFFIX = {"bytes": "_bytes", "seconds": "_seconds", "celsius": "_celsius", "watts": "_watts",
               "percent": "_ratio", "fraction": "_ratio"}
OFF_CONVENTION = {"hami_node_gpu_overview"}  # bytes, though the name does not say so


def documented(section: str) -> dict[str, tuple[str, frozenset[str], str]]:
    """name -> (type, labels, unit) from the table under the `## <section>` heading."""
    text = DOC.read_text()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            labels = frozenset(re.findall(r"`([a-z_]+)`", cells[2]))
            rows[cells[0].strip("`")] = (cells[1], labels, cells[3])
    assert rows, f"no metric table under '## {section}' in {DOC}"
    return rows


def emitted(registry: CollectorRegistry) -> dict[str, tuple[str, frozenset[str], list[float]]]:
    """name -> (type, labels, values) as a Prometheus scrape would see the families."""
    found = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = {key for sample in family.samples for key in sample.labels if key != "le"}
        # A gauge's or counter's values; a histogram's observation count (its _count sample).
        wanted = family.name + "_count" if family.type == "histogram" else name
        values = [sample.value for sample in family.samples if sample.name == wanted]
        found[name] = (family.type, frozenset(labels), values)
    return found


def check_contract(section: str, registry: CollectorRegistry) -> dict[str, list[float]]:
    doc, code = documented(section), emitted(registry)
    assert set(code) == set(doc), f"emitted but not documented: {set(code) - set(doc)}; " \
                                  f"documented but not emitted: {set(doc) - set(code)}"
    for name, (kind, labels, unit) in doc.items():
        code_kind, code_labels, values = code[name]
        assert values, f"{name}: no samples; the fixture must populate every series"
        assert code_kind == kind, f"{name}: type {code_kind}, documented {kind}"
        assert code_labels == labels, f"{name}: labels {sorted(code_labels)}, documented {sorted(labels)}"
        suffix = UNIT_SUFFIX.get(unit)
        named_as_hami_does = name in OFF_CONVENTION  # HAMi's name breaks the suffix rule; kept as HAMi spells it
        assert suffix is None or name.endswith(suffix) or named_as_hami_does, f"{name}: unit {unit}"
        if unit == "percent":
            assert all(0 <= value <= 100 for value in values), f"{name}: {values} not 0-100"
        if unit == "fraction":
            assert all(0 <= value <= 1 for value in values), f"{name}: {values} not 0-1"
        if name.startswith("hami_"):
            assert "zone" in labels, f"{name}: HAMi's series carry zone"
    return {name: values for name, (_kind, _labels, values) in code.items()}


# ---- extender ------------------------------------------------------------------------------------


def _gpu(index: int) -> dict:
    return {"id": f"GPU-{index}", "index": index, "product": "AMD Instinct MI210", "gfxTargetVersion": 90010,
            "cuCount": 104, "vramMiB": 65536, "pciBDF": f"0000:0{index}:00.0", "splitCount": 10, "healthy": True,
            "cuTopology": {"numXCC": 1, "arrayCount": 8, "simdArraysPerEngine": 1, "cuPerSimdArray": 14}}


def _pod(name: str, record: dict) -> dict:
    text = encode_record(AllocationRecord.model_validate({"version": 1, "node": "n1", **record}))
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                         "annotations": {ALLOCATION_ANNOTATION: text, ALLOCATED_ANNOTATION: "2026-01-01T00:00:00Z"}},
            "spec": {"schedulerName": "rocshare-scheduler", "nodeName": "n1"},
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}}


SHARED_POD = {"containers": [
    {"name": "a", "devices": [{"gpuId": "GPU-0", "memoryMiB": 4096, "cuCount": 26, "cuRanges": [[0, 25]]}]},
    {"name": "b", "devices": [{"gpuId": "GPU-0", "memoryMiB": 2048, "cuCount": 26, "cuRanges": [[26, 51]]}]}]}
WHOLE_POD = {"containers": [{"name": "main", "devices": [
    {"gpuId": "GPU-1", "memoryMiB": 65536, "cuCount": 104, "cuRanges": [[0, 103]], "whole": True}]}]}


@pytest.fixture
async def extender_registry() -> CollectorRegistry:
    state = SchedulerState()
    state.on_node("ADDED", {"metadata": {"name": "n1"}, "status": {"allocatable": {"amd.com/gpu": "20"}}})
    state.on_gpu_node("ADDED", {"metadata": {"name": "n1"}, "status": {"gpus": [_gpu(0), _gpu(1)]}})
    state.on_quota("ADDED", {"metadata": {"name": "q", "namespace": "team"},
                             "spec": {"hard": {"limits.amd.com/gpumem": "131072", "limits.amd.com/gpucores": "400",
                                               "requests.amd.com/gpu": "8"}}})
    await state.on_pod("ADDED", _pod("shared", SHARED_POD))
    await state.on_pod("ADDED", _pod("whole", WHOLE_POD))
    metrics = ExtenderMetrics(state)
    metrics.latency.labels(verb="filter").observe(0.002)
    metrics.decisions.labels(verb="bind", outcome="bound").inc()
    metrics.node_rejections.labels(reason="CardInsufficientMemory").inc()
    return metrics.registry


async def test_extender_matches_the_documented_list(extender_registry) -> None:
    check_contract("Extender", extender_registry)


async def test_extender_values_and_units(extender_registry) -> None:
    get = extender_registry.get_sample_value
    gpu0 = {"node": "n1", "device_uuid": "GPU-0", "device_index": "0", "device_type": "AMD Instinct MI210", "zone": "vGPU"}
    assert get("hami_gpu_memory_limit_bytes", gpu0) == 65536 * MIB
    assert get("hami_gpu_core_limit_ratio", gpu0) == 100
    assert get("hami_gpu_memory_allocated_bytes", {**gpu0, "device_cores": "104"}) == 6144 * MIB
    assert get("hami_gpu_shared_count", gpu0) == 2  # two containers of one pod
    assert get("hami_gpu_core_allocated_ratio", gpu0) == 50  # 52 of 104 CUs, percent
    assert get("hami_node_gpu_memory_allocated_ratio", gpu0) == 6144 / 65536  # HAMi's fraction
    assert get("hami_node_gpu_overview", {**gpu0, "device_cores": "104", "device_memory_limit": "65536"}) == 6144 * MIB
    container = {"namespace": "team", "node": "n1", "pod": "shared", "device_uuid": "GPU-0", "zone": "vGPU"}
    # Two containers of one pod on one GPU: two series (the duplicate-series bug, fixed).
    assert get("hami_vgpu_memory_allocated_bytes", {**container, "container_index": "0"}) == 4096 * MIB
    assert get("hami_vgpu_memory_allocated_bytes", {**container, "container_index": "1"}) == 2048 * MIB
    assert get("hami_vgpu_core_allocated_ratio", {**container, "container_index": "1"}) == 25  # ceil(26/104 x 100)
    quota = {"namespace": "team", "zone": "vGPU"}
    assert get("hami_resource_quota_used", {**quota, "quota_name": "amd.com/gpumem", "limit": "131072"}) == 71680
    assert get("hami_resource_quota_used", {**quota, "quota_name": "amd.com/gpucores", "limit": "400"}) == 150
    assert get("hami_resource_quota_used", {**quota, "quota_name": "amd.com/gpu", "limit": "8"}) == 3
    assert get("hami_resource_quota_limit", {**quota, "quota_name": "amd.com/gpucores"}) == 400
    # Shader engines of an MI210 (8 engines of one array; by the kernel's mapping bit i is on engine i mod 8):
    # the shared pod's CUs 0-51 put 7 CUs on engines 0-3 (bits e, e+8, ..., e+48) and 6 on engines 4-7.
    unit = {"node": "n1", "device_uuid": "GPU-0", "unit": "SE"}
    assert [get("rocshare_gpu_unit_cus_held", {**unit, "unit_index": str(e), "namespace": "team", "pod": "shared"})
            for e in range(8)] == [7, 7, 7, 7, 6, 6, 6, 6]
    assert get("rocshare_gpu_unit_tenants", {"node": "n1", "device_uuid": "GPU-0", "device_index": "0", "unit": "SE",
                                             "unit_index": "5"}) == 1
    assert get("rocshare_gpu_unit_tenants", {"node": "n1", "device_uuid": "GPU-1", "device_index": "1", "unit": "SE",
                                             "unit_index": "0"}) == 1  # the whole-GPU pod, on every engine


async def test_a_dra_pools_gpus_and_claims_are_reported_like_the_device_plugins() -> None:
    """A node of a pool serving DRA (no amd.com/gpu allocatable: the extender never places there)
    still has its GPUs reported, and an allocated claim is a holder on them, named by the claim."""
    state = SchedulerState()
    state.on_pool("ADDED", {"metadata": {"name": "dra"}, "spec": {"nodeSelector": {"gpu": "dra"},
                                                                   "agent": {"interface": "DRA"}}})
    state.on_node("ADDED", {"metadata": {"name": "n1", "labels": {"rocshare.io/pool": "dra"}}, "status": {}})
    state.on_gpu_node("ADDED", {"metadata": {"name": "n1"}, "status": {"gpus": [_gpu(0)]}})
    record = AllocationRecord.model_validate({"version": 1, "node": "n1", "containers": [{"name": "first", "devices": [
        {"gpuId": "GPU-0", "memoryMiB": 4096, "cuCount": 26, "cuRanges": [[26, 51]], "coresPct": 25}]}]})
    state.accounts.on_claim(claim_key("team", "first"), "team", "n1", record)
    get = ExtenderMetrics(state).registry.get_sample_value
    assert state.inventories == {}
    gpu0 = {"node": "n1", "device_uuid": "GPU-0", "device_index": "0", "device_type": "AMD Instinct MI210", "zone": "vGPU"}
    assert get("hami_gpu_memory_allocated_bytes", {**gpu0, "device_cores": "104"}) == 4096 * MIB
    assert get("hami_gpu_core_allocated_ratio", gpu0) == 25  # 26 of 104 CUs
    holder = {"namespace": "team", "node": "n1", "pod": "resourceclaim/first", "container_index": "0",
              "device_uuid": "GPU-0", "zone": "vGPU"}
    assert get("hami_vgpu_memory_allocated_bytes", holder) == 4096 * MIB
    assert get("hami_resource_quota_used", {"namespace": "team", "zone": "vGPU", "quota_name": "amd.com/gpumem",
                                            "limit": "0"}) == 4096


# ---- monitor -------------------------------------------------------------------------------------

UID = "3f9c2a1e-1b2c-4d5e-8f90-123456789abc"
CID = "a" * 64


def _capture_with_a_process(tmp_path: Path) -> tuple[Path, Path]:
    """The Strix Point capture (real DRM folder) with synthetic additions: mem_busy_percent (the
    capture's kernel had none) and one KFD process of a pod using 1 GiB and 6 of 12 CUs."""
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS / "strixpoint-apu", sysfs, symlinks=True)
    for path in [sysfs, *sysfs.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    (sysfs / "class/drm/card1/device/mem_busy_percent").write_text("7\n")
    gpu_ids = [(node / "gpu_id").read_text().strip() for node in (sysfs / "class/kfd/kfd/topology/nodes").iterdir()]
    (gpu_id,) = [int(value) for value in gpu_ids if value not in ("", "0")]
    process = sysfs / "class/kfd/kfd/proc/4242"
    (process / f"stats_{gpu_id}").mkdir(parents=True)
    (process / f"vram_{gpu_id}").write_text(f"{1024 * MIB}\n")
    (process / f"stats_{gpu_id}" / "cu_occupancy").write_text("6\n")
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n")
    (proc / "environ").write_bytes(b"ROCR_VISIBLE_DEVICES=GPU-pci-0000-c1-00-0\0HIP_DEVICE_MEMORY_LIMIT_0=4096m\0")
    return sysfs, tmp_path / "proc"


def test_monitor_matches_the_documented_list(tmp_path) -> None:
    sysfs, proc = _capture_with_a_process(tmp_path)
    pod = {"metadata": {"uid": UID, "namespace": "team", "name": "infer"},
           "status": {"containerStatuses": [{"name": "main", "containerID": f"containerd://{CID}"}]}}
    # a second pod whose slice has an account folder (docs/container-account.md): its series come from there
    store = AccountStore(tmp_path / "accounts")
    folders = store.prepare(store.pod_folder("uid-acct", "main"), SliceLimits(1, {0: 2048 * MIB}))
    usage = bytearray(USAGE_FILE_BYTES)
    usage[0:4] = (1).to_bytes(4, "little")  # one slot in use
    usage[8:12] = (77).to_bytes(4, "little")  # its pid
    usage[24:32] = (512 * MIB).to_bytes(8, "little")  # used on GPU 0
    usage[37120:37128] = (768 * MIB).to_bytes(8, "little")  # peak on GPU 0
    (Path(folders.usage_host_dir) / USAGE_FILE).write_bytes(bytes(usage))
    record = AllocationRecord.model_validate({"node": "apu", "containers": [
        {"name": "main", "devices": [{"gpuId": "GPU-pci-0000-c1-00-0", "memoryMiB": 2048, "cuCount": 6}]}]})
    accounted = {"metadata": {"uid": "uid-acct", "namespace": "team", "name": "notebook",
                              "annotations": {ALLOCATION_ANNOTATION: encode_record(record)}}, "status": {}}
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs, proc_root=proc, node_name="apu",
                                          pods=lambda: [pod, accounted], accounts=store))
    values = check_contract("Node agent monitor", registry)
    assert sorted(values["hami_vgpu_memory_used_bytes"]) == [512 * MIB, 1024 * MIB]
    assert sorted(values["hami_vgpu_memory_limit_bytes"]) == [2048 * MIB, 4096 * MIB]
    assert values["rocshare_container_memory_peak_bytes"] == [768 * MIB]
    assert values["rocshare_container_processes"] == [1]
    assert values["rocshare_container_accounts_unreadable"] == [0]
    assert values["hami_container_device_utilization_ratio"] == [50.0]  # 6 of 12 CUs, percent
    assert values["hami_host_gpu_utilization_ratio"] == [3.0]  # gpu_busy_percent 3, percent
    assert values["hami_host_gpu_memory_controller_utilization_ratio"] == [7.0]
