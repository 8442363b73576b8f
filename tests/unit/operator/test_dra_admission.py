"""Admission of HAMi-style pods into DRA pools (pure rules, admission/dra_pods.py): which pools a
pod goes to, the claims written for it, and the refusals. Expected claim specs are worked out
here from the request and the GPU (MI210: 104 CUs, 65536 MiB), not read back from the product."""

from __future__ import annotations

import kopf
import pytest

from rocshare.api.models import AmdGpuPoolSpec, GpuInfo, Sharing
from rocshare.api.node_settings import (POOL_LABEL, POOL_SETTINGS_ANNOTATION, NodeSettings, decode_settings,
                                        encode_settings)
from rocshare.core.inventory import NodeInventory
from rocshare.core.resource_slices import slice_devices
from rocshare_operator import scheduling
from rocshare_operator.admission.dra_pods import (
    MIXED_POOLS_REASON,
    UNSATISFIABLE_REASON,
    dra_pools_for,
    plan_dra,
    pool_shapes,
    template_name,
)
from rocshare.kube.client import Conflict, Forbidden
from rocshare_operator.admission.pods import Refused, amd_resources, containers_of
from rocshare_operator.admission.webhook import write_templates
from rocshare_operator.extender.state import SchedulerState

MI210 = GpuInfo(id="GPU-1901ead3a2ecd4a6", index=0, render_minor=128, card=1, gfx_target_version=90010,
                vram_mib=65536, cu_count=104, pci_bdf="0000:63:00.0", split_count=10, healthy=True)
SHAPES = NodeInventory.from_gpu_infos("n1", [MI210], Sharing()).gpus


def pool(interface: str, **selector: str) -> AmdGpuPoolSpec:
    return AmdGpuPoolSpec.model_validate({"nodeSelector": selector, "agent": {"interface": interface}})


POOLS = {"dra": pool("DRA", gpu="mi210"), "plugin": pool("DevicePlugin", gpu="mi300")}


def pod(limits: dict, selector: dict | None = None, init: dict | None = None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "x", "resources": {"limits": {"cpu": "1", **limits}}},
                                 {"name": "side", "image": "x"}]}
    if init is not None:
        spec["initContainers"] = [{"name": "warm", "image": "x", "resources": {"limits": init}}]
    if selector is not None:
        spec["nodeSelector"] = selector
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}


@pytest.mark.parametrize(("selector", "expected"), [
    ({"gpu": "mi210"}, ("dra",)),
    ({"rocshare.io/pool": "dra"}, ("dra",)),
    ({"rocshare.io/pool": "plugin"}, ()),
    ({"gpu": "mi300"}, ()),
    ({"rocshare.io/pool": "gone"}, ()),
])
def test_the_pools_a_pod_can_land_on_decide(selector, expected):
    assert dra_pools_for(pod({"amd.com/gpu": "1"}, selector), POOLS) == expected


def with_affinity(body: dict, *terms: list[dict]) -> dict:
    body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions} for expressions in terms]}}}
    return body


@pytest.mark.parametrize(("terms", "expected"), [
    ([[{"key": "rocshare.io/pool", "operator": "In", "values": ["dra"]}]], ("dra",)),
    ([[{"key": "gpu", "operator": "In", "values": ["mi210", "mi250"]}]], ("dra",)),
    ([[{"key": "gpu", "operator": "NotIn", "values": ["mi210"]}]], ()),
    ([[{"key": "rocshare.io/pool", "operator": "In", "values": ["plugin"]}],
      [{"key": "zone", "operator": "In", "values": ["a"]}, {"key": "gpu", "operator": "In", "values": ["mi300"]}]], ()),
    ([[{"key": "gpu", "operator": "DoesNotExist"}]], ()),
])
def test_required_node_affinity_narrows_the_pools_as_the_node_selector_does(terms, expected):
    # Terms are ORed; expressions of a term ANDed; a label a pool does not fix (zone) rules nothing out.
    assert dra_pools_for(with_affinity(pod({"amd.com/gpu": "1"}), *terms), POOLS) == expected


def test_no_dra_pool_leaves_every_pod_to_the_device_plugin():
    assert dra_pools_for(pod({"amd.com/gpu": "1"}), {"plugin": POOLS["plugin"]}) == ()


def test_mixed_pools_are_refused_naming_them():
    with pytest.raises(Refused) as refused:
        dra_pools_for(pod({"amd.com/gpu": "1"}), POOLS)
    message = str(refused.value)
    assert message.startswith(MIXED_POOLS_REASON) and "(dra)" in message and "(plugin)" in message
    assert "rocshare.io/pool" in message


def test_memory_and_cores_become_a_claim_and_leave_no_amd_resource():
    asked = pod({"amd.com/gpu": "1", "amd.com/gpumem": "8192", "amd.com/gpucores": "25"}, {"gpu": "mi210"})
    plan = plan_dra(asked, ("dra",), SHAPES)
    [template] = plan.templates
    [request] = template["spec"]["spec"]["devices"]["requests"]
    [shape] = request["firstAvailable"]
    # 25 % of 104 CUs is 26 (ceil); MiB asked as it stands.
    assert shape["capacity"]["requests"] == {"memory": "8192Mi", "compute": "26"}
    assert shape["deviceClassName"] == f"104cu-{SHAPES[0].memory_mib}mi.gpu.rocshare.io" and shape["count"] == 1
    [device_class] = plan.device_classes  # written before the template names it
    assert device_class["metadata"]["name"] == shape["deviceClassName"]
    assert "quantity('104')" in device_class["spec"]["selectors"][0]["cel"]["expression"]
    assert template["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "rocshare"}
    name = template["metadata"]["name"]
    assert name == template_name(template["spec"]["spec"]) and len(name) <= 63
    main, side = plan.spec["containers"]
    assert not amd_resources(main) and main["resources"]["limits"] == {"cpu": "1"}
    assert main["resources"]["claims"] == [{"name": "rocshare-gpu-0"}]
    assert "claims" not in (side.get("resources") or {})
    assert plan.spec["resourceClaims"] == [{"name": "rocshare-gpu-0", "resourceClaimTemplateName": name}]
    assert plan.spec["nodeSelector"] == {"gpu": "mi210"}  # the rest of the spec is kept


def test_equal_requests_share_one_template_and_different_ones_do_not():
    one = plan_dra(pod({"amd.com/gpu": "1", "amd.com/gpumem": "4096"}), ("dra",), SHAPES)
    again = plan_dra(pod({"amd.com/gpu": "1", "amd.com/gpumem": "4096"}), ("dra",), SHAPES)
    other = plan_dra(pod({"amd.com/gpu": "1", "amd.com/gpumem": "4097"}), ("dra",), SHAPES)
    assert one.templates == again.templates
    assert one.templates[0]["metadata"]["name"] != other.templates[0]["metadata"]["name"]
    [request] = one.templates[0]["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["capacity"] == {"requests": {"memory": "4096Mi"}}


def test_each_gpu_container_gets_its_own_pod_claim_and_existing_claims_stay():
    asked = pod({"amd.com/gpu": "2"}, init={"amd.com/gpu": "1"})
    asked["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimName": "theirs"}]
    plan = plan_dra(asked, ("dra",), SHAPES)
    names = [claim["name"] for claim in plan.spec["resourceClaims"]]
    assert names == ["mine", "rocshare-gpu-init-0", "rocshare-gpu-0"]
    assert plan.spec["initContainers"][0]["resources"] == {"claims": [{"name": "rocshare-gpu-init-0"}]}
    assert len(plan.templates) == 2
    assert not any(amd_resources(container) for _, _, container in containers_of({"spec": plan.spec}))
    two = next(t for t in plan.templates if t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2)
    assert two["spec"]["spec"]["devices"]["constraints"][0]["distinctAttribute"] == "gpu.rocshare.io/uuid"


def test_more_memory_than_any_gpu_of_the_pool_is_refused():
    with pytest.raises(Refused) as refused:
        plan_dra(pod({"amd.com/gpu": "1", "amd.com/gpumem": "65537"}), ("dra",), SHAPES)
    assert str(refused.value).startswith(UNSATISFIABLE_REASON) and "65536 MiB" in str(refused.value)


def test_a_percentage_with_no_gpu_reported_in_the_pool_is_refused():
    with pytest.raises(Refused) as refused:
        plan_dra(pod({"amd.com/gpu": "1", "amd.com/gpucores": "50"}), ("dra",), [])
    assert str(refused.value).startswith(UNSATISFIABLE_REASON) and "pools dra" in str(refused.value)


def test_a_bad_request_is_refused_as_the_device_plugin_path_refuses_it():
    with pytest.raises(Refused, match="gpucores"):
        plan_dra(pod({"amd.com/gpu": "1", "amd.com/gpucores": "101"}), ("dra",), SHAPES)


def test_pool_shapes_read_only_the_nodes_of_the_pools():
    node_pools = {"n1": "dra", "n2": "plugin", "n3": "dra"}
    gpus = {"n1": SHAPES, "n2": SHAPES + SHAPES, "n3": ()}
    assert pool_shapes(("dra",), node_pools, lambda node: gpus[node]) == list(SHAPES)


class TemplateStore:
    """Stands in for the API server's create (a unit test of the webhook's write; the e2e uses the real one)."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.created: list[str] = []
        self.refuse = refuse

    async def create(self, path: str, body: dict) -> dict:
        if self.refuse is not None:
            raise self.refuse
        name = body["metadata"]["name"]
        if name in self.created:
            raise Conflict(409, "AlreadyExists", name)
        self.created.append(name)
        return body


async def test_templates_are_written_once_never_on_a_dry_run_and_a_failure_refuses_the_pod():
    templates = plan_dra(pod({"amd.com/gpu": "1", "amd.com/gpumem": "1024"}), ("dra",), SHAPES).templates
    store = TemplateStore()
    await write_templates(store, "ns", templates, dryrun=True)
    assert store.created == []
    await write_templates(store, "ns", templates, dryrun=False)
    await write_templates(store, "ns", templates, dryrun=False)  # exists: left as it is
    assert store.created == [templates[0]["metadata"]["name"]]
    with pytest.raises(kopf.AdmissionError, match="cannot write ResourceClaimTemplate ns/rocshare-gpu-"):
        await write_templates(TemplateStore(Forbidden(403, "Forbidden", "no")), "ns", templates, dryrun=False)


async def _mutate_in_dra_pool(body: dict) -> kopf.Patch:
    """The operator's own mutating handler (webhook.register), called as Kopf calls it, with the
    real DRA planner for the mi210 pool (a dry run: no template is written)."""
    from types import SimpleNamespace

    from rocshare_operator.admission.webhook import MUTATE_ID, WebhookSettings, register

    registry = kopf.OperatorRegistry()
    register(registry, WebhookSettings(), lambda _pod: None,
             dra_plan_for=lambda defaulted: plan_dra(defaulted, ("dra",), SHAPES))
    mutate = next(handler.fn for handler in registry._webhooks.get_all_handlers() if handler.id == MUTATE_ID)
    patch = kopf.Patch()
    await mutate(body=kopf.Body(body), patch=patch, userinfo={"username": "carol"}, dryrun=True,
                 memo=SimpleNamespace(rocshare=SimpleNamespace(kube=None)))
    return patch


@pytest.mark.parametrize(("change", "reason"), [
    ({"securityContext": {"privileged": True}}, "PrivilegedSlice"),
    ({"env": [{"name": "HIP_DEVICE_MEMORY_LIMIT_0", "value": "65536m"}]}, "ProtectedEnvVar"),
    ({"envFrom": [{"configMapRef": {"name": "m"}}]}, "ProtectedEnvFrom"),
    ({"volumeMounts": [{"name": "v", "mountPath": "/usr/local/vgpu/libamvgpu.so", "subPath": "x"}]}, "HookPathMount"),
], ids=["privileged", "env", "envFrom", "hook mount"])
async def test_the_dra_translation_keeps_the_device_plugin_paths_checks(change: dict, reason: str) -> None:
    """Issue 39: the webhook checked the pod after its amd.com/* limits became a claim, so it saw no
    GPU request: privileged with amd.com/gpumem in a DRA pool was admitted and saw every GPU."""
    body = pod({"amd.com/gpu": "1", "amd.com/gpumem": "4096"}, {"rocshare.io/pool": "dra"})
    assert (await _mutate_in_dra_pool(body)).spec["resourceClaims"]  # the plain slice: translated
    body["spec"]["containers"][0].update(change)
    with pytest.raises(kopf.AdmissionError, match=f"^{reason}: containers\\[0\\] \\(main\\)"):
        await _mutate_in_dra_pool(body)


async def test_a_host_dev_volume_beside_a_dra_slice_is_refused() -> None:
    body = pod({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "25"}, {"rocshare.io/pool": "dra"})
    body["spec"]["volumes"] = [{"name": "dev", "hostPath": {"path": "/dev"}}]
    with pytest.raises(kopf.AdmissionError, match="^HostDeviceVolume: volume dev is the host's /dev"):
        await _mutate_in_dra_pool(body)


def test_the_shapes_are_the_gpus_the_agent_publishes_not_the_pool_spec():
    """Issue 45: the node's GPU specs are one rule (inventory.node_inventory: the AmdGpuNode's GPUs
    with the sharing marked on the Node, the annotation the agent reads). The admission's DRA shapes
    had drifted to the AmdGpuPool's spec: while the pool loop has not marked a new deviceMemoryScaling,
    they named a registered memory no device of the node publishes, and the claim could not be met."""
    state = SchedulerState()
    state.on_pool("ADDED", {"metadata": {"name": "dra"}, "spec": {
        "nodeSelector": {"gpu": "mi210"}, "agent": {"interface": "DRA"}, "sharing": {"deviceMemoryScaling": 2.0}}})
    marked = encode_settings(NodeSettings(pool="dra", sharing=Sharing()))  # the node's marks: scaling 1.0 still
    state.on_node("ADDED", {"metadata": {"name": "n1", "labels": {"gpu": "mi210", POOL_LABEL: "dra"},
                                         "annotations": {POOL_SETTINGS_ANNOTATION: marked}}, "status": {}})
    state.on_gpu_node("ADDED", {"metadata": {"name": "n1"}, "status": {"gpus": [MI210.model_dump(by_alias=True)]}})
    [published] = slice_devices("n1", [MI210], decode_settings(marked).sharing)  # what the agent offers
    [shape] = scheduling.gpus_of(state, "n1")
    assert shape.memory_mib * 2**20 == int(published["capacity"]["memory"]["value"]) == 65536 * 2**20


async def test_the_webhook_keeps_the_request_it_turned_into_claims_and_sends_the_pod_to_dra_modes_profile() -> None:
    """Issue 42: the extender's score for DRA pods reads the limits from the annotation; a tenant's own
    value is replaced by what the webhook removed, and the pod goes to DRA mode's scheduler profile."""
    from rocshare.api.dra import DRA_SCHEDULER_NAME
    from rocshare.api.dra_request import DRA_REQUEST_ANNOTATION, decode_request

    limits = {"amd.com/gpu": "1", "amd.com/gpumem": "4096", "amd.com/gpucores": "30"}
    body = pod(limits, {"rocshare.io/pool": "dra"})
    forged = '{"version":1,"containers":[{"kind":"containers","index":0,"limits":{"amd.com/gpu":"8"}}]}'
    body["metadata"]["annotations"] = {DRA_REQUEST_ANNOTATION: forged}
    patch = await _mutate_in_dra_pool(body)
    [kept] = decode_request(patch.metadata.annotations[DRA_REQUEST_ANNOTATION]).containers
    assert (kept.kind, kept.index, kept.limits) == ("containers", 0, limits)
    assert patch.spec["schedulerName"] == DRA_SCHEDULER_NAME
