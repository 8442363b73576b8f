"""Users keep their habits in a DRA pool, on Kubernetes 1.37.2: a pod written with HAMi-style
amd.com/* limits passes the operator's real admission webhook (served by a real operator process,
called by the real API server), which writes the equivalent ResourceClaimTemplate; the
resourceclaim controller makes the claim, the real kube-scheduler allocates it from the node
agent's ResourceSlice (agent in DRA mode on a simulated node, Vega10 capture: 64 CUs, 16368 MiB),
and the agent's DRA plugin, called over its socket as the kubelet calls it, prepares it.

The environment the container gets (the CDI spec the plugin wrote) must equal what the device
plugin path gives the same pod on the same GPU (the extender's allocate and the agent's renderer,
as the device plugin's Allocate answers), and the numbers are worked out here: 25 % of 64 CUs is
16; 50 % of 16368 MiB is 8184 MiB. Refusals are read from kubectl's answer.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from rocshare.api.dra import DRA_SCHEDULER_NAME
from rocshare.api.models import API_VERSION, GpuInfo, OperatingMode, ResourceNaming, Sharing
from rocshare.api.resource_names import named
from rocshare.core.allocate import allocate
from rocshare.core.fit import FitFailure
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare.core.policies import Policy
from rocshare.core.quantity import memory_mib_quantity, whole_quantity
from rocshare.core.resource_slices import device_name
from rocshare.core.request import parse_pod
from rocshare.kube.client import Kube, NotFound, object_path
from rocshare_agent.deviceplugin.container_spec import AccountFolders, render_container
from rocshare_agent.discovery import discover
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode, runtime_specs
from tests.e2e.dra.test_dra_allocation import RESOURCE, as_kubelet, cdi_env, consumed
from tests.e2e.fleet import wait_for

pytestmark = pytest.mark.e2e

NAMESPACE = "default"
POOL, PLUGIN_POOL = "dra-admission", "plugin-admission"
SELECTOR = {"rocshare-e2e/admission": "dra"}
VEGA_MIB, VEGA_CUS = 16368, 64


@pytest.fixture(scope="module")
def operator(cluster):
    process = OperatorProcess(cluster)
    process.start()
    try:
        process.install_webhooks()
        yield process
    finally:
        # Pools first, while the operator runs to release its finalizer on them; then its webhooks.
        cluster.kubectl("delete", "pods", "hami-dra", "hami-dra-again", "-n", NAMESPACE, "--ignore-not-found",
                        "--grace-period=0", "--force", check=False)
        cluster.kubectl("delete", "amdgpupools", POOL, PLUGIN_POOL, "--ignore-not-found", "--timeout=60s",
                        check=False)
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        process.stop()


@pytest.fixture(scope="module")
def node(cluster, sysfs_fixtures):
    name = f"dra-adm-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # a unix socket's path holds 107 bytes
    root = work / name
    sim = SimulatedNode(name=name, kubeconfig=cluster.kubeconfig, sysfs_root=sysfs_fixtures / "vega10-1gpu",
                        work_dir=work, bin_dir=cluster.bin_dir, health_interval_s=0.3, labels=SELECTOR,
                        agent_args=("--interface=DRA", f"--dra-plugins-dir={root / 'plugins'}",
                                    f"--dra-registry-dir={root / 'registry'}", f"--cdi-dir={root / 'cdi'}"))
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()
        shutil.rmtree(work, ignore_errors=True)


def hami_pod(name: str, node_selector: dict[str, str], **limits: str) -> dict:
    amd = {f"amd.com/{key}": value for key, value in limits.items()}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"nodeSelector": node_selector, "containers": [{
                "name": "main", "image": "rocm/pytorch", "resources": {"limits": {"cpu": "100m", **amd}}}]}}


def dry_run(cluster, pod: dict):
    return cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input_text=json.dumps(pod),
                           check=False)


def admitted_as_claim(cluster, pod: dict) -> dict | None:
    """The pod as the webhook would store it, once it writes claims for it (the operator has seen
    the pool, labelled the node and read the node's GPUs from its AmdGpuNode)."""
    result = dry_run(cluster, pod)
    if result.returncode != 0:
        return None
    stored = json.loads(result.stdout)
    return stored if stored["spec"].get("resourceClaims") else None


async def create_pool(kube: Kube, name: str, selector: dict[str, str], interface: str) -> None:
    await kube.create(object_path(API_VERSION, "amdgpupools"), {
        "apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": name},
        "spec": {"nodeSelector": selector, "agent": {"interface": interface}}})


async def claim_of(kube: Kube, pod: str) -> dict | None:
    stored = await kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
    statuses = (stored.get("status") or {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    claim = await kube.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{statuses[0]['resourceClaimName']}")
    return claim if (claim.get("status") or {}).get("allocation") else None


def device_plugin_env(pod: dict, gpu: GpuInfo, hook_dir: str, sharing: Sharing = Sharing()) -> dict[str, str]:
    """What a device-plugin pool with `sharing` gives `pod` as written, on an empty `gpu`: the extender's
    allocate, then the agent's renderer (the envs of the device plugin's Allocate response)."""
    [gpu] = named([gpu], sharing)  # the resource the agent registers it under
    inventory = NodeInventory.from_gpu_infos("n", [gpu], sharing)
    record = allocate(inventory, Ledger().usage(inventory), parse_pod(pod), Policy())
    assert not isinstance(record, FitFailure), record
    # Both modes give a slice container its account folder (docs/container-account.md); the host
    # folders do not show in the environment, which names the fixed container paths.
    account = AccountFolders(usage_host_dir="/host/usage", slice_host_dir="/host/slice")
    return render_container(record.containers[0], {gpu.id: gpu}, oversubscribed=False, hook_host_dir=hook_dir,
                            account=account).envs


async def test_hami_style_pod_in_a_dra_pool_gets_a_claim_and_the_device_plugin_environment(
        cluster, kube, operator, node):
    await create_pool(kube, POOL, SELECTOR, "DRA")
    written = hami_pod("hami-dra", {"rocshare.io/pool": POOL}, gpu="1", **{"gpumem-percentage": "50"},
                       gpucores="25")
    stored = await wait_for(lambda: _async(admitted_as_claim(cluster, written)), timeout_s=60,
                            what="the webhook writing claims for the pool's pods")
    assert not any(key.startswith("amd.com/") for key in stored["spec"]["containers"][0]["resources"]["limits"])

    created = await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", written)
    spec = created["spec"]
    assert spec["containers"][0]["resources"]["limits"] == {"cpu": "100m"}
    [pod_claim] = spec["resourceClaims"]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": pod_claim["name"]}]
    assert spec.get("schedulerName") == DRA_SCHEDULER_NAME  # DRA mode's profile: the allocator, the extender's score
    template = await kube.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaimtemplates/"
                              f"{pod_claim['resourceClaimTemplateName']}")
    assert template["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rocshare"
    # The subrequest names the DeviceClass of the Vega's shape, which the webhook wrote: the driver
    # and the shape in its one selector, none on the claim.
    [subrequest] = template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert subrequest["deviceClassName"] == f"64cu-{VEGA_MIB}mi.gpu.rocshare.io" and "selectors" not in subrequest
    device_class = await kube.get(f"{RESOURCE}/deviceclasses/{subrequest['deviceClassName']}")
    assert device_class["spec"]["selectors"] == [{"cel": {"expression": (
        'device.driver == "gpu.rocshare.io" && '
        "device.capacity['gpu.rocshare.io'].compute.compareTo(quantity('64')) == 0 && "
        f"device.capacity['gpu.rocshare.io'].memory.compareTo(quantity('{VEGA_MIB}Mi')) == 0")}}]

    claim = await wait_for(lambda: claim_of(kube, "hami-dra"), timeout_s=60, what="the pod's claim allocated")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == node.name and result["driver"] == "gpu.rocshare.io"
    capacity = result["consumedCapacity"]
    assert memory_mib_quantity(capacity["memory"]) == VEGA_MIB * 50 // 100 == 8184
    assert whole_quantity(capacity["compute"], name="compute", unit="CUs") == 16  # ceil(64 x 25 / 100)

    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    assert (await as_kubelet(node, "prepare", (name, uid))).claims[uid].error == ""
    env = cdi_env(node, uid)
    assert env["HSA_CU_MASK"] == "0:0-15" and env["HIP_DEVICE_MEMORY_LIMIT_0"] == "8184m"
    [gpu] = discover(node.sysfs_root).gpus
    assert env == device_plugin_env(written, gpu, str(node.hook_dir))

    # The same request again: the same template, no second one.
    again = await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", {**written, "metadata": {
        "name": "hami-dra-again", "namespace": NAMESPACE}})
    assert again["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == pod_claim["resourceClaimTemplateName"]


async def test_unsatisfiable_and_mixed_pool_pods_are_refused_with_the_reason(cluster, kube, operator, node):
    await wait_for(lambda: _pool_known(kube), timeout_s=30, what="the DRA pool")
    too_big = hami_pod("too-big", {"rocshare.io/pool": POOL}, gpu="1", gpumem=str(VEGA_MIB + 1))
    result = await wait_for(lambda: _async(_refused(cluster, too_big)), timeout_s=60, what="too-big refused")
    assert "DraRequestUnsatisfiable" in result and f"{VEGA_MIB} MiB" in result and "main" in result

    await create_pool(kube, PLUGIN_POOL, {"rocshare-e2e/admission": "plugin"}, "DevicePlugin")
    unselected = hami_pod("unselected", {}, gpu="1", gpumem="1024")
    await wait_for(lambda: _async(_refused(cluster, unselected)), timeout_s=30, what="mixed refused")
    result = cluster.kubectl("create", "-f", "-", input_text=json.dumps(unselected), check=False)
    assert result.returncode != 0
    assert "MixedPoolInterfaces" in result.stderr and f"({POOL})" in result.stderr
    assert f"({PLUGIN_POOL})" in result.stderr
    with pytest.raises(NotFound):
        await kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/unselected")


async def test_the_translation_keeps_the_device_plugin_paths_checks(cluster, kube, operator, node):
    """Issue 39: the webhook checked the pod after its amd.com/* limits became a claim, where nothing
    says it holds a slice, so a privileged slice (every GPU, no limit) or one whose env replaces its
    limit was admitted in a DRA pool. The plain slice is admitted as a claim first (the positive
    signal that the webhook translates in this pool); each variant is then refused by name."""
    plain = hami_pod("widen-plain", {"rocshare.io/pool": POOL}, gpu="1", gpumem="2048", gpucores="25")
    await wait_for(lambda: _async(admitted_as_claim(cluster, plain)), timeout_s=60, what="the slice translated")
    variants = (({"securityContext": {"privileged": True}}, "PrivilegedSlice: containers[0] (main)"),
                ({"env": [{"name": "HIP_DEVICE_MEMORY_LIMIT_0", "value": "65536m"}]},
                 "ProtectedEnvVar: containers[0] (main): env HIP_DEVICE_MEMORY_LIMIT_0"))
    for change, reason in variants:
        attack = json.loads(json.dumps(plain))
        attack["metadata"]["name"] = "widen"
        attack["spec"]["containers"][0].update(change)
        result = cluster.kubectl("create", "-f", "-", input_text=json.dumps(attack), check=False)
        assert result.returncode != 0 and reason in result.stderr, result.stderr
        with pytest.raises(NotFound):
            await kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/widen")


async def _pool_known(kube: Kube) -> dict | None:
    try:
        return await kube.get(object_path(API_VERSION, "amdgpupools", POOL))
    except NotFound:
        return None


def _refused(cluster, pod: dict) -> str | None:
    result = dry_run(cluster, pod)
    return result.stderr if result.returncode != 0 and "denied the request" in result.stderr else None


async def _async(value):
    return value


QUOTA_NAMESPACE, SHARE = "dra-quota", "team"
QUOTA_MIB = 6000


def claim_body(name: str, *, memory_mib: int, cus: int) -> dict:
    """A ResourceClaim as a user writes one (not the webhook's translation)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": QUOTA_NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.rocshare.io", "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": f"{memory_mib}Mi", "compute": str(cus)}}}}]}}}


def pod_with_claim(name: str, claim: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": QUOTA_NAMESPACE},
            "spec": {"nodeSelector": SELECTOR, "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": "rocm/pytorch",
                                     "resources": {"limits": {"cpu": "100m"}, "claims": [{"name": "gpu"}]}}]}}


async def share_used(kube: Kube, want: dict) -> dict | None:
    share = await kube.get(object_path(API_VERSION, "amdgpushares", SHARE, namespace=QUOTA_NAMESPACE))
    status = share.get("status") or {}
    return status if {key: (status.get("used") or {}).get(key) for key in want} == want else None


async def test_claims_count_in_their_share_and_are_held_to_its_quota(cluster, kube, operator, node):
    """A claim written by hand in a namespace with an AmdGpuShare: once kube-scheduler allocates it,
    the share counts it (memory, cores, GPUs, listed by name), with the CUs the agent handed out once
    it prepared the claim; a second claim that would pass the share's memory limit is refused at
    creation with the figures; freeing the first lets it in."""
    cluster.kubectl("delete", "pods", "hami-dra", "hami-dra-again", "-n", NAMESPACE, "--ignore-not-found",
                    "--timeout=60s")  # the GPU is the earlier tests'; their claims go with their pods
    cluster.kubectl("create", "namespace", QUOTA_NAMESPACE, check=False)
    await kube.create(object_path(API_VERSION, "amdgpushares", namespace=QUOTA_NAMESPACE), {
        "apiVersion": API_VERSION, "kind": "AmdGpuShare", "metadata": {"name": SHARE, "namespace": QUOTA_NAMESPACE},
        "spec": {"limits": {"memoryMiB": QUOTA_MIB}}})
    await wait_for(lambda: share_used(kube, {"memoryMiB": 0}), timeout_s=60, what="the share's status")

    first = claim_body("first", memory_mib=4096, cus=16)
    await wait_for(lambda: _async(_created(cluster, first)), timeout_s=60, what="the first claim admitted")
    await kube.create(f"/api/v1/namespaces/{QUOTA_NAMESPACE}/pods", pod_with_claim("holder", "first"))
    status = await wait_for(lambda: share_used(kube, {"memoryMiB": 4096, "coresPercent": 25, "gpus": 1}),
                            timeout_s=90, what="the share counting the allocated claim")
    assert [holder["pod"] for holder in status["pods"]] == ["resourceclaim/first"]

    claim = await kube.get(f"{RESOURCE}/namespaces/{QUOTA_NAMESPACE}/resourceclaims/first")
    uid = claim["metadata"]["uid"]
    reply = await as_kubelet(node, "prepare", ("first", uid), namespace=QUOTA_NAMESPACE)
    assert reply.claims[uid].error == ""
    low, high = (int(n) for n in cdi_env(node, uid)["HSA_CU_MASK"].removeprefix("0:").split("-"))
    assert high - low + 1 == 16  # what the container gets, from the agent's CDI file
    status = await wait_for(lambda: _holder_cus(kube, 16), timeout_s=60, what="the prepared CUs counted")

    second = claim_body("second", memory_mib=4096, cus=16)
    refused = cluster.kubectl("create", "-f", "-", input_text=json.dumps(second), check=False)
    assert refused.returncode != 0 and "ResourceQuotaNotFit" in refused.stderr
    assert f"memory MiB: 4096 used + 4096 asked > {QUOTA_MIB} limit" in refused.stderr
    with pytest.raises(NotFound):
        await kube.get(f"{RESOURCE}/namespaces/{QUOTA_NAMESPACE}/resourceclaims/second")
    # The same claim naming the class of the Vega's shape (the one admission wrote for the percentage
    # pod above) takes the same devices: the webhook is asked, and refuses it with the same figures.
    shaped = claim_body("shaped", memory_mib=4096, cus=16)
    shaped["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = f"64cu-{VEGA_MIB}mi.gpu.rocshare.io"
    await kube.get(f"{RESOURCE}/deviceclasses/64cu-{VEGA_MIB}mi.gpu.rocshare.io")
    refused = cluster.kubectl("create", "-f", "-", input_text=json.dumps(shaped), check=False)
    assert refused.returncode != 0 and f"memory MiB: 4096 used + 4096 asked > {QUOTA_MIB} limit" in refused.stderr

    cluster.kubectl("delete", "pod", "holder", "-n", QUOTA_NAMESPACE, "--grace-period=0", "--force")
    cluster.kubectl("delete", "resourceclaim", "first", "-n", QUOTA_NAMESPACE, "--timeout=60s")
    await wait_for(lambda: share_used(kube, {"memoryMiB": 0, "gpus": 0}), timeout_s=60, what="the share freed")
    await wait_for(lambda: _async(_created(cluster, second)), timeout_s=30, what="the second claim admitted")


def _created(cluster, claim: dict) -> bool | None:
    return True if cluster.kubectl("create", "-f", "-", input_text=json.dumps(claim), check=False).returncode == 0 \
        else None


async def _holder_cus(kube: Kube, cus: int) -> dict | None:
    status = await share_used(kube, {"memoryMiB": 4096, "coresPercent": 25, "gpus": 1})
    return status if status and [h["cuCount"] for h in status["pods"]] == [cus] else None


async def _event_about(kube: Kube, pod: str, text: str) -> str | None:
    events = await kube.list(f"/api/v1/namespaces/{QUOTA_NAMESPACE}/events", fieldSelector=f"involvedObject.name={pod}")
    return next((event["message"] for event in events["items"] if text in event.get("message", "")), None)


async def _templated_claim_held(kube: Kube, pod: str) -> dict | None:
    stored = await kube.get(f"/api/v1/namespaces/{QUOTA_NAMESPACE}/pods/{pod}")
    statuses = (stored.get("status") or {}).get("resourceClaimStatuses") or []
    name = statuses[0].get("resourceClaimName") if statuses else None
    status = await share_used(kube, {"memoryMiB": 4096, "gpus": 1}) if name else None
    return status if status and [h["pod"] for h in status["pods"]] == [f"resourceclaim/{name}"] else None


async def test_claims_made_from_templates_are_held_to_the_quota(cluster, kube, operator, node):
    """A HAMi-style pod in a DRA pool under an AmdGpuShare (after the test above: the share holds the
    4096 MiB claim `second`, not yet allocated): the webhook writes its template, kube-controller-manager
    makes the claim and is refused by the quota (4096 + 4096 > 6000), the pod waits with the reason in
    its events; once `second` goes, the claim is made, allocated and counted in the share."""
    pod = {**hami_pod("templated", SELECTOR, gpu="1", gpumem="4096"),
           "metadata": {"name": "templated", "namespace": QUOTA_NAMESPACE}}
    await kube.create(f"/api/v1/namespaces/{QUOTA_NAMESPACE}/pods", pod)
    message = await wait_for(lambda: _event_about(kube, "templated", "ResourceQuotaNotFit"), timeout_s=60,
                             what="the template claim refused by the quota")
    assert f"memory MiB: 4096 used + 4096 asked > {QUOTA_MIB} limit" in message
    claims = await kube.list(f"{RESOURCE}/namespaces/{QUOTA_NAMESPACE}/resourceclaims")
    assert [claim["metadata"]["name"] for claim in claims["items"]] == ["second"]

    cluster.kubectl("delete", "resourceclaim", "second", "-n", QUOTA_NAMESPACE, "--timeout=60s")
    await wait_for(lambda: _templated_claim_held(kube, "templated"), timeout_s=120,
                   what="the template's claim made, allocated and counted in the share")
    cluster.kubectl("delete", "pod", "templated", "-n", QUOTA_NAMESPACE, "--grace-period=0", "--force")


# ---- node choice: DRA mode's profile, scored by the extender (issue 42) ------------------------------

PLACE_POOL = "dra-placement"
PLACE_SELECTOR = {"rocshare-e2e/placement": "dra"}
NODE_CPUS = 16  # kubelet-peer's default capacity


@pytest.fixture(scope="module")
def placement_nodes(cluster, sysfs_fixtures):
    """Two nodes of one Vega10 GPU each (64 CUs), in a pool of their own."""
    work = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    nodes = []
    try:
        for _ in range(2):
            name = f"dra-place-{uuid.uuid4().hex[:6]}"
            root = work / name
            nodes.append(SimulatedNode(
                name=name, kubeconfig=cluster.kubeconfig, sysfs_root=sysfs_fixtures / "vega10-1gpu", work_dir=work,
                bin_dir=cluster.bin_dir, health_interval_s=0.3, labels=PLACE_SELECTOR,
                agent_args=("--interface=DRA", f"--dra-plugins-dir={root / 'plugins'}",
                            f"--dra-registry-dir={root / 'registry'}", f"--cdi-dir={root / 'cdi'}")))
            nodes[-1].start()
        yield sorted(nodes, key=lambda sim: sim.name)
    finally:
        cluster.kubectl("delete", "pods", "placed-holder", "placed-filler", "placed-probe", "-n", NAMESPACE,
                        "--ignore-not-found", "--grace-period=0", "--force", check=False)
        cluster.kubectl("delete", "amdgpupools", PLACE_POOL, "--ignore-not-found", "--timeout=60s", check=False)
        for sim in nodes:
            sim.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def dra_scheduler(cluster, operator):
    """kube-scheduler with the configuration DRA mode ships, its extender the operator's: the webhook
    sends the pods it gives claims to this profile."""
    name = cluster.start_dra_scheduler(f"http://127.0.0.1:{operator.port}/extender")
    try:
        yield name
    finally:
        cluster.stop_dra_scheduler()


async def _bound(kube: Kube, pod: str) -> str | None:
    return ((await kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")).get("spec") or {}).get("nodeName")


async def test_a_dra_pod_goes_to_the_node_the_fragmentation_model_prefers(
        cluster, kube, operator, placement_nodes, dra_scheduler):
    """Node a holds a claim of half its GPU; node b's GPU is free but half its CPU is taken. A pod
    asking a quarter of a GPU, through DRA mode's profile: kube-scheduler's own scores (MostAllocated)
    prefer b, the fragmentation-aware policy a (it leaves b's GPU whole). The extender's score wins."""
    a, b = placement_nodes
    await kube.create(object_path(API_VERSION, "amdgpupools"), {
        "apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": PLACE_POOL},
        "spec": {"nodeSelector": PLACE_SELECTOR, "agent": {"interface": "DRA"},
                 "scheduling": {"gpuPolicy": "fragmentation-aware"}}})
    quarter = {"gpu": "1", "gpucores": "25", "gpumem-percentage": "25"}
    holder = hami_pod("placed-holder", {"rocshare.io/pool": PLACE_POOL, "kubernetes.io/hostname": a.name},
                      gpu="1", gpucores="50", **{"gpumem-percentage": "50"})
    filler = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "placed-filler", "namespace": NAMESPACE},
              "spec": {"nodeSelector": {"kubernetes.io/hostname": b.name}, "containers": [{
                  "name": "main", "image": "busybox", "resources": {"requests": {"cpu": str(NODE_CPUS // 2)}}}]}}
    probe = hami_pod("placed-probe", {"rocshare.io/pool": PLACE_POOL}, **quarter)
    filler["spec"]["schedulerName"] = dra_scheduler  # the webhook sends the GPU pods there itself
    await wait_for(lambda: _async(admitted_as_claim(cluster, holder)), timeout_s=60,
                   what="the webhook writing claims for the placement pool's pods")
    await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", holder)
    claim = await wait_for(lambda: claim_of(kube, "placed-holder"), timeout_s=60, what="the holder's claim allocated")
    assert claim["status"]["allocation"]["devices"]["results"][0]["pool"] == a.name
    await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", filler)
    assert await wait_for(lambda: _bound(kube, "placed-filler"), timeout_s=60, what="the filler bound") == b.name

    # Worked out here: free CUs per node after the probe's 16 (25 % of 64) on either node, and the
    # whole GPUs that leaves free; kube-scheduler's MostAllocated alone: the node with more CPU asked.
    free_cus = {a.name: VEGA_CUS - VEGA_CUS // 2, b.name: VEGA_CUS}
    probe_cus = VEGA_CUS * 25 // 100
    whole_left = {choice: sum(1 for node, free in free_cus.items()
                              if (free - probe_cus if node == choice else free) == VEGA_CUS) for choice in free_cus}
    assert whole_left == {a.name: 1, b.name: 0}
    cpu_asked_milli = {a.name: 100, b.name: NODE_CPUS // 2 * 1000}
    assert max(cpu_asked_milli, key=cpu_asked_milli.get) == b.name  # what the plain profile would pick
    expected = max(whole_left, key=whole_left.get)

    created = await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", probe)
    assert "rocshare.io/dra-request" in created["metadata"]["annotations"]  # the webhook kept the request
    assert created["spec"]["schedulerName"] == dra_scheduler == DRA_SCHEDULER_NAME
    claim = await wait_for(lambda: claim_of(kube, "placed-probe"), timeout_s=60, what="the probe's claim allocated")
    assert claim["status"]["allocation"]["devices"]["results"][0]["pool"] == expected == a.name
    assert await _bound(kube, "placed-probe") == a.name


# ---- partitions beside shares in one DRA pool (issue 42, item 5) ---------------------------------------

MIXED_POOL, MIXED_NAMESPACE, MIXED_SHARE = "dra-mixed", "dra-mixed", "mixed"
MIXED_SELECTOR = {"rocshare-e2e/mixed": "dra"}


@pytest.fixture(scope="module")
def mixed_nodes(cluster, sysfs_fixtures):
    """One pool (cu mode, the default), two nodes: the MI300X capture in CPX mode (63 compute
    partitions of 38 CUs, each a whole device) and the Vega10 capture (one shared GPU)."""
    work = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # a unix socket's path holds 107 bytes
    nodes = {}
    try:
        for kind, capture in (("cpx", "mi300x-8gpu-cpx"), ("vega", "vega10-1gpu")):
            nodes[kind] = SimulatedNode(
                name=f"dra-mix-{kind}-{uuid.uuid4().hex[:6]}", kubeconfig=cluster.kubeconfig,
                sysfs_root=sysfs_fixtures / capture, work_dir=work, bin_dir=cluster.bin_dir, health_interval_s=0.3,
                labels=MIXED_SELECTOR, dra=True)
            nodes[kind].start()
        yield nodes
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", MIXED_NAMESPACE, "--ignore-not-found", "--grace-period=0",
                        "--force", check=False)
        cluster.kubectl("delete", "amdgpupools", MIXED_POOL, "--ignore-not-found", "--timeout=60s", check=False)
        for sim in nodes.values():
            sim.stop()
        shutil.rmtree(work, ignore_errors=True)


def mixed_pod(name: str, annotations: dict[str, str] | None = None, **limits: str) -> dict:
    pod = hami_pod(name, {"rocshare.io/pool": MIXED_POOL}, **limits)
    pod["metadata"] = {"name": name, "namespace": MIXED_NAMESPACE, "annotations": annotations or {}}
    return pod


async def _running(kube: Kube, pod: str) -> dict | None:
    stored = await kube.get(f"/api/v1/namespaces/{MIXED_NAMESPACE}/pods/{pod}")
    return runtime_specs(stored) if (stored.get("status") or {}).get("phase") == "Running" else None


async def _claim_of_pod(kube: Kube, pod: str) -> dict:
    stored = await kube.get(f"/api/v1/namespaces/{MIXED_NAMESPACE}/pods/{pod}")
    [status] = stored["status"]["resourceClaimStatuses"]
    return await kube.get(f"{RESOURCE}/namespaces/{MIXED_NAMESPACE}/resourceclaims/{status['resourceClaimName']}")


async def _mixed_share(kube: Kube, want: dict) -> dict | None:
    share = await kube.get(object_path(API_VERSION, "amdgpushares", MIXED_SHARE, namespace=MIXED_NAMESPACE))
    status = share.get("status") or {}
    return status if {key: (status.get("used") or {}).get(key) for key in want} == want else None


async def test_a_pool_mixing_partitions_and_shared_gpus_places_both_and_counts_both(cluster, kube, operator,
                                                                                     mixed_nodes):
    """Pods written with amd.com/* limits in one DRA pool of a CPX node and a Vega10 node: each whole-GPU
    pod asking for the MI300X gets one partition of its own (a whole device: no shareID, no mask, no memory
    limit), each share lands on the Vega10 (the only shared device), no device is handed out twice, every
    container runs with the CDI device and environment the device plugin would give it on that device
    (worked out here from the captures), and the namespace's AmdGpuShare counts all five. The fifth is
    written as for a device-plugin pool with mixed naming: `amd.com/cpx: 1`, the name the device plugin
    gives these partitions (the capture has no memory partition mode); a kind the pool has none of
    (`amd.com/cpx_nps4`) is refused at admission, naming it."""
    cpx, vega = mixed_nodes["cpx"], mixed_nodes["vega"]
    cpx_gpus = {device_name(gpu.id): gpu for gpu in discover(cpx.sysfs_root).gpus}
    cpx_specs = {device_name(spec.gpu_id): spec for spec in
                 NodeInventory.from_gpu_infos(cpx.name, list(cpx_gpus.values()), Sharing()).gpus}
    [vega_gpu] = discover(vega.sysfs_root).gpus
    assert len(cpx_gpus) == 63 and all(spec.partition and spec.cu_count == 38 for spec in cpx_specs.values())
    await create_pool(kube, MIXED_POOL, MIXED_SELECTOR, "DRA")
    cluster.kubectl("create", "namespace", MIXED_NAMESPACE, check=False)
    await kube.create(object_path(API_VERSION, "amdgpushares", namespace=MIXED_NAMESPACE), {
        "apiVersion": API_VERSION, "kind": "AmdGpuShare",
        "metadata": {"name": MIXED_SHARE, "namespace": MIXED_NAMESPACE},
        "spec": {"limits": {"gpus": 8}}})

    mi300x = {"amd.com/use-gputype": "MI300X"}
    pods = {"part-a": mixed_pod("part-a", mi300x, gpu="1"), "part-b": mixed_pod("part-b", mi300x, gpu="1"),
            "share-a": mixed_pod("share-a", gpu="1", gpumem="2048", gpucores="25"),
            "share-b": mixed_pod("share-b", gpu="1", gpumem="4096", gpucores="50"),
            "part-kind": mixed_pod("part-kind", cpx="1")}
    mixed_naming = Sharing(operatingMode=OperatingMode.PARTITION, resourceNaming=ResourceNaming.MIXED)
    assert {named([gpu], mixed_naming)[0].resource for gpu in cpx_gpus.values()} == {"amd.com/cpx"}
    for name in ("share-b", "part-kind"):  # a share needs the Vega10's GPU known, a partition kind the CPX's
        await wait_for(lambda: _async(admitted_as_claim(cluster, pods[name])), timeout_s=90,
                       what=f"the webhook writing claims for {name} in the mixed pool")
    absent = mixed_pod("absent-kind", cpx_nps4="1")
    refusal = _refused(cluster, absent)  # both nodes' GPUs are known now (above)
    assert refusal is not None and "DraRequestUnsatisfiable" in refusal \
        and "no amd.com/cpx_nps4 partition (its partitions are amd.com/cpx)" in refusal, refusal
    specs = {}
    for name, pod in pods.items():  # one at a time: the CUs each share gets are then worked out here
        await kube.create(f"/api/v1/namespaces/{MIXED_NAMESPACE}/pods", pod)
        specs[name] = await wait_for(lambda: _running(kube, name), timeout_s=90, what=f"{name} Running")

    results = {}
    for name in pods:
        claim = await _claim_of_pod(kube, name)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        results[name] = (claim["metadata"]["uid"], result)
        assert specs[name]["main"]["cdiDevices"] == [f"rocshare.io/gpu={claim['metadata']['uid']}"]
    # Partitions: two different CPX devices, whole (no share), nothing consumed from capacities.
    partitioned = ("part-a", "part-b", "part-kind")
    part_devices = [results[name][1]["device"] for name in partitioned]
    assert {results[name][1]["pool"] for name in partitioned} == {cpx.name}
    assert len(set(part_devices)) == 3 and set(part_devices) <= set(cpx_gpus)
    assert all("shareID" not in results[name][1] for name in partitioned)
    # Shares: both on the Vega10's one device, each with a share of its own.
    for name in ("share-a", "share-b"):
        assert (results[name][1]["pool"], results[name][1]["device"]) == (vega.name, device_name(vega_gpu.id))
    assert results["share-a"][1]["shareID"] != results["share-b"][1]["shareID"]
    assert consumed(results["share-a"][1])[:2] == (2048, VEGA_CUS * 25 // 100)
    assert consumed(results["share-b"][1])[:2] == (4096, VEGA_CUS * 50 // 100)

    # What each container received, against the device plugin's rendering on the same device.
    for name in partitioned:
        gpu = cpx_gpus[results[name][1]["device"]]
        env = specs[name]["main"]["envs"]
        assert "HSA_CU_MASK" not in env and "HIP_DEVICE_MEMORY_LIMIT_0" not in env  # whole: no mask, no limit
        # part-kind: as a device-plugin pool naming partitions by kind gives amd.com/cpx on this partition.
        expected = device_plugin_env(pods[name], gpu, str(cpx.hook_dir),
                                     mixed_naming if name == "part-kind" else Sharing())
        assert {key: env.get(key) for key in expected} == expected
        assert (str(cpx.dev_root / "dri" / f"renderD{gpu.render_minor}"), f"/dev/dri/renderD{gpu.render_minor}") in {
            (d["hostPath"], d["containerPath"]) for d in specs[name]["main"]["devices"]}
    share_a, share_b = specs["share-a"]["main"]["envs"], specs["share-b"]["main"]["envs"]
    expected_a = device_plugin_env(pods["share-a"], vega_gpu, str(vega.hook_dir))  # first on the empty GPU
    assert {key: share_a.get(key) for key in expected_a} == expected_a
    assert (share_a["HSA_CU_MASK"], share_a["HIP_DEVICE_MEMORY_LIMIT_0"]) == ("0:0-15", "2048m")
    assert (share_b["HSA_CU_MASK"], share_b["HIP_DEVICE_MEMORY_LIMIT_0"]) == ("0:16-47", "4096m")  # the next 32

    # The share counts all five: each partition whole (its registered memory, 100 % of its cores).
    part_mib = sum(cpx_specs[device].memory_mib for device in part_devices)
    status = await wait_for(lambda: _mixed_share(kube, {"gpus": 5, "memoryMiB": 2048 + 4096 + part_mib,
                                                        "coresPercent": 25 + 50 + 100 + 100 + 100}),
                            timeout_s=60, what="the share counting the partitions and the shares")
    claim_names = [(await _claim_of_pod(kube, name))["metadata"]["name"] for name in pods]
    assert sorted(holder["pod"] for holder in status["pods"]) == sorted(f"resourceclaim/{c}" for c in claim_names)
