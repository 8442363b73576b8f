"""Migrating from HAMi, end to end: pods HAMi placed keep running on a node while rocshare takes it
over, rocshare counts them, fills the rest of the node, and over-allocates nothing.

Real kube-apiserver and kube-scheduler with rocshare's extender, the operator process, and one
simulated MI210 node (the kubelet's device manager with a rocshare agent on the real capture, with
a synthetic 64 GiB per GPU: see fleet.mi210_with_synthetic_vram).

The HAMi pods are written the way HAMi's own code writes them (HAMi 4707fb0 and its AMD device
plugin; no HAMi process runs here): HAMi's scheduler filter patches `hami.io/vgpu-node`,
`hami.io/vgpu-time`, `hami.io/amd-devices-to-allocate` and `hami.io/amd-devices-allocated`, its
bind patches `hami.io/bind-phase: allocating` and `hami.io/bind-time` and posts a plain Binding;
HAMi's AMD plugin admits the pod (here: status Running, as the migration finds it) and writes
`hami.io/amd-cu-allocated` and `hami.io/bind-phase: success`. Their GPU ids are in the AMD SMI UUID
form HAMi's plugin registers, built from each GPU's unique_id and PCI device id; one pod uses
rocshare's own ids (what a HAMi scheduler reading rocshare's `hami.io/node-amd-register` writes),
and one was never given CU ranges (an older plugin): rocshare must hold all of that GPU's CUs.
rocshare is "installed" (webhooks on) only after the HAMi pods run, as in a migration.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest

from rocshare.api.hami import decode_node_register, decode_pod_devices
from rocshare.api.models import API_VERSION
from rocshare.core.cumask import mask_from_ranges
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode
from rocshare.kube.client import Kube, NotFound, object_path
from tests.e2e.fleet import gpu_pod, mi210_with_synthetic_vram, read_pod, record_of, scheduling_failures, wait_for

pytestmark = pytest.mark.e2e

NODE = "hami-mi210"
NAMESPACE = "hami-migration"
POOL = {"rocshare.io/pool": "hami-mi210"}
ROCSHARE_PODS = 11
ASK_MIB, ASK_CORES_PCT = 16384, 50


@pytest.fixture(scope="module")
def operator(cluster) -> Iterator[OperatorProcess]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    process = OperatorProcess(cluster)
    process.start()
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps({
        "apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": "hami-mi210"},
        "spec": {"nodeSelector": {"rocshare.io/sim": "hami-mi210"}, "sharing": {}}}))
    try:
        yield process
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        cluster.kubectl("delete", "amdgpupools", "hami-mi210", "--ignore-not-found", "--timeout=30s", check=False)
        process.stop()


@pytest.fixture(scope="module")
def node(cluster, operator, tmp_path_factory, sysfs_fixtures) -> Iterator[SimulatedNode]:
    work = tmp_path_factory.mktemp("hami")
    simulated = SimulatedNode(name=NODE, kubeconfig=cluster.kubeconfig, work_dir=work,
                              sysfs_root=mi210_with_synthetic_vram(sysfs_fixtures, work),
                              labels={"rocshare.io/sim": "hami-mi210"})
    simulated.start(timeout_s=120)
    try:
        yield simulated
    finally:
        simulated.stop()


def amd_smi_uuid(rocshare_id: str, device_id: str) -> str:
    """The id HAMi's AMD plugin registers for a GPU: amd_smi_lib's amdsmi_uuid_gen of the GPU's
    unique_id and PCI device id, partition byte 0xff (unit-tested against HAMi's plugin's example)."""
    unique_id = int(rocshare_id.removeprefix("GPU-"), 16)
    return (f"{unique_id >> 56:02x}ff{int(device_id, 16):04x}-0000-1000-80{(unique_id >> 48) & 0xff:02x}-"
            f"{(unique_id >> 32) & 0xffff:04x}{unique_id & 0xffffffff:08x}")


def hami_pod(name: str, containers: int = 1) -> dict:
    pod = gpu_pod(name, namespace=NAMESPACE, containers=[{"gpu": "1", "gpumem": "1024"}] * containers)
    pod["spec"]["schedulerName"] = "hami-scheduler"  # no such scheduler runs: we act as HAMi
    return pod


async def place_as_hami(kube: Kube, name: str, devices: str, cu_allocated: dict[str, str] | None,
                        containers: int = 1) -> None:
    path = object_path("v1", "pods", name, namespace=NAMESPACE)
    await kube.create(object_path("v1", "pods", namespace=NAMESPACE), hami_pod(name, containers))
    now = str(int(time.time()))
    await kube.merge_patch(path, {"metadata": {"labels": {"hami.io/vgpu-node": NODE}, "annotations": {
        "hami.io/vgpu-node": NODE, "hami.io/vgpu-time": now,
        "hami.io/amd-devices-to-allocate": devices, "hami.io/amd-devices-allocated": devices}}})  # filter
    await kube.merge_patch(path, {"metadata": {"annotations": {
        "hami.io/bind-phase": "allocating", "hami.io/bind-time": now}}})  # bind, before its Binding
    # Admitted by HAMi's stack before rocshare came: the kubelet peer leaves a running pod alone.
    await kube.merge_patch(path + "/status", {"status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}})
    await kube.create(path + "/binding", {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                                          "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}})
    served = {"hami.io/bind-phase": "success"}
    if cu_allocated is not None:
        served["hami.io/amd-cu-allocated"] = json.dumps(cu_allocated)
    await kube.merge_patch(path, {"metadata": {"annotations": served}})  # HAMi's plugin, at Allocate


async def test_hami_placed_pods_are_held_and_rocshare_fills_the_rest_without_overallocating(
        cluster, operator: OperatorProcess, node: SimulatedNode, kube: Kube) -> None:
    async def gpus_published():
        try:
            status = (await kube.get(object_path(API_VERSION, "amdgpunodes", NODE))).get("status") or {}
        except NotFound:
            return None
        return status.get("gpus") if len(status.get("gpus") or []) == 8 else None
    gpus = await wait_for(gpus_published, timeout_s=120, what="the agent's 8 MI210 GPUs")
    ids = [gpu["id"] for gpu in gpus]
    smi = [amd_smi_uuid(gpu["id"], gpu["deviceId"]) for gpu in gpus]
    cus = {gpu["id"]: gpu["cuCount"] for gpu in gpus}
    vram = {gpu["id"]: gpu["vramMiB"] for gpu in gpus}
    assert set(cus.values()) == {104} and set(vram.values()) == {65536}

    # What HAMi placed, in its own annotations: (pod, devices annotation, CUs its plugin pinned).
    hami = [
        ("hami-half", f"{smi[0]},AMD Instinct MI210,32768,52:;", {smi[0]: "0-51"}),
        ("hami-unpinned", f"{smi[1]},AMD Instinct MI210,60000,26:;", None),  # CUs unknown: all held
        ("hami-whole", f"{smi[2]},AMD Instinct MI210,65536,104:;", {smi[2]: "0-103"}),
        ("hami-two", f"{ids[3]},AMD Instinct MI210,16384,26:;{ids[4]},AMD Instinct MI210,16384,26:;",
         {ids[3]: "0-25", ids[4]: "0-25"}),
    ]
    for name, devices, pinned in hami:
        await place_as_hami(kube, name, devices, pinned, containers=devices.count(";"))
    operator.install_webhooks()  # rocshare "installed" now, beside the running HAMi pods

    for index in range(ROCSHARE_PODS):
        await kube.create(object_path("v1", "pods", namespace=NAMESPACE), gpu_pod(
            f"r{index}", namespace=NAMESPACE, node_selector=POOL, gpu="1", gpumem=str(ASK_MIB),
            gpucores=str(ASK_CORES_PCT)))

    # Room for 52-CU slices after HAMi's pods: GPU0 1 (CUs 52-103), GPU1 0 (all CUs unknown),
    # GPU2 0 (whole), GPU3 and GPU4 1 each (78 CUs free), GPU5-7 2 each.
    expected_running = 1 + 0 + 0 + 1 + 1 + 3 * 2

    async def settled():
        pods = [await read_pod(kube, f"r{index}", NAMESPACE) for index in range(ROCSHARE_PODS)]
        running = [pod for pod in pods if pod and pod["status"].get("phase") == "Running"]
        waiting = [pod["metadata"]["name"] for pod in pods if pod and not pod["spec"].get("nodeName")]
        refused = [name for name in waiting if await scheduling_failures(kube, name, NAMESPACE)]
        return running if len(running) + len(refused) == ROCSHARE_PODS else None
    running = await wait_for(settled, timeout_s=600, what="every rocshare pod running or refused", every_s=2)
    assert len(running) == expected_running

    # The records, per GPU: rocshare's pods and HAMi's together stay within each GPU's capacity.
    memory: dict[str, int] = defaultdict(int)
    masks: dict[str, list[int]] = defaultdict(list)
    whole_cus = mask_from_ranges([(0, 103)])
    for pod in running:
        for container in record_of(pod).containers:
            for device in container.devices:
                memory[device.gpu_id] += device.memory_mib
                masks[device.gpu_id].append(mask_from_ranges(device.cu_ranges))
    rocshare_on = {gpu: len(found) for gpu, found in masks.items()}
    assert ids[1] not in rocshare_on and ids[2] not in rocshare_on  # all their CUs are HAMi's
    memory[ids[0]] += 32768; masks[ids[0]].append(mask_from_ranges([(0, 51)]))  # noqa: E702
    memory[ids[1]] += 60000; masks[ids[1]].append(whole_cus)  # noqa: E702
    memory[ids[2]] += 65536; masks[ids[2]].append(whole_cus)  # noqa: E702
    for gpu in (ids[3], ids[4]):
        memory[gpu] += 16384
        masks[gpu].append(mask_from_ranges([(0, 25)]))
    for gpu in ids:
        assert memory[gpu] <= vram[gpu], f"{gpu}: {memory[gpu]} MiB held of {vram[gpu]}"
        union = 0
        for mask in masks[gpu]:
            assert union & mask == 0, f"{gpu}: a CU handed out twice"
            union |= mask
        assert union.bit_count() <= cus[gpu]

    # HAMi's view: every rocshare pod carries what HAMi's scheduler reads (onAddPod), and HAMi's own
    # usage rule (per device id: sum of MiB, of CUs, of pods) stays within what the node registers.
    node_obj = await kube.get(object_path("v1", "nodes", NODE))
    register = {device["id"]: device for device in
                decode_node_register(node_obj["metadata"]["annotations"]["hami.io/node-amd-register"])}
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for pod in running:
        annotations = pod["metadata"]["annotations"]
        assert annotations["hami.io/vgpu-node"] == NODE and annotations["hami.io/vgpu-time"].isdigit()
        for container in decode_pod_devices(annotations["hami.io/amd-devices-allocated"]):
            for device in container:
                used[device.uuid] = [used[device.uuid][0] + device.memory_mib,
                                     used[device.uuid][1] + device.cu_count, used[device.uuid][2] + 1]
    for gpu, (mib, cu_count, count) in used.items():
        assert gpu in register
        assert mib <= register[gpu]["devmem"] and cu_count <= register[gpu]["devcore"] <= 104
        assert count <= register[gpu]["count"]
