"""Every object that rocshare ships -- each kustomization's rendered output, samples/ and
the Argo CD Application -- fits its schema: Kubernetes' own at v1.35 (kubernetes-validate,
strict: unknown fields fail), rocshare's CRDs from crds/ for AmdGpu* objects, Kopf's peering
CRD for the peering object, and contract schemas for cert-manager, Prometheus Operator and
Argo CD kinds."""

from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.unit.manifests.contracts import BY_KIND
from tests.unit.manifests.rendering import KUSTOMIZATIONS, ROOT, is_foreign, render, validate


def _objects() -> list[tuple[str, dict]]:
    rendered = [(path, obj) for path in KUSTOMIZATIONS for obj in render(path)]
    argocd = [("manifests/argocd", obj) for obj in yaml.safe_load_all((ROOT / "manifests/argocd/application.yaml").read_text())]
    return rendered + argocd


OBJECTS = _objects()


def _id(item: tuple[str, dict]) -> str:
    path, obj = item
    return f"{path}:{obj['kind']}/{obj['metadata'].get('namespace', '-')}/{obj['metadata']['name']}"


@pytest.mark.parametrize("item", [item for item in OBJECTS if not is_foreign(item[1])], ids=_id)
def test_object_fits_its_schema(item: tuple[str, dict]) -> None:
    validate(item[1])


@pytest.mark.parametrize("item", [item for item in OBJECTS if is_foreign(item[1])], ids=_id)
def test_foreign_object_fits_its_contract(item: tuple[str, dict]) -> None:
    obj = item[1]
    group = obj["apiVersion"].rpartition("/")[0]
    jsonschema.validate(obj, BY_KIND[(group, obj["kind"])])


def test_every_shipped_kind_is_covered() -> None:
    kinds = {obj["kind"] for _, obj in OBJECTS}
    assert {"Deployment", "ValidatingAdmissionPolicy", "AmdGpuPool", "AmdGpuShare", "Pod", "Certificate",
            "ServiceMonitor", "Application"} <= kinds


# The checks themselves must be able to fail, or the tests above prove nothing.

def test_strict_kubernetes_schema_refuses_a_misspelt_field() -> None:
    deployment = copy.deepcopy(next(obj for _, obj in OBJECTS if obj["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)


def test_crd_schema_refuses_a_bad_pool() -> None:
    pool = copy.deepcopy(next(obj for _, obj in OBJECTS if obj["kind"] == "AmdGpuPool"))
    pool["spec"]["sharing"]["operatingMode"] = "mig"
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)
    pool = copy.deepcopy(next(obj for _, obj in OBJECTS if obj["kind"] == "AmdGpuPool"))
    pool["spec"]["sharing"]["splitcount"] = 4
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)


def test_contract_refuses_a_misspelt_field() -> None:
    certificate = copy.deepcopy(next(obj for _, obj in OBJECTS if obj["kind"] == "Certificate"))
    certificate["spec"]["dnsName"] = ["x"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(certificate, BY_KIND[("cert-manager.io", "Certificate")])
