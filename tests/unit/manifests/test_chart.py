"""charts/rocshare is the kustomize manifests, not a second copy: it is what `rocshare-dev chart`
generates from them (up to date), `helm template` with the default values renders
`kubectl kustomize manifests/overlays/dev` object for object (CRDs included), and
webhook.certificate=cert-manager renders overlays/cert-manager; the opt-in components' values
render the dev overlay with that component, and only when set; the values users change take
effect; `helm lint --strict` passes. helm is built from its Go module (dev/helm/build.sh)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from rocshare_dev import chart
from tests.unit.manifests.rendering import ROOT, find, render

CHART = ROOT / "charts" / "rocshare"


@cache
def helm() -> Path:
    built = subprocess.run([str(ROOT / "dev" / "helm" / "build.sh")], capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, f"dev/helm/build.sh failed: {built.stderr[-2000:]}"
    return Path(built.stdout.strip().splitlines()[-1])


def helm_template(*args: str) -> list[dict]:
    result = subprocess.run([str(helm()), "template", "rocshare", str(CHART), "--include-crds", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_key(objects: list[dict]) -> dict[tuple, dict]:
    keyed = {chart.key(obj): obj for obj in objects}
    assert len(keyed) == len(objects), "two objects with one kind, namespace and name"
    return keyed


def test_chart_is_generated_from_the_manifests() -> None:
    problems = chart.differences(chart.generate())
    assert not problems, "charts/rocshare is out of date: run `rocshare-dev chart`\n" + "\n".join(problems)


@pytest.mark.parametrize(("overlay", "args"), [
    ("manifests/overlays/dev", ()),
    ("manifests/overlays/cert-manager", ("--set", "webhook.certificate=cert-manager")),
])
def test_helm_template_equals_kustomize_object_for_object(overlay: str, args: tuple[str, ...]) -> None:
    helm_objects, kustomize_objects = by_key(helm_template(*args)), by_key(render(overlay))
    assert sorted(helm_objects) == sorted(kustomize_objects)
    for key, obj in kustomize_objects.items():
        assert helm_objects[key] == obj, key


@pytest.mark.parametrize(("component", "args"), [
    (chart.CLIENT_CA, ("--set", "webhook.clientCA.configMap=rocshare-webhook-client-ca")),
    (chart.NETWORK_POLICY, ("--set", "webhook.networkPolicy.apiServerCIDRs={192.0.2.0/24}")),
])
def test_a_components_value_renders_the_dev_overlay_with_that_component(component: str,
                                                                         args: tuple[str, ...]) -> None:
    helm_objects, kustomize_objects = by_key(helm_template(*args)), by_key(chart.kustomize_with(chart.DEV, component))
    assert sorted(helm_objects) == sorted(kustomize_objects)
    for key, obj in kustomize_objects.items():
        assert helm_objects[key] == obj, key


def operator_pod(objects: list[dict]) -> tuple[dict, dict]:
    pod = find(objects, "Deployment", "rocshare-operator")["spec"]["template"]["spec"]
    return pod, next(c for c in pod["initContainers"] if c["name"] == "operator")


@pytest.mark.parametrize("certificate", ["self-managed", "cert-manager"])
def test_the_webhook_client_ca_is_mounted_and_passed_only_when_its_value_is_set(certificate: str) -> None:
    """Issue 39: the chart's way to make the webhook require the API server's client certificate.
    Set: the operator reads --webhook-client-ca from the mount of the ConfigMap the value names (the
    operator's own flag parser reads the argument); unset: no flag, no such mount or volume."""
    import argparse

    from rocshare_operator import cli

    pod, operator = operator_pod(helm_template("--set", f"webhook.certificate={certificate}",
                                               "--set", "webhook.clientCA.configMap=apiserver-client-ca"))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    ca_file = Path(parser.parse_args(operator["args"][1:]).webhook_client_ca)
    mount = next(m for m in operator["volumeMounts"] if Path(m["mountPath"]) == ca_file.parent)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"] == {"name": "apiserver-client-ca"} and ca_file.name == "ca.crt"
    assert mount["readOnly"] is True
    plain_pod, plain_operator = operator_pod(helm_template("--set", f"webhook.certificate={certificate}"))
    assert parser.parse_args(plain_operator["args"][1:]).webhook_client_ca is None
    assert mount not in plain_operator["volumeMounts"] and volume not in plain_pod["volumes"]
    assert [a for a in operator["args"] if not a.startswith("--webhook-client-ca=")] == plain_operator["args"]


def test_the_network_policy_admits_the_webhook_port_from_the_given_cidrs_only_when_set() -> None:
    cidrs = ["10.0.0.0/24", "fd00::/64"]
    objects = helm_template("--set", "webhook.networkPolicy.apiServerCIDRs={" + ",".join(cidrs) + "}")
    policy = find(objects, "NetworkPolicy", "rocshare-operator-ingress")
    webhook_rule = next(rule for rule in policy["spec"]["ingress"] if rule["ports"] == [{"port": 9443, "protocol": "TCP"}])
    assert webhook_rule["from"] == [{"ipBlock": {"cidr": cidr}} for cidr in cidrs]
    assert not [obj for obj in helm_template() if obj["kind"] == "NetworkPolicy"]


def test_values_take_effect() -> None:
    objects = helm_template(
        "--set", "operator.image.repository=registry.example/rocshare/operator", "--set", "operator.image.tag=1.2.3",
        "--set", "scheduler.image.tag=v1.35.9", "--set", "global.imagePullPolicy=IfNotPresent",
        "--set", "global.imagePullSecrets[0].name=pull", "--set", "operator.resources.limits.memory=2Gi",
        "--set", "operator.nodeSelector.role=control", "--set", "operator.tolerations[0].operator=Exists",
        "--set", "samplePools.enabled=true", "--set", "agent.image.tag=9.9", "--set", "agent.hookMissing=RunWithoutLimit",
        "--set", "namespace.create=false")
    pod = find(objects, "Deployment", "rocshare-operator")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in [*pod["initContainers"], *pod["containers"]]}
    assert containers["operator"]["image"] == "registry.example/rocshare/operator:1.2.3"
    assert containers["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.35.9"
    assert {c["imagePullPolicy"] for c in containers.values()} == {"IfNotPresent"}
    assert containers["operator"]["resources"]["limits"]["memory"] == "2Gi"
    assert pod["nodeSelector"] == {"role": "control"} and pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["imagePullSecrets"] == [{"name": "pull"}]
    pools = [obj for obj in objects if obj["kind"] == "AmdGpuPool"]
    samples = [obj for obj in render("samples") if obj["kind"] == "AmdGpuPool"]
    assert sorted(p["metadata"]["name"] for p in pools) == sorted(p["metadata"]["name"] for p in samples)
    assert {p["spec"]["agent"]["image"] for p in pools} == {"rocshare/node-agent:9.9"}
    assert {p["spec"]["agent"]["hookMissing"] for p in pools} == {"RunWithoutLimit"}
    assert not [obj for obj in objects if obj["kind"] == "Namespace"]
    assert not [obj for obj in helm_template() if obj["kind"] == "AmdGpuPool"]  # the samples' pools are off by default


def test_values_outside_the_schema_are_refused() -> None:
    result = subprocess.run([str(helm()), "template", "rocshare", str(CHART), "--set", "webhook.certificate=vault"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "/webhook/certificate" in result.stderr, result.stderr


def test_helm_lint_passes() -> None:
    for args in ((), ("--set", "webhook.certificate=cert-manager", "--set", "samplePools.enabled=true",
                      "--set", "webhook.clientCA.configMap=ca", "--set", "webhook.networkPolicy.apiServerCIDRs={10.0.0.0/8}")):
        result = subprocess.run([str(helm()), "lint", "--strict", str(CHART), *args], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
