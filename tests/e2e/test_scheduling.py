"""The whole scheduling path, end to end: real kube-apiserver and kube-scheduler (with the
rocshare extender), the operator process (reconcilers, extender, admission webhook), and
simulated nodes — the kubelet's own device manager (kubelet peer) with a rocshare agent
reading a real sysfs capture. Each test creates pods as a user would and asserts what the
kubelet handed the containers.

The MI210 capture carries no VRAM size; these tests use a copy with a synthetic 64 GiB per
GPU (see fleet.mi210_with_synthetic_vram).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from rocshare.api.models import API_VERSION
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode
from rocshare.kube.client import Forbidden, Invalid, Kube, object_path
from rocshare_dev.devcluster.captures import mi300x_spx
from tests.e2e.fleet import (
    create_pod,
    delete_pod,
    gpu_pod,
    mask_bits,
    mi210_with_synthetic_vram,
    mi300x_spx_xcd,
    read_pod,
    record_of,
    runtime_of,
    scheduling_failures,
    wait_for,
    wait_running,
)

pytestmark = pytest.mark.e2e

MI210_NODE = "sched-mi210"
APU_NODE = "sched-apu"
MI300X_NODE = "sched-mi300x"
NAMESPACES = ("team-a", "team-b")
# Every pod names its simulated node's pool: nodes other test modules leave behind must not matter.
MI210 = {"rocshare.io/pool": "sched-mi210"}
APU = {"rocshare.io/pool": "sched-apu"}
MI300X = {"rocshare.io/pool": "sched-mi300x"}


def pool(name: str, selector: str, **sharing) -> dict:
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": name},
            "spec": {"nodeSelector": {"rocshare.io/sim": selector}, "sharing": sharing}}


@pytest.fixture(scope="module")
def fleet(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[dict[str, SimulatedNode]]:
    work = tmp_path_factory.mktemp("fleet")
    for namespace in NAMESPACES:
        cluster.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(cluster)
    operator.start()
    operator.install_webhooks()
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pool("sched-mi210", "mi210")))
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pool("sched-apu", "apu")))
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pool("sched-mi300x", "mi300x")))  # cuLayout default
    nodes = {
        MI210_NODE: SimulatedNode(name=MI210_NODE, kubeconfig=cluster.kubeconfig, work_dir=work,
                                  sysfs_root=mi210_with_synthetic_vram(sysfs_fixtures, work),
                                  labels={"rocshare.io/sim": "mi210"}),
        APU_NODE: SimulatedNode(name=APU_NODE, kubeconfig=cluster.kubeconfig, work_dir=work,
                                sysfs_root=sysfs_fixtures / "strixpoint-apu", labels={"rocshare.io/sim": "apu"}),
        # Derived from the CPX capture: 8 GPUs in SPX mode, 8 XCCs and 304 CUs each (see captures.mi300x_spx).
        MI300X_NODE: SimulatedNode(name=MI300X_NODE, kubeconfig=cluster.kubeconfig, work_dir=work,
                                   sysfs_root=mi300x_spx(sysfs_fixtures, work), labels={"rocshare.io/sim": "mi300x"}),
    }
    try:
        for node in nodes.values():
            node.start()
        yield nodes
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        # The pools go while the operator runs: their finalizer unmarks the nodes first.
        cluster.kubectl("delete", "amdgpupools", "sched-mi210", "sched-apu", "sched-mi300x", "--ignore-not-found",
                        "--timeout=30s",
                        check=False)
        for node in nodes.values():
            node.stop()
        operator.stop()


async def allocatable_gpus(kube: Kube, node: str) -> int:
    obj = await kube.get(object_path("v1", "nodes", node))
    return int(obj.get("status", {}).get("allocatable", {}).get("amd.com/gpu", "0"))


@pytest.fixture
async def ready(fleet, kube: Kube) -> dict[str, SimulatedNode]:
    """Every simulated node registered its GPUs and the extender knows them."""
    await wait_for(lambda: allocatable_gpus(kube, MI210_NODE), timeout_s=60, what="MI210 node allocatable")
    await wait_for(lambda: allocatable_gpus(kube, APU_NODE), timeout_s=60, what="APU node allocatable")
    await wait_for(lambda: allocatable_gpus(kube, MI300X_NODE), timeout_s=60, what="MI300X node allocatable")
    return fleet


async def test_two_quarter_slices_on_an_mi300x_in_spx_mode_are_on_disjoint_xcds(ready, kube: Kube) -> None:
    """Issue 41: the pool's default layout on CDNA is Isolated. Two 25 % slices (76 of 304 CUs) on one
    MI300X get two whole XCDs each, none in common, read from what the kubelet handed the containers."""
    for name in ("xcd-a", "xcd-b"):
        await create_pod(kube, gpu_pod(name, gpu="1", gpumem="16384", gpucores="25", node_selector=MI300X))
    envs = [runtime_of(await wait_running(kube, name))["c0"]["envs"] for name in ("xcd-a", "xcd-b")]
    assert envs[0]["ROCR_VISIBLE_DEVICES"] == envs[1]["ROCR_VISIBLE_DEVICES"]  # binpack: one GPU, co-tenants
    slices = [mask_bits(env["HSA_CU_MASK"])[0] for env in envs]
    xcds = [{mi300x_spx_xcd(bit) for bit in bits} for bits in slices]
    assert [len(bits) for bits in slices] == [76, 76]
    for bits, on in zip(slices, xcds):
        assert len(on) == 2 and bits == {bit for bit in range(304) if mi300x_spx_xcd(bit) in on}  # whole XCDs
    assert not xcds[0] & xcds[1]
    for name in ("xcd-a", "xcd-b"):
        await delete_pod(kube, name)


async def gpu_of(kube: Kube, name: str, namespace: str = "default") -> list[str]:
    pod = await read_pod(kube, name, namespace)
    return [device.gpu_id for container in record_of(pod).containers for device in container.devices]


async def test_seed_sample_pod_gets_26_cus_and_4096_mib(ready, kube: Kube) -> None:
    await create_pod(kube, gpu_pod("sample", gpu="1", gpumem="4096", gpucores="25",
                                   node_selector=MI210))
    pod = await wait_running(kube, "sample")
    envs = runtime_of(pod)["c0"]["envs"]
    record = record_of(pod)
    device = record.containers[0].devices[0]
    assert device.cu_count == 26 and device.memory_mib == 4096
    bits = {bit for low, high in device.cu_ranges for bit in range(low, high + 1)}
    # MI210, pool layout Isolated by default on CDNA: 26 CUs are two whole shader engines of 13. By the
    # kernel's mapping (mqd_symmetrically_map_cu_mask, 8 engines of one array) bit i is on engine i mod 8.
    engines = {bit % 8 for bit in bits}
    assert len(bits) == 26 and len(engines) == 2 and bits == {bit for bit in range(104) if bit % 8 in engines}
    assert envs["HSA_CU_MASK"] == "0:" + ",".join(f"{low}-{high}" if low != high else f"{low}"
                                                  for low, high in device.cu_ranges)
    assert envs["HIP_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert envs["ROCR_VISIBLE_DEVICES"] == device.gpu_id
    assert envs["LD_AUDIT"] == "/usr/local/vgpu/libamvgpu.so"
    assert pod["metadata"]["annotations"]["hami.io/amd-devices-allocated"].startswith(f"{device.gpu_id},")
    await delete_pod(kube, "sample")


async def test_four_quarter_pods_on_one_gpu_get_disjoint_ranges_and_memory_only_waits(ready, kube: Kube) -> None:
    target = (await kube.get(object_path(API_VERSION, "amdgpunodes", MI210_NODE)))["status"]["gpus"][3]["id"]
    pinned = {"amd.com/use-gpu-uuid": target}
    for index in range(4):
        await create_pod(kube, gpu_pod(f"quarter-{index}", gpu="1", gpumem="4096", gpucores="25", annotations=pinned,
                                       node_selector=MI210))
    ranges = []
    for index in range(4):
        pod = await wait_running(kube, f"quarter-{index}")
        device = record_of(pod).containers[0].devices[0]
        assert device.gpu_id == target
        ranges.extend(range(low, high + 1) for low, high in device.cu_ranges)
    covered = sorted(cu for span in ranges for cu in span)
    assert covered == list(range(104)), "four 25 % slices of 104 CUs: 26 each, disjoint, covering the GPU"

    # A memory-only slice under omittedCores Exclusive needs the whole compute range: it waits.
    await create_pod(kube, gpu_pod("memory-only", gpu="1", gpumem="2048", annotations=pinned, node_selector=MI210))
    await asyncio.sleep(3)
    assert (await read_pod(kube, "memory-only"))["status"]["phase"] == "Pending"
    failures = await wait_for(lambda: scheduling_failures(kube, "memory-only"), timeout_s=20,
                              what="a FailedScheduling event")
    assert any("CardInsufficientCore" in message for message in failures), failures
    for index in range(4):
        await delete_pod(kube, f"quarter-{index}")
    pod = await wait_running(kube, "memory-only", timeout_s=60)
    assert record_of(pod).containers[0].devices[0].reserves_all_cores
    await delete_pod(kube, "memory-only")


async def test_memory_only_pod_runs_at_once_under_shared_cores(ready, kube: Kube, cluster) -> None:
    cluster.kubectl("patch", "amdgpupool", "sched-mi210", "--type=merge",
                    "-p", json.dumps({"spec": {"sharing": {"omittedCores": "Shared"}}}))
    try:
        target = (await kube.get(object_path(API_VERSION, "amdgpunodes", MI210_NODE)))["status"]["gpus"][5]["id"]
        pinned = {"amd.com/use-gpu-uuid": target}
        await asyncio.sleep(2)  # the operator rewrites the node's pool settings; the extender reads them
        await create_pod(kube, gpu_pod("holder", gpu="1", gpumem="4096", gpucores="100", annotations=pinned,
                                       node_selector=MI210))
        await wait_running(kube, "holder")
        await create_pod(kube, gpu_pod("shared-memory", gpu="1", gpumem="2048", annotations=pinned,
                                       node_selector=MI210))
        pod = await wait_running(kube, "shared-memory")
        device = record_of(pod).containers[0].devices[0]
        assert device.gpu_id == target and not device.reserves_all_cores and device.cu_ranges == []
        assert "HSA_CU_MASK" not in runtime_of(pod)["c0"]["envs"]
    finally:
        cluster.kubectl("patch", "amdgpupool", "sched-mi210", "--type=merge",
                        "-p", json.dumps({"spec": {"sharing": {"omittedCores": "Exclusive"}}}))
        for name in ("holder", "shared-memory"):
            await delete_pod(kube, name)


async def test_percentage_only_gets_a_gpu_and_rdna_rounds_to_whole_wgps(ready, kube: Kube) -> None:
    created = await create_pod(kube, gpu_pod("percent", **{"gpumem-percentage": "50"},
                                             node_selector=APU))
    assert created["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "1"
    assert created["spec"]["schedulerName"] == "rocshare-scheduler"
    await wait_running(kube, "percent")
    await delete_pod(kube, "percent")

    # Strix Point: 12 CUs in WGPs of 2; 25 % is 3 CUs, rounded up to 2 whole WGPs.
    await create_pod(kube, gpu_pod("rdna", gpu="1", gpumem="1024", gpucores="25",
                                   node_selector=APU))
    pod = await wait_running(kube, "rdna")
    device = record_of(pod).containers[0].devices[0]
    assert device.cu_count == 4
    assert device.cu_ranges[0][0] % 2 == 0 and (device.cu_ranges[0][1] + 1) % 2 == 0
    await delete_pod(kube, "rdna")


async def test_seed_binpack_two_users_share_two_physical_gpus(ready, kube: Kube) -> None:
    # Both ask for a share of the compute too: under omittedCores Exclusive a memory-only slice
    # would hold each GPU's whole compute range and nobody could share it.
    await create_pod(kube, gpu_pod("user-a", gpu="2", gpumem="10240", gpucores="25", node_selector=MI210))
    await wait_running(kube, "user-a")
    await create_pod(kube, gpu_pod("user-b", gpu="2", gpumem="20480", gpucores="50", node_selector=MI210))
    await wait_running(kube, "user-b")
    assert sorted(await gpu_of(kube, "user-a")) == sorted(await gpu_of(kube, "user-b"))
    for name in ("user-a", "user-b"):
        await delete_pod(kube, name)


async def test_link_bind_lands_inside_one_xgmi_hive_and_five_gpus_do_not_fit(ready, kube: Kube) -> None:
    gpus = (await kube.get(object_path(API_VERSION, "amdgpunodes", MI210_NODE)))["status"]["gpus"]
    hive_of = {gpu["id"]: gpu["hiveId"] for gpu in gpus}
    bind = {"amd.com/link-bind": "true", "amd.com/numa-bind": "true"}
    await create_pod(kube, gpu_pod("hive", gpu="4", gpumem="1024", annotations=bind, node_selector=MI210))
    await wait_running(kube, "hive")
    chosen = await gpu_of(kube, "hive")
    assert len({hive_of[gpu] for gpu in chosen}) == 1, chosen
    await delete_pod(kube, "hive")

    await create_pod(kube, gpu_pod("too-wide", gpu="5", gpumem="1024", annotations={"amd.com/link-bind": "true"},
                                   node_selector=MI210))
    failures = await wait_for(lambda: scheduling_failures(kube, "too-wide"), timeout_s=20,
                              what="a FailedScheduling event")
    assert any("LinkNotFit" in message for message in failures), failures
    assert (await read_pod(kube, "too-wide"))["status"]["phase"] == "Pending"
    await delete_pod(kube, "too-wide")


async def test_quota_keeps_a_pod_pending_until_raised(ready, kube: Kube, cluster) -> None:
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": "team-a"},
             "spec": {"hard": {"limits.amd.com/gpumem": "6000"}}}
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(quota))
    await create_pod(kube, gpu_pod("first", namespace="team-a", gpu="1", gpumem="4096", gpucores="10", node_selector=MI210))
    await wait_running(kube, "first", "team-a")
    await create_pod(kube, gpu_pod("second", namespace="team-a", gpu="1", gpumem="4096", gpucores="10", node_selector=MI210))
    failures = await wait_for(lambda: scheduling_failures(kube, "second", "team-a"), timeout_s=20,
                              what="a FailedScheduling event")
    assert any("ResourceQuotaNotFit" in message for message in failures), failures
    await create_pod(kube, gpu_pod("elsewhere", namespace="team-b", gpu="1", gpumem="4096", gpucores="10",
                                   node_selector=MI210))
    await wait_running(kube, "elsewhere", "team-b")

    quota["spec"]["hard"]["limits.amd.com/gpumem"] = "8192"
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(quota))
    await wait_running(kube, "second", "team-a", timeout_s=90)
    for name, namespace in (("first", "team-a"), ("second", "team-a"), ("elsewhere", "team-b")):
        await delete_pod(kube, name, namespace)
    cluster.kubectl("delete", "resourcequota", "gpu", "-n", "team-a")


async def test_node_without_gpus_takes_no_pods_until_they_return(ready, kube: Kube) -> None:
    node = ready[APU_NODE]
    node.set_gpu_healthy(128, False)
    await wait_for(lambda: _is_zero(allocatable_gpus(kube, APU_NODE)), timeout_s=20, what="allocatable 0")
    await create_pod(kube, gpu_pod("waiting", gpu="1", gpumem="1024", node_selector=APU))
    await asyncio.sleep(3)
    assert (await read_pod(kube, "waiting"))["status"]["phase"] == "Pending"
    node.set_gpu_healthy(128, True)
    await wait_running(kube, "waiting", timeout_s=90)
    await delete_pod(kube, "waiting")


async def _is_zero(value) -> bool:
    return (await value) == 0


async def test_webhook_refuses_bad_pods_with_precise_messages(ready, cluster) -> None:
    # A plain user with the built-in `edit` role: not one of rocshare's trusted writers.
    cluster.kubectl("create", "rolebinding", "alice-edit", "--clusterrole=edit", "--user=alice", "-n", "default")
    kube = await Kube.connect(cluster.user_kubeconfig("alice"))
    cases = [
        (gpu_pod("bad-cores", gpu="1", gpucores="101"), "amd.com/gpucores"),
        (gpu_pod("bad-pct", gpu="1", **{"gpumem-percentage": "150"}), "amd.com/gpumem-percentage"),
        (gpu_pod("no-gpu", gpumem="1024"), "amd.com/gpumem needs amd.com/gpu"),
        ({**gpu_pod("bypass", gpu="1"), "spec": {**gpu_pod("bypass", gpu="1")["spec"], "nodeName": MI210_NODE}},
         "bypass"),
        (gpu_pod("forged", gpu="1", annotations={"rocshare.io/allocation": "{}"}), "rocshare.io/allocation"),
    ]
    try:
        for pod, message in cases:
            with pytest.raises((Invalid, Forbidden)) as refused:
                await create_pod(kube, pod)
            assert message in refused.value.message, refused.value.message
        # Pods without amd.com resources pass untouched.
        plain = await create_pod(kube, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": "default"},
                                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        assert plain["spec"]["schedulerName"] == "default-scheduler"
        # Nor can the user write an allocation onto an existing pod.
        with pytest.raises((Invalid, Forbidden)) as refused:
            await kube.merge_patch(object_path("v1", "pods", "plain", namespace="default"),
                                   {"metadata": {"annotations": {"rocshare.io/allocation": "{}"}}})
        assert "rocshare.io/allocation" in refused.value.message
        await kube.delete(object_path("v1", "pods", "plain", namespace="default"))
    finally:
        await kube.close()


async def test_pool_runtime_class_is_set_on_pods_that_name_none(ready, kube: Kube, cluster) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "rocm"}, "handler": "rocm"}))
    cluster.kubectl("patch", "amdgpupool", "sched-apu", "--type=merge", "-p", '{"spec": {"runtimeClassName": "rocm"}}')
    try:
        async def pool_seen():  # the webhook reads pools from the extender's cache
            try:
                created = await create_pod(kube, gpu_pod("with-class", gpu="1", gpumem="1024", node_selector=APU))
            except Exception:  # noqa: BLE001 - only the outcome below matters
                return None
            if created["spec"].get("runtimeClassName") == "rocm":
                return created
            await delete_pod(kube, "with-class")
            return None
        created = await wait_for(pool_seen, timeout_s=20, what="runtimeClassName rocm on a new pod", every_s=0.5)
        assert created["spec"]["runtimeClassName"] == "rocm"
        await delete_pod(kube, "with-class")
    finally:
        cluster.kubectl("patch", "amdgpupool", "sched-apu", "--type=json",
                        "-p", '[{"op": "remove", "path": "/spec/runtimeClassName"}]')
