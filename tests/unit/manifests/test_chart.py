"""charts/rocshare is the kustomize manifests, not a second copy: it is what `rocshare-dev chart`
generates from them (up to date), `helm template` with the default values renders
`kubectl kustomize manifests/overlays/dev` object for object (CRDs included), and
webhook.certificate=cert-manager renders overlays/cert-manager; the values users change take
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
    for args in ((), ("--set", "webhook.certificate=cert-manager", "--set", "samplePools.enabled=true")):
        result = subprocess.run([str(helm()), "lint", "--strict", str(CHART), *args], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
