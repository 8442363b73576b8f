"""service: the device plugin's handlers called directly (no socket), with an in-memory pod
source: Allocate serves the in-flight pod container by container and marks it once, refuses
with the reason recorded, ListAndWatch streams health changes at once, GetPreferredAllocation
answers (without a preference, warned once) when the API server times out."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, DeviceSlice, encode_record
from rocshare.api.models import GpuInfo
from rocshare.kube.client import Unavailable
from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin import service as service_module
from rocshare_agent.deviceplugin.inflight import Refusal
from rocshare_agent.deviceplugin.service import DevicePluginService
from tests.agent_fakes import MemoryPods, hook_present

NODE = "node-a"


def gpu(index: int, *, healthy: bool = True) -> GpuInfo:
    return GpuInfo(id=f"GPU-{index:016x}", index=index, render_minor=128 + index, gfx_target_version=90010,
                   cu_count=104, pci_bdf=f"0000:{index:02x}:00.0", numa=index % 2, split_count=2, healthy=healthy)


def committed_pod(name: str, containers: dict[str, list[str]]) -> dict:
    rec = AllocationRecord(node=NODE, containers=[
        ContainerAllocation(name=c, devices=[DeviceSlice(gpu_id=g, memory_mib=2048, cu_count=52, cu_ranges=[(0, 51)])
                                             for g in gpus]) for c, gpus in containers.items()])
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {ALLOCATION_ANNOTATION: encode_record(rec)}},
            "spec": {"nodeName": NODE, "containers": [
                {"name": c, "resources": {"limits": {"amd.com/gpu": str(len(g))}}} for c, g in containers.items()]},
            "status": {"phase": "Pending"}}


def make(pods: list[dict]) -> tuple[DevicePluginService, MemoryPods]:
    source = MemoryPods(pods)
    service = DevicePluginService(node_name=NODE, pods=source, hook_host_dir="/opt/vgpu", hook_check=hook_present)
    service.set_inventory([gpu(0), gpu(1), gpu(2)])
    return service, source


def request(*counts: int) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=[f"x{k}" for k in range(n)]) for n in counts])


async def test_options_advertise_preferred_allocation():
    service, _ = make([])
    options = await service.get_device_plugin_options(pb.Empty())
    assert options.get_preferred_allocation_available and not options.pre_start_required


async def test_allocate_serves_each_container_and_writes_nothing():
    service, source = make([committed_pod("p", {"a": ["GPU-0000000000000002"], "b": ["GPU-0000000000000000", "GPU-0000000000000001"]})])
    first = await service.allocate(request(1))
    assert first.container_responses[0].envs["ROCR_VISIBLE_DEVICES"] == "GPU-0000000000000002"
    second = await service.allocate(request(2))
    await service.settle()
    envs = second.container_responses[0].envs
    assert envs["HIP_VISIBLE_DEVICES"] == "0,1" and envs["HSA_CU_MASK"] == "0:0-51;1:0-51"
    assert envs["HIP_DEVICE_MEMORY_LIMIT_1"] == "2048m"
    assert [d.container_path for d in second.container_responses[0].devices] == [
        "/dev/kfd", "/dev/dri/renderD128", "/dev/dri/renderD129"]
    assert second.container_responses[0].mounts[0].read_only
    assert source.refused == [] and set(source.pods[0]["metadata"]["annotations"]) == {ALLOCATION_ANNOTATION}


async def test_a_served_pod_is_not_in_flight_even_before_the_kubelets_status_write_is_visible():
    service, source = make([committed_pod("p", {"a": ["GPU-0000000000000000"]})])
    await service.allocate(request(1))
    with pytest.raises(Refusal, match="no pod in flight"):  # the pod still looks unadmitted
        await service.allocate(request(1))


async def test_a_pod_the_kubelet_started_is_not_in_flight():
    service, source = make([committed_pod("p", {"a": ["GPU-0000000000000000"]})])
    source.admit("p")  # e.g. served by an agent before this one restarted
    with pytest.raises(Refusal, match="no pod in flight"):
        await service.allocate(request(1))


async def test_refusal_marks_nothing_but_the_reason():
    service, source = make([committed_pod("p", {"a": ["GPU-0000000000000000"]})])
    with pytest.raises(Refusal, match="kubelet asks 2"):
        await service.allocate(request(2))
    assert source.refused and source.refused[0][0] == "p" and "committed 1" in source.refused[0][1]


async def test_a_committed_gpu_missing_from_the_node_is_refused():
    service, source = make([committed_pod("p", {"a": ["GPU-00000000000000ff"]})])
    with pytest.raises(Refusal, match="not on this node"):
        await service.allocate(request(1))


async def test_list_and_watch_sends_now_and_on_every_health_change():
    service, _ = make([])
    stream = service.list_and_watch(pb.Empty())
    first = await anext(stream)
    assert len(first.devices) == 6 and {d.health for d in first.devices} == {"Healthy"}
    assert first.devices[2].topology.nodes[0].ID == 1
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.01)
    assert not pending.done()  # nothing changed: nothing sent
    service.set_inventory([gpu(0), gpu(1, healthy=False), gpu(2)])
    second = await asyncio.wait_for(pending, 1)
    assert [d.health for d in second.devices].count("Unhealthy") == 2
    await stream.aclose()


async def test_preferred_allocation_points_at_the_committed_gpus():
    service, _ = make([committed_pod("p", {"a": ["GPU-0000000000000002", "GPU-0000000000000000"]})])
    available = [f"GPU-{i:016x}::{k}" for i in range(3) for k in range(2)]
    reply = await service.get_preferred_allocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=2)]))
    assert list(reply.container_responses[0].deviceIDs) == ["GPU-0000000000000002::0", "GPU-0000000000000000::0"]


class LaggingWatch(MemoryPods):
    """The kubelet asks as soon as it sees the binding; this agent's watch has not shown it yet."""

    def cached(self):
        return []


async def test_preferred_allocation_finds_the_pod_the_watch_has_not_shown_yet():
    pods = [committed_pod("p", {"a": ["GPU-0000000000000002", "GPU-0000000000000000"]})]
    service = DevicePluginService(node_name=NODE, pods=LaggingWatch(pods), hook_host_dir="/opt/vgpu",
                                  hook_check=hook_present)
    service.set_inventory([gpu(0), gpu(1), gpu(2)])
    available = [f"GPU-{i:016x}::{k}" for i in range(3) for k in range(2)]
    reply = await service.get_preferred_allocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=2)]))
    assert list(reply.container_responses[0].deviceIDs) == ["GPU-0000000000000002::0", "GPU-0000000000000000::0"]


class UnreachableApi(MemoryPods):
    """Under load the API server times out: the watch has not shown the binding and a fresh list fails."""

    def __init__(self, pods, *, hang_s: float = 0.0) -> None:
        super().__init__(pods)
        self.hang_s = hang_s
        self.lists = 0

    def cached(self):
        return []

    async def fresh(self):
        self.lists += 1
        if self.hang_s:
            await asyncio.sleep(self.hang_s)
        raise Unavailable(0, "Unreachable", "TimeoutError")


def preference_request(*sizes: int) -> pb.PreferredAllocationRequest:
    available = [f"GPU-{i:016x}::{k}" for i in range(3) for k in range(2)]
    return pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=size) for size in sizes])


async def test_preferred_allocation_answers_without_a_preference_when_the_lookup_times_out(caplog):
    pods = UnreachableApi([committed_pod("p", {"a": ["GPU-0000000000000002"], "b": ["GPU-0000000000000001"]})])
    service = DevicePluginService(node_name=NODE, pods=pods, hook_host_dir="/opt/vgpu", hook_check=hook_present)
    service.set_inventory([gpu(0), gpu(1), gpu(2)])
    with caplog.at_level("DEBUG", logger="rocshare_agent.deviceplugin.service"):
        reply = await service.get_preferred_allocation(preference_request(1, 1))
        again = await service.get_preferred_allocation(preference_request(2))
    # No committed GPUs to point at: KFD order, then the first GPU's NUMA neighbour (GPU 2); no error.
    assert [list(r.deviceIDs) for r in reply.container_responses] == [["GPU-0000000000000000::0"]] * 2
    assert list(again.container_responses[0].deviceIDs) == ["GPU-0000000000000000::0", "GPU-0000000000000002::0"]
    assert pods.lists == 2  # one lookup per call: the second container does not wait again
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "without a preference" in warnings[0].getMessage()  # once per outage


async def test_preferred_allocation_does_not_wait_past_its_bound(monkeypatch):
    monkeypatch.setattr(service_module, "PREFERENCE_LOOKUP_S", 0.05)
    pods = UnreachableApi([], hang_s=10)
    service = DevicePluginService(node_name=NODE, pods=pods, hook_host_dir="/opt/vgpu", hook_check=hook_present)
    service.set_inventory([gpu(0), gpu(1), gpu(2)])
    reply = await asyncio.wait_for(service.get_preferred_allocation(preference_request(1)), 2)
    assert list(reply.container_responses[0].deviceIDs) == ["GPU-0000000000000000::0"]


async def test_a_lookup_that_works_again_rearms_the_warning(caplog):
    pod = committed_pod("p", {"a": ["GPU-0000000000000002"]})
    pods = UnreachableApi([pod])
    service = DevicePluginService(node_name=NODE, pods=pods, hook_host_dir="/opt/vgpu", hook_check=hook_present)
    service.set_inventory([gpu(0), gpu(1), gpu(2)])
    with caplog.at_level("WARNING", logger="rocshare_agent.deviceplugin.service"):
        await service.get_preferred_allocation(preference_request(1))
        pods.cached = lambda: [pod]  # the API server answers again
        healthy = await service.get_preferred_allocation(preference_request(1))
        pods.cached = lambda: []
        await service.get_preferred_allocation(preference_request(1))
    assert list(healthy.container_responses[0].deviceIDs) == ["GPU-0000000000000002::0"]
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 2


async def test_allocate_mounts_the_containers_account_with_its_limits_read_only(tmp_path):
    """docs/container-account.md: a slice container gets its account folder, the usage read-write and
    the slice's limits read-only at fixed paths, the limits file holding the record's figures; a whole
    GPU gets none; the folder goes once the pod is gone (after the grace)."""
    from rocshare.api.container_account import USAGE_FILE
    from rocshare_agent.accounts import AccountStore

    pods = [committed_pod("p", {"a": ["GPU-0000000000000000", "GPU-0000000000000001"]})]
    source = MemoryPods(pods)
    store = AccountStore(tmp_path / "accounts")
    service = DevicePluginService(node_name=NODE, pods=source, hook_host_dir="/opt/vgpu", hook_check=hook_present,
                                  accounts=store)
    service.set_inventory([gpu(0), gpu(1), gpu(2)])
    response = (await service.allocate(request(2))).container_responses[0]
    folder = tmp_path / "accounts" / "pods" / "uid-p" / "a"
    mounts = {m.container_path: (m.host_path, m.read_only) for m in response.mounts}
    assert mounts["/usr/local/vgpu/account"] == (str(folder / "usage"), False)
    assert mounts["/usr/local/vgpu/slice"] == (str(folder / "slice"), True)
    assert response.envs["ROCSHARE_ACCOUNT_DIR"] == "/usr/local/vgpu/account"
    assert response.envs["ROCSHARE_SLICE_DIR"] == "/usr/local/vgpu/slice"
    mib = 2048 * 1024 * 1024  # committed_pod's slices: 2048 MiB, CUs 0-51, on both GPUs
    assert (folder / "slice" / "limits").read_text() == (
        f"rocshare-limits 1\ngeneration 1\nmemory 0 {mib}\nmemory 1 {mib}\ncu-mask 0 0-51\ncu-mask 1 0-51\n")
    assert not (folder / "usage" / USAGE_FILE).exists()  # the hook makes it
    source.pods.clear()
    service.forget_gone_pods()
    assert folder.exists()  # within the grace
    old = time.time() - 3600
    os.utime(tmp_path / "accounts" / "pods" / "uid-p", (old, old))
    service.forget_gone_pods()
    assert not (tmp_path / "accounts" / "pods" / "uid-p").exists()


async def test_a_whole_gpu_gets_no_account(tmp_path):
    from rocshare_agent.accounts import AccountStore

    rec = AllocationRecord(node=NODE, containers=[ContainerAllocation(name="w", devices=[
        DeviceSlice(gpu_id="GPU-0000000000000000", memory_mib=65536, cu_count=104, whole=True)])])
    pod = committed_pod("w", {"w": ["GPU-0000000000000000"]})
    pod["metadata"]["annotations"][ALLOCATION_ANNOTATION] = encode_record(rec)
    service = DevicePluginService(node_name=NODE, pods=MemoryPods([pod]), hook_host_dir="/opt/vgpu",
                                  hook_check=hook_present, accounts=AccountStore(tmp_path / "accounts"))
    service.set_inventory([gpu(0)])
    response = (await service.allocate(request(1))).container_responses[0]
    assert "ROCSHARE_SLICE_DIR" not in response.envs and not (tmp_path / "accounts" / "pods").exists()
