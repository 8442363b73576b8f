"""What the rendered manifests must say, beyond fitting their schemas: the operator pod's two
containers and ports, the scheduler configuration mounted unchanged under a stable name,
namespaces written on every object, the webhook configurations shipped as written, TLS wired
in each overlay, RBAC free of wildcards, Argo CD sync waves that put definitions first."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.manifests.rendering import KUBECTL, ROOT, find, render

OVERLAYS = ("manifests/overlays/dev", "manifests/overlays/cert-manager")
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering",
                  "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding", "AmdGpuPool", "AmdGpuNode", "RuntimeClass", "DeviceClass"}


def containers(objects: list[dict]) -> dict[str, dict]:
    spec = find(objects, "Deployment", "rocshare-operator")["spec"]["template"]["spec"]
    return {container["name"]: container for container in [*spec.get("initContainers", []), *spec["containers"]]}


def test_operator_pod_runs_the_operator_and_kube_scheduler() -> None:
    objects = render("manifests/base")
    pod = containers(objects)
    assert pod["operator"]["args"] == ["operator", "--namespace", "rocshare-system", "--scheduler-lease",
                                       "rocshare-scheduler"]
    assert {port["containerPort"] for port in pod["operator"]["ports"]} == {31990, 31993, 9443}
    scheduler = pod["kube-scheduler"]
    assert scheduler["image"] == "registry.k8s.io/kube-scheduler:v1.35.4"
    assert "--config=/etc/rocshare/scheduler/kube-scheduler-config.yaml" in scheduler["command"]
    spec = find(objects, "Deployment", "rocshare-operator")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "rocshare-operator"
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_dra_modes_scheduler_scores_through_the_extender_on_its_own_lease_and_port() -> None:
    """Issue 42: DRA mode's profile (the name admission sends DRA pods to) asks the extender to score
    only, beside the operator; its own Lease (the operator may read and renew it) and HTTPS port."""
    from rocshare.api.dra import DRA_SCHEDULER_NAME
    from rocshare_operator.extender.server import PRIORITIZE_DRA, UNGATED_VERBS

    objects = render("manifests/base")
    written = (ROOT / "manifests/base/scheduler/kube-scheduler-dra-config.yaml").read_text()
    assert find(objects, "ConfigMap", "rocshare-dra-scheduler-config")["data"]["kube-scheduler-dra-config.yaml"] == written
    config = yaml.safe_load(written)
    assert [profile["schedulerName"] for profile in config["profiles"]] == [DRA_SCHEDULER_NAME]
    [extender] = config["extenders"]
    assert extender["prioritizeVerb"] == PRIORITIZE_DRA in UNGATED_VERBS and extender["ignorable"] is True
    assert not {"filterVerb", "bindVerb", "preemptVerb"} & extender.keys()
    plain = yaml.safe_load((ROOT / "manifests/base/scheduler/kube-scheduler-config.yaml").read_text())
    assert extender["urlPrefix"] == plain["extenders"][0]["urlPrefix"]  # the operator beside it
    lease = config["leaderElection"]["resourceName"]
    assert lease != plain["leaderElection"]["resourceName"]
    role = find(objects, "Role", "rocshare-scheduler-leader-election")
    assert lease in role["rules"][0]["resourceNames"]
    dra = containers(objects)["kube-scheduler-dra"]
    assert "--config=/etc/rocshare/dra-scheduler/kube-scheduler-dra-config.yaml" in dra["command"]
    ports = {port["containerPort"] for container in containers(objects).values() for port in container.get("ports", [])}
    assert "--secure-port=10260" in dra["command"] and 10259 in ports and 10260 in ports


def test_scheduler_config_is_the_file_unchanged_under_a_stable_name() -> None:
    config_map = find(render("manifests/base"), "ConfigMap", "rocshare-scheduler-config")
    written = (ROOT / "manifests/base/scheduler/kube-scheduler-config.yaml").read_text()
    assert config_map["data"]["kube-scheduler-config.yaml"] == written
    config = yaml.safe_load(written)
    assert config["clientConnection"]["kubeconfig"] == ""  # in-cluster
    assert config["leaderElection"]["resourceNamespace"] == "rocshare-system"
    volumes = find(render("manifests/base"), "Deployment", "rocshare-operator")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "scheduler-config", "configMap": {"name": "rocshare-scheduler-config"}} in volumes


def test_webhook_configurations_are_shipped_as_written() -> None:
    written = list(yaml.safe_load_all((ROOT / "manifests/base/webhook/webhooks.yaml").read_text()))
    rendered = render("manifests/base")
    for config in written:
        assert find(rendered, config["kind"], config["metadata"]["name"]) == config


@pytest.mark.parametrize("path", ["manifests/base", *OVERLAYS, "manifests/observability", "samples"])
def test_every_namespaced_object_names_its_namespace(path: str) -> None:
    for obj in render(path):
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"].get("namespace"), f"{obj['kind']}/{obj['metadata']['name']} has no namespace"


def test_cert_manager_overlay_serves_the_webhook_with_the_tls_secret() -> None:
    objects = render("manifests/overlays/cert-manager")
    operator = containers(objects)["operator"]
    assert "--webhook-cert=/etc/rocshare/webhook-tls/tls.crt" in operator["args"]
    assert "--webhook-key=/etc/rocshare/webhook-tls/tls.key" in operator["args"]
    assert {"name": "webhook-tls", "mountPath": "/etc/rocshare/webhook-tls", "readOnly": True} in operator["volumeMounts"]
    volumes = find(objects, "Deployment", "rocshare-operator")["spec"]["template"]["spec"]["volumes"]
    secret = next(volume["secret"] for volume in volumes if volume["name"] == "webhook-tls")
    assert secret["secretName"] == "rocshare-webhook-tls"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_exposes_the_webhook_service(overlay: str) -> None:
    service = find(render(overlay), "Service", "rocshare-webhook")
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]


def test_dev_overlay_has_the_operator_own_its_certificate() -> None:
    """overlays/dev: the operator keeps the Secret itself (admission/tls_secret.py); no file flags,
    no Secret volume that could be missing when the pod starts."""
    from rocshare.cli import build_parser

    operator = containers(render("manifests/overlays/dev"))["operator"]
    args = build_parser().parse_args(operator["args"])
    assert args.webhook_tls_secret == "rocshare-webhook-tls"
    assert args.webhook_cert is None and args.webhook_key is None
    assert all(mount["name"] != "webhook-tls" for mount in operator.get("volumeMounts", []))


def test_cert_manager_overlay_injects_the_ca_into_both_webhooks() -> None:
    objects = render("manifests/overlays/cert-manager")
    certificate = find(objects, "Certificate", "rocshare-webhook")
    assert certificate["spec"]["secretName"] == "rocshare-webhook-tls"
    assert "rocshare-webhook.rocshare-system.svc" in certificate["spec"]["dnsNames"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = find(objects, kind, "rocshare-pods")["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == "rocshare-system/rocshare-webhook"


@pytest.mark.parametrize("path", ["manifests/base", *OVERLAYS])
def test_rbac_names_every_verb_and_resource(path: str) -> None:
    for role in (obj for obj in render(path) if obj["kind"] in ("Role", "ClusterRole")):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], (role["metadata"]["name"], rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def test_operator_service_account_carries_scheduler_roles() -> None:
    bindings = [obj for obj in render("manifests/base") if obj["kind"] == "ClusterRoleBinding"]
    roles = {binding["roleRef"]["name"] for binding in bindings
             if {"kind": "ServiceAccount", "name": "rocshare-operator", "namespace": "rocshare-system"}
             in binding["subjects"]}
    assert roles == {"rocshare-operator", "system:kube-scheduler", "system:volume-scheduler"}


def test_agent_monitor_service_is_headless_and_selects_agent_pods() -> None:
    service = find(render("manifests/base"), "Service", "rocshare-node-agent-monitor")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "rocshare-node-agent"}
    assert service["spec"]["ports"][0]["port"] == 9394


def wave(obj: dict) -> int:
    return int(obj["metadata"].get("annotations", {}).get("argocd.argoproj.io/sync-wave", "0"))


@pytest.mark.parametrize("path", [*OVERLAYS, "samples"])
def test_sync_waves_put_definitions_before_what_uses_them(path: str) -> None:
    objects = render(path) + (render("manifests/base") if path == "samples" else [])
    crd_wave = max(wave(obj) for obj in objects if obj["kind"] == "CustomResourceDefinition")
    namespace_wave = {obj["metadata"]["name"]: wave(obj) for obj in objects if obj["kind"] == "Namespace"}
    for obj in objects:
        if obj["apiVersion"].split("/")[0] in ("rocshare.io", "kopf.dev", "cert-manager.io"):
            assert wave(obj) > crd_wave, f"{obj['kind']}/{obj['metadata']['name']} syncs with its definition"
        namespace = obj["metadata"].get("namespace")
        if namespace in namespace_wave and obj["kind"] != "Namespace":
            assert wave(obj) >= namespace_wave[namespace], obj["metadata"]["name"]
    webhooks = [obj for obj in objects if obj["kind"].endswith("WebhookConfiguration")]
    deployments = [obj for obj in objects if obj["kind"] == "Deployment"]
    assert all(wave(hook) > wave(deploy) for hook in webhooks for deploy in deployments)


def test_samples_order_pools_share_pods() -> None:
    waves = {obj["kind"]: wave(obj) for obj in render("samples")}
    assert waves["AmdGpuPool"] < waves["AmdGpuShare"] < waves["Pod"]


@pytest.mark.parametrize("path", ["manifests/base", *OVERLAYS])
def test_operator_arguments_parse_with_the_real_cli(path: str) -> None:
    from rocshare.cli import build_parser

    args = build_parser().parse_args(containers(render(path))["operator"]["args"])
    assert args.namespace == "rocshare-system"
    assert args.standalone is False  # peering through the ClusterKopfPeering `rocshare`
    # ... which the operator creates (leadership.py): an object beside its CRD in one
    # apply fails the first run. Only the definition is shipped.
    objects = render(path)
    assert not [obj for obj in objects if obj["kind"] == "ClusterKopfPeering"]
    assert find(objects, "CustomResourceDefinition", "clusterkopfpeerings.kopf.dev")


def test_webhook_skips_exactly_the_users_the_operator_trusts() -> None:
    """The validating webhook's matchCondition and the webhook's own trusted list name the same users:
    a user skipped by the condition but not trusted by the handler (or the reverse) is a hole or a cost."""
    from rocshare_dev.devcluster.operator_proc import TRUSTED_USERS_CONDITION, _also_trusting
    from rocshare_operator.admission.webhook import WebhookSettings

    written = list(yaml.safe_load_all((ROOT / "manifests/base/webhook/webhooks.yaml").read_text()))
    validating = find(written, "ValidatingWebhookConfiguration", "rocshare-pods")["webhooks"][0]
    expression = next(c["expression"] for c in validating["matchConditions"] if c["name"] == TRUSTED_USERS_CONDITION)
    listed = re.findall(r"'([^']+)'", expression)
    assert set(listed) == set(WebhookSettings().trusted_users)
    assert re.findall(r"'([^']+)'", _also_trusting(expression, "admin")) == ["admin", *listed]


def test_pod_policy_trusts_exactly_the_users_the_operator_trusts() -> None:
    """The pod ValidatingAdmissionPolicy (policy/pods.yaml) lets the same users write allocation
    annotations as the webhook does; it ships in the base, and the pod-defaults policy is a
    component (only where the API server serves MutatingAdmissionPolicy)."""
    from rocshare_operator.admission.webhook import WebhookSettings

    rendered = render("manifests/base")
    policy = find(rendered, "ValidatingAdmissionPolicy", "rocshare-pods")
    trusted = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "trusted")
    assert set(re.findall(r"'([^']+)'", trusted)) == set(WebhookSettings().trusted_users)
    assert find(rendered, "ValidatingAdmissionPolicyBinding", "rocshare-pods")["spec"]["validationActions"] == ["Deny"]
    assert not [obj for obj in rendered if obj["kind"].startswith("MutatingAdmissionPolicy")]
    component = list(yaml.safe_load_all(
        (ROOT / "manifests/components/pod-defaults-policy/pod-defaults.yaml").read_text()))
    binding = find(component, "MutatingAdmissionPolicyBinding", "rocshare-pod-defaults")
    assert binding["spec"]["paramRef"] == {"name": "rocshare-admission", "namespace": "rocshare-system",
                                           "parameterNotFoundAction": "Deny"}


def render_component(component: str, overlay: Path) -> list[dict]:
    """A component rendered through an overlay of its own, as a user includes it."""
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "components": [os.path.relpath(ROOT / component, overlay)]}))
    result = subprocess.run([str(KUBECTL), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def test_pod_defaults_policy_at_the_beta_and_the_ga_api_version(tmp_path: Path) -> None:
    """MutatingAdmissionPolicy is admissionregistration.k8s.io/v1beta1 (gated) on 1.34-1.35 and v1 from 1.36,
    where v1beta1 is off by default: components/pod-defaults-policy is the one, pod-defaults-policy-v1
    the other, the same objects otherwise."""
    beta = render_component("manifests/components/pod-defaults-policy", tmp_path / "beta")
    ga = render_component("manifests/components/pod-defaults-policy-v1", tmp_path / "ga")
    kinds = ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
    assert [obj["kind"] for obj in beta] == [obj["kind"] for obj in ga] == kinds
    assert {obj["apiVersion"] for obj in beta} == {"admissionregistration.k8s.io/v1beta1"}
    assert {obj["apiVersion"] for obj in ga} == {"admissionregistration.k8s.io/v1"}
    assert [{**obj, "apiVersion": None} for obj in beta] == [{**obj, "apiVersion": None} for obj in ga]


@pytest.mark.parametrize("component", ["manifests/components/pod-defaults-policy",
                                       "manifests/components/pod-defaults-policy-v1"])
def test_with_the_pod_defaults_policy_an_overlay_renders_no_webhook(tmp_path: Path, component: str) -> None:
    """The policy does every mutation the webhook does and the base's ValidatingAdmissionPolicy every
    check: an overlay with the component renders no webhook configuration (each costs the API server
    a CEL evaluation of every GPU pod), and everything else of the overlay unchanged."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "manifests/overlays/dev", overlay)],
        "components": [os.path.relpath(ROOT / component, overlay)]}))
    result = subprocess.run([str(KUBECTL), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    with_policy = {(obj["kind"], obj["metadata"]["name"]) for obj in yaml.safe_load_all(result.stdout)}
    plain = {(obj["kind"], obj["metadata"]["name"]) for obj in render("manifests/overlays/dev")}
    webhooks = {("MutatingWebhookConfiguration", "rocshare-pods"), ("ValidatingWebhookConfiguration", "rocshare-pods")}
    assert webhooks <= plain
    assert with_policy == (plain - webhooks) | {("MutatingAdmissionPolicy", "rocshare-pod-defaults"),
                                                ("MutatingAdmissionPolicyBinding", "rocshare-pod-defaults")}


def test_two_operator_replicas_with_one_decider_and_a_disruption_budget() -> None:
    """Issue 30: two replicas spread over nodes, a rollout that adds a synced replica before removing
    one, the operator started (and synced) before kube-scheduler, following the scheduler's Lease."""
    from rocshare.cli import build_parser

    objects = render("manifests/base")
    deployment = find(objects, "Deployment", "rocshare-operator")
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (operator,) = pod["initContainers"]
    assert operator["name"] == "operator" and operator["restartPolicy"] == "Always"  # a native sidecar
    assert "/readyz" in " ".join(operator["startupProbe"]["exec"]["command"])
    assert [container["name"] for container in pod["containers"]] == ["kube-scheduler", "kube-scheduler-dra"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod_labels(deployment).items()
    budget = find(objects, "PodDisruptionBudget", "rocshare-operator")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels(deployment).items()
    election = yaml.safe_load((ROOT / "manifests/base/scheduler/kube-scheduler-config.yaml").read_text())[
        "leaderElection"]
    assert build_parser().parse_args(operator["args"]).scheduler_lease == election["resourceName"]
    seconds = {key: float(election[key].removesuffix("ms")) / 1000 if election[key].endswith("ms")
               else float(election[key].removesuffix("s")) for key in ("leaseDuration", "renewDeadline", "retryPeriod")}
    assert seconds["retryPeriod"] * 2.2 <= 1.2  # client-go's jitter: a graceful handover within the 2 s goal
    assert seconds["retryPeriod"] < seconds["renewDeadline"] < seconds["leaseDuration"] <= 8  # SIGKILL goal 10 s


def pod_labels(deployment: dict) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_pod_policy_protects_the_names_the_agent_hands_over() -> None:
    """Issue 39: the policy's lists of handed-over variables are rocshare.api.container_env's (the
    agent renders from it), and its hook-path and host-path patterns refuse what the webhook's rule
    (core/tenant_spec.py) refuses; it refuses more only where CEL cannot resolve a '..'."""
    from rocshare.api.container_env import HANDED_OVER_PREFIXES, PROTECTED_NAMES, is_protected
    from rocshare.core.tenant_spec import HOST_PATHS_REFUSED, container_path, covers_hook

    written = list(yaml.safe_load_all((ROOT / "manifests/base/policy/pods.yaml").read_text()))
    policy = find(written, "ValidatingAdmissionPolicy", "rocshare-pods")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    names = re.escape  # the names are plain words and underscores
    assert variables["handedOver"] == (f"'^({'|'.join(map(names, PROTECTED_NAMES))})$"
                                       f"|^({'|'.join(map(names, HANDED_OVER_PREFIXES))})'")
    assert re.findall(r"'([^']+)'", variables["handedOverStarts"]) == [*PROTECTED_NAMES, *HANDED_OVER_PREFIXES]
    handed_over = re.compile(variables["handedOver"].strip("'"))
    for name in ("HIP_DEVICE_MEMORY_LIMIT_3", "ROCSHARE_HOOK_DIR", "LD_AUDIT", "LD_AUDITX", "HSA_CU_MASKS", "APP",
                 "HSA_CU_MASK_SKIP_INIT"):
        assert bool(handed_over.search(name)) == is_protected(name), name
    hook_cover = re.compile(variables["hookCover"].strip("'"))
    for target in ("/", "/usr", "/usr/", "/usr/local", "//usr//local/vgpu/", "/usr/local/vgpu/libamvgpu.so",
                   "usr/local/vgpu", "/usr/local/vgpu2", "/usr/lib", "/usrx", "/data", "/tmp", "/usr/local/vgpux/a"):
        assert bool(hook_cover.search(target)) == covers_hook(target), target
    assert hook_cover.search("/a/../usr") and hook_cover.search("/data/..")  # stricter: CEL does not resolve '..'
    host = next(re.search(r"v\.hostPath\.path\.matches\('([^']+)'\)", v["expression"]).group(1)
                for v in policy["spec"]["validations"] if "HostDeviceVolume" in v["messageExpression"])
    for path in ("/", "/dev", "/dev/dri", "/dev/kfd", "/./dev", "//sys", "/sys/class/drm", "/proc", "/devices",
                 "/var/lib", "/data/dev"):
        refused = container_path(path) == "/" or any(
            container_path(path) == root or container_path(path).startswith(root + "/") for root in HOST_PATHS_REFUSED)
        assert bool(re.search(host, path)) == refused, path
    # The mutating webhook's matchCondition sends a pod naming DRA claims only when it carries what
    # these rules judge, with the same patterns.
    webhooks = list(yaml.safe_load_all((ROOT / "manifests/base/webhook/webhooks.yaml").read_text()))
    mutating = find(webhooks, "MutatingWebhookConfiguration", "rocshare-pods")["webhooks"][0]
    condition = next(c["expression"] for c in mutating["matchConditions"] if c["name"] == "asks-for-amd-gpus")
    for pattern in (variables["handedOver"], variables["hookCover"], f"'{host}'"):
        assert f".matches({pattern})" in condition, pattern


def test_the_webhook_client_ca_component_points_the_operator_at_the_mounted_ca(tmp_path: Path) -> None:
    """components/webhook-client-ca on the dev overlay: the operator's own flag parser reads a
    --webhook-client-ca file that lies in the ConfigMap the pod mounts, and nothing else changes."""
    import argparse

    from rocshare_operator import cli

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "manifests/overlays/dev", overlay)],
        "components": [os.path.relpath(ROOT / "manifests/components/webhook-client-ca", overlay)]}))
    result = subprocess.run([str(KUBECTL), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rendered = list(yaml.safe_load_all(result.stdout))
    pod = find(rendered, "Deployment", "rocshare-operator")["spec"]["template"]["spec"]
    operator = next(c for c in pod["initContainers"] if c["name"] == "operator")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    ca_file = Path(parser.parse_args(operator["args"][1:]).webhook_client_ca)
    mount = next(m for m in operator["volumeMounts"] if Path(m["mountPath"]) == ca_file.parent)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"] == {"name": "rocshare-webhook-client-ca"} and ca_file.name == "ca.crt"
    plain = render("manifests/overlays/dev")
    assert [(o["kind"], o["metadata"]["name"]) for o in rendered] == [(o["kind"], o["metadata"]["name"]) for o in plain]
