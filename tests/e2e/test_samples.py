"""Every file in samples/ applied as users apply it, each checked against the outcome
samples/README.md gives it: Running with the expected slice, Pending with the expected reason,
or refused with the expected message.

The fleet is `make demo`'s (dev/rocshare_dev/devcluster/demo.py: two MI210 nodes with a synthetic
64 GiB per GPU, an MI300X in CPX mode, an MI300X in SPX mode derived from the CPX capture (tainted for
the inference pair), a Strix Point APU, and an MI210 node in DRA mode for samples/dra/), started by the
same function, so the demo and this test cannot drift apart. Placement assertions are about properties
(the GPU's own CU count, NUMA node, XGMI peers) rather than one node or GPU, where the samples leave the
choice to the scheduler.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest
import yaml

from rocshare.api.models import API_VERSION
from rocshare.kube.client import Kube, object_path
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT
from rocshare_dev.devcluster.demo import DRA_NAMESPACE, DRA_NODE, apply_dra_samples, start_samples_fleet
from rocshare_dev.devcluster.evidence import conflicts, inventories, parse_cu_mask, shares_of
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from tests.e2e.fleet import (
    mask_bits,
    mi300x_spx_xcd,
    read_pod,
    record_of,
    runtime_of,
    scheduling_failures,
    wait_for,
    wait_running,
)

pytestmark = pytest.mark.e2e

SAMPLES = PROJECT_ROOT / "samples"
RUNNING = {  # namespace -> pods README.md says run
    "gpu-demo": ("slice-4g-25pct", "slice-25pct-vram", "numa-pair", "xgmi-pair"),
    "gpu-samples": ("whole-gpu", "two-partitions", "mi210-only", "one-gpu-by-uuid", "spread-me", "non-root",
                    "pytorch", "user-a", "user-b", "inference-a", "inference-b"),
}
REFUSED = {
    "gpumem-without-gpu.yaml": "amd.com/gpumem needs amd.com/gpu",
    "privileged-slice.yaml": "a privileged container sees every GPU",
    "forged-allocation.yaml": "rocshare.io/allocation is written only by the rocshare scheduler",
}


@pytest.fixture(scope="module")
def samples_fleet(cluster, tmp_path_factory) -> Iterator[dict[str, dict]]:
    """The demo fleet with samples/ applied; yields the AmdGpuNode status of every node."""
    operator = OperatorProcess(cluster)
    nodes: list = []
    try:
        start_samples_fleet(cluster, operator, tmp_path_factory.mktemp("samples"), nodes, dra=True)
        yield {node.name: node for node in nodes}
    finally:
        cluster.kubectl("delete", "-k", str(SAMPLES / "dra"), "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "-k", str(SAMPLES), "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "pods", "--all", "-n", "gpu-samples", "--force", "--grace-period=0", check=False)
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        # The pools go while the operator runs: their finalizer unmarks the nodes first.
        cluster.kubectl("delete", "amdgpupools", "--all", "--timeout=60s", check=False)
        for node in nodes:
            node.stop()
        operator.stop()
        cluster.stop_default_scheduler()  # started for samples/dra; the rest of the suite has neither
        cluster.stop_dra_scheduler()


@pytest.fixture(scope="module")
async def running(samples_fleet, cluster) -> dict[str, dict]:
    """Every pod README.md says runs, Running (by namespace/name)."""
    kube = await Kube.connect(cluster.kubeconfig)
    try:
        pods = {}
        for namespace, names in RUNNING.items():
            for name in names:
                pods[f"{namespace}/{name}"] = await wait_running(kube, name, namespace, timeout_s=180)
        return pods
    finally:
        await kube.close()


async def _inventory(kube: Kube) -> dict[tuple[str, str], dict]:
    """(node, GPU id) -> the GPU as its agent published it."""
    nodes = (await kube.list(object_path(API_VERSION, "amdgpunodes")))["items"]
    return {(node["metadata"]["name"], gpu["id"]): gpu for node in nodes for gpu in node["status"].get("gpus", [])}


def _devices(pod: dict) -> list:
    return [device for container in record_of(pod).containers for device in container.devices]


async def test_seed_pods_get_their_slices(running, kube: Kube) -> None:
    inventory = await _inventory(kube)
    slice_pod = running["gpu-demo/slice-4g-25pct"]
    (device,) = _devices(slice_pod)
    gpu = inventory[(record_of(slice_pod).node, device.gpu_id)]
    assert device.memory_mib == 4096 and device.cu_count == math.ceil(gpu["cuCount"] * 25 / 100)
    assert runtime_of(slice_pod)["main"]["envs"]["HSA_CU_MASK"].count(":") == 1

    quarter = running["gpu-demo/slice-25pct-vram"]
    (device,) = _devices(quarter)
    gpu = inventory[(record_of(quarter).node, device.gpu_id)]
    assert quarter["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "1"  # added by the webhook
    assert device.cu_count == gpu["cuCount"]
    assert device.memory_mib in {gpu["vramMiB"] // 4, gpu["vramMiB"] * 2 // 4}  # real, or scaled 2x (MI210 pool)

    numa = running["gpu-demo/numa-pair"]
    numa_nodes = {inventory[(record_of(numa).node, d.gpu_id)]["numa"] for d in _devices(numa)}
    assert len(_devices(numa)) == 2 and len(numa_nodes) == 1

    linked = running["gpu-demo/xgmi-pair"]
    first, second = (inventory[(record_of(linked).node, d.gpu_id)] for d in _devices(linked))
    assert second["pciBDF"] in first["xgmiPeers"]


async def test_inference_pair_on_an_mi300x_in_spx_mode_is_on_disjoint_xcds(running) -> None:
    """Issue 41's demo: two 25 % slices on one MI300X in SPX mode (pool mi300x-cu, cuLayout Isolated) are
    on disjoint XCDs, read from the HSA_CU_MASK the kubelet peer recorded for each container and mapped
    by the test's own table (bit i -> XCD i mod 8)."""
    pods = [running[f"gpu-samples/inference-{name}"] for name in ("a", "b")]
    assert {record_of(pod).node for pod in pods} == {"demo-mi300x-spx"}
    envs = [runtime_of(pod)["main"]["envs"] for pod in pods]
    assert envs[0]["ROCR_VISIBLE_DEVICES"] == envs[1]["ROCR_VISIBLE_DEVICES"]  # binpack: co-tenants of one GPU
    slices = [mask_bits(env["HSA_CU_MASK"])[0] for env in envs]
    assert [len(bits) for bits in slices] == [76, 76]  # ceil(25 % of 304)
    xcds = [{mi300x_spx_xcd(bit) for bit in bits} for bits in slices]
    for bits, on in zip(slices, xcds):
        assert len(on) == 2 and bits == {bit for bit in range(304) if mi300x_spx_xcd(bit) in on}  # whole XCDs
    assert not xcds[0] & xcds[1]


async def test_amdgpunode_status_shows_the_pair_on_its_own_xcds(running, cluster) -> None:
    """What `kubectl get amdgpunode -o yaml` shows an admin (status.isolation, written by the operator):
    per XCD of the pair's GPU, which pod holds how many CUs -- checked against the containers'
    HSA_CU_MASK mapped by the test's own table, not against the product's rule."""
    pods = {name: running[f"gpu-samples/{name}"] for name in ("inference-a", "inference-b")}
    (gpu_id,) = {device.gpu_id for pod in pods.values() for device in _devices(pod)}
    want: dict[int, dict[str, int]] = {}  # XCD -> pod -> CUs, from what the kubelet handed the containers
    for name, pod in pods.items():
        for bit in mask_bits(runtime_of(pod)["main"]["envs"]["HSA_CU_MASK"])[0]:
            on = want.setdefault(mi300x_spx_xcd(bit), {})
            on[f"gpu-samples/{name}"] = on.get(f"gpu-samples/{name}", 0) + 1

    async def shown() -> dict | None:
        status = yaml.safe_load(cluster.kubectl("get", "amdgpunode", "demo-mi300x-spx", "-o", "yaml").stdout)["status"]
        found = [gpu for gpu in status.get("isolation") or [] if gpu["gpuId"] == gpu_id]
        return found[0] if found and sum(len(unit["tenants"]) for unit in found[0]["units"]) == 4 else None

    gpu = await wait_for(shown, timeout_s=90, what="status.isolation naming both pods' XCDs")
    assert gpu["unit"] == "XCD" and [unit["cuCount"] for unit in gpu["units"]] == [38] * 8
    got = {unit["index"]: {tenant["pod"]: tenant["cusHeld"] for tenant in unit["tenants"]}
           for unit in gpu["units"] if unit["tenants"]}
    assert got == want and len(got) == 4 and all(len(on) == 1 for on in got.values())


async def test_whole_gpu_gets_no_limit_and_no_hook(running) -> None:
    pod = running["gpu-samples/whole-gpu"]
    (device,) = _devices(pod)
    envs = runtime_of(pod)["main"]["envs"]
    assert device.whole and "HIP_DEVICE_MEMORY_LIMIT_0" not in envs and "LD_AUDIT" not in envs


async def test_partitions_are_whole_and_get_the_pools_runtime_class(running) -> None:
    pod = running["gpu-samples/two-partitions"]
    assert record_of(pod).node == "demo-mi300x-cpx"
    assert [device.whole for device in _devices(pod)] == [True, True]
    assert pod["spec"]["runtimeClassName"] == "rocm"


async def test_type_and_uuid_selection(running, kube: Kube) -> None:
    inventory = await _inventory(kube)
    typed = running["gpu-samples/mi210-only"]
    assert all("MI210" in inventory[(record_of(typed).node, d.gpu_id)]["product"] for d in _devices(typed))
    assert [d.gpu_id for d in _devices(running["gpu-samples/one-gpu-by-uuid"])] == ["GPU-51276ac12ce05db3"]


async def test_scaled_pool_slices_oversubscribe_with_xnack(running) -> None:
    pod = running["gpu-samples/pytorch"]
    envs = runtime_of(pod)["main"]["envs"]
    assert envs["HIP_VISIBLE_DEVICES"] == "0" and envs["HIP_DEVICE_MEMORY_LIMIT_0"] == "16384m"
    on_mi210 = record_of(pod).node.startswith("demo-mi210")
    assert (envs.get("HIP_OVERSUBSCRIBE"), envs.get("HSA_XNACK")) == (("true", "1") if on_mi210 else (None, None))


async def test_the_guides_two_users_fill_two_gpus(running) -> None:
    # Both users are pinned to demo-mi210-b, but the pool packs nodes (binpack), so another sample
    # may land there too (one-gpu-by-uuid's GPU exists on both MI210 nodes). The guide's point holds
    # either way: the two users' four slices open at most two GPUs no other pod uses, never four --
    # on an otherwise empty node exactly user A's two; next to another pod, a user may pack onto
    # that pod's GPU instead, which is fuller.
    keys = ("gpu-samples/user-a", "gpu-samples/user-b")
    users = [running[key] for key in keys]
    assert {record_of(pod).node for pod in users} == {"demo-mi210-b"}
    gpus_a, gpus_b = ({d.gpu_id for d in _devices(pod)} for pod in users)
    assert len(gpus_a) == len(gpus_b) == 2
    others = {d.gpu_id for key, pod in running.items() if key not in keys
              and record_of(pod).node == "demo-mi210-b" for d in _devices(pod)}
    assert len((gpus_a | gpus_b) - others) <= 2, (gpus_a, gpus_b, others)
    if not others:
        assert gpus_a == gpus_b


async def test_policies_and_non_root_pods_run(running) -> None:
    assert _devices(running["gpu-samples/spread-me"])
    non_root = running["gpu-samples/non-root"]
    assert non_root["spec"]["securityContext"]["runAsUser"] == 1000 and _devices(non_root)


async def test_over_quota_pod_is_pending_with_the_reason(running, kube: Kube) -> None:
    failures = await wait_for(lambda: scheduling_failures(kube, "over-quota", "gpu-quota-demo"), timeout_s=60,
                              what="a FailedScheduling event")
    assert any("ResourceQuotaNotFit" in message for message in failures), failures
    assert (await read_pod(kube, "over-quota", "gpu-quota-demo"))["status"]["phase"] == "Pending"


async def test_pools_and_shares_report(running, cluster) -> None:
    def pool(name: str) -> dict:
        return json.loads(cluster.kubectl("get", "amdgpupool", name, "-o", "json").stdout).get("status", {})

    async def counted():
        return all(pool(name).get("gpusTotal") for name in ("mi210", "mi300x-partition", "mi300x-cu", "radeon")) or None

    await wait_for(counted, timeout_s=60, what="pools counting their GPUs")
    assert (pool("mi210")["nodes"], pool("mi210")["gpusTotal"]) == (2, 16)
    assert (pool("mi300x-partition")["nodes"], pool("mi300x-partition")["gpusTotal"]) == (1, 63)
    assert (pool("radeon")["nodes"], pool("radeon")["gpusTotal"]) == (1, 1)
    assert (pool("mi300x-cu")["nodes"], pool("mi300x-cu")["gpusTotal"]) == (1, 8)
    quota = json.loads(cluster.kubectl("get", "resourcequota", "-n", "gpu-quota-demo", "-o", "json").stdout)["items"]
    assert [q["spec"]["hard"]["limits.amd.com/gpumem"] for q in quota] == ["8192"]


@pytest.mark.parametrize(("sample", "message"), sorted(REFUSED.items()))
def test_refused_samples_name_the_problem(samples_fleet, cluster, sample: str, message: str) -> None:
    # As a plain user with the built-in edit role: rocshare's own writers are trusted.
    cluster.kubectl("create", "rolebinding", "samples-edit", "--clusterrole=edit", "--user=sample-user",
                    "-n", "gpu-samples", check=False)
    as_user = f"--kubeconfig={cluster.user_kubeconfig('sample-user')}"  # the last --kubeconfig wins
    result = cluster.kubectl(as_user, "apply", "-f", str(SAMPLES / "refused" / sample), check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


async def test_the_dra_pool_runs_a_claim_and_amd_limits_and_its_share_counts_them(running, cluster, kube: Kube) -> None:
    """samples/dra/: a pod written as a claim and one written with amd.com/* limits (turned into a claim
    by the webhook) run on the DRA node, each container receiving its claim's CDI device with a
    quarter of an MI210 (8 GiB, 26 of its 104 CUs, worked out here from the inventory), on CUs
    disjoint from the other's; `kubectl get amdgpushares` counts both claims. Last in the module: with a
    DRA pool present, the refused samples (no nodeSelector) would match pools of both kinds."""
    apply_dra_samples(cluster)
    pods = {name: await wait_running(kube, name, DRA_NAMESPACE, timeout_s=120) for name in ("dra-claim",
                                                                                          "dra-amd-limits")}
    gpus = inventories((await kube.list(object_path(API_VERSION, "amdgpunodes")))["items"])[DRA_NODE[0]]
    translated = pods["dra-amd-limits"]["spec"]["containers"][0]["resources"]
    assert "limits" not in translated or not any(key.startswith("amd.com/") for key in translated["limits"])
    held = []
    for name, pod in pods.items():
        assert pod["spec"]["nodeName"] == DRA_NODE[0]
        [claim_status] = pod["status"]["resourceClaimStatuses"]
        claim = await kube.get(object_path("resource.k8s.io/v1", "resourceclaims", claim_status["resourceClaimName"],
                                           namespace=DRA_NAMESPACE))
        received = runtime_of(pod)
        assert received["main"]["cdiDevices"] == [f"rocshare.io/gpu={claim['metadata']['uid']}"]
        [share] = shares_of(f"{DRA_NAMESPACE}/{name}", DRA_NODE[0], received, gpus)
        cus = sum(high - low + 1 for low, high in parse_cu_mask(received["main"]["envs"]["HSA_CU_MASK"])[0])
        assert share.memory_mib == 8192 and cus == math.ceil(share.gpu.cu_count * 25 / 100) == 26  # MI210: 104 CUs
        assert conflicts(share, held) == []
        held.append(share)

    async def counted():
        share = await kube.get(object_path(API_VERSION, "amdgpushares", "team-dra", namespace=DRA_NAMESPACE))
        status = share.get("status") or {}
        return status if len(status.get("pods") or []) == 2 else None

    status = await wait_for(counted, timeout_s=60, what="team-dra counting the two claims")
    assert sorted(holder["pod"].split("/")[0] for holder in status["pods"]) == ["resourceclaim", "resourceclaim"]
    assert (status["used"]["memoryMiB"], status["used"]["gpus"], status["used"]["coresPercent"]) == (16384, 2, 50)
