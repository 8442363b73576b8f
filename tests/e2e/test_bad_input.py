"""Bad input against the real servers: pods through the real admission webhook (as a plain user
with the built-in `edit` role), CRs through the API server's schema (a share naming a pool loses the
field: docs/accounting.md), broken node annotations and AmdGpuNode statuses seen by the running extender,
and malformed requests POSTed to the running extender. Every refusal says why; the operator
survives all of it (no traceback in its log) and still answers.

Pure cases of the same kinds are in tests/unit/badinput/ and tests/integration/badinput/.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from rocshare.api.models import API_VERSION
from rocshare.api.node_settings import POOL_SETTINGS_ANNOTATION
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare.kube.client import ApiError, Forbidden, Invalid, Kube, object_path
from tests.e2e.fleet import gpu_pod, privileged, wait_for, with_spec

pytestmark = pytest.mark.e2e

NAMESPACE = "badinput"
USER = "bob"


@pytest.fixture(scope="module")
def operator(cluster) -> Iterator[OperatorProcess]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("create", "rolebinding", "bob-edit", "--clusterrole=edit", f"--user={USER}", "-n", NAMESPACE)
    process = OperatorProcess(cluster)
    process.start()
    process.install_webhooks()
    try:
        yield process
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        process.stop()
        cluster.kubectl("delete", "amdgpushares", "--all", "-n", NAMESPACE, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.fixture
async def bob(cluster, operator) -> Kube:
    client = await Kube.connect(cluster.user_kubeconfig(USER))
    try:
        yield client
    finally:
        await client.close()


BAD_PODS = [
    ("cores 150", gpu_pod("b1", namespace=NAMESPACE, gpu="1", gpucores="150"), "amd.com/gpucores is 150, must be 1-100"),
    ("memory with a byte unit", gpu_pod("b2", namespace=NAMESPACE, gpu="1", gpumem="4Gi"),
     "amd.com/gpumem is in MiB: '4Gi' has a binary (byte) suffix"),
    # The API server stores 1.5 as "1500m": the refusal names the value as the webhook reads it.
    ("fractional memory", gpu_pod("b4", namespace=NAMESPACE, gpu="1", gpumem="1.5"),
     "amd.com/gpumem is in MiB: '1500m' is not a whole number"),
    ("percentage 0", gpu_pod("b3", namespace=NAMESPACE, gpu="1", **{"gpumem-percentage": "0"}),
     "amd.com/gpumem-percentage is 0"),
    ("cores without gpu", gpu_pod("b5", namespace=NAMESPACE, gpucores="20"), "amd.com/gpucores needs amd.com/gpu"),
    ("link-bind maybe", gpu_pod("b6", namespace=NAMESPACE, gpu="2", annotations={"amd.com/link-bind": "maybe"}),
     "amd.com/link-bind is 'maybe'"),
    ("nodeName bypass", with_spec(gpu_pod("b7", namespace=NAMESPACE, gpu="1"), nodeName="any-node"),
     "would bypass the rocshare scheduler"),
    ("privileged slice", privileged(gpu_pod("b8", namespace=NAMESPACE, gpu="1", gpumem="1024")),
     "privileged container sees every GPU"),
    ("forged record", gpu_pod("b9", namespace=NAMESPACE, gpu="1", annotations={
        "rocshare.io/allocation": json.dumps({"version": 1, "node": "n", "containers": []})}),
     "rocshare.io/allocation is written only by"),
    ("forged allocated mark", gpu_pod("b10", namespace=NAMESPACE, gpu="1", annotations={"rocshare.io/allocated": "x"}),
     "rocshare.io/allocated is written only by"),
    ("forged record, no GPU asked", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "b11", "namespace": NAMESPACE, "annotations": {"rocshare.io/allocation": "{}"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}, "rocshare.io/allocation is written only by"),
]


@pytest.mark.parametrize(("pod", "message"), [(pod, message) for _, pod, message in BAD_PODS],
                         ids=[case for case, _, _ in BAD_PODS])
async def test_bad_pods_are_refused_by_the_webhook_with_why(bob: Kube, pod: dict, message: str) -> None:
    with pytest.raises((Invalid, Forbidden)) as refused:
        await bob.create(object_path("v1", "pods", namespace=NAMESPACE), pod)
    assert message in refused.value.message, refused.value.message


def pool(name: str, **spec) -> dict:
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": name},
            "spec": {"nodeSelector": {"x": "y"}, **spec}}


BAD_CRS = [
    ("split count as text", pool("bad-1", sharing={"splitCount": "many"}), "splitCount"),
    ("split count 0 < minimum", pool("bad-2", sharing={"splitCount": -1}), "splitCount"),
    ("unknown operating mode", pool("bad-3", sharing={"operatingMode": "mig"}), "operatingMode"),
    ("memory scaling above the maximum", pool("bad-4", sharing={"deviceMemoryScaling": 100}), "deviceMemoryScaling"),
    ("unknown gpu policy", pool("bad-5", scheduling={"gpuPolicy": "random"}), "gpuPolicy"),
    ("share without limits", {"apiVersion": API_VERSION, "kind": "AmdGpuShare",
                              "metadata": {"name": "s1", "namespace": NAMESPACE}, "spec": {}}, "limits"),
    ("share with negative memory", {"apiVersion": API_VERSION, "kind": "AmdGpuShare",
                                    "metadata": {"name": "s2", "namespace": NAMESPACE},
                                    "spec": {"limits": {"memoryMiB": -5}}}, "memoryMiB"),
]


@pytest.mark.parametrize(("body", "field"), [(body, field) for _, body, field in BAD_CRS],
                         ids=[case for case, _, _ in BAD_CRS])
async def test_schema_violations_are_refused_naming_the_field(kube: Kube, operator, body: dict, field: str) -> None:
    plural = "amdgpupools" if body["kind"] == "AmdGpuPool" else "amdgpushares"
    with pytest.raises(Invalid) as refused:
        await kube.create(object_path(API_VERSION, plural, namespace=body["metadata"].get("namespace")), body)
    assert field in refused.value.message, refused.value.message


async def test_a_share_naming_a_pool_loses_the_field_and_limits_its_namespace(kube: Kube, operator) -> None:
    """Shares written for the old schema: the API server prunes `pool`; the share is the namespace's quota."""
    path = object_path(API_VERSION, "amdgpushares", namespace=NAMESPACE)
    created = await kube.create(path, {"apiVersion": API_VERSION, "kind": "AmdGpuShare",
                                       "metadata": {"name": "orphan", "namespace": NAMESPACE},
                                       "spec": {"pool": "no-such-pool", "limits": {"gpus": 2}}})
    assert created["spec"] == {"limits": {"gpus": 2}}

    async def ready_condition():
        share = await kube.get(object_path(API_VERSION, "amdgpushares", "orphan", namespace=NAMESPACE))
        found = [c for c in share.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        return found[0] if found and found[0]["status"] == "True" else None
    condition = await wait_for(ready_condition, timeout_s=20, what="Ready=True on the share")
    assert condition["reason"] == "QuotaApplied"


# ---- the running extender ----------------------------------------------------------------------


def post(cluster, verb: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{cluster.ports.extender}/extender/{verb}", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def gpu(gpu_id: str, index: int) -> dict:
    return {"id": gpu_id, "index": index, "gfxTargetVersion": 90010, "cuCount": 104, "vramMiB": 65520,
            "pciBDF": f"0000:0{index}:00.0", "splitCount": 10, "healthy": True}


async def fake_node(kube: Kube, name: str, gpus: list[dict], annotations: dict | None = None) -> None:
    """A Node and its AmdGpuNode as the kubelet and the agent would write them (no processes). The
    AmdGpuNode comes first so the extender reads the Node's annotations the moment it appears
    (the operator then strips rocshare settings from a node that is in no pool)."""
    path = object_path(API_VERSION, "amdgpunodes", name)
    body = {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": name}}
    await kube.apply(path, body, field_manager="rocshare-agent")
    await kube.apply(path + "/status", {**body, "status": {"gpus": gpus}}, field_manager="rocshare-agent")
    await kube.create(object_path("v1", "nodes"), {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {"badinput": "1"}, "annotations": annotations or {}}})
    await kube.merge_patch(object_path("v1", "nodes", name) + "/status",
                           {"status": {"allocatable": {"amd.com/gpu": "20"}, "capacity": {"amd.com/gpu": "20"}}})


POD = gpu_pod("probe", namespace=NAMESPACE, gpu="1", gpumem="1024", gpucores="10")


async def test_running_extender_flags_bad_node_inputs_and_keeps_answering(cluster, kube: Kube, operator) -> None:
    await fake_node(kube, "bad-twice", [gpu("GPU-aaaa", 0), gpu("GPU-aaaa", 1)])
    await fake_node(kube, "bad-settings", [gpu("GPU-bbbb", 0)], {POOL_SETTINGS_ANNOTATION: '{"version":1,"pool":'})
    await fake_node(kube, "bad-none", [gpu("GPU-cccc", 0)], {POOL_SETTINGS_ANNOTATION: '{"version":1,"pool":"p","sharing":{"splitCount":"x"}}'})
    names = ["bad-twice", "bad-settings", "bad-none", "ghost-node"]

    async def filtered():
        status, reply = await asyncio.to_thread(post, cluster, "filter",
                                                json.dumps({"Pod": POD, "NodeNames": names}).encode())
        unreadable = [name for name in names if "NodeUnreadable" in reply.get("FailedNodes", {}).get(name, "")]
        return reply if status == 200 and len(unreadable) == 3 else None
    reply = await wait_for(filtered, timeout_s=20, what="the extender to see the nodes")
    assert reply["NodeNames"] == []  # nothing it cannot read is offered: never the default settings
    assert "more than once" in reply["FailedNodes"]["bad-twice"]  # a doubled GPU: the node offers nothing
    assert "pool settings cannot be read" in reply["FailedNodes"]["bad-settings"]
    assert "sharing.splitCount" in reply["FailedNodes"]["bad-none"]
    assert "NoGpuInventory" in reply["FailedNodes"]["ghost-node"]  # an unknown node: filtered out, not a crash
    log = operator.log_path.read_text()
    assert "node bad-twice: its AmdGpuNode lists GPU GPU-aaaa more than once" in log
    assert "node bad-settings: its pool settings cannot be read: rocshare.io/pool-settings is invalid" in log
    assert "node bad-none: its pool settings cannot be read: rocshare.io/pool-settings is invalid at sharing.splitCount" in log


@pytest.mark.parametrize(("verb", "body", "status", "message"), [
    ("filter", b'{"Pod": {"metadata"', 400, "not JSON"),
    ("filter", b"[]", 400, "must be a JSON object"),
    ("filter", b'{"NodeNames": ["n"]}', 400, "ExtenderArgs.Pod is missing"),
    ("prioritize", b'{"Pod": {"metadata": {}}, "NodeNames": {"n": 1}}', 400, "NodeNames must be a list"),
    ("bind", b'{"PodName": "x"}', 400, "ExtenderBindingArgs lacks"),
    ("bind", json.dumps({"PodName": "ghost", "PodNamespace": NAMESPACE, "PodUID": "u", "Node": "n"}).encode(), 200,
     "cannot read the pod"),
    ("filter", json.dumps({"Pod": with_spec(POD, containers=[{"name": "c", "resources": {"limits": 5}}]),
                           "NodeNames": ["n"]}).encode(), 200, "limits must be an object, got int"),
    ("unknown", b"{}", 404, "unknown extender verb"),
], ids=["truncated", "array", "no pod", "names as object", "bind without node", "bind unknown pod",
        "pod with a wrong shape", "unknown verb"])
async def test_malformed_extender_requests(cluster, operator, verb, body, status, message) -> None:
    got_status, reply = await asyncio.to_thread(post, cluster, verb, body)
    assert got_status == status and message in reply["Error"], reply


async def test_operator_survived_everything(cluster, kube: Kube, operator) -> None:
    for name in ("bad-twice", "bad-settings", "bad-none"):
        await kube.delete(object_path(API_VERSION, "amdgpunodes", name))
        await kube.delete(object_path("v1", "nodes", name))
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.ports.extender}/readyz", timeout=5) as reply:
        assert reply.status == 200
    assert "Traceback" not in operator.log_path.read_text()
    try:
        await kube.delete(object_path(API_VERSION, "amdgpushares", "orphan", namespace=NAMESPACE))
    except ApiError:
        pass
