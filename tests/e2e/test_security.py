"""Security checks on the real control plane, with the operator process and one simulated node
(Vega10 capture: kubelet peer + agent):

* the admission webhook fails closed: with the operator stopped, a GPU pod is refused (saying
  the webhook could not be called), a pod without GPUs is still admitted, and kube-system is
  not affected at all;
* a user with the built-in `edit` role (mallory; the admin client is a trusted writer in these
  tests) cannot obtain another pod's slice or an unallocated GPU by writing annotations: not on
  create, not on her own pod, not on the victim's; nor bypass the scheduler with nodeName or
  with schedulerName;
* a tenant cannot widen its slice through its own pod spec (issue 39): env or envFrom setting what
  rocshare hands over, a mount over the memory hook, a hostPath of /dev beside a slice, privileged
  in a container naming a gpu.rocshare.io claim -- each refused by the webhook with its reason;
* the agent's device plugin socket on the node is not writable by group or others;
* the extender serves TLS with a certificate from the cluster CA, and kube-scheduler (config
  `enableHTTPS: true`, `tlsConfig.caData`) schedules and binds through it; plain HTTP and an
  untrusted client are refused;
* the admission webhook authenticates its caller (issue 39, `--webhook-client-ca`): kube-apiserver,
  restarted with an AdmissionConfiguration whose kubeconfig presents a client certificate, has GPU
  pods mutated and refused through the webhook, while an AdmissionReview posted without that
  certificate is refused at the TLS handshake (and one with it is answered).

The node agent's ValidatingAdmissionPolicy (an agent may write only its own node's objects) is
proven on the real API server in tests/e2e/test_manifests.py (test_agent_writes_its_own_amdgpunode_and_not_another
and the tests after it).
"""

from __future__ import annotations

import base64
import json
import signal
import ssl
import stat
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import yaml

from rocshare.api.allocation import ALLOCATION_ANNOTATION
from rocshare.api.models import API_VERSION
from rocshare_dev.devcluster import certs
from rocshare_dev.devcluster.controlplane import ControlPlane, free_port, stop_process, write_webhook_client_auth
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode
from rocshare.kube.client import ApiError, Forbidden, Invalid, Kube, object_path
from tests.e2e.fleet import create_pod, delete_pod, gpu_pod, read_pod, record_of, wait_for, wait_running

pytestmark = pytest.mark.e2e

NODE = "sec-vega10"
NAMESPACE = "sec"
HERE = {"rocshare.io/pool": "sec-vega10"}


@pytest.fixture(scope="module")
def setup(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[tuple[OperatorProcess, SimulatedNode]]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("create", "rolebinding", "mallory-edit", "--clusterrole=edit", "--user=mallory", "-n", NAMESPACE)
    operator = OperatorProcess(cluster)
    operator.start()
    operator.install_webhooks()
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps({
        "apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": "sec-vega10"},
        "spec": {"nodeSelector": {"rocshare.io/sim": "sec-vega10"}}}))
    node = SimulatedNode(name=NODE, kubeconfig=cluster.kubeconfig, work_dir=tmp_path_factory.mktemp("sec"),
                         sysfs_root=sysfs_fixtures / "vega10-1gpu", labels={"rocshare.io/sim": "sec-vega10"})
    try:
        node.start()
        yield operator, node
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--force", "--grace-period=0", "--wait=false",
                        check=False)
        node.stop()
        operator.stop()
        cluster.kubectl("delete", "amdgpupool", "sec-vega10", "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.fixture
async def ready(setup, kube: Kube) -> tuple[OperatorProcess, SimulatedNode]:
    async def allocatable():
        node = await kube.get(object_path("v1", "nodes", NODE))
        return int(node.get("status", {}).get("allocatable", {}).get("amd.com/gpu", "0"))
    await wait_for(allocatable, timeout_s=60, what=f"{NODE} allocatable")
    return setup


@pytest.fixture
async def mallory(cluster, setup) -> Kube:
    client = await Kube.connect(cluster.user_kubeconfig("mallory"))
    try:
        yield client
    finally:
        await client.close()


def plain_pod(name: str, namespace: str = NAMESPACE) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "terminationGracePeriodSeconds": 0}}


# ---- annotations cannot buy capacity ---------------------------------------------------------------


async def test_user_cannot_take_another_pods_slice_or_an_unallocated_gpu(ready, kube: Kube, mallory: Kube) -> None:
    await create_pod(kube, gpu_pod("victim", namespace=NAMESPACE, gpu="1", gpumem="2048", gpucores="25",
                                   node_selector=HERE))
    victim = await wait_running(kube, "victim", NAMESPACE)
    stolen = victim["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    gpu_id = record_of(victim).containers[0].devices[0].gpu_id
    pods = object_path("v1", "pods", namespace=NAMESPACE)

    async def refused(call, message: str = ALLOCATION_ANNOTATION) -> str:
        with pytest.raises((Invalid, Forbidden)) as error:
            await call
        assert message in error.value.message, error.value.message
        return error.value.message

    # A copy of the victim's record on a new pod, with or without nodeName: refused.
    forged = gpu_pod("copycat", namespace=NAMESPACE, gpu="1", annotations={ALLOCATION_ANNOTATION: stolen})
    await refused(mallory.create(pods, forged))
    await refused(mallory.create(pods, {**forged, "spec": {**forged["spec"], "nodeName": NODE}}))
    # A record naming the unallocated rest of the GPU as a whole: refused, even on a pod asking nothing.
    whole = json.dumps({"version": 1, "node": NODE, "containers": [{"name": "c", "devices": [
        {"gpuId": gpu_id, "memoryMiB": 16368, "cuCount": 64, "whole": True}]}]})
    await refused(mallory.create(pods, {**plain_pod("grabber"), "metadata": {
        "name": "grabber", "namespace": NAMESPACE, "annotations": {ALLOCATION_ANNOTATION: whole}}}))
    # nodeName straight onto the GPU node: refused.
    await refused(mallory.create(pods, {**gpu_pod("bypass", namespace=NAMESPACE, gpu="1"),
                                        "spec": {**gpu_pod("bypass", gpu="1")["spec"], "nodeName": NODE}}),
                  "would bypass the rocshare scheduler")
    # Her own pod, created clean, then annotated: refused.
    await mallory.create(pods, plain_pod("mine"))
    mine = object_path("v1", "pods", "mine", namespace=NAMESPACE)
    await refused(mallory.merge_patch(mine, {"metadata": {"annotations": {ALLOCATION_ANNOTATION: stolen}}}))
    await refused(mallory.merge_patch(mine, {"metadata": {"annotations": {"rocshare.io/allocated": "now"}}}),
                  "rocshare.io/allocated")
    # The victim's record: not changed, not removed, not marked.
    victim_path = object_path("v1", "pods", "victim", namespace=NAMESPACE)
    await refused(mallory.merge_patch(victim_path, {"metadata": {"annotations": {ALLOCATION_ANNOTATION: whole}}}))
    await refused(mallory.merge_patch(victim_path, {"metadata": {"annotations": {ALLOCATION_ANNOTATION: None}}}))
    await refused(mallory.json_patch(victim_path, [
        {"op": "remove", "path": "/metadata/annotations/rocshare.io~1allocation"}]))
    assert (await read_pod(kube, "victim", NAMESPACE))["metadata"]["annotations"][ALLOCATION_ANNOTATION] == stolen
    # Asking for the default scheduler does not escape rocshare's: the webhook sends the pod there.
    escaped = gpu_pod("escape", namespace=NAMESPACE, gpu="1", gpumem="1024", node_selector=HERE)
    escaped["spec"]["schedulerName"] = "default-scheduler"
    created = await mallory.create(pods, escaped)
    assert created["spec"]["schedulerName"] == "rocshare-scheduler"
    for name in ("victim", "mine", "escape"):
        await delete_pod(kube, name, NAMESPACE)


# ---- the agent's socket ---------------------------------------------------------------------------------


def test_agent_socket_is_not_group_or_world_writable(ready) -> None:
    _, node = ready
    sockets = [path for path in node.plugin_dir.iterdir() if path.is_socket() and path.name != "kubelet.sock"]
    assert sockets, f"no plugin socket in {node.plugin_dir}"
    for path in sockets:
        mode = path.stat().st_mode
        assert not mode & (stat.S_IWOTH | stat.S_IWGRP | stat.S_IROTH), f"{path} mode {oct(mode)}"


# ---- a pod's own spec cannot widen its slice (issue 39) ---------------------------------------------------

ISSUE_ENV = [{"name": "HIP_DEVICE_MEMORY_LIMIT_0", "value": "65536m"}, {"name": "HSA_CU_MASK", "value": "0:0-103"},
             {"name": "LD_AUDIT", "value": "/nonexistent.so"}]
SPEC_ATTACKS = [
    ("the issue's env", {"env": ISSUE_ENV}, {}, "ProtectedEnvVar: containers[0] (c0): env HIP_DEVICE_MEMORY_LIMIT_0"),
    ("valueFrom", {"env": [{"name": "LD_AUDIT", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "k"}}}]}, {},
     "ProtectedEnvVar: containers[0] (c0): env LD_AUDIT"),
    ("ROCr's CU-mask skip switch", {"env": [{"name": "HSA_CU_MASK_SKIP_INIT", "value": "1"}]}, {},
     "ProtectedEnvVar: containers[0] (c0): env HSA_CU_MASK_SKIP_INIT"),
    ("envFrom, no prefix", {"envFrom": [{"configMapRef": {"name": "tuning"}}]}, {},
     "ProtectedEnvFrom: containers[0] (c0): envFrom configMapRef tuning without a prefix"),
    ("hook mount, subPath", {"volumeMounts": [{"name": "fake", "mountPath": "/usr/local/vgpu/libamvgpu.so",
                                               "subPath": "noop.so"}]},
     {"volumes": [{"name": "fake", "emptyDir": {}}]}, "HookPathMount: containers[0] (c0): volume fake"),
    ("hostPath /dev", {"volumeMounts": [{"name": "dev", "mountPath": "/host-dev"}]},
     {"volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}]}, "HostDeviceVolume: volume dev is the host's /dev"),
]


@pytest.mark.parametrize(("index", "container", "spec", "message"),
                         [(index, *case[1:]) for index, case in enumerate(SPEC_ATTACKS)],
                         ids=[case[0] for case in SPEC_ATTACKS])
async def test_a_tenant_cannot_widen_its_slice_through_its_pod_spec(ready, mallory: Kube, index: int, container: dict,
                                                                   spec: dict, message: str) -> None:
    pod = gpu_pod(f"widen-{index}", namespace=NAMESPACE, gpu="1", gpumem="2048", gpucores="25", node_selector=HERE)
    pod["spec"]["containers"][0].update(container)
    pod["spec"].update(spec)
    with pytest.raises((Invalid, Forbidden)) as refused:
        await mallory.create(object_path("v1", "pods", namespace=NAMESPACE), pod)
    assert 'admission webhook "pods.mutate.rocshare.io" denied the request' in refused.value.message
    assert message in refused.value.message, refused.value.message


async def test_a_prefixed_env_from_is_admitted(ready, mallory: Kube, cluster) -> None:
    """The fix the refusal names works: the same source behind prefix APP_ is admitted."""
    pod = gpu_pod("prefixed", namespace=NAMESPACE, gpu="1", gpumem="2048", node_selector=HERE)
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "tuning"}, "prefix": "APP_"}]
    created = await mallory.create(object_path("v1", "pods", namespace=NAMESPACE), pod)
    assert created["spec"]["containers"][0]["envFrom"][0]["prefix"] == "APP_"
    cluster.kubectl("delete", "pod", "prefixed", "-n", NAMESPACE, "--force", "--grace-period=0", "--wait=false")


async def test_a_container_naming_a_rocshare_claim_is_held_to_a_slice(ready, kube: Kube, mallory: Kube,
                                                                      cluster) -> None:
    """No amd.com/* limits, a gpu.rocshare.io claim named directly: privileged is refused as for a
    slice, also when the claim is not written yet; another driver's claim is not judged."""
    claims = object_path("resource.k8s.io/v1", "resourceclaims", namespace=NAMESPACE)
    for name, device_class in (("mine", "gpu.rocshare.io"), ("other", "gpu.example.com")):
        await kube.create(claims, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                   "metadata": {"name": name}, "spec": {"devices": {"requests": [
                                       {"name": "g", "exactly": {"deviceClassName": device_class}}]}}})

    def claiming(pod_name: str, claim: str) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name, "namespace": NAMESPACE}, "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True},
                            "resources": {"claims": [{"name": "gpu"}]}}]}}

    pods = object_path("v1", "pods", namespace=NAMESPACE)
    try:
        for pod_name, claim in (("claims-mine", "mine"), ("claims-later", "not-yet")):
            with pytest.raises((Invalid, Forbidden)) as refused:
                await mallory.create(pods, claiming(pod_name, claim))
            assert "PrivilegedSlice: containers[0] (c): a privileged container sees every GPU" in refused.value.message
        assert (await mallory.create(pods, claiming("claims-other", "other")))["metadata"]["name"] == "claims-other"
    finally:
        cluster.kubectl("delete", "pod", "claims-other", "-n", NAMESPACE, "--force", "--grace-period=0",
                        "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "resourceclaims", "mine", "other", "-n", NAMESPACE, "--ignore-not-found",
                        "--wait=false", check=False)


# ---- fail closed ------------------------------------------------------------------------------------------


async def test_webhook_fails_closed_for_gpu_pods_only(ready, kube: Kube, cluster) -> None:
    operator, _ = ready
    operator.stop()
    try:
        with pytest.raises(ApiError) as refused:
            await create_pod(kube, gpu_pod("while-down", namespace=NAMESPACE, gpu="1", gpumem="1024"))
        assert "failed calling webhook" in refused.value.message, refused.value.message
        await kube.create(object_path("v1", "pods", namespace=NAMESPACE), plain_pod("no-gpu"))
        system = gpu_pod("system-gpu", namespace="kube-system", gpu="1")
        created = await kube.create(object_path("v1", "pods", namespace="kube-system"), system)
        assert created["spec"]["schedulerName"] == "default-scheduler"  # not mutated, not refused
    finally:
        operator.start()
        operator.wait_webhook_serving()
        for name, namespace in (("no-gpu", NAMESPACE), ("system-gpu", "kube-system")):
            cluster.kubectl("delete", "pod", name, "-n", namespace, "--force", "--grace-period=0",
                            "--ignore-not-found", "--wait=false", check=False)


# ---- extender TLS -----------------------------------------------------------------------------------------


class TlsOperator(OperatorProcess):
    """The operator with the extender on TLS; ready when its HTTPS /readyz answers."""

    def readyz(self) -> tuple[str, ssl.SSLContext]:
        context = ssl.create_default_context(cafile=str(self.cluster.pki / "ca.crt"))
        return f"https://127.0.0.1:{self.cluster.ports.extender}/readyz", context


def tls_scheduler_config(cluster: ControlPlane) -> str:
    config = yaml.safe_load(cluster._write_scheduler_config().read_text())
    for extender in config["extenders"]:
        extender["urlPrefix"] = f"https://127.0.0.1:{cluster.ports.extender}/extender"
        extender["enableHTTPS"] = True
        extender["tlsConfig"] = {"caData": base64.b64encode((cluster.pki / "ca.crt").read_bytes()).decode()}
    path = cluster.root / "kube-scheduler-tls.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def restart_scheduler(cluster: ControlPlane, config: str | None) -> None:
    stop_process(cluster.pids.pop("kube-scheduler"), "kube-scheduler", sig=signal.SIGTERM)
    cluster.start_scheduler(config_path=config)


async def test_extender_serves_tls_and_kube_scheduler_binds_through_it(ready, kube: Kube, cluster) -> None:
    operator, _ = ready
    ca = certs.KeyPair(cluster.pki / "ca.crt", cluster.pki / "ca.key")
    pair = certs.issue(ca, cluster.pki, "extender", common_name="rocshare-extender", server=True,
                       dns_names=("localhost",), ip_addresses=("127.0.0.1",))
    operator.stop()
    tls = TlsOperator(cluster, metrics_port=operator.metrics_port, webhook_port=operator.webhook_port,
                      extra_args=(f"--extender-tls-cert={pair.cert}", f"--extender-tls-key={pair.key}"))
    restart_scheduler(cluster, tls_scheduler_config(cluster))
    try:
        tls.start()
        url = f"http://127.0.0.1:{cluster.ports.extender}/readyz"
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(url, timeout=3).read()  # plain HTTP on the TLS port: no answer
        with pytest.raises(urllib.error.URLError) as untrusted:
            urllib.request.urlopen(url.replace("http:", "https:"), timeout=3, context=ssl.create_default_context())
        assert "CERTIFICATE_VERIFY_FAILED" in str(untrusted.value)
        await create_pod(kube, gpu_pod("over-tls", namespace=NAMESPACE, gpu="1", gpumem="1024", gpucores="10",
                                       node_selector=HERE))
        pod = await wait_running(kube, "over-tls", NAMESPACE, timeout_s=60)
        assert record_of(pod).node == NODE  # filtered and bound by the extender, over TLS
        await delete_pod(kube, "over-tls", NAMESPACE)
    finally:
        tls.stop()
        restart_scheduler(cluster, None)
        operator.start()
        operator.wait_webhook_serving()


# ---- the webhook authenticates its caller -------------------------------------------------------------


def forged_review(url: str, context: ssl.SSLContext) -> dict:
    """A pod AdmissionReview posted straight to the webhook, as any pod on the network could."""
    pod = gpu_pod("forged", namespace=NAMESPACE, gpu="1", gpumem="1024")
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "forged-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                          "resource": {"group": "", "version": "v1", "resource": "pods"},
                          "namespace": NAMESPACE, "operation": "CREATE", "object": pod,
                          "userInfo": {"username": "mallory"}}}
    request = urllib.request.Request(url, data=json.dumps(review).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        return json.loads(answer.read())


async def test_the_webhook_answers_only_the_api_servers_certificate(ready, kube: Kube, mallory: Kube, cluster,
                                                                    tmp_path) -> None:
    operator, _ = ready
    port = free_port()
    auth = write_webhook_client_auth(tmp_path / "webhook-client", (f"127.0.0.1:{port}",))
    before = cluster.extra_apiserver_args
    cluster.extra_apiserver_args = (*before, auth.apiserver_arg)
    cluster.restart_apiserver()
    guarded = OperatorProcess(cluster, metrics_port=free_port(), webhook_port=port,
                              extra_args=(f"--webhook-client-ca={auth.client_ca}",))
    operator.stop()
    try:
        guarded.start()
        guarded.install_webhooks()
        # The API server's calls carry its certificate: the mutating webhook sets the scheduler,
        # and the validating one refuses a slice that sets its own memory limit, with its reason.
        created = await create_pod(mallory, gpu_pod("through-api", namespace=NAMESPACE, gpu="1", gpumem="1024"))
        assert created["spec"]["schedulerName"] != "default-scheduler", created["spec"]
        widened = gpu_pod("widened", namespace=NAMESPACE, gpu="1", gpumem="1024")
        widened["spec"]["containers"][0]["env"] = [{"name": "HIP_DEVICE_MEMORY_LIMIT_0", "value": "65536m"}]
        with pytest.raises(ApiError) as refused:
            await create_pod(mallory, widened)
        assert "HIP_DEVICE_MEMORY_LIMIT_0" in refused.value.message, refused.value.message
        # Straight to the webhook: without the certificate the handshake fails; with it, answered.
        url = f"https://127.0.0.1:{port}/pods.validate.rocshare.io"
        server_ca = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            forged_review(url, server_ca)
        client = yaml.safe_load(auth.kubeconfig.read_text())["users"][0]["user"]
        server_ca.load_cert_chain(client["client-certificate"], client["client-key"])
        assert forged_review(url, server_ca)["response"]["uid"] == "forged-1"
    finally:
        guarded.stop()
        cluster.extra_apiserver_args = before
        cluster.restart_apiserver()
        operator.start()
        operator.install_webhooks()
        cluster.kubectl("delete", "pod", "through-api", "-n", NAMESPACE, "--force", "--grace-period=0",
                        "--ignore-not-found", "--wait=false", check=False)
