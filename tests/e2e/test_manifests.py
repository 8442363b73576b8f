"""The deployment manifests on the real kube-apiserver v1.35:

* every rendered overlay passes `kubectl apply --server-side --dry-run=server` (the API
  server's own validation, CEL compilation of the admission policy and webhook match
  conditions included), after its definitions and namespace land first, as Argo CD's sync
  waves order them;
* the RBAC grants each service account what its code calls, and not what it does not
  (`kubectl auth can-i` as the service account);
* the ValidatingAdmissionPolicy lets the node agent write its own node's objects and refuses
  another node's, with the policy's message, using a real service-account token bound to a
  pod on the node (TokenRequest with boundObjectRef).

Objects applied for real are removed at the end, except namespaces and definitions.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rocshare.api import dra
from rocshare.api.allocation import ALLOCATION_ANNOTATION
from rocshare.api.models import API_VERSION
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, ControlPlane
from rocshare.kube.client import Forbidden, Kube, object_path

pytestmark = pytest.mark.e2e

OVERLAYS = ("dev", "cert-manager")
NAMESPACE = "rocshare-system"
AGENT_SA = "rocshare-node-agent"
OPERATOR_SA = "rocshare-operator"
NODE_A, NODE_B = "vap-node-a", "vap-node-b"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"

# cert-manager's kinds are not installed here: stand-in definitions (any content accepted)
# let the dry run reach them; their content is checked by the unit tests' contract schemas.
CERT_MANAGER_STUB_KINDS = (("Issuer", "issuers"), ("Certificate", "certificates"))


def render(cluster: ControlPlane, path: str) -> list[dict[str, Any]]:
    output = cluster.kubectl("kustomize", str(PROJECT_ROOT / path)).stdout
    return [doc for doc in yaml.safe_load_all(output) if doc]


def apply(cluster: ControlPlane, objects: list[dict[str, Any]], *extra: str) -> str:
    text = yaml.safe_dump_all(objects, sort_keys=False)
    return cluster.kubectl("apply", "--server-side", "--field-manager=rocshare-e2e", *extra, "-f", "-",
                           input_text=text).stdout


def of_kind(objects: list[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] in kinds]


def stub_crd(group: str, kind: str, plural: str) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


@pytest.fixture(scope="module")
def definitions(cluster: ControlPlane) -> None:
    """Sync wave -2 for real: the namespace and the definitions. rocshare's own CRDs are in
    place already (the session fixture applies crds/); Kopf's peering CRD is added here."""
    base = render(cluster, "manifests/base")
    stubs = [stub_crd("cert-manager.io", kind, plural) for kind, plural in CERT_MANAGER_STUB_KINDS]
    foreign = [crd for crd in of_kind(base, "CustomResourceDefinition") if crd["spec"]["group"] != "rocshare.io"]
    apply(cluster, of_kind(base, "Namespace") + foreign + stubs)
    cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_server_side_dry_run(cluster: ControlPlane, definitions: None, overlay: str) -> None:
    objects = render(cluster, f"manifests/overlays/{overlay}")
    # Forced: crds/ went in with `kubectl apply -f`, and kustomize writes the schema's 1.0 as 1,
    # which server-side apply counts as another value of a field kubectl owns. A dry run changes nothing.
    output = apply(cluster, objects, "--dry-run=server", "--force-conflicts")
    applied = [line for line in output.splitlines() if line.strip()]
    assert len(applied) == len(objects), output
    assert all("serverside-applied (server dry run)" in line for line in applied), output



def test_samples_server_side_dry_run(cluster: ControlPlane, definitions: None) -> None:
    """samples/ after its namespace exists (sync wave 2): pools, share and pods pass the API
    server (CRD schemas with defaults and CEL, pod validation)."""
    objects = render(cluster, "samples")
    namespaces = of_kind(objects, "Namespace")
    apply(cluster, namespaces)
    output = apply(cluster, [obj for obj in objects if obj["kind"] != "Namespace"], "--dry-run=server")
    assert output.count("serverside-applied (server dry run)") == len(objects) - len(namespaces), output


# ---- RBAC -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def installed_rbac(cluster: ControlPlane, definitions: None) -> Iterator[list[dict[str, Any]]]:
    """The service accounts, roles, bindings and the admission policy, applied for real."""
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    objects = of_kind(render(cluster, "manifests/overlays/dev"), *kinds)
    apply(cluster, objects)
    yield objects
    for obj in reversed(objects):
        namespace = obj["metadata"].get("namespace")
        args = ["delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found", "--wait=false"]
        cluster.kubectl(*args, *(["-n", namespace] if namespace else []))


def can_i(cluster: ControlPlane, account: str, verb: str, resource: str, *, namespace: str | None = None,
          name: str | None = None, subresource: str | None = None) -> bool:
    args = ["auth", "can-i", verb, resource + (f"/{name}" if name else ""),
            f"--as=system:serviceaccount:{NAMESPACE}:{account}"]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    args += [f"--subresource={subresource}"] if subresource else []
    result = cluster.kubectl(*args, check=False)
    assert result.stdout.strip() in ("yes", "no"), (args, result.stdout, result.stderr)
    return result.stdout.strip() == "yes"


OPERATOR_NEEDS = [
    ("list", "amdgpupools.rocshare.io"), ("watch", "amdgpupools.rocshare.io"), ("patch", "amdgpupools.rocshare.io"),
    ("patch", "amdgpupools.rocshare.io", None, None, "status"),
    ("list", "amdgpushares.rocshare.io"), ("patch", "amdgpushares.rocshare.io", None, None, "status"),
    ("watch", "amdgpunodes.rocshare.io"), ("patch", "nodes"), ("watch", "nodes"),
    ("patch", "amdgpunodes.rocshare.io", None, None, "status"),  # status.isolation (the pool loop, issue 41)
    ("get", "pods"), ("patch", "pods"), ("watch", "pods"), ("create", "pods", None, None, "binding"),
    ("delete", "pods"), ("patch", "pods", None, None, "status"), ("list", "poddisruptionbudgets.policy"),
    ("create", "resourcequotas"), ("patch", "resourcequotas"), ("watch", "resourcequotas"),
    ("patch", "resourcequotas", None, None, "status"),  # the used entries only rocshare counts (issue 43)
    ("create", "daemonsets.apps", NAMESPACE), ("patch", "daemonsets.apps", NAMESPACE), ("create", "events"),
    ("patch", "clusterkopfpeerings.kopf.dev", None, "rocshare"), ("watch", "clusterkopfpeerings.kopf.dev"),
    ("get", "clusterkopfpeerings.kopf.dev", None, "rocshare"), ("create", "clusterkopfpeerings.kopf.dev"),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
    # kube-scheduler, through system:kube-scheduler, system:volume-scheduler and our Role:
    ("create", "bindings"), ("create", "leases.coordination.k8s.io", NAMESPACE),
    ("update", "leases.coordination.k8s.io", NAMESPACE, "rocshare-scheduler"),
    ("update", "leases.coordination.k8s.io", NAMESPACE, "rocshare-dra-scheduler"),  # DRA mode's (issue 42)
    ("get", "configmaps", "kube-system", "extension-apiserver-authentication"),
    ("watch", "persistentvolumeclaims"),
    # dev overlay: its own self-signed certificate and caBundle
    ("get", "secrets", NAMESPACE, "rocshare-webhook-tls"),
    ("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io", None, "rocshare-pods"),
]
OPERATOR_MUST_NOT = [
    ("update", "pods"), ("delete", "nodes"), ("create", "nodes"), ("list", "secrets"),
    ("get", "secrets", NAMESPACE, "some-other-secret"), ("delete", "amdgpupools.rocshare.io"),
    ("create", "amdgpunodes.rocshare.io"), ("patch", "amdgpunodes.rocshare.io"),
    ("delete", "daemonsets.apps", NAMESPACE), ("patch", "clusterkopfpeerings.kopf.dev", None, "other"),
    ("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io", None, "someone-elses"),
    ("update", "leases.coordination.k8s.io", NAMESPACE, "someone-elses-lease"),
]
AGENT_NEEDS = [
    ("get", "nodes"), ("patch", "nodes"), ("create", "amdgpunodes.rocshare.io"),
    ("patch", "amdgpunodes.rocshare.io", None, None, "status"),
    ("list", "pods"), ("watch", "pods"), ("patch", "pods"), ("create", "events", "default"),
    ("create", "events", "gpu-team"),  # NoMemoryLimit on a slice pod, narrowed by the policy
]
AGENT_MUST_NOT = [
    ("create", "nodes"), ("delete", "nodes"), ("list", "nodes"), ("patch", "nodes", None, None, "status"),
    ("delete", "amdgpunodes.rocshare.io"), ("patch", "amdgpunodes.rocshare.io"), ("get", "pods"),
    ("delete", "pods"), ("create", "pods", None, None, "binding"), ("patch", "events", NAMESPACE),
    ("list", "secrets"), ("patch", "amdgpupools.rocshare.io"), ("list", "amdgpupools.rocshare.io"),
]


def _check(cluster: ControlPlane, account: str, rows: list[tuple], expected: bool) -> None:
    wrong = [row for row in rows
             if can_i(cluster, account, row[0], row[1], **dict(zip(("namespace", "name", "subresource"), row[2:])))
             is not expected]
    assert not wrong, f"{account}: expected can-i {'yes' if expected else 'no'} for {wrong}"


def test_operator_rbac_grants_what_the_code_calls_and_no_more(cluster: ControlPlane, installed_rbac) -> None:
    _check(cluster, OPERATOR_SA, OPERATOR_NEEDS, True)
    _check(cluster, OPERATOR_SA, OPERATOR_MUST_NOT, False)


def test_agent_rbac_grants_what_the_code_calls_and_no_more(cluster: ControlPlane, installed_rbac) -> None:
    _check(cluster, AGENT_SA, AGENT_NEEDS, True)
    _check(cluster, AGENT_SA, AGENT_MUST_NOT, False)


# ---- the node agent's admission policy ----------------------------------------------------------


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"rocshare.io/pool": "p"}}}


def agent_pod(name: str, node_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {"team": "gpu"}},
            "spec": {"nodeName": node_name, "serviceAccountName": AGENT_SA,
                     "containers": [{"name": "agent", "image": "rocshare/node-agent:0.1.0"}]}}


def gpu_node(name: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": name}, "spec": {}}


def node_event(node_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{node_name}.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name},
            "reason": "AMDGPUUnhealthy", "message": "test", "type": "Warning",
            "source": {"component": "rocshare-agent", "host": node_name}}


async def request_token(kube: Kube, *, bound_pod: dict[str, Any] | None) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 600}
    if bound_pod is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": bound_pod["metadata"]["name"],
                                  "uid": bound_pod["metadata"]["uid"]}
    reply = await kube.create(object_path("v1", "serviceaccounts", AGENT_SA, namespace=NAMESPACE, subresource="token"),
                              {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
    return reply["status"]["token"]


def token_kubeconfig(cluster: ControlPlane, token: str, path: Path) -> Path:
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "agent",
              "clusters": admin["clusters"],
              "users": [{"name": "agent", "user": {"token": token}}],
              "contexts": [{"name": "agent", "context": {"cluster": admin["clusters"][0]["name"], "user": "agent"}}]}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
async def node_objects(cluster: ControlPlane, installed_rbac) -> AsyncIterator[dict[str, dict[str, Any]]]:
    """Nodes A and B, an agent pod bound to each (no kubelet: they stay Pending), B's AmdGpuNode."""
    async with await Kube.connect(cluster.kubeconfig) as admin:
        created: dict[str, dict[str, Any]] = {}
        for name in (NODE_A, NODE_B):
            created[name] = await admin.create(object_path("v1", "nodes"), node(name))
        for suffix, node_name in (("a", NODE_A), ("b", NODE_B)):
            created[f"pod-{suffix}"] = await admin.create(object_path("v1", "pods", namespace=NAMESPACE),
                                                          agent_pod(f"vap-agent-{suffix}", node_name))
        await admin.create(object_path(API_VERSION, "amdgpunodes"), gpu_node(NODE_B))
        yield created
        for suffix in ("a", "b"):
            await admin.request("DELETE", object_path("v1", "pods", f"vap-agent-{suffix}", namespace=NAMESPACE),
                                query={"gracePeriodSeconds": "0"})
        for name in (NODE_A, NODE_B):
            await admin.delete(object_path(API_VERSION, "amdgpunodes", name))
            await admin.delete(object_path("v1", "nodes", name))


def resource_slice(name: str, node_name: str, driver: str = dra.DRIVER_NAME) -> dict[str, Any]:
    return {"apiVersion": dra.RESOURCE_API_VERSION, "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node_name, "devices": [{"name": "gpu-0"}],
                     "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1}}}


async def forbidden_soon(call: Callable[[], Awaitable[Any]], timeout_s: float = 30.0) -> None:
    """Wait until `call` (a dry run) is refused: a new policy takes a few seconds to be enforced."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await call()
        except Forbidden:
            return
        assert time.monotonic() < deadline, "the policy is still not enforced"
        await asyncio.sleep(0.5)


@pytest.fixture
async def agent_on_a(cluster: ControlPlane, kube: Kube, node_objects, tmp_path: Path) -> AsyncIterator[Kube]:
    token = await request_token(kube, bound_pod=node_objects["pod-a"])
    async with await Kube.connect(token_kubeconfig(cluster, token, tmp_path / "agent-a.kubeconfig")) as agent:
        # The policy was just applied: wait until it is enforced (dry runs refused) before testing it.
        await forbidden_soon(lambda: agent.request("POST", object_path(API_VERSION, "amdgpunodes"),
                                                   body=gpu_node("vap-probe"), query={"dryRun": "All"}))
        await forbidden_soon(lambda: agent.request("POST", object_path(dra.RESOURCE_API_VERSION, "resourceslices"),
                                                   body=resource_slice("vap-probe", NODE_B), query={"dryRun": "All"}))
        yield agent


async def test_bound_token_carries_the_node_name(agent_on_a: Kube) -> None:
    review = await agent_on_a.create("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                     {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{AGENT_SA}"
    assert user["extra"][NODE_NAME_EXTRA] == [NODE_A], json.dumps(user)


async def test_agent_writes_its_own_amdgpunode_and_not_another(agent_on_a: Kube) -> None:
    await agent_on_a.create(object_path(API_VERSION, "amdgpunodes"), gpu_node(NODE_A))
    status = {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": NODE_A},
              "status": {"agentVersion": "e2e", "gpus": []}}
    applied = await agent_on_a.apply(object_path(API_VERSION, "amdgpunodes", NODE_A, subresource="status"),
                                     status, field_manager="rocshare-agent")
    assert applied["status"]["agentVersion"] == "e2e"

    with pytest.raises(Forbidden) as refused:
        await agent_on_a.create(object_path(API_VERSION, "amdgpunodes"), gpu_node("vap-node-c"))
    assert "rocshare-node-agent-own-node" in refused.value.message
    assert f"rocshare-node-agent on node {NODE_A} may only write its own node's objects" in refused.value.message

    other = {**status, "metadata": {"name": NODE_B}}
    with pytest.raises(Forbidden) as refused:
        await agent_on_a.apply(object_path(API_VERSION, "amdgpunodes", NODE_B, subresource="status"),
                               other, field_manager="rocshare-agent")
    assert f"not amdgpunodes/status {NODE_B} of node {NODE_B}" in refused.value.message


async def test_agent_labels_its_own_node_only(agent_on_a: Kube, node_objects) -> None:
    def labels(name: str, values: dict[str, str]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": node_objects[name]["metadata"]["uid"],
                "labels": values, "annotations": {"hami.io/node-amd-register": "[]"}}}

    applied = await agent_on_a.apply(object_path("v1", "nodes", NODE_A),
                                     labels(NODE_A, {"amd.com/gpu.family": "AI"}), field_manager="rocshare-agent")
    assert applied["metadata"]["labels"]["amd.com/gpu.family"] == "AI"
    with pytest.raises(Forbidden) as refused:
        await agent_on_a.apply(object_path("v1", "nodes", NODE_B), labels(NODE_B, {"amd.com/gpu.family": "AI"}),
                               field_manager="rocshare-agent")
    assert f"not nodes {NODE_B} of node {NODE_B}" in refused.value.message
    with pytest.raises(Forbidden) as refused:  # the pool mark is the operator's
        await agent_on_a.merge_patch(object_path("v1", "nodes", NODE_A),
                                     {"metadata": {"labels": {"rocshare.io/pool": "stolen"}}})
    assert "may change only its Node's amd.com/gpu.* labels" in refused.value.message
    with pytest.raises(Forbidden):  # nor may it cordon its node
        await agent_on_a.merge_patch(object_path("v1", "nodes", NODE_A), {"spec": {"unschedulable": True}})


async def test_agent_annotates_pods_on_its_node_only(agent_on_a: Kube, node_objects) -> None:
    pod_a = object_path("v1", "pods", "vap-agent-a", namespace=NAMESPACE)
    patched = await agent_on_a.merge_patch(pod_a, {"metadata": {
        "uid": node_objects["pod-a"]["metadata"]["uid"], "annotations": {"rocshare.io/allocated": "2026-01-01T00:00:00Z"}}})
    assert patched["metadata"]["annotations"]["rocshare.io/allocated"] == "2026-01-01T00:00:00Z"
    with pytest.raises(Forbidden) as refused:
        await agent_on_a.merge_patch(object_path("v1", "pods", "vap-agent-b", namespace=NAMESPACE),
                                     {"metadata": {"annotations": {"rocshare.io/allocated": "2026-01-01T00:00:00Z"}}})
    assert f"not pods vap-agent-b of node {NODE_B}" in refused.value.message
    with pytest.raises(Forbidden) as refused:  # its own node's pod, but not an annotation of its own
        await agent_on_a.merge_patch(pod_a, {"metadata": {"annotations": {"rocshare.io/allocation": "forged"}}})
    assert "may change only the rocshare.io/allocated and rocshare.io/allocation-error" in refused.value.message


async def test_agent_posts_events_about_its_own_node_only(agent_on_a: Kube) -> None:
    await agent_on_a.create(object_path("v1", "events", namespace="default"), node_event(NODE_A))
    with pytest.raises(Forbidden) as refused:
        await agent_on_a.create(object_path("v1", "events", namespace="default"), node_event(NODE_B))
    assert f"of node {NODE_B}" in refused.value.message


def pod_event(reason: str, host: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "slice.", "namespace": NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "slice", "namespace": NAMESPACE},
            "reason": reason, "message": "test", "type": "Warning",
            "source": {"component": "rocshare-agent", "host": host}}


async def test_agent_warns_on_pods_only_of_a_missing_memory_hook_from_its_own_node(agent_on_a: Kube) -> None:
    events = object_path("v1", "events", namespace=NAMESPACE)
    await agent_on_a.create(events, pod_event("NoMemoryLimit", NODE_A))
    await agent_on_a.create(events, pod_event("LoadCheckNotRun", NODE_A))  # the load check never ran there
    for reason, host in (("NoMemoryLimit", NODE_B), ("LoadCheckNotRun", NODE_B), ("Evicted", NODE_A)):
        with pytest.raises(Forbidden):
            await agent_on_a.create(events, pod_event(reason, host))


async def test_token_not_bound_to_a_node_writes_nothing(cluster: ControlPlane, kube: Kube, node_objects,
                                                         tmp_path: Path) -> None:
    token = await request_token(kube, bound_pod=None)
    async with await Kube.connect(token_kubeconfig(cluster, token, tmp_path / "unbound.kubeconfig")) as agent:
        with pytest.raises(Forbidden) as refused:
            await agent.create(object_path(API_VERSION, "amdgpunodes"), gpu_node("vap-node-d"))
    assert "not bound to a pod on a node" in refused.value.message


# ---- the agent's DRA rights, and the claim record and consumers (issue 39) ---------------------


def claim_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    return object_path(dra.RESOURCE_API_VERSION, "resourceclaims", name, namespace=namespace, subresource=subresource)


def gpu_claim(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": dra.RESOURCE_API_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS_NAME}}]}}}


async def allocated_claim(admin: Kube, namespace: str, name: str, node_name: str, driver: str = dra.DRIVER_NAME,
                          reserved_for: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A claim allocated one device on `node_name` (written as kube-scheduler would, as the admin)."""
    await admin.create(claim_path(namespace), gpu_claim(name))
    status: dict[str, Any] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": driver, "pool": node_name, "device": "gpu-0"}]}}}
    if reserved_for:
        status["reservedFor"] = reserved_for
    return await admin.merge_patch(claim_path(namespace, name, "status"), {"status": status})


def reservation(pod: dict[str, Any]) -> dict[str, Any]:
    return {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}


@pytest.fixture
async def claim_objects(cluster: ControlPlane, node_objects, kube: Kube) -> AsyncIterator[None]:
    """The DRA policies enforced (dry runs refused), then removes the slices and claims the tests make."""
    await forbidden_soon(lambda: kube.request("POST", claim_path(NAMESPACE), query={"dryRun": "All"},
                                              body=gpu_claim("vap-probe", {ALLOCATION_ANNOTATION: "{}"})))
    yield
    async with await Kube.connect(cluster.kubeconfig) as admin:
        for name in ("vap-slice-a", "vap-slice-b", "vap-slice-other"):
            await admin.delete(object_path(dra.RESOURCE_API_VERSION, "resourceslices", name))
        for claim in (await admin.list(claim_path(NAMESPACE)))["items"]:
            if claim["metadata"]["name"].startswith("vap-"):
                await admin.delete(claim_path(NAMESPACE, claim["metadata"]["name"]))


async def test_agent_writes_its_own_nodes_resource_slice_of_its_driver_only(agent_on_a: Kube, kube: Kube,
                                                                            claim_objects) -> None:
    slices = object_path(dra.RESOURCE_API_VERSION, "resourceslices")
    await agent_on_a.create(slices, resource_slice("vap-slice-a", NODE_A))
    await agent_on_a.merge_patch(f"{slices}/vap-slice-a", {"metadata": {"labels": {"e2e": "yes"}}})
    with pytest.raises(Forbidden) as refused:
        await agent_on_a.create(slices, resource_slice("vap-slice-b", NODE_B))
    assert f"not resourceslices vap-slice-b of node {NODE_B}" in refused.value.message
    with pytest.raises(Forbidden) as refused:  # its own node, but another driver's
        await agent_on_a.create(slices, resource_slice("vap-slice-other", NODE_A, driver="other.example.com"))
    assert "only ResourceSlices of the driver gpu.rocshare.io" in refused.value.message
    await kube.create(slices, resource_slice("vap-slice-b", NODE_B))  # as the node B agent would
    with pytest.raises(Forbidden) as refused:
        await agent_on_a.delete(f"{slices}/vap-slice-b")
    assert f"of node {NODE_B}" in refused.value.message
    await kube.get(f"{slices}/vap-slice-b")
    await agent_on_a.delete(f"{slices}/vap-slice-a", missing_ok=False)


async def test_agent_writes_only_the_record_of_claims_allocated_on_its_node(agent_on_a: Kube, kube: Kube,
                                                                            claim_objects) -> None:
    mine = await allocated_claim(kube, NAMESPACE, "vap-claim-a", NODE_A)
    await allocated_claim(kube, NAMESPACE, "vap-claim-b", NODE_B)
    await kube.create(claim_path(NAMESPACE), gpu_claim("vap-claim-unallocated"))
    record = {"metadata": {"uid": mine["metadata"]["uid"], "annotations": {ALLOCATION_ANNOTATION: "{}"}}}
    patched = await agent_on_a.merge_patch(claim_path(NAMESPACE, "vap-claim-a"), record)
    assert patched["metadata"]["annotations"][ALLOCATION_ANNOTATION] == "{}"
    with pytest.raises(Forbidden) as refused:  # its own node's claim, but not its annotation
        await agent_on_a.merge_patch(claim_path(NAMESPACE, "vap-claim-a"), {"metadata": {"annotations": {"team": "x"}}})
    assert "may change only the rocshare.io/allocation annotation" in refused.value.message
    for name, node_name in (("vap-claim-b", NODE_B), ("vap-claim-unallocated", "(none)")):
        with pytest.raises(Forbidden) as refused:
            await agent_on_a.merge_patch(claim_path(NAMESPACE, name),
                                         {"metadata": {"annotations": {ALLOCATION_ANNOTATION: "{}"}}})
        assert f"not resourceclaims {name} of node {node_name}" in refused.value.message


@pytest.fixture(scope="module")
async def tenant(cluster: ControlPlane, installed_rbac) -> AsyncIterator[Kube]:
    """A user who may create, read and patch ResourceClaims in the namespace (as `edit` may)."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "vap-claim-tenant", "namespace": NAMESPACE},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
                       "verbs": ["get", "create", "patch", "update"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "vap-claim-tenant", "namespace": NAMESPACE},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vap-claim-tenant"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "vap-tenant"}]}
    apply(cluster, [role, binding])
    async with await Kube.connect(cluster.user_kubeconfig("vap-tenant")) as client:
        yield client
    cluster.kubectl("delete", "rolebinding,role", "vap-claim-tenant", "-n", NAMESPACE, "--ignore-not-found")


async def test_a_tenant_cannot_write_the_record_on_its_claim(agent_on_a: Kube, kube: Kube, tenant: Kube,
                                                            claim_objects) -> None:
    forged = '{"version":1,"node":"' + NODE_A + '","containers":[]}'
    with pytest.raises(Forbidden) as refused:  # nor on a new claim (a template's annotations are copied too)
        await tenant.create(claim_path(NAMESPACE), gpu_claim("vap-claim-forged", {ALLOCATION_ANNOTATION: forged}))
    assert "only the rocshare node agent of the claim's node may write rocshare.io/* annotations" \
        in refused.value.message
    claim = await allocated_claim(kube, NAMESPACE, "vap-claim-tenant", NODE_A)
    await tenant.merge_patch(claim_path(NAMESPACE, "vap-claim-tenant"), {"metadata": {"annotations": {"team": "x"}}})
    await agent_on_a.merge_patch(claim_path(NAMESPACE, "vap-claim-tenant"), {"metadata": {
        "uid": claim["metadata"]["uid"], "annotations": {ALLOCATION_ANNOTATION: "{}"}}})
    for value in (forged, None):  # rewrite it, or remove it
        with pytest.raises(Forbidden) as refused:
            await tenant.merge_patch(claim_path(NAMESPACE, "vap-claim-tenant"),
                                     {"metadata": {"annotations": {ALLOCATION_ANNOTATION: value}}})
        assert "rocshare-resourceclaim-records" in refused.value.message
    stored = await kube.get(claim_path(NAMESPACE, "vap-claim-tenant"))
    assert stored["metadata"]["annotations"] == {"team": "x", ALLOCATION_ANNOTATION: "{}"}


async def test_a_claim_of_the_driver_is_reserved_for_one_pod_at_most(kube: Kube, node_objects, claim_objects) -> None:
    pods = [reservation(node_objects["pod-a"]), reservation(node_objects["pod-b"])]
    reserved = await allocated_claim(kube, NAMESPACE, "vap-claim-one", NODE_A, reserved_for=pods[:1])
    assert [entry["name"] for entry in reserved["status"]["reservedFor"]] == ["vap-agent-a"]
    with pytest.raises(Forbidden) as refused:  # the second pod kube-scheduler would add
        await kube.merge_patch(claim_path(NAMESPACE, "vap-claim-one", "status"), {"status": {"reservedFor": pods}})
    assert "reserved for one pod at most (asked: 2)" in refused.value.message
    shared = await allocated_claim(kube, NAMESPACE, "vap-claim-other-driver", NODE_A, driver="other.example.com",
                                   reserved_for=pods)
    assert len(shared["status"]["reservedFor"]) == 2  # another driver's claims are not ours to limit


@pytest.mark.parametrize("policy", ["rocshare-node-agent-own-node", "rocshare-resourceclaim-records",
                                    "rocshare-resourceclaim-one-consumer"])
def test_policy_is_type_checked_clean(cluster: ControlPlane, installed_rbac, policy: str) -> None:
    """The API server type-checks the policy's CEL against the matched kinds: no warnings."""
    stored = json.loads(cluster.kubectl("get", "validatingadmissionpolicy", policy, "-o", "json").stdout)
    warnings = (stored.get("status") or {}).get("typeChecking", {}).get("expressionWarnings") or []
    assert warnings == [], warnings

