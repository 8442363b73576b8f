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

from rocshare.api.allocation import ContainerAllocation, DeviceSlice
from rocshare.api.models import GpuInfo
from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin.container_spec import HOOK_CONTAINER_PATH, render_container
from rocshare_agent.deviceplugin.service import to_response
from rocshare_agent.dra.cdi import PreparedClaim, cdi_spec
from rocshare_agent.load_check import (
    CDI_DEVICE_NAME,
    install_load_check,
    write_device_plugin_spec,
)

GPU = GpuInfo(id="GPU-1901ead3a2ecd4a6", index=0, render_minor=128, card=1, gfx_target_version=90010,
              vram_mib=65536, cu_count=104, pci_bdf="0000:63:00.0", split_count=10, healthy=True)
HOOK_DIR = "/var/lib/rocshare/hook"
CHECK_HOOK = {"hookName": "createContainer", "path": f"{HOOK_DIR}/rocshare-loadcheck",
              "args": ["rocshare-loadcheck", "--library", f"{HOOK_DIR}/libamvgpu.so", "--audit-path", HOOK_CONTAINER_PATH]}


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
    path = write_device_plugin_spec(tmp_path, hook_host_dir=HOOK_DIR, library_file="libamvgpu.so")
    spec = json.loads(path.read_text())
    assert f"{spec['kind']}={spec['devices'][0]['name']}" == CDI_DEVICE_NAME
    assert spec["devices"][0]["containerEdits"] == {"hooks": [CHECK_HOOK]}
    assert [p.name for p in tmp_path.iterdir()] == ["rocshare.io-loadcheck.json"]


@pytest.mark.parametrize("whole", [False, True])
def test_a_prepared_claims_spec_carries_the_check_for_a_slice(whole: bool) -> None:
    claim = PreparedClaim(uid="u1", namespace="ns", name="c", devices=())
    edits = cdi_spec(claim, spec_for(whole=whole))["devices"][0]["containerEdits"]
    assert edits.get("hooks") == (None if whole else [CHECK_HOOK])


def test_the_check_is_installed_beside_the_hook(tmp_path: Path) -> None:
    source = tmp_path / "shipped"
    source.write_bytes(b"\x7fELF check")
    hook_dir = tmp_path / "hook"
    assert install_load_check(source, hook_dir) is True
    installed = hook_dir / "rocshare-loadcheck"
    assert installed.read_bytes() == b"\x7fELF check" and stat.S_IMODE(installed.stat().st_mode) == 0o755
    assert install_load_check(source, hook_dir) is False
    assert sorted(p.name for p in hook_dir.iterdir()) == ["rocshare-loadcheck"]  # no temporary left
