"""The memory hook is checked, not assumed (hook.py, the device plugin's Allocate, the inventory
loop, the monitor's gauge, the pool's agent.hookMissing in the DaemonSet): a slice on a node
without libamvgpu.so is refused naming the file (Refuse, the default) or runs without a limit
and says so in a pod event (RunWithoutLimit); whole GPUs never need the hook."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, DeviceSlice, encode_record
from rocshare.api.models import AmdGpuPoolSpec, GpuInfo, HookMissing
from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin.container_spec import HOOK_CONTAINER_PATH, render_container
from rocshare_agent.deviceplugin.inflight import Refusal
from rocshare_agent.deviceplugin.service import DevicePluginService
from rocshare_agent.hook import (HookCheck, HookCollector, check_hook, hook_condition, hook_library_path,
                                 hook_transition)
from rocshare_agent.inventory_loop import InventoryAgent
from rocshare_operator.reconcilers.agent_daemonset import AgentDeployment, render_daemonset
from tests.agent_fakes import MemoryPods, RecordingKube

NODE = "node-a"
GPU = GpuInfo(id="GPU-0000000000000001", index=0, render_minor=128, gfx_target_version=90010, cu_count=104,
              pci_bdf="0000:01:00.0", split_count=4, healthy=True)


# ---- the check ---------------------------------------------------------------------------------


def test_check_names_what_is_wrong_with_the_library(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    library = tmp_path / "libamvgpu.so"
    assert check_hook(str(tmp_path)) == HookCheck(str(library), "is missing")
    library.mkdir()
    assert check_hook(str(tmp_path)).problem == "is not a regular file"
    library.rmdir()
    library.write_bytes(b"")
    assert check_hook(str(tmp_path)).problem == "is empty"
    library.write_bytes(b"\x7fELF")  # a readable file is not a hook (test_hook_install.py has every kind)
    assert check_hook(str(tmp_path)).problem.startswith("is not a readable ELF file")
    library.write_bytes(elf_files["rocshare"].read_bytes())
    assert check_hook(str(tmp_path)).present
    library.unlink()
    os.symlink(tmp_path / "gone.so", library)  # a dangling link is missing, as the kubelet's mount finds it
    assert check_hook(str(tmp_path)).problem == "is missing"


def test_condition_and_node_events_follow_the_check() -> None:
    missing, found = HookCheck("/h/libamvgpu.so", "is missing"), HookCheck("/h/libamvgpu.so")
    condition = hook_condition(missing, HookMissing.REFUSE)
    assert (condition.type, condition.status, condition.reason) == ("MemoryHook", "False", "MemoryHookMissing")
    assert condition.message == "/h/libamvgpu.so is missing: memory slices on this node are refused (pool agent.hookMissing: Refuse)"
    assert "run without a memory limit" in hook_condition(missing, HookMissing.RUN_WITHOUT_LIMIT).message
    assert hook_condition(found, HookMissing.REFUSE).status == "True"
    first = hook_transition(None, missing, HookMissing.REFUSE)
    assert (first.reason, first.event_type) == ("MemoryHookMissing", "Warning")
    assert hook_transition(missing, missing, HookMissing.REFUSE) is None
    back = hook_transition(missing, found, HookMissing.REFUSE)
    assert (back.reason, back.event_type) == ("MemoryHookFound", "Normal")
    assert hook_transition(None, found, HookMissing.REFUSE) is None  # present from the start: nothing to say
    assert hook_transition(found, missing, HookMissing.REFUSE).reason == "MemoryHookMissing"


def test_monitor_gauge_is_one_only_while_the_library_is_an_audit_library(tmp_path: Path,
                                                                         elf_files: dict[str, Path]) -> None:
    collector = HookCollector(node_name=NODE, hook_dir=str(tmp_path))
    (family,) = collector.collect()
    (sample,) = family.samples
    assert family.name == "rocshare_node_memory_hook_present"
    assert sample.labels == {"node": NODE, "path": str(tmp_path / "libamvgpu.so"), "library": ""} and sample.value == 0
    (tmp_path / "libamvgpu.so").write_bytes(elf_files["external"].read_bytes())
    assert next(iter(collector.collect())).samples[0].value == 1


# ---- what a container gets -----------------------------------------------------------------------


def slice_container(*, whole: bool = False) -> ContainerAllocation:
    device = (DeviceSlice(gpu_id=GPU.id, memory_mib=0, cu_count=104, cu_ranges=[(0, 103)], whole=True) if whole
              else DeviceSlice(gpu_id=GPU.id, memory_mib=4096, cu_count=26, cu_ranges=[(0, 25)]))
    return ContainerAllocation(name="main", devices=[device])


def test_a_slice_without_the_hook_gets_neither_hook_nor_an_unenforced_limit() -> None:
    spec = render_container(slice_container(), {GPU.id: GPU}, oversubscribed=False, hook_host_dir="/h",
                            memory_hook=False)
    assert "LD_AUDIT" not in spec.envs and "HIP_DEVICE_MEMORY_LIMIT_0" not in spec.envs and not spec.mounts
    assert spec.envs["HSA_CU_MASK"]  # the compute slice still holds


def committed_pod(container: ContainerAllocation) -> dict:
    record = AllocationRecord(node=NODE, containers=[container])
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p",
                         "annotations": {ALLOCATION_ANNOTATION: encode_record(record)}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}


def service_for(container: ContainerAllocation, hook_dir: Path, policy: HookMissing) -> tuple[DevicePluginService, MemoryPods]:
    source = MemoryPods([committed_pod(container)])
    service = DevicePluginService(node_name=NODE, pods=source, hook_host_dir=str(hook_dir), hook_missing=policy)
    service.set_inventory([GPU])
    return service, source


ONE = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["x"])])


async def test_refuse_is_the_default_and_the_refusal_names_the_missing_file(tmp_path: Path) -> None:
    assert AmdGpuPoolSpec(nodeSelector={}).agent.hook_missing == HookMissing.REFUSE
    service, source = service_for(slice_container(), tmp_path, HookMissing.REFUSE)
    with pytest.raises(Refusal) as refused:
        await service.allocate(ONE)
    library = hook_library_path(str(tmp_path))
    assert f"the memory hook {library} is missing on node {NODE}" in refused.value.message
    assert source.refused == [("p", refused.value.message)] and not source.warnings


async def test_run_without_limit_serves_the_slice_and_warns_on_the_pod(tmp_path: Path) -> None:
    service, source = service_for(slice_container(), tmp_path, HookMissing.RUN_WITHOUT_LIMIT)
    reply = await service.allocate(ONE)
    await service.settle()
    (container,) = reply.container_responses
    assert "LD_AUDIT" not in container.envs and not container.mounts
    (warning,) = source.warnings
    assert warning[:2] == ("p", "NoMemoryLimit")
    assert warning[2] == (f"container main has no memory limit: the memory hook {tmp_path}/libamvgpu.so is missing "
                          "on this node (pool agent.hookMissing: RunWithoutLimit)")


async def test_with_the_hook_a_slice_gets_it_whatever_the_setting(tmp_path: Path, elf_files: dict[str, Path]) -> None:
    (tmp_path / "libamvgpu.so").write_bytes(elf_files["rocshare"].read_bytes())
    service, source = service_for(slice_container(), tmp_path, HookMissing.REFUSE)
    (container,) = (await service.allocate(ONE)).container_responses
    assert container.envs["LD_AUDIT"] == HOOK_CONTAINER_PATH
    assert [(m.host_path, m.container_path, m.read_only) for m in container.mounts] == [
        (str(tmp_path / "libamvgpu.so"), HOOK_CONTAINER_PATH, True)]
    assert not source.warnings and not source.refused


async def test_whole_gpus_never_need_the_hook(tmp_path: Path) -> None:
    def never(hook_dir: str) -> HookCheck:
        raise AssertionError("a whole-GPU container checked the hook")

    source = MemoryPods([committed_pod(slice_container(whole=True))])
    service = DevicePluginService(node_name=NODE, pods=source, hook_host_dir=str(tmp_path), hook_check=never)
    service.set_inventory([GPU])
    (container,) = (await service.allocate(ONE)).container_responses
    assert "LD_AUDIT" not in container.envs and not source.refused


def test_the_pool_setting_reaches_the_agent_through_its_daemonset() -> None:
    pool = {"metadata": {"name": "p", "uid": "u"},
            "spec": {"nodeSelector": {"a": "b"}, "agent": {"hookMissing": "RunWithoutLimit"}}}
    args = render_daemonset(pool, AgentDeployment(namespace="rocshare-system"))["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--hook-missing=RunWithoutLimit" in args
    default = render_daemonset({**pool, "spec": {"nodeSelector": {"a": "b"}}}, AgentDeployment(namespace="x"))
    assert "--hook-missing=Refuse" in default["spec"]["template"]["spec"]["containers"][0]["args"]


def test_pool_hook_library_reaches_the_agent_and_its_mount() -> None:
    """Rocshare (the default): the agent installs its hook, so the host folder is mounted writable;
    External: the admin's library is only read."""

    def agent_container(spec: dict) -> dict:
        pool = {"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeSelector": {"a": "b"}, **spec}}
        return render_daemonset(pool, AgentDeployment(namespace="x"))["spec"]["template"]["spec"]["containers"][0]

    default, external = agent_container({}), agent_container({"agent": {"hookLibrary": "External"}})
    assert AmdGpuPoolSpec(nodeSelector={}).agent.hook_library == "Rocshare"
    assert "--hook-library=Rocshare" in default["args"] and "--hook-library=External" in external["args"]
    hook_mount = [m for m in default["volumeMounts"] if m["name"] == "hook"]
    assert hook_mount == [{"name": "hook", "mountPath": "/usr/local/vgpu", "readOnly": False}]
    assert [m["readOnly"] for m in external["volumeMounts"] if m["name"] == "hook"] == [True]


# ---- the inventory loop publishes it -------------------------------------------------------------


async def test_inventory_pass_publishes_the_condition_and_one_event_per_change(tmp_path: Path,
                                                                              elf_files: dict[str, Path]) -> None:
    kube = RecordingKube(NODE)
    agent = InventoryAgent(kube, node_name=NODE, sysfs_root=tmp_path / "sys", dev_root=None, hook_dir=str(tmp_path),
                           hook_missing=HookMissing.REFUSE)

    def published_condition() -> dict:
        status = next(body for path, body in reversed(kube.applied) if path.endswith("/status"))["status"]
        return next(c for c in status["conditions"] if c["type"] == "MemoryHook")

    def node_events() -> list[str]:
        return [body["reason"] for path, body in kube.created if body.get("kind") == "Event"]

    await agent.check()
    assert published_condition()["status"] == "False" and published_condition()["reason"] == "MemoryHookMissing"
    await agent.check()
    assert node_events() == ["MemoryHookMissing"]
    (tmp_path / "libamvgpu.so").write_bytes(elf_files["rocshare"].read_bytes())
    await agent.check()
    assert published_condition()["status"] == "True"
    assert node_events() == ["MemoryHookMissing", "MemoryHookFound"]
