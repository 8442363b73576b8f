"""Generate the CustomResourceDefinitions in crds/ from the pydantic models.

pydantic emits JSON Schema (with $ref, anyOf-null and titles); Kubernetes wants a
structural OpenAPI v3 schema (everything inline, `nullable`, no titles). This module
converts one to the other and adds what only a CRD has: scope, names, printer
columns and the status subresource. Pure: returns dicts; the CLI writes the files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from rocshare.api import models

_KEYWORDS_KEPT = ("type", "description", "enum", "minimum", "maximum", "minLength", "maxLength",
                  "pattern", "default", "format", "minItems", "maxItems")


@dataclass(frozen=True)
class CrdSpec:
    kind: str
    plural: str
    short_names: tuple[str, ...]
    scope: str  # "Cluster" or "Namespaced"
    description: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    printer_columns: tuple[dict[str, str], ...]
    spec_required: bool = True


def _column(name: str, type_: str, path: str, description: str, priority: int = 0) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path, "description": description}
    if priority:
        column["priority"] = priority
    return column


def _ready_column() -> dict[str, Any]:
    return _column("Ready", "string", '.status.conditions[?(@.type=="Ready")].status', "Ready condition")


def _age_column() -> dict[str, Any]:
    return _column("Age", "date", ".metadata.creationTimestamp", "Time since creation")


CRDS: tuple[CrdSpec, ...] = (
    CrdSpec(
        kind="AmdGpuPool", plural="amdgpupools", short_names=("agp", "gpupool"), scope="Cluster",
        description="A set of nodes (by label) whose AMD GPUs rocshare shares, and how it shares them.",
        spec_model=models.AmdGpuPoolSpec, status_model=models.AmdGpuPoolStatus,
        printer_columns=(
            _column("Mode", "string", ".spec.sharing.operatingMode", "cu or partition"),
            _column("Nodes", "integer", ".status.nodes", "Nodes in the pool"),
            _column("GPUs", "integer", ".status.gpusTotal", "GPUs or partitions"),
            _column("Healthy", "integer", ".status.gpusHealthy", "Healthy GPUs"),
            _column("VRAM-MiB", "integer", ".status.vramTotalMiB", "VRAM in the pool"),
            _column("Alloc-MiB", "integer", ".status.vramAllocatedMiB", "VRAM given to pods"),
            _ready_column(),
            _age_column(),
        ),
    ),
    CrdSpec(
        kind="AmdGpuNode", plural="amdgpunodes", short_names=("agn", "gpunode"), scope="Cluster",
        description="The AMD GPUs of one node, written by that node's rocshare agent (status only).",
        spec_model=models.AmdGpuNodeSpec, status_model=models.AmdGpuNodeStatus,
        printer_columns=(
            _column("GPUs", "integer", ".status.gpusTotal", "GPUs or partitions"),
            _column("Healthy", "integer", ".status.gpusHealthy", "Healthy GPUs"),
            _column("VRAM-MiB", "integer", ".status.vramTotalMiB", "Real VRAM, MiB"),
            _column("Mode", "string", ".status.operatingMode", "cu or partition"),
            _column("Heartbeat", "date", ".status.lastHeartbeatTime", "Last publication by the agent"),
            _column("Plugin", "string", '.status.conditions[?(@.type=="DevicePlugin")].status',
                    "DevicePlugin condition: the kubelet has the device list (the node is offered only then)"),
            _ready_column(),
            _age_column(),
        ),
        spec_required=False,
    ),
    CrdSpec(
        kind="AmdGpuShare", plural="amdgpushares", short_names=("ags", "gpushare"), scope="Namespaced",
        description="A namespace's share of the cluster's AMD GPUs: VRAM, compute and GPU limits, enforced by a ResourceQuota and the scheduler extender.",
        spec_model=models.AmdGpuShareSpec, status_model=models.AmdGpuShareStatus,
        printer_columns=(
            _column("Mem-Used", "integer", ".status.used.memoryMiB", "VRAM held, MiB"),
            _column("Mem-Limit", "integer", ".spec.limits.memoryMiB", "VRAM limit, MiB"),
            _column("Cores-Used", "integer", ".status.used.coresPercent", "Compute held, % of one GPU"),
            _column("Cores-Limit", "integer", ".spec.limits.coresPercent", "Compute limit, % of one GPU"),
            _column("Pods", "integer", ".status.podsTotal", "Pods holding slices"),
            _ready_column(),
            _age_column(),
        ),
    ),
)


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A structural OpenAPI v3 schema for `model`, with every $ref inlined."""
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    return _convert(raw, raw.get("$defs", {}))


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        merged = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    if "anyOf" in node:
        return _convert_nullable(node, defs)
    out = {key: node[key] for key in _KEYWORDS_KEPT if key in node}
    if "const" in node:
        out["enum"] = [node["const"]]
    if out.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        out.update(_convert_object(node, defs))
    if out.get("type") == "array":
        out["items"] = _convert(node.get("items", {}), defs)
    return out


def _convert_nullable(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    options = [option for option in node["anyOf"] if option.get("type") != "null"]
    if len(options) != 1:
        raise ValueError(f"cannot express anyOf {node['anyOf']} structurally")
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    out = _convert({**options[0], **rest}, defs)
    out["nullable"] = True
    if out.get("default", "") is None:
        del out["default"]
    return out


def _convert_object(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "properties" in node:
        required = node.get("required", [])
        out["properties"] = {name: _convert(prop, defs) for name, prop in node["properties"].items()}
        for name, prop in out["properties"].items():
            # An omitted optional sub-object defaults to {}, so the API server fills in its
            # scalar defaults and `kubectl get` shows them.
            if name not in required and prop.get("type") == "object" and "properties" in prop \
                    and not prop.get("nullable") and "default" not in prop:
                prop["default"] = {}
        if required:
            out["required"] = list(required)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = _convert(extra, defs)
    return out


def crd(spec: CrdSpec) -> dict[str, Any]:
    """The CustomResourceDefinition object for one kind."""
    spec_schema = openapi_schema(spec.spec_model)
    status_schema = openapi_schema(spec.status_model)
    properties = {
        "apiVersion": {"type": "string", "description": f"The object's API group and version: {models.API_VERSION}."},
        "kind": {"type": "string", "description": f"The object's kind: {spec.kind}."},
        "metadata": {"type": "object"},  # the API server allows nothing more here, and explains ObjectMeta itself
        "spec": spec_schema,
        "status": status_schema,
    }
    root: dict[str, Any] = {"type": "object", "description": spec.description, "properties": properties}
    if spec.spec_required:
        root["required"] = ["spec"]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{spec.plural}.{models.GROUP}"},
        "spec": {
            "group": models.GROUP,
            "scope": spec.scope,
            "names": {
                "kind": spec.kind,
                "listKind": f"{spec.kind}List",
                "plural": spec.plural,
                "singular": spec.kind.lower(),
                "shortNames": list(spec.short_names),
                "categories": ["rocshare"],
            },
            "versions": [{
                "name": models.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": list(spec.printer_columns),
                "schema": {"openAPIV3Schema": root},
            }],
        },
    }


def all_crds() -> dict[str, dict[str, Any]]:
    """File name in crds/ -> CRD object."""
    return {f"{spec.plural}.{models.GROUP}.yaml": crd(spec) for spec in CRDS}
