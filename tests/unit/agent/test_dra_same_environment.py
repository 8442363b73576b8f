"""A pod written with HAMi-style limits gets the same environment in a DRA pool as in a device-plugin
pool: the device plugin path (the extender's allocate, then the agent's renderer) and the DRA path
(the claim from rocshare.core.dra_claims, consumed as the slice's request policies make
kube-scheduler consume it, then prepare's plan and the same renderer) give equal HSA_CU_MASK,
memory limits, hook and visible devices, pod after pod on one GPU. The consumed amounts are worked
out here from the published policies (requests as asked; an omitted compute takes the default,
every CU under omittedCores Exclusive)."""

from __future__ import annotations

import pytest

from rocshare.api.allocation import ContainerAllocation
from rocshare.api.models import GpuInfo, Sharing
from rocshare.core.allocate import allocate
from rocshare.core.dra_claims import claim_spec
from rocshare.core.dra_shares import AllocatedDevice, Holdings, plan_claim
from rocshare.core.fit import FitFailure
from rocshare.core.ids import PodKey
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare.core.policies import Policy
from rocshare.core.request import parse_pod
from rocshare.core.resource_slices import device_name
from rocshare_agent.deviceplugin.container_spec import render_container

MI210 = GpuInfo(id="GPU-1901ead3a2ecd4a6", index=0, render_minor=128, card=1, gfx_target_version=90010,
                vram_mib=65536, cu_count=104, pci_bdf="0000:63:00.0", split_count=10, healthy=True)
RX7900 = GpuInfo(id="GPU-a1ffc9d1799c317f", index=0, render_minor=128, card=1, gfx_target_version=110000,
                 vram_mib=24560, cu_count=96, cu_per_wgp=2, pci_bdf="0000:86:00.0", split_count=10, healthy=True)


def pod(name: str, **limits: int) -> dict:
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {
                f"amd.com/{key.replace('_', '-')}": str(value) for key, value in limits.items()}}}]}}


def consumed_by_scheduler(spec: dict, gpu: NodeInventory) -> dict[str, str]:
    """What kube-scheduler consumes for the claim on this GPU: the subrequest of its shape (or the
    exact request), each capacity as asked (these asks are already on the policy's steps) or its default."""
    [request] = spec["devices"]["requests"]
    [shape] = gpu.gpus
    wanted = f"{shape.cu_count}cu-{shape.memory_mib}mi.gpu.rocshare.io"  # the class of its shape
    chosen = request.get("exactly") or next(s for s in request["firstAvailable"] if s["deviceClassName"] == wanted)
    asked = (chosen.get("capacity") or {}).get("requests", {})
    return {"memory": asked.get("memory", f"{shape.memory_mib}Mi"),
            "compute": asked.get("compute", str(shape.cu_usable))}


@pytest.mark.parametrize("gpu", [MI210, RX7900], ids=["mi210", "rx7900"])
def test_hami_style_pods_get_the_same_environment_in_both_modes(gpu: GpuInfo):
    inventory = NodeInventory.from_gpu_infos("n", [gpu], Sharing())
    ledger, prepared = Ledger(), []
    pods = [pod("a", gpumem=1000, gpucores=25), pod("b", gpumem_percentage=50, gpucores=30),
            pod("c", gpumem_percentage=10, gpucores=10)]
    for raw in pods:
        request = parse_pod(raw)
        record = allocate(inventory, ledger.usage(inventory), request, Policy())
        assert not isinstance(record, FitFailure), record
        ledger.apply(record, PodKey(f"ns/{request.name}"))
        plugin_env = render_container(record.containers[0], {gpu.id: gpu}, oversubscribed=False,
                                      hook_host_dir="/usr/local/vgpu").envs

        claim = claim_spec(request.containers[0], inventory.gpus)
        allocated = AllocatedDevice(request="gpu", device=device_name(gpu.id), share_id=f"s-{request.name}",
                                    consumed=consumed_by_scheduler(claim, inventory))
        slices = plan_claim([allocated], {device_name(gpu.id): inventory.gpus[0]},
                            Holdings.of(prepared, {gpu.id: gpu.cu_count}))
        prepared.extend(slices)
        dra_env = render_container(ContainerAllocation(name="main", devices=slices), {gpu.id: gpu},
                                   oversubscribed=False, hook_host_dir="/usr/local/vgpu").envs
        assert dra_env == plugin_env, request.name
        assert "HSA_CU_MASK" in dra_env and dra_env["HIP_DEVICE_MEMORY_LIMIT_0"].endswith("m")


def test_memory_only_pod_has_no_mask_in_either_mode():
    inventory = NodeInventory.from_gpu_infos("n", [MI210], Sharing())
    request = parse_pod(pod("m", gpumem=2000))
    record = allocate(inventory, Ledger().usage(inventory), request, Policy())
    claim = claim_spec(request.containers[0], inventory.gpus)
    [dra_slice] = plan_claim([AllocatedDevice(request="gpu", device=device_name(MI210.id), share_id="s",
                                              consumed=consumed_by_scheduler(claim, inventory))],
                             {device_name(MI210.id): inventory.gpus[0]}, Holdings(masks={}))
    plugin_env = render_container(record.containers[0], {MI210.id: MI210}, oversubscribed=False,
                                  hook_host_dir="/h").envs
    dra_env = render_container(ContainerAllocation(name="main", devices=[dra_slice]), {MI210.id: MI210},
                               oversubscribed=False, hook_host_dir="/h").envs
    assert dra_env == plugin_env and "HSA_CU_MASK" not in dra_env
    assert dra_env["HIP_DEVICE_MEMORY_LIMIT_0"] == "2000m"
