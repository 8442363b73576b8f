"""Memory oversubscription by GPU family, from real captures (AMD's guide: with
deviceMemoryScaling > 1 pods get HIP_OVERSUBSCRIBE=true, and on CDNA XNACK must be on).

A CDNA GPU (MI210, gfx90a) on a scaled pool registers scaled VRAM and its slices get
HIP_OVERSUBSCRIBE=true and HSA_XNACK=1. An RDNA GPU (RX 7900 XTX, gfx1100) has no XNACK: it
registers its real VRAM, and its slices get neither variable. Unscaled pools give neither anywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rocshare.api.gfx import effective_memory_scaling, is_cdna, is_rdna, xnack_capable
from rocshare.api.hami import decode_node_register, encode_node_register
from rocshare.api.models import OperatingMode, Sharing
from rocshare.core.allocate import allocate
from rocshare.core.fit import FitFailure
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare.core.policies import Policy
from rocshare.core.request import parse_pod
from rocshare_agent.deviceplugin.container_spec import render_container
from rocshare_agent.discovery import discover


def _capture_gpus(sysfs: Path, name: str, vram_mib: int):
    gpus = discover(sysfs / name).gpus
    assert gpus, f"no GPU discovered in {name}"
    # Some captures lack a VRAM size; give the inventory one so a memory slice can be placed.
    return [gpu.model_copy(update={"vram_mib": gpu.vram_mib or vram_mib}) for gpu in gpus]


def _slice_envs(gpus, scaling: float) -> tuple[NodeInventory, dict[str, str]]:
    inventory = NodeInventory.from_gpu_infos("n1", gpus, Sharing(deviceMemoryScaling=scaling))
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"containers": [{"name": "main", "resources": {"limits": {
               "amd.com/gpu": "1", "amd.com/gpumem": "2048", "amd.com/gpucores": "25"}}}]}}
    record = allocate(inventory, Ledger().usage(inventory), parse_pod(pod), Policy())
    assert not isinstance(record, FitFailure), record.summary()
    spec = render_container(record.containers[0], {gpu.id: gpu for gpu in gpus},
                            oversubscribed=record.oversubscribed, hook_host_dir="/usr/local/vgpu")
    return inventory, spec.envs


@pytest.mark.parametrize("scaling", [1.0, 2.0])
def test_cdna_slice_gets_xnack_with_oversubscription(sysfs: Path, scaling: float) -> None:
    gpus = _capture_gpus(sysfs, "mi210-8gpu-xgmi", 65536)
    assert all(is_cdna(gpu.gfx_target_version) for gpu in gpus)
    inventory, envs = _slice_envs(gpus, scaling)
    assert inventory.gpus[0].memory_mib == int(65536 * scaling)
    if scaling > 1:
        assert envs["HIP_OVERSUBSCRIBE"] == "true" and envs["HSA_XNACK"] == "1"
    else:
        assert "HIP_OVERSUBSCRIBE" not in envs and "HSA_XNACK" not in envs


def test_rdna_is_never_scaled_and_gets_neither(sysfs: Path) -> None:
    gpus = _capture_gpus(sysfs, "rx7900xtx-kfd", 24560)
    assert all(is_rdna(gpu.gfx_target_version) and not xnack_capable(gpu.gfx_target_version) for gpu in gpus)
    real_mib = gpus[0].vram_mib
    inventory, envs = _slice_envs(gpus, 2.0)
    assert inventory.gpus[0].memory_mib == real_mib and not inventory.oversubscribed
    assert "HIP_OVERSUBSCRIBE" not in envs and "HSA_XNACK" not in envs
    register = decode_node_register(encode_node_register(gpus, operating_mode=OperatingMode.CU, memory_scaling=2.0))
    assert register[0]["devmem"] == real_mib


@pytest.mark.parametrize(("gfx", "cdna", "xnack"), [
    (90008, True, True), (90010, True, True), (90402, True, True), (90500, True, True),
    (90000, False, True), (90006, False, True), (110000, False, False), (120001, False, False), (0, False, False),
])
def test_families(gfx: int, cdna: bool, xnack: bool) -> None:
    assert is_cdna(gfx) is cdna and xnack_capable(gfx) is xnack
    assert effective_memory_scaling(gfx, 3.0) == (3.0 if xnack else 1.0)
