"""The load check reaches the runtime in both modes (rocshare_agent/load_check.py): a slice container given
the hook gets the check as a CDI createContainer hook -- in the device plugin's Allocate answer through
`cdi_devices` (ContainerAllocateResponse field 5, CDIDevice{name=1}, as the published v1beta1 API),
in DRA mode in the claim's own CDI spec -- and a whole-GPU container gets neither. Before the check
existed (fea6fe5) neither answer named anything: the runtime started the container unchecked."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from rocshare.api.allocation import (
    ALLOCATION_ANNOTATION,
    AllocationRecord,
    ContainerAllocation,
    DeviceSlice,
    encode_record,
)
from rocshare.api.models import GpuInfo, HookLibrary, HookMissing
from rocshare_agent.app import AgentConfig, _install_load_check
from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin.container_spec import HOOK_CONTAINER_PATH, render_container
from rocshare_agent.deviceplugin.inflight import Refusal
from rocshare_agent.deviceplugin.service import DevicePluginService, to_response
from rocshare_agent.dra.cdi import PreparedClaim, cdi_spec
from rocshare_agent.load_check import (
    CDI_DEVICE_NAME,
    WITNESS_DIR,
    install_load_check,
    witness_name,
    write_device_plugin_spec,
)
from tests.agent_fakes import MemoryPods, hook_present

GPU = GpuInfo(id="GPU-1901ead3a2ecd4a6", index=0, render_minor=128, card=1, gfx_target_version=90010,
              vram_mib=65536, cu_count=104, pci_bdf="0000:63:00.0", split_count=10, healthy=True)
NODE = "node-a"
HOOK_DIR = "/usr/local/vgpu"
CHECK_DIR = "/var/lib/rocshare/loadcheck"
CHECK_HOOK = {"hookName": "createContainer", "path": f"{CHECK_DIR}/rocshare-loadcheck",
              "args": ["rocshare-loadcheck", "--library", f"{HOOK_DIR}/libamvgpu.so",
                       "--audit-path", HOOK_CONTAINER_PATH]}


def spec_for(*, whole: bool, memory_hook: bool = True):
    device = DeviceSlice(gpu_id=GPU.id, memory_mib=65536 if whole else 4096, cu_ranges=[] if whole else [(0, 25)],
                         cu_count=104, whole=whole)
    return render_container(ContainerAllocation(name="main", devices=[device]), {GPU.id: GPU}, oversubscribed=False,
                            hook_host_dir=HOOK_DIR, memory_hook=memory_hook)


def test_allocate_names_the_check_for_a_slice_container_only() -> None:
    slice_answer = pb.ContainerAllocateResponse.FromString(to_response(spec_for(whole=False)).SerializeToString())
    assert [d.name for d in slice_answer.cdi_devices] == [CDI_DEVICE_NAME] == ["rocshare.io/loadcheck=slice"]
    assert list(to_response(spec_for(whole=True)).cdi_devices) == []
    assert list(to_response(spec_for(whole=False, memory_hook=False)).cdi_devices) == []  # no hook: nothing to check


def test_cdi_devices_are_field_5_with_name_1_as_the_kubelet_reads_them() -> None:
    """The bytes the kubelet decodes: field 5 (length-delimited) holding field 1, the name."""
    wire = pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name="a/b=c")]).SerializeToString()
    assert wire == bytes([5 << 3 | 2, 7, 1 << 3 | 2, 5]) + b"a/b=c"


def test_the_device_plugin_spec_carries_only_the_check(tmp_path: Path) -> None:
    check_dir, cdi_dir = tmp_path / "check", tmp_path / "cdi"
    path = write_device_plugin_spec(cdi_dir, check_dir=check_dir, hook_host_dir=HOOK_DIR, library_file="libamvgpu.so")
    spec = json.loads(path.read_text())
    assert f"{spec['kind']}={spec['devices'][0]['name']}" == CDI_DEVICE_NAME
    assert spec["devices"][0]["containerEdits"] == {"hooks": [{
        "hookName": "createContainer", "path": f"{check_dir}/rocshare-loadcheck",
        "args": ["rocshare-loadcheck", "--library", f"{HOOK_DIR}/libamvgpu.so", "--audit-path", HOOK_CONTAINER_PATH,
                 "--witness-dir", f"{check_dir}/.loadcheck-ran"]}]}  # the witness: device plugin mode only (below)
    assert [p.name for p in cdi_dir.iterdir()] == ["rocshare.io-loadcheck.json"]
    assert (check_dir / WITNESS_DIR).is_dir()


@pytest.mark.parametrize("whole", [False, True])
def test_a_prepared_claims_spec_carries_the_check_for_a_slice(whole: bool) -> None:
    claim = PreparedClaim(uid="u1", namespace="ns", name="c", devices=())
    edits = cdi_spec(claim, spec_for(whole=whole), CHECK_DIR)["devices"][0]["containerEdits"]
    assert edits.get("hooks") == (None if whole else [CHECK_HOOK])


def test_the_check_is_installed_into_its_folder(tmp_path: Path) -> None:
    source = tmp_path / "shipped"
    source.write_bytes(b"\x7fELF check")
    hook_dir = tmp_path / "hook"
    assert install_load_check(source, hook_dir) is True
    installed = hook_dir / "rocshare-loadcheck"
    assert installed.read_bytes() == b"\x7fELF check" and stat.S_IMODE(installed.stat().st_mode) == 0o755
    assert install_load_check(source, hook_dir) is False
    assert sorted(p.name for p in hook_dir.iterdir()) == ["rocshare-loadcheck"]  # no temporary left


# ---- a runtime that ignores the CDI device: the witness, and hookMissing ---------------------------

def slice_pod(name: str) -> dict:
    record = AllocationRecord(node=NODE, containers=[ContainerAllocation(name="main", devices=[
        DeviceSlice(gpu_id=GPU.id, memory_mib=2048, cu_count=104, cu_ranges=[(0, 25)])])])
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {ALLOCATION_ANNOTATION: encode_record(record)}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}


def started(source: MemoryPods, name: str) -> None:
    """The kubelet's status once the container runs."""
    source.admit(name)
    pod = next(p for p in source.pods if p["metadata"]["name"] == name)
    pod["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}]


ONE = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["x"])])


async def served_and_started(policy: HookMissing, hook_dir: Path, *, witness: bool) -> tuple[DevicePluginService,
                                                                                           MemoryPods]:
    source = MemoryPods([slice_pod("first")])
    service = DevicePluginService(node_name=NODE, pods=source, hook_host_dir=str(hook_dir), hook_missing=policy,
                                  hook_check=hook_present, load_check_dir=hook_dir / "check")
    service.set_inventory([GPU])
    write_device_plugin_spec(hook_dir / "cdi", check_dir=hook_dir / "check", hook_host_dir=str(hook_dir),
                             library_file="libamvgpu.so")
    (reply,) = (await service.allocate(ONE)).container_responses
    assert [d.name for d in reply.cdi_devices] == [CDI_DEVICE_NAME]
    if witness:  # what the check leaves (hook/src/loadcheck.c; named as tests/hook/test_loadcheck.py shows)
        (hook_dir / "check" / WITNESS_DIR / witness_name("uid-first", "main")).touch()
    started(source, "first")
    service.audit_load_check()
    await service.settle()
    source.pods.append(slice_pod("second"))
    return service, source


async def test_a_slice_started_without_the_checks_witness_refuses_later_slices(tmp_path: Path) -> None:
    service, source = await served_and_started(HookMissing.REFUSE, tmp_path, witness=False)
    assert [(name, reason) for name, reason, _ in source.warnings] == [("first", "LoadCheckNotRun")]
    assert "ignored its CDI device rocshare.io/loadcheck=slice" in source.warnings[0][2]
    with pytest.raises(Refusal, match="container runtime ignores CDI devices"):
        await service.allocate(ONE)
    service.audit_load_check()
    await service.settle()
    assert len(source.warnings) == 1  # said once per container


async def test_with_run_without_limit_the_slice_is_served_and_warned(tmp_path: Path) -> None:
    service, source = await served_and_started(HookMissing.RUN_WITHOUT_LIMIT, tmp_path, witness=False)
    assert [reason for _, reason, _ in source.warnings] == ["LoadCheckNotRun"]
    assert "RunWithoutLimit" in source.warnings[0][2]
    (reply,) = (await service.allocate(ONE)).container_responses
    assert [d.name for d in reply.cdi_devices] == [CDI_DEVICE_NAME]


async def test_with_the_witness_nothing_is_said_and_gone_pods_lose_theirs(tmp_path: Path) -> None:
    service, source = await served_and_started(HookMissing.REFUSE, tmp_path, witness=True)
    assert source.warnings == [] and not service.runtime_ignores_cdi
    (reply,) = (await service.allocate(ONE)).container_responses
    assert [d.name for d in reply.cdi_devices] == [CDI_DEVICE_NAME]
    source.pods[:] = [p for p in source.pods if p["metadata"]["name"] != "first"]
    service.audit_load_check()
    assert list((tmp_path / "check" / WITNESS_DIR).iterdir()) == []


@pytest.mark.parametrize("library", [HookLibrary.ROCSHARE, HookLibrary.EXTERNAL])
def test_the_agent_installs_the_check_and_its_spec_for_either_library(tmp_path: Path, library: HookLibrary) -> None:
    """An External pool's library folder is the admin's and is never written, but its slices are
    checked too: the check lives in its own folder and reads whatever library the hook folder holds."""
    shipped = tmp_path / "image"
    shipped.mkdir()
    (shipped / "rocshare-loadcheck").write_bytes(b"\x7fELF check")
    hook_dir = tmp_path / "vgpu"
    hook_dir.mkdir()
    (hook_dir / "libamvgpu.so").write_bytes(b"the admin's")
    hook_dir.chmod(0o555)  # as an External pool's agent sees the admin's folder (mounted read-only)
    config = AgentConfig(node_name="n", hook_path=str(hook_dir), hook_library=library, cdi_dir=tmp_path / "cdi",
                         hook_source=shipped / "librocshare-hook.so", load_check_dir=tmp_path / "check")
    assert _install_load_check(config) is True
    assert (tmp_path / "check" / "rocshare-loadcheck").read_bytes() == b"\x7fELF check"
    assert sorted(p.name for p in hook_dir.iterdir()) == ["libamvgpu.so"]
    spec = json.loads((tmp_path / "cdi" / "rocshare.io-loadcheck.json").read_text())
    (hook,) = spec["devices"][0]["containerEdits"]["hooks"]
    assert hook["path"] == str(tmp_path / "check" / "rocshare-loadcheck")
    assert str(hook_dir / "libamvgpu.so") in hook["args"]
    config = AgentConfig(node_name="n", hook_path=str(hook_dir), hook_library=library, cdi_dir=tmp_path / "cdi2",
                         hook_source=tmp_path / "absent" / "librocshare-hook.so", load_check_dir=tmp_path / "check2")
    assert _install_load_check(config) is False  # logged; the device plugin then judges no witnesses
