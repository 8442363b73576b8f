"""The container account folders (docs/container-account.md) on a temp root: what Allocate makes
(modes, the limits file), what the agent reads back when a tenant controls the usage folder
(symlinks, FIFOs, oversized and forged files, high_water past the slots), how folders of gone pods
and claims are removed, and the monitor's per-container series from an account."""

from __future__ import annotations

import os
import stat
import struct
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rocshare.api.allocation import (ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, DeviceSlice,
                                    encode_record)
from rocshare.api.container_account import (
    ACCOUNT_SLOTS,
    USAGE_FILE,
    USAGE_FILE_BYTES,
    AccountFormatError,
    SliceLimits,
    decode_limits,
    decode_usage,
    encode_limits,
    limits_for,
)
from rocshare_agent import accounts as accounts_module
from rocshare_agent.accounts import AccountOwner, AccountStore
from rocshare_agent.monitor import GpuMetricsCollector

GIB = 1 << 30
UID = "3f9c2a1e-1b2c-4d5e-8f90-123456789abc"
GPU = "GPU-c34ec50444dd0a6c"


def usage_bytes(slots: list[tuple[int, list[int]]], *, high_water: int | None = None, peak: list[int] | None = None,
                refusals: int = 0) -> bytes:
    """A usage file laid out as docs/container-account.md says, built here independently of the codec."""
    data = bytearray(USAGE_FILE_BYTES)
    struct.pack_into("<I", data, 0, len(slots) if high_water is None else high_water)
    for i, (pid, used) in enumerate(slots):
        struct.pack_into("<i", data, 8 + 144 * i, pid)
        for position, value in enumerate(used):
            struct.pack_into("<Q", data, 8 + 144 * i + 16 + 8 * position, value)
    struct.pack_into("<I", data, 36876, refusals)
    for position, value in enumerate(peak or []):
        struct.pack_into("<Q", data, 37120 + 8 * position, value)
    return bytes(data)


# ---- codecs ----


def test_limits_round_trip_and_the_hooks_rules():
    devices = [DeviceSlice(gpu_id="a", memory_mib=4096, cu_ranges=[(0, 15), (32, 47)], cu_count=32),
               DeviceSlice(gpu_id="b", memory_mib=65536, cu_count=104, whole=True)]
    limits = limits_for(devices, generation=3)
    text = encode_limits(limits)
    assert text == "rocshare-limits 1\ngeneration 3\nmemory 0 4294967296\ncu-mask 0 0-15,32-47\n"
    assert decode_limits(text.encode()) == limits
    for bad in (b"rocshare-limits 2\nmemory 0 1\n", b"rocshare-limits 1\nmemory 0 1",
                b"rocshare-limits 1\nmemory 0 -1\n",
                b"rocshare-limits 1\nmemory 16 1\n", b"rocshare-limits 1\nmemory 0 1\nmemory 0 2\n",
                b"rocshare-limits 1\nmemory 0 18446744073709551616\n", b"rocshare-limits 1\n\0", b"x" * 5000,
                "rocshare-limits 1\nmemory 0 \u0661\n".encode(), b"rocshare-limits 1\ncu-mask 0 1-\n",
                b"rocshare-limits 1\ncu-mask 0 ,1\n", b"rocshare-limits 1\ncu-mask 0 3-2\n",
                b"rocshare-limits 1\ncu-mask 0 256\n", b"rocshare-limits 1\ncu-mask 16 1\n",
                b"rocshare-limits 1\ncu-mask 0 0x3\n", b"rocshare-limits 1\ncu-mask 0 1\ncu-mask 0 2\n",
                b"rocshare-limits 1\ncu-mask 0\n"):
        with pytest.raises(AccountFormatError):
            decode_limits(bad)


def test_usage_sums_live_slots_and_caps_a_forged_file():
    data = usage_bytes([(100, [GIB, 0]), (0, [5 * GIB]), (-7, [GIB]), (101, [2 * GIB])], peak=[4 * GIB], refusals=2)
    usage = decode_usage(data)
    assert usage.used_bytes[0] == 4 * GIB and usage.used_bytes[1] == 0  # the free slot (pid 0) does not count
    assert usage.processes == 2 and usage.peak_bytes[0] == 4 * GIB and usage.refusals == 2
    forged = usage_bytes([(1, [(1 << 64) - 1])] * 3, high_water=0xFFFFFFFF)
    assert decode_usage(forged).used_bytes[0] == (1 << 64) - 1  # capped, slots clamped to ACCOUNT_SLOTS
    assert ACCOUNT_SLOTS == 256
    with pytest.raises(AccountFormatError):
        decode_usage(data[:-1])


# ---- the store ----


def test_prepare_makes_the_folders_with_their_modes_and_the_limits(tmp_path):
    store = AccountStore(tmp_path / "accounts")
    limits = SliceLimits(generation=1, memory_bytes={0: 4 * GIB})
    folders = store.prepare(store.pod_folder(UID, "main"), limits)
    usage, slice_dir = Path(folders.usage_host_dir), Path(folders.slice_host_dir)
    assert usage == tmp_path / "accounts" / "pods" / UID / "main" / "usage"
    assert stat.S_IMODE(usage.stat().st_mode) == 0o777 and stat.S_IMODE(slice_dir.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "accounts").stat().st_mode) == 0o700
    assert (slice_dir / "limits").read_text() == "rocshare-limits 1\ngeneration 1\nmemory 0 4294967296\n"
    assert stat.S_IMODE((slice_dir / "limits").stat().st_mode) == 0o644
    (usage / USAGE_FILE).write_bytes(usage_bytes([(5, [GIB])]))
    store.prepare(store.pod_folder(UID, "main"), SliceLimits(generation=2, memory_bytes={0: 8 * GIB}))  # a resize
    assert (usage / USAGE_FILE).exists()  # the usage is kept
    assert "memory 0 8589934592" in (slice_dir / "limits").read_text()
    for bad in ("..", ".", "a/b", ""):
        with pytest.raises(ValueError):
            store.pod_folder(bad, "main")


def _readings(store: AccountStore) -> dict[AccountOwner, accounts_module.AccountReading]:
    return {reading.owner: reading for reading in store.read_all()}


def test_the_agent_reads_an_account_as_untrusted_input(tmp_path):
    """What a tenant can put in its usage folder: a symlink to a host file, a FIFO (a reader that
    blocks would hang the scrape), a huge file, a directory. Each is an error for that account,
    never followed, read past its bound, or waited on; the limits still come from the slice folder."""
    secret = tmp_path / "host-secret"
    secret.write_bytes(usage_bytes([(1, [123])]))
    store = AccountStore(tmp_path / "accounts")
    cases = {"symlink": lambda f: f.symlink_to(secret), "fifo": lambda f: os.mkfifo(f),
             "huge": lambda f: f.write_bytes(b"\0" * (USAGE_FILE_BYTES * 4)), "folder": lambda f: f.mkdir(),
             "short": lambda f: f.write_bytes(b"\0" * 10)}
    for container, plant in cases.items():
        folders = store.prepare(store.pod_folder(UID, container), SliceLimits(1, {0: GIB}))
        plant(Path(folders.usage_host_dir) / USAGE_FILE)
    good = store.prepare(store.pod_folder(UID, "good"), SliceLimits(1, {0: GIB}))
    (Path(good.usage_host_dir) / USAGE_FILE).write_bytes(usage_bytes([(9, [GIB // 2])]))
    done: list = []
    reader = threading.Thread(target=lambda: done.append(_readings(store)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert done, "reading the accounts blocked (a FIFO was opened for reading without O_NONBLOCK?)"
    readings = done[0]
    for container in cases:
        reading = readings[AccountOwner("pod", UID, container)]
        assert reading.usage is None and reading.error and "usage" in reading.error, (container, reading)
        assert reading.limits == SliceLimits(1, {0: GIB})
    good_reading = readings[AccountOwner("pod", UID, "good")]
    assert good_reading.error is None and good_reading.usage.used_bytes[0] == GIB // 2


def test_a_symlinked_account_folder_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "usage").mkdir(parents=True)
    (elsewhere / "usage" / USAGE_FILE).write_bytes(usage_bytes([(1, [GIB])]))
    store = AccountStore(tmp_path / "accounts")
    store.prepare(store.pod_folder(UID, "main"), SliceLimits(1, {0: GIB}))
    (tmp_path / "accounts" / "pods" / UID / "linked").symlink_to(elsewhere)
    (tmp_path / "accounts" / "claims").mkdir()
    (tmp_path / "accounts" / "claims" / "c1").symlink_to(elsewhere)
    owners = set(_readings(store))
    assert owners == {AccountOwner("pod", UID, "main")}


def test_gone_pods_lose_their_folders_after_the_grace(tmp_path, monkeypatch):
    store = AccountStore(tmp_path / "accounts")
    store.prepare(store.pod_folder(UID, "main"), SliceLimits(1, {0: GIB}))
    store.prepare(store.pod_folder("other-uid", "main"), SliceLimits(1, {0: GIB}))
    assert store.remove_pods_except([]) == []  # both just made: kept (Allocate may precede the cache)
    monkeypatch.setattr(time, "time", lambda: os.stat(tmp_path).st_mtime + 3600)
    assert store.remove_pods_except(["other-uid"]) == [UID]
    assert not (tmp_path / "accounts" / "pods" / UID).exists()
    assert (tmp_path / "accounts" / "pods" / "other-uid" / "main" / "slice" / "limits").exists()
    store.prepare(store.claim_folder("claim-1"), SliceLimits(1, {0: GIB}))
    store.remove_claim("claim-1")
    assert not (tmp_path / "accounts" / "claims" / "claim-1").exists()


# ---- the monitor ----


def _pod() -> dict:
    record = AllocationRecord(node="n1", containers=[ContainerAllocation(name="main", devices=[
        DeviceSlice(gpu_id=GPU, memory_mib=4096, cu_ranges=[(0, 15)], cu_count=16)])])
    return {"metadata": {"uid": UID, "namespace": "team", "name": "trainer",
                         "annotations": {ALLOCATION_ANNOTATION: encode_record(record)}},
            "status": {"containerStatuses": []}}


def test_the_monitor_reports_each_container_from_its_account(copy_capture, tmp_path):
    """Used, limit, peak and process count per container, where KFD shows no process at all (the
    demo, a node without GPU processes): the values written into the account here."""
    sysfs = copy_capture("vega10-1gpu")
    store = AccountStore(tmp_path / "accounts")
    folders = store.prepare(store.pod_folder(UID, "main"), SliceLimits(2, {0: 8 * GIB}))
    (Path(folders.usage_host_dir) / USAGE_FILE).write_bytes(
        usage_bytes([(10, [3 * GIB]), (11, [2 * GIB]), (0, [GIB])], peak=[5 * GIB]))
    gone = store.prepare(store.pod_folder("gone-uid", "main"), SliceLimits(1, {0: GIB}))  # pod not on the node
    (Path(gone.usage_host_dir) / USAGE_FILE).write_bytes(usage_bytes([(1, [GIB])]))
    broken = store.prepare(store.pod_folder(UID, "other"), SliceLimits(1, {0: GIB}))
    (Path(broken.usage_host_dir) / USAGE_FILE).symlink_to("/etc/passwd")
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs, proc_root=tmp_path / "proc", node_name="n1",
                                          pods=lambda: [_pod()], accounts=store))
    labels = {"namespace": "team", "pod": "trainer", "container": "main", "vdevice_index": "0", "device_uuid": GPU}
    assert registry.get_sample_value("hami_vgpu_memory_used_bytes", {**labels, "zone": "vGPU"}) == 5 * GIB
    assert registry.get_sample_value("hami_vgpu_memory_limit_bytes", {**labels, "zone": "vGPU"}) == 8 * GIB
    assert registry.get_sample_value("rocshare_container_memory_peak_bytes", labels) == 5 * GIB
    assert registry.get_sample_value("rocshare_container_processes",
                                     {"namespace": "team", "pod": "trainer", "container": "main"}) == 2
    assert registry.get_sample_value("rocshare_container_accounts_unreadable", {"node": "n1"}) == 1
    families = {family.name: family for family in registry.collect()}
    assert len(families["hami_vgpu_memory_used_bytes"].samples) == 1  # the gone pod's account is not reported


def test_an_account_without_a_usage_file_leaves_kfds_use_and_gives_the_limit(copy_capture, tmp_path):
    """No process of the container allocated through the hook yet: KFD's per-process figures stand,
    the limit is the one the slice's file says now (a resize shows before the next allocation)."""
    sysfs = copy_capture("vega10-1gpu")
    cid = "a" * 64
    kfd = sysfs / "class/kfd/kfd/proc/100"
    kfd.mkdir(parents=True)
    (kfd / "vram_13261").write_text("1000\n")
    proc = tmp_path / "proc" / "100"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(f"0::/kubepods/pod{UID}/{cid}\n")
    (proc / "environ").write_bytes(f"ROCR_VISIBLE_DEVICES={GPU}\0HIP_DEVICE_MEMORY_LIMIT_0=4096m\0".encode())
    pod = _pod()
    pod["status"]["containerStatuses"] = [{"name": "main", "containerID": f"containerd://{cid}"}]
    store = AccountStore(tmp_path / "accounts")
    store.prepare(store.pod_folder(UID, "main"), SliceLimits(2, {0: 6 * GIB}))
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs, proc_root=tmp_path / "proc", node_name="n1",
                                          pods=lambda: [pod], accounts=store))
    labels = {"namespace": "team", "pod": "trainer", "container": "main", "vdevice_index": "0", "device_uuid": GPU,
              "zone": "vGPU"}
    assert registry.get_sample_value("hami_vgpu_memory_used_bytes", labels) == 1000
    assert registry.get_sample_value("hami_vgpu_memory_limit_bytes", labels) == 6 * GIB


def test_a_claims_account_is_reported_for_the_container_that_names_the_claim(copy_capture, tmp_path):
    """DRA: the account is the claim's (claims/<uid>/); the monitor finds its consumer through the
    pod that names the claim and the container that lists it, and its GPUs through the claim's record."""
    from rocshare_agent.deviceplugin.container_spec import ContainerSpec
    from rocshare_agent.dra import cdi

    sysfs = copy_capture("vega10-1gpu")
    slice_ = DeviceSlice(gpu_id=GPU, memory_mib=4096, cu_ranges=[(0, 15)], cu_count=16)
    claim = cdi.PreparedClaim(uid="claim-uid", namespace="team", name="notebook-gpu", devices=(
        cdi.PreparedDevice(request="gpu", pool="n1", device="gpu-0", share_id=None, slice=slice_),))
    cdi.write_spec(tmp_path / "cdi", claim, ContainerSpec())
    store = AccountStore(tmp_path / "accounts")
    folders = store.prepare(store.claim_folder("claim-uid"), limits_for([slice_], generation=1))
    (Path(folders.usage_host_dir) / USAGE_FILE).write_bytes(usage_bytes([(3, [GIB])], peak=[GIB]))
    pod = {"metadata": {"uid": "pod-uid", "namespace": "team", "name": "notebook"},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "notebook-gpu"}],
                    "containers": [{"name": "sidecar"}, {"name": "lab", "resources": {"claims": [{"name": "gpu"}]}}]},
           "status": {}}
    registry = CollectorRegistry()
    registry.register(GpuMetricsCollector(sysfs_root=sysfs, proc_root=tmp_path / "proc", node_name="n1",
                                          pods=lambda: [pod], accounts=store, cdi_dir=tmp_path / "cdi"))
    labels = {"namespace": "team", "pod": "notebook", "container": "lab", "vdevice_index": "0", "device_uuid": GPU,
              "zone": "vGPU"}
    assert registry.get_sample_value("hami_vgpu_memory_used_bytes", labels) == GIB
    assert registry.get_sample_value("hami_vgpu_memory_limit_bytes", labels) == 4096 * 1024 * 1024
