"""Shared helpers for the manifest tests: render a kustomization with the project's kubectl
(the K8S_VERSION build, by `make controlplane`), and validate one object against the schema that
governs it -- Kubernetes' own (kubernetes-validate, strict), rocshare's CRDs (crds/), or the
definition shipped beside it (Kopf's peering CRD)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from rocshare_dev.devcluster.controlplane import bin_dir

ROOT = Path(__file__).resolve().parents[3]
KUBECTL = bin_dir() / "kubectl"
# Schemas of the oldest supported minor: manifests valid there are valid on the newer ones.
KUBERNETES_VERSION = "1.35.0"
KUSTOMIZATIONS = ("manifests/base", "manifests/overlays/dev", "manifests/overlays/cert-manager",
                  "manifests/observability", "samples", "samples/dra")

# Kinds of other projects (not installed in the test cluster, no schema offline): checked
# against contract schemas in contracts.py instead.
FOREIGN_GROUPS = ("cert-manager.io", "monitoring.coreos.com", "argoproj.io")


@cache
def _render_text(path: str) -> str:
    assert KUBECTL.exists(), f"missing {KUBECTL}: run `make controlplane`"
    result = subprocess.run([str(KUBECTL), "kustomize", str(ROOT / path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, f"kubectl kustomize {path} failed: {result.stderr}"
    return result.stdout


def render(path: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(_render_text(path)) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


@cache
def crd_schemas() -> dict[tuple[str, str, str], dict[str, Any]]:
    """(group, version, kind) -> openAPIV3Schema, from crds/ and the base's own CRDs."""
    crds = [yaml.safe_load(path.read_text()) for path in sorted((ROOT / "crds").glob("*.yaml"))]
    crds += [obj for obj in render("manifests/base") if obj["kind"] == "CustomResourceDefinition"]
    schemas = {}
    for crd in crds:
        spec = crd["spec"]
        for version in spec["versions"]:
            schemas[(spec["group"], version["name"], spec["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return schemas


def _group_version(obj: dict[str, Any]) -> tuple[str, str]:
    group, _, version = obj["apiVersion"].rpartition("/")
    return group, version


def is_foreign(obj: dict[str, Any]) -> bool:
    return _group_version(obj)[0] in FOREIGN_GROUPS


def validate(obj: dict[str, Any]) -> None:
    """Raise if `obj` does not fit its schema."""
    group, version = _group_version(obj)
    schema = crd_schemas().get((group, version, obj["kind"]))
    if schema is not None:
        jsonschema.validate(obj, _closed(schema), cls=jsonschema.Draft7Validator)
        return
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD schema as the API server applies it: unknown fields are errors (no pruning
    here), except where x-kubernetes-preserve-unknown-fields says otherwise; apiVersion,
    kind and metadata are always allowed at the top."""
    def close(node: dict[str, Any]) -> dict[str, Any]:
        node = dict(node)
        if "properties" in node:
            node["properties"] = {key: close(child) for key, child in node["properties"].items()}
            if not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                node[key] = close(node[key])
        return node

    top = close(schema)
    top["properties"] = {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                         "metadata": {"type": "object"}, **top.get("properties", {})}
    return top
