"""Pod admission without the webhook (issue 18), on the real API server: the ValidatingAdmissionPolicy
(manifests/base/policy/pods.yaml) refuses what the webhook refused, with the same reasons (issue 39's
pod-spec doors too: env, envFrom, mounts over the hook, hostPath /dev, privileged in a DRA-translated
container), and the
pod-defaults MutatingAdmissionPolicy (manifests/components/pod-defaults-policy; the dev control plane
serves it, see controlplane.py) sets the scheduler name and the pool's RuntimeClass from the
operator's parameters (admission/policy_params.py), and amd.com/gpu: 1 where a container asks for
a memory percentage alone. Proven with the operator stopped: no webhook can answer (none is
installed with the policy), so whatever is decided here was decided by the API server alone.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest

from rocshare.api.models import API_VERSION
from rocshare.kube.client import ApiError, Forbidden, Invalid, Kube, object_path
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from tests.e2e.fleet import gpu_pod, privileged, wait_for, with_spec

pytestmark = pytest.mark.e2e

NAMESPACE = "admission"
USER = "carol"
POOL = "admission-pool"
RUNTIME_CLASS = "rocshare-admission-test"


@pytest.fixture(scope="module")
def operator(cluster) -> Iterator[OperatorProcess]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("create", "rolebinding", f"{USER}-edit", "--clusterrole=edit", f"--user={USER}", "-n", NAMESPACE)
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNTIME_CLASS}, "handler": "runc"}))
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps({
        "apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": POOL},
        "spec": {"nodeSelector": {"rocshare.io/sim": POOL}, "runtimeClassName": RUNTIME_CLASS}}))
    process = OperatorProcess(cluster)
    process.start()
    process.install_webhooks(admission_policies=True)
    try:
        yield process
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        process.stop()
        cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--force", "--grace-period=0", "--wait=false",
                        check=False)
        # The operator is stopped (operator_down stops it for good), so nobody would run the pool's
        # finalizer: a pool left terminating would go on naming RUNTIME_CLASS, deleted below, in the
        # policy parameters the next module's operator writes (its pods then refused at admission).
        cluster.kubectl("patch", "amdgpupool", POOL, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                        check=False)
        cluster.kubectl("delete", "amdgpupool", POOL, "--ignore-not-found", "--timeout=60s", check=False)
        cluster.kubectl("delete", "runtimeclass", RUNTIME_CLASS, "--ignore-not-found", check=False)
        # The policy parameters stay: the next operator rewrites them without this module's pool (a
        # ConfigMap deleted and made again left kube-apiserver 1.35 answering "no params found").
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator_down(operator: OperatorProcess, cluster) -> Iterator[OperatorProcess]:
    """The policies installed and their parameters written, then the operator stopped (its webhook
    answers nothing), the policies kept."""
    if not operator.serves_mutating_admission_policy():
        pytest.skip("this API server does not serve MutatingAdmissionPolicy")

    def params() -> dict:
        result = cluster.kubectl("get", "configmap", "rocshare-admission", "-n", "rocshare-system", "-o", "json",
                                 check=False)
        return json.loads(result.stdout).get("data", {}) if result.returncode == 0 else {}

    import time
    deadline = time.monotonic() + 30
    while params().get(f"pool.{POOL}") != RUNTIME_CLASS:
        assert time.monotonic() < deadline, f"the operator did not write the policy parameters: {params()}"
        time.sleep(0.3)
    installed, operator.policies = operator.policies, ()
    operator.stop()  # keeps the policies (taken from it above)
    operator.policies = installed
    yield operator


@pytest.fixture
async def carol(cluster, operator) -> AsyncIterator[Kube]:
    client = await Kube.connect(cluster.user_kubeconfig(USER))
    try:
        yield client
    finally:
        await client.close()


PODS = object_path("v1", "pods", namespace=NAMESPACE)


async def test_the_api_server_sets_the_defaults_with_the_operator_down(operator_down, carol: Kube) -> None:
    created = await carol.create(PODS, gpu_pod("in-pool", namespace=NAMESPACE, gpu="1", gpumem="1024",
                                               node_selector={"rocshare.io/pool": POOL}))
    assert created["spec"]["schedulerName"] == "rocshare-scheduler"
    assert created["spec"]["runtimeClassName"] == RUNTIME_CLASS
    # The only pool: a pod naming none lands there, and gets its RuntimeClass too.
    only = await carol.create(PODS, gpu_pod("no-pool", namespace=NAMESPACE, gpu="1", gpucores="10"))
    assert only["spec"]["schedulerName"] == "rocshare-scheduler" and only["spec"]["runtimeClassName"] == RUNTIME_CLASS
    # A pod without GPUs is not touched.
    plain = await carol.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                                      "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert plain["spec"]["schedulerName"] == "default-scheduler" and "runtimeClassName" not in plain["spec"]


async def test_a_memory_percentage_alone_gets_one_gpu_from_the_api_server(operator_down, carol: Kube) -> None:
    """The webhook's last mutation, done by the policy too: a container asking only a memory
    percentage is given amd.com/gpu: 1 (limits, and requests as the API server defaults them);
    a container that names its GPUs, and one asking nothing, are left as they are."""
    pod = gpu_pod("pct", namespace=NAMESPACE, **{"gpumem-percentage": "50"})
    spec = pod["spec"]
    spec["initContainers"] = [{**spec["containers"][0], "name": "init"}]
    spec["containers"] += [{"name": "two", "image": "x", "resources": {"limits": {
        "amd.com/gpu": "2", "amd.com/gpumem-percentage": "25"}}}, {"name": "none", "image": "x"}]
    created = (await carol.create(PODS, pod))["spec"]
    first, two, none = created["containers"]
    for container in (created["initContainers"][0], first):
        assert container["resources"]["limits"]["amd.com/gpu"] == "1"
        assert container["resources"]["requests"]["amd.com/gpu"] == "1"
    assert two["resources"]["limits"]["amd.com/gpu"] == "2" and not none.get("resources")
    assert created["schedulerName"] == "rocshare-scheduler"


def test_with_the_policy_no_webhook_is_installed(operator, cluster) -> None:
    """The component leaves the webhooks out: no pod create waits for one (or fails with the operator)."""
    if not operator.serves_mutating_admission_policy():
        pytest.skip("this API server does not serve MutatingAdmissionPolicy")
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        assert cluster.kubectl("get", kind, "rocshare-pods", check=False).returncode != 0, kind


def slice_with(name: str, container: dict, **spec: object) -> dict:
    """A 2048 MiB / 25 % slice pod whose container (and pod spec) also carry what a tenant wrote."""
    pod = gpu_pod(name, namespace=NAMESPACE, gpu="1", gpumem="2048", gpucores="25")
    pod["spec"]["containers"][0].update(container)
    pod["spec"].update(spec)
    return pod


def translated(name: str, **container: object) -> dict:
    """A pod as the webhook leaves it in a DRA pool (admission/dra_pods.py): no amd.com/*, a pod claim
    rocshare-gpu-0 from a rocshare-gpu-<hash> template, named by the container."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {
        "resourceClaims": [{"name": "rocshare-gpu-0", "resourceClaimTemplateName": "rocshare-gpu-0123456789abcdef"}],
        "containers": [{"name": "c0", "image": "x", "resources": {"claims": [{"name": "rocshare-gpu-0"}]}, **container}]}}


ISSUE_ENV = [{"name": "HIP_DEVICE_MEMORY_LIMIT_0", "value": "65536m"}, {"name": "HSA_CU_MASK", "value": "0:0-103"},
             {"name": "LD_AUDIT", "value": "/nonexistent.so"}]
BAD_PODS = [
    ("cores 150", gpu_pod("b1", namespace=NAMESPACE, gpu="1", gpucores="150"),
     "container 'c0': amd.com/gpucores is 150, must be 1-100"),
    ("memory with a byte unit", gpu_pod("b2", namespace=NAMESPACE, gpu="1", gpumem="4Gi"),
     "amd.com/gpumem is in MiB: '4Gi' has a binary (byte) suffix"),
    ("memory 0", gpu_pod("b3", namespace=NAMESPACE, gpu="1", gpumem="0"), "amd.com/gpumem is 0, must be >= 1"),
    ("cores without gpu", gpu_pod("b5", namespace=NAMESPACE, gpucores="20"), "amd.com/gpucores needs amd.com/gpu"),
    ("gpu 0 with a slice", gpu_pod("b6", namespace=NAMESPACE, gpu="0", gpumem="1024"),
     "amd.com/gpu is 0 but a GPU slice is asked"),
    ("link-bind maybe", gpu_pod("b7", namespace=NAMESPACE, gpu="2", annotations={"amd.com/link-bind": "maybe"}),
     "annotation amd.com/link-bind is 'maybe', must be \"true\" or \"false\""),
    ("empty type", gpu_pod("b8", namespace=NAMESPACE, gpu="1", annotations={"amd.com/use-gputype": "mi210,"}),
     "amd.com/use-gputype is 'mi210,', must be a comma list of non-empty names"),
    ("unknown policy", gpu_pod("b9", namespace=NAMESPACE, gpu="1",
                               annotations={"hami.io/gpu-scheduler-policy": "random"}),
     "hami.io/gpu-scheduler-policy is 'random', must be one of"),
    ("partition with a slice", gpu_pod("b10", namespace=NAMESPACE, cpx_nps4="1", gpumem="1024"),
     "asks for whole partitions of one kind"),
    ("nodeName bypass", with_spec(gpu_pod("b11", namespace=NAMESPACE, gpu="1"), nodeName="any-node"),
     "would bypass the rocshare scheduler"),
    ("privileged slice", privileged(gpu_pod("b12", namespace=NAMESPACE, gpu="1", gpumem="1024")),
     "a privileged container sees every GPU"),
    ("env over the slice (issue 39)", slice_with("t1", {"env": ISSUE_ENV}),
     "ProtectedEnvVar: container 'c0': env HIP_DEVICE_MEMORY_LIMIT_0 is set by rocshare"),
    ("valueFrom", slice_with("t2", {"env": [{"name": "ROCSHARE_HOOK_DIR", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.name"}}}]}), "ProtectedEnvVar: container 'c0': env ROCSHARE_HOOK_DIR"),
    ("ROCr's CU-mask skip switch", slice_with("t11", {"env": [{"name": "HSA_CU_MASK_SKIP_INIT", "value": "1"}]}),
     "ProtectedEnvVar: container 'c0': env HSA_CU_MASK_SKIP_INIT"),
    ("envFrom without a prefix", slice_with("t3", {"envFrom": [{"configMapRef": {"name": "tuning"}}]}),
     "ProtectedEnvFrom: container 'c0': an envFrom without a prefix"),
    ("envFrom prefix LD_", slice_with("t4", {"envFrom": [{"secretRef": {"name": "s"}, "prefix": "LD_"}]}),
     "ProtectedEnvFrom: container 'c0'"),
    ("hook mount, subPath", slice_with("t5", {"volumeMounts": [{"name": "fake", "subPath": "noop.so",
                                                                 "mountPath": "/usr/local/vgpu/libamvgpu.so"}]},
                                        volumes=[{"name": "fake", "emptyDir": {}}]),
     "HookPathMount: container 'c0': a volume mounted at /usr/local/vgpu/libamvgpu.so would cover /usr/local/vgpu"),
    ("mount above the hook", slice_with("t6", {"volumeMounts": [{"name": "fake", "mountPath": "/usr/local"}]},
                                        volumes=[{"name": "fake", "emptyDir": {}}]), "HookPathMount"),
    ("hostPath /dev/dri", slice_with("t7", {}, volumes=[{"name": "dri", "hostPath": {"path": "/dev/dri"}}]),
     "HostDeviceVolume: volume dri is the host's /dev/dri"),
    ("hostPath /", slice_with("t8", {}, volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
     "HostDeviceVolume: volume root is the host's /"),
    ("DRA-translated, privileged", translated("t9", securityContext={"privileged": True}),
     "PrivilegedSlice: container 'c0': a privileged container sees every GPU"),
    ("DRA-translated, env", translated("t10", env=[{"name": "HSA_CU_MASK", "value": "0:0-103"}]),
     "ProtectedEnvVar: container 'c0': env HSA_CU_MASK"),
    ("forged record", gpu_pod("b13", namespace=NAMESPACE, gpu="1", annotations={"rocshare.io/allocation": "{}"}),
     "annotation rocshare.io/allocation is written only by the rocshare scheduler and node agent; remove it"),
    ("forged record, no GPU asked", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "b14", "namespace": NAMESPACE, "annotations": {"hami.io/amd-devices-allocated": "x"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}, "hami.io/amd-devices-allocated is written only by"),
]


@pytest.mark.parametrize(("pod", "message"), [(pod, message) for _, pod, message in BAD_PODS],
                         ids=[case for case, _, _ in BAD_PODS])
async def test_bad_pods_are_refused_by_the_api_server_alone(operator_down, carol: Kube, pod: dict,
                                                            message: str) -> None:
    with pytest.raises((Invalid, Forbidden)) as refused:
        await carol.create(PODS, pod)
    assert message in refused.value.message, refused.value.message
    assert "ValidatingAdmissionPolicy 'rocshare-pods'" in refused.value.message


async def test_the_pod_spec_rules_leave_ordinary_pods_alone(operator_down, carol: Kube) -> None:
    """What the issue-39 rules must not refuse: a prefixed envFrom, the app's own variables, a mount
    beside the hook, whole GPUs privileged, and the same variables in a pod without GPUs."""
    ok = slice_with("ok-slice", {"envFrom": [{"configMapRef": {"name": "tuning"}, "prefix": "APP_"}],
                                 "env": [{"name": "HIP_LAUNCH_BLOCKING", "value": "1"}],
                                 "volumeMounts": [{"name": "data", "mountPath": "/usr/local/vgpu-data"}]},
                    volumes=[{"name": "data", "emptyDir": {}}])
    assert (await carol.create(PODS, ok))["metadata"]["name"] == "ok-slice"
    assert (await carol.create(PODS, privileged(gpu_pod("ok-whole", namespace=NAMESPACE, gpu="1"))))
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ok-plain"}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "env": ISSUE_ENV, "envFrom": [{"configMapRef": {"name": "m"}}]}]}}
    assert (await carol.create(PODS, plain))["metadata"]["name"] == "ok-plain"


async def test_forged_updates_are_refused_by_the_api_server_alone(operator_down, carol: Kube, kube: Kube) -> None:
    pod = await carol.create(PODS, gpu_pod("victim", namespace=NAMESPACE, gpu="1", gpumem="512"))
    path = object_path("v1", "pods", "victim", namespace=NAMESPACE)
    for key in ("rocshare.io/allocation", "rocshare.io/allocated"):
        with pytest.raises((Invalid, Forbidden)) as refused:
            await carol.merge_patch(path, {"metadata": {"annotations": {key: "x"}}})
        assert f"annotation {key} is written only by" in refused.value.message
    # rocshare's own writers (here the admin user, trusted as its service accounts are) may.
    await kube.merge_patch(path, {"metadata": {"annotations": {"rocshare.io/allocation-error": "test"}}})
    assert pod["metadata"]["name"] == "victim"
