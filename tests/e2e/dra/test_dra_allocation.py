"""rocshare as a DRA driver on Kubernetes 1.37.2: the node agent (a real process, in DRA mode, on a
simulated node with the Vega10 capture: one GPU, 64 CUs, 16368 MiB) publishes its ResourceSlice,
the real kube-scheduler allocates ResourceClaims with capacity requests from it, and the agent's
DRA plugin, called over its real socket as the kubelet calls it, prepares them. The kubelet peer
runs the kubelet's own plugin and DRA managers: it registers the plugin, prepares each bound pod's
claims before it reports the pod Running, with what the container received, and unprepares them
when the pod is deleted; the tests below also call the plugin themselves, as a kubelet would.

Evidence comes from the API server (the stored slice, the claims' allocation results, the pods'
scheduling conditions) and from the CDI specs the plugin wrote; every expected number is worked out
here from the capture (64 CUs, 16368 MiB) and the requests.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import uuid
from pathlib import Path

import grpc
import pytest

from rocshare.api.models import API_VERSION, Sharing
from rocshare.core.dra_claims import claim_spec, shape_classes_of
from rocshare.core.inventory import NodeInventory
from rocshare.core.quantity import memory_mib_quantity, whole_quantity
from rocshare.core.request import ContainerRequest
from rocshare.kube.client import Kube, NotFound, object_path
from rocshare_agent.discovery import discover
from rocshare_agent.dra import dra_pb2 as pb
from rocshare_agent.dra import dra_pb2_grpc as pb_grpc
from rocshare_agent.dra import registration_pb2 as reg_pb
from rocshare_agent.dra import registration_pb2_grpc as reg_grpc
from rocshare_agent.dra.server import plugin_socket, registration_socket
from rocshare_dev.devcluster.evidence import inventories, shares_of
from rocshare_dev.devcluster.simnode import SimulatedNode, runtime_specs
from tests.e2e.fleet import wait_for

pytestmark = pytest.mark.e2e

MIB = 2**20
VEGA_MIB, VEGA_CUS = 16368, 64
DEVICE = "gpu-c34ec50444dd0a6c"
WHOLE_DEVICE = f"{DEVICE}-whole"
OFFERED = 2
"""Devices the Vega10 node publishes on 1.37: its whole twin and its shared device."""
RESOURCE = "/apis/resource.k8s.io/v1"
NAMESPACE = "default"


def dra_node(cluster, capture: Path, prefix: str) -> SimulatedNode:
    """A simulated node whose agent runs in DRA mode, its kubelet folders and CDI folder under its root
    (a short folder in /tmp: a unix socket's path holds at most 107 bytes, pytest's tmp_path is longer).
    Its agent offers each shared GPU whole too (--dra-whole-twins): this file's schedulers are 1.37.2."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    return SimulatedNode(name=name, kubeconfig=cluster.kubeconfig, sysfs_root=capture, work_dir=work,
                         bin_dir=cluster.bin_dir, health_interval_s=0.3, dra=True, agent_args=("--dra-whole-twins",))


@pytest.fixture(scope="module")
def node(cluster, sysfs_fixtures):
    sim = dra_node(cluster, sysfs_fixtures / "vega10-1gpu", "dra-vega")
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()
        shutil.rmtree(sim.root.parent, ignore_errors=True)


def slice_path(node: SimulatedNode) -> str:
    return f"{RESOURCE}/resourceslices/{node.name}-gpu.rocshare.io"


def counters_path(node: SimulatedNode) -> str:
    return f"{RESOURCE}/resourceslices/{node.name}-gpu.rocshare.io-counters"


async def stored_slice(kube: Kube, node: SimulatedNode) -> dict | None:
    try:
        return await kube.get(slice_path(node))
    except NotFound:
        return None


def claim_body(name: str, **capacity: str) -> dict:
    exactly: dict = {"deviceClassName": "gpu.rocshare.io"}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def pod_body(name: str, claim: str, node: SimulatedNode) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": "rocm/pytorch",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


async def claim_with_pod(kube: Kube, node: SimulatedNode, name: str, **capacity: str) -> None:
    await kube.create(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims", claim_body(name, **capacity))
    await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(f"pod-{name}", name, node))


async def allocation(kube: Kube, name: str) -> dict | None:
    claim = await kube.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{name}")
    return (claim.get("status") or {}).get("allocation")


async def allocated(kube: Kube, name: str) -> dict:
    return await wait_for(lambda: allocation(kube, name), timeout_s=30, what=f"claim {name} allocated")


async def unschedulable_message(kube: Kube, pod: str) -> str | None:
    stored = await kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
    for condition in (stored.get("status") or {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return condition.get("message") or condition.get("reason")
    return None


def consumed(result: dict) -> tuple[int, int, int]:
    """(MiB, CUs, shares) of one allocation result, read from the API server's quantities."""
    capacity = result["consumedCapacity"]
    return (memory_mib_quantity(capacity["memory"]), whole_quantity(capacity["compute"], name="compute", unit="CUs"),
            whole_quantity(capacity["shares"], name="shares", unit="shares"))


async def as_kubelet(node: SimulatedNode, method: str, *claims: tuple[str, str], namespace: str = NAMESPACE):
    endpoint = plugin_socket(node.root / "plugins")
    async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
        stub = pb_grpc.DRAPluginStub(channel)
        wanted = [pb.Claim(namespace=namespace, name=name, uid=uid) for name, uid in claims]
        if method == "prepare":
            return await stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=wanted))
        return await stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=wanted))


async def claim_uid(kube: Kube, name: str) -> str:
    return (await kube.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{name}"))["metadata"]["uid"]


def cdi_env(node: SimulatedNode, uid: str) -> dict[str, str]:
    spec = json.loads((node.root / "cdi" / f"rocshare.io-gpu_{uid}.json").read_text())
    return dict(item.split("=", 1) for item in spec["devices"][0]["containerEdits"]["env"])


async def test_the_agent_publishes_its_slice_and_follows_health(kube, node):
    body = await wait_for(lambda: stored_slice(kube, node), timeout_s=30, what="the node's ResourceSlice")
    assert body["spec"]["driver"] == "gpu.rocshare.io" and body["spec"]["nodeName"] == node.name
    assert body["metadata"]["ownerReferences"][0]["kind"] == "Node"
    node_uid = (await kube.get(object_path("v1", "nodes", node.name)))["metadata"]["uid"]
    assert body["metadata"]["ownerReferences"][0]["uid"] == node_uid
    # 1.37 serves shared counters: the GPU is offered whole (its twin, first) and shared, one counter for both.
    twin, device = body["spec"]["devices"]
    assert twin["name"] == WHOLE_DEVICE and "allowMultipleAllocations" not in twin
    assert twin["consumesCounters"] == device["consumesCounters"] == [
        {"counterSet": DEVICE, "counters": {"gpu": {"value": "1"}}}]
    counters = await kube.get(counters_path(node))
    assert counters["spec"]["sharedCounters"] == [{"name": DEVICE, "counters": {"gpu": {"value": "1"}}}]
    assert counters["spec"]["pool"] == body["spec"]["pool"] and body["spec"]["pool"]["resourceSliceCount"] == 2
    assert device["name"] == DEVICE and device["allowMultipleAllocations"] is True  # kept: the gate is on
    memory, compute = device["capacity"]["memory"], device["capacity"]["compute"]
    assert memory_mib_quantity(memory["value"]) == VEGA_MIB
    assert memory_mib_quantity(memory["requestPolicy"]["validRange"]["step"]) == 1
    assert whole_quantity(compute["value"], name="compute", unit="CUs") == VEGA_CUS
    assert compute["requestPolicy"]["default"] == str(VEGA_CUS)
    assert device["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:19:00.0"}
    generation = body["spec"]["pool"]["generation"]

    node.set_gpu_healthy(128, False)  # renderD128 gone: the device is lost
    sick = await wait_for(lambda: _with_devices(kube, node, 0), timeout_s=15, what="the sick GPU left out")
    assert sick["spec"]["pool"] == {"name": node.name, "generation": generation + 1, "resourceSliceCount": 1}
    assert await gone(kube, counters_path(node))  # nothing to twin: the counters slice goes
    node.set_gpu_healthy(128, True)
    back = await wait_for(lambda: _with_devices(kube, node, OFFERED), timeout_s=15, what="the GPU offered again")
    assert back["spec"]["pool"]["generation"] == generation + 2


async def _with_devices(kube: Kube, node: SimulatedNode, count: int) -> dict | None:
    body = await stored_slice(kube, node)
    return body if body is not None and len(body["spec"].get("devices", [])) == count else None  # [] is omitted


async def running_specs(kube: Kube, pod: str) -> dict | None:
    stored = await kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
    return runtime_specs(stored) if (stored.get("status") or {}).get("phase") == "Running" else None


async def gone(kube: Kube, path: str) -> bool:
    try:
        await kube.get(path)
    except NotFound:
        return True
    return False


async def test_a_claim_runs_on_the_simulated_node_with_its_cdi_device_and_is_unprepared_on_delete(kube, node):
    """The kubelet peer prepares the claim over the plugin's socket (found through the registration
    socket) before it reports the pod Running, and the container receives the claim's CDI device and
    the edits of the CDI spec the plugin wrote; deleting the pod unprepares the claim before the pod
    object goes. Runs first on the empty GPU and leaves it empty for the tests after it."""
    await wait_for(lambda: _with_devices(kube, node, OFFERED), timeout_s=30, what="the node's device published")
    await claim_with_pod(kube, node, "runs", memory="2Gi", compute="8")
    specs = await wait_for(lambda: running_specs(kube, "pod-runs"), timeout_s=60, what="pod-runs Running")
    uid = await claim_uid(kube, "runs")
    [result] = (await allocation(kube, "runs"))["devices"]["results"]
    assert consumed(result) == (2048, 8, 1)
    main = specs["main"]
    assert main["cdiDevices"] == [f"rocshare.io/gpu={uid}"]
    # What the container got, against the spec file as the plugin wrote it (read while prepared)...
    spec = json.loads((node.cdi_dir / f"rocshare.io-gpu_{uid}.json").read_text())
    [device] = spec["devices"]
    assert f"{spec['kind']}={device['name']}" == main["cdiDevices"][0]
    edits = device["containerEdits"]
    expected_env = dict(item.split("=", 1) for item in edits["env"])
    assert {key: main["envs"].get(key) for key in expected_env} == expected_env
    assert {(d["hostPath"], d["path"]) for d in edits["deviceNodes"]} <= {
        (d["hostPath"], d["containerPath"]) for d in main["devices"]}
    # ...and against the request, worked out here: the first 8 of 64 CUs of the empty GPU, 2 GiB.
    assert main["envs"]["HSA_CU_MASK"] == "0:0-7" and main["envs"]["HIP_DEVICE_MEMORY_LIMIT_0"] == "2048m"
    assert (str(node.dev_root / "dri" / "renderD128"), "/dev/dri/renderD128") in {
        (d["hostPath"], d["containerPath"]) for d in main["devices"]}
    # The evidence checks read a DRA container as they read a device plugin's.
    gpu_node = await kube.get(object_path(API_VERSION, "amdgpunodes", node.name))
    [share] = shares_of(f"{NAMESPACE}/pod-runs", node.name, specs, inventories([gpu_node])[node.name])
    assert (share.gpu.render_minor, share.memory_mib, share.cu_ranges) == (128, 2048, ((0, 7),))

    pod_path = f"/api/v1/namespaces/{NAMESPACE}/pods/pod-runs"
    await kube.delete(pod_path)  # graceful: the peer unprepares, then removes the pod
    await wait_for(lambda: gone(kube, pod_path), timeout_s=30, what="pod-runs removed by the peer")
    assert not (node.cdi_dir / f"rocshare.io-gpu_{uid}.json").exists()
    claim_path = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/runs"
    await kube.delete(claim_path)
    await wait_for(lambda: gone(kube, claim_path), timeout_s=30, what="claim runs deleted")


async def test_a_whole_gpu_claim_and_shares_of_it_never_overlap_through_the_shared_counter(cluster, kube, node):
    """Partitionable devices (KEP-4815) on kube-scheduler 1.37.2: the GPU's whole twin and its shared
    device consume its one counter. A share held: a claim asking no capacity (the whole GPU) is refused,
    though the twin alone would fit it; the share freed, the claim gets the twin (no shareID, nothing
    consumed) and runs with the whole GPU (no mask, no limit); then a share is refused until the whole
    claim goes. Starts and leaves the GPU empty."""
    await wait_for(lambda: _with_devices(kube, node, OFFERED), timeout_s=30, what="the node's devices published")
    await claim_with_pod(kube, node, "held-share", memory="2Gi", compute="8")
    await wait_for(lambda: running_specs(kube, "pod-held-share"), timeout_s=60, what="the share running")
    [share] = (await allocation(kube, "held-share"))["devices"]["results"]
    assert share["device"] == DEVICE and share["shareID"]
    await claim_with_pod(kube, node, "whole-gpu")
    message = await wait_for(lambda: unschedulable_message(kube, "pod-whole-gpu"), timeout_s=30, what="whole refused")
    assert "cannot allocate all claims" in message and await allocation(kube, "whole-gpu") is None

    await _delete_claim_and_pod(kube, "held-share")
    whole = await wait_for(lambda: running_specs(kube, "pod-whole-gpu"), timeout_s=60, what="the whole claim running")
    [result] = (await allocation(kube, "whole-gpu"))["devices"]["results"]
    assert result["device"] == WHOLE_DEVICE and "shareID" not in result and "consumedCapacity" not in result
    env = whole["main"]["envs"]
    assert "HSA_CU_MASK" not in env and not any(key.startswith("HIP_DEVICE_MEMORY_LIMIT") for key in env)
    assert (str(node.dev_root / "dri" / "renderD128"), "/dev/dri/renderD128") in {
        (d["hostPath"], d["containerPath"]) for d in whole["main"]["devices"]}

    await claim_with_pod(kube, node, "late-share", memory="1Gi", compute="4")
    message = await wait_for(lambda: unschedulable_message(kube, "pod-late-share"), timeout_s=30, what="share refused")
    assert "cannot allocate all claims" in message and await allocation(kube, "late-share") is None
    await _delete_claim_and_pod(kube, "whole-gpu")
    [late] = (await allocated(kube, "late-share"))["devices"]["results"]
    assert late["device"] == DEVICE and consumed(late) == (1024, 4, 1)
    await _delete_claim_and_pod(kube, "late-share")


async def _delete_claim_and_pod(kube: Kube, name: str) -> None:
    """Gracefully: the peer unprepares the claim, then removes the pod; then the claim goes."""
    for path in (f"/api/v1/namespaces/{NAMESPACE}/pods/pod-{name}",
                 f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{name}"):
        await kube.delete(path)
        await wait_for(lambda: gone(kube, path), timeout_s=30, what=f"{path} deleted")


async def test_kube_scheduler_shares_one_gpu_refuses_overflow_and_whole_and_the_plugin_prepares(
        cluster, kube, node):
    await wait_for(lambda: _with_devices(kube, node, OFFERED), timeout_s=30, what="the node's device published")
    await claim_with_pod(kube, node, "share-a", memory="4Gi", compute="16")
    first = await allocated(kube, "share-a")
    await claim_with_pod(kube, node, "share-b", memory="6Gi", compute="24")
    second = await allocated(kube, "share-b")
    [a], [b] = first["devices"]["results"], second["devices"]["results"]
    assert (a["driver"], a["pool"], a["device"]) == (b["driver"], b["pool"], b["device"]) == (
        "gpu.rocshare.io", node.name, DEVICE)
    assert a["shareID"] != b["shareID"]
    assert consumed(a) == (4096, 16, 1) and consumed(b) == (6144, 24, 1)
    # Left on the GPU: 64 - 40 = 24 CUs, 16368 - 10240 MiB. 32 CUs do not fit; nor does the whole GPU.
    await claim_with_pod(kube, node, "too-big", memory="1Gi", compute="32")
    await claim_with_pod(kube, node, "whole")
    for pod in ("pod-too-big", "pod-whole"):
        message = await wait_for(lambda: unschedulable_message(kube, pod), timeout_s=30, what=f"{pod} refused")
        assert "cannot allocate all claims" in message, message
    assert await allocation(kube, "too-big") is None and await allocation(kube, "whole") is None

    # The kubelet's part, over the plugin's real socket: registration, then prepare.
    async with grpc.aio.insecure_channel(f"unix://{registration_socket(node.root / 'registry')}") as channel:
        info = await reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest())
    assert (info.type, info.name, info.endpoint) == (
        "DRAPlugin", "gpu.rocshare.io", str(plugin_socket(node.root / "plugins")))
    uid_a, uid_b = await claim_uid(kube, "share-a"), await claim_uid(kube, "share-b")
    reply = await as_kubelet(node, "prepare", ("share-a", uid_a))
    assert reply.claims[uid_a].error == ""
    assert list(reply.claims[uid_a].devices[0].cdi_device_ids) == [f"rocshare.io/gpu={uid_a}"]
    assert reply.claims[uid_a].devices[0].share_id == a["shareID"]

    # The agent dies after the first prepare; its successor reads the CDI folder back.
    node.stop_agent()
    node.start_agent()
    reply = await wait_for(lambda: _prepared(node, ("share-b", uid_b)), timeout_s=30, what="prepare after restart")
    assert reply.claims[uid_b].error == ""
    env_a, env_b = cdi_env(node, uid_a), cdi_env(node, uid_b)
    assert env_a["HSA_CU_MASK"] == "0:0-15" and env_b["HSA_CU_MASK"] == "0:16-39"  # disjoint, exactly 16 and 24
    assert env_a["HIP_DEVICE_MEMORY_LIMIT_0"] == "4096m" and env_b["HIP_DEVICE_MEMORY_LIMIT_0"] == "6144m"
    again = await as_kubelet(node, "prepare", ("share-a", uid_a))  # a retried prepare: the same answer
    assert list(again.claims[uid_a].devices[0].cdi_device_ids) == [f"rocshare.io/gpu={uid_a}"]
    assert cdi_env(node, uid_a) == env_a

    # Deleting the first pod frees its share: the scheduler's sums and, once unprepared, the CUs.
    cluster.kubectl("delete", "pod", "pod-share-a", "--grace-period=0", "--force", "--wait=false")
    assert (await as_kubelet(node, "unprepare", ("share-a", uid_a))).claims[uid_a].error == ""
    assert not (node.root / "cdi" / f"rocshare.io-gpu_{uid_a}.json").exists()
    await kube.delete(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/share-a")
    big = await wait_for(lambda: allocation(kube, "too-big"), timeout_s=60,
                         what="the pending claim allocated once the first share is gone")  # 40 CUs free: 32 fit
    assert consumed(big["devices"]["results"][0]) == (1024, 32, 1)
    uid_big = await claim_uid(kube, "too-big")
    assert (await as_kubelet(node, "prepare", ("too-big", uid_big))).claims[uid_big].error == ""
    # Free: 0-15 and 40-63. No single gap holds 32: the largest (24) first, then 8 from the other.
    assert cdi_env(node, uid_big)["HSA_CU_MASK"] == "0:0-7,40-63"


async def _prepared(node: SimulatedNode, claim: tuple[str, str]):
    """The reply once the restarted agent serves and has published (before that the kubelet's call
    fails or is refused with ClaimNotAllocated, and the kubelet calls again, as this does)."""
    try:
        reply = await as_kubelet(node, "prepare", claim)
    except grpc.aio.AioRpcError:
        reply = None
    if reply is None or "has not published" in reply.claims[claim[1]].error:
        await asyncio.sleep(0.2)
        return None
    return reply


async def test_rdna_compute_is_rounded_up_to_whole_wgps_by_the_scheduler(cluster, kube, sysfs_fixtures):
    """Strix Point (RDNA 3.5, 12 CUs in WGPs of 2): the slice's compute step makes kube-scheduler
    itself round 5 CUs up to 6, and the plugin pins exactly those 6."""
    apu = dra_node(cluster, sysfs_fixtures / "strixpoint-apu", "dra-apu")
    apu.start()
    try:
        await wait_for(lambda: _with_devices(kube, apu, OFFERED), timeout_s=30, what="the APU's devices published")
        await claim_with_pod(kube, apu, "apu-share", memory="1Gi", compute="5")
        [result] = (await allocated(kube, "apu-share"))["devices"]["results"]
        assert result["pool"] == apu.name and result["device"] == "gpu-pci-0000-c1-00-0"
        assert consumed(result) == (1024, 6, 1)
        uid = await claim_uid(kube, "apu-share")
        assert (await as_kubelet(apu, "prepare", ("apu-share", uid))).claims[uid].error == ""
        env = cdi_env(apu, uid)
        assert env["HSA_CU_MASK"] == "0:0-5" and env["HIP_DEVICE_MEMORY_LIMIT_0"] == "1024m"
        assert env["ROCR_VISIBLE_DEVICES"] == "0"  # an APU without unique_id: named by index

        # HAMi-style percentages as a claim (rocshare.core.dra_claims) naming the DeviceClass of the
        # GPU's shape, written first as admission writes it: the API server compiles the class's CEL
        # and kube-scheduler picks the subrequest of this GPU's shape. 25 % of 12 CUs is 3, a whole
        # WGP more is 4; 50 % of the APU's 15679 MiB is 7839 MiB.
        gpus = discover(sysfs_fixtures / "strixpoint-apu").gpus
        shapes = NodeInventory.from_gpu_infos(apu.name, gpus, Sharing()).gpus
        spec = claim_spec(ContainerRequest("main", False, 1, memory_pct=50, cores_pct=25), shapes)
        for device_class in shape_classes_of(spec, shapes):
            await kube.create(f"{RESOURCE}/deviceclasses", device_class)
        await kube.create(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "apu-percent"},
            "spec": spec})
        await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body("pod-apu-percent", "apu-percent", apu))
        [result] = (await allocated(kube, "apu-percent"))["devices"]["results"]
        assert result["request"] == "gpu/shape0" and consumed(result) == (7839, 4, 1)
    finally:
        apu.stop()
        shutil.rmtree(apu.root.parent, ignore_errors=True)
