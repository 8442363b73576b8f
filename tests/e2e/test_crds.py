"""The three CRDs on the real kube-apiserver: version, CRUD with status, validation
messages that name the field, the printer columns `kubectl get` shows and the description
`kubectl explain` shows for every field."""

from __future__ import annotations

import json

import pytest
import yaml

from rocshare.api.models import API_VERSION
from rocshare.kube.client import Invalid, Kube, object_path
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, k8s_version

pytestmark = pytest.mark.e2e


def pool(name: str, **sharing) -> dict:
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": name},
            "spec": {"nodeSelector": {"gpu": "amd"}, "sharing": sharing}}


def share(name: str, **limits) -> dict:
    return {"apiVersion": API_VERSION, "kind": "AmdGpuShare", "metadata": {"name": name, "namespace": "default"},
            "spec": {"limits": limits}}


async def test_server_is_the_built_version(kube: Kube) -> None:
    """The API server is the K8S_VERSION build (default 1.35.4; `make test K8S_VERSION=1.37.2`)."""
    version = await kube.get("/version")
    assert version["gitVersion"] == f"v{k8s_version()}", version
    assert (version["major"], version["minor"]) == tuple(k8s_version().split(".")[:2]), version


async def test_pool_create_read_status_delete(kube: Kube) -> None:
    path = object_path(API_VERSION, "amdgpupools", "crud-pool")
    created = await kube.create(object_path(API_VERSION, "amdgpupools"), pool("crud-pool"))
    # Structural defaults come from the models: an omitted field gets its documented default.
    assert created["spec"]["sharing"] == {"splitCount": 0, "deviceMemoryScaling": 1.0, "operatingMode": "cu",
                                          "resourceNaming": "single", "omittedCores": "Exclusive"}
    assert created["spec"]["scheduling"] == {"nodePolicy": "binpack", "gpuPolicy": "binpack"}
    await kube.merge_patch(path + "/status", {"status": {"nodes": 2, "gpusTotal": 16, "conditions": [
        {"type": "Ready", "status": "True", "reason": "AllNodesReporting", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    read = await kube.get(path)
    assert read["status"]["gpusTotal"] == 16
    assert read["status"]["conditions"][0]["reason"] == "AllNodesReporting"
    await kube.delete(path, missing_ok=False)
    names = [item["metadata"]["name"] for item in (await kube.list(object_path(API_VERSION, "amdgpupools")))["items"]]
    assert "crud-pool" not in names


async def test_node_and_share_crud(kube: Kube) -> None:
    node_path = object_path(API_VERSION, "amdgpunodes", "worker-1")
    await kube.create(object_path(API_VERSION, "amdgpunodes"),
                      {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": "worker-1"}})
    gpu = {"id": "GPU-0123456789abcdef", "index": 0, "gfxTargetVersion": 90010, "cuCount": 104, "pciBDF": "0000:03:00.0",
           "splitCount": 10, "healthy": True, "vramMiB": 65520}
    await kube.merge_patch(node_path + "/status", {"status": {"gpus": [gpu]}})
    assert (await kube.get(node_path))["status"]["gpus"][0]["cuCount"] == 104
    await kube.delete(node_path, missing_ok=False)

    share_path = object_path(API_VERSION, "amdgpushares", "team-a", namespace="default")
    await kube.create(object_path(API_VERSION, "amdgpushares", namespace="default"),
                      {**share("team-a", memoryMiB=8192, coresPercent=250), "metadata": {"name": "team-a"}})
    await kube.merge_patch(share_path + "/status", {"status": {"used": {"memoryMiB": 4096, "coresPercent": 25}}})
    assert (await kube.get(share_path))["status"]["used"]["memoryMiB"] == 4096
    await kube.delete(share_path, missing_ok=False)


@pytest.mark.parametrize(("body", "field"), [
    (pool("bad", splitCount=65), "spec.sharing.splitCount"),
    (pool("bad", splitCount=-1), "spec.sharing.splitCount"),
    (pool("bad", deviceMemoryScaling=0.5), "spec.sharing.deviceMemoryScaling"),
    (pool("bad", deviceMemoryScaling=9), "spec.sharing.deviceMemoryScaling"),
    (pool("bad", operatingMode="mig"), "spec.sharing.operatingMode"),
    (pool("bad", omittedCores="sometimes"), "spec.sharing.omittedCores"),
    (share("bad", memoryMiB=-1), "spec.limits.memoryMiB"),
    (share("bad", coresPercent=-5), "spec.limits.coresPercent"),
    (share("bad", gpus=-2), "spec.limits.gpus"),
])
async def test_invalid_objects_are_refused_naming_the_field(kube: Kube, body: dict, field: str) -> None:
    namespace = body["metadata"].get("namespace")
    with pytest.raises(Invalid) as refused:
        await kube.create(object_path(API_VERSION, body["kind"].lower() + "s", namespace=namespace), body)
    assert field in refused.value.message, refused.value.message


def test_unknown_fields_are_refused_by_kubectl(cluster) -> None:
    body = pool("typo")
    body["spec"]["sharing"] = {"splitCont": 4}
    result = cluster.kubectl("apply", "-f", "-", input_text=json.dumps(body), check=False)
    assert result.returncode != 0
    assert 'unknown field "spec.sharing.splitCont"' in result.stderr, result.stderr


def test_missing_required_field_is_named(cluster) -> None:
    body = {"apiVersion": API_VERSION, "kind": "AmdGpuShare", "metadata": {"name": "nolimits", "namespace": "default"},
            "spec": {}}
    result = cluster.kubectl("apply", "-f", "-", input_text=json.dumps(body), check=False)
    assert result.returncode != 0
    assert "spec.limits: Required value" in result.stderr, result.stderr


def test_a_share_names_no_pool(cluster) -> None:
    """docs/accounting.md: a share is its namespace's quota over every pool; `pool` is no field."""
    body = share("pooled")
    body["spec"]["pool"] = "p"
    result = cluster.kubectl("apply", "-f", "-", input_text=json.dumps(body), check=False)
    assert result.returncode != 0
    assert 'unknown field "spec.pool"' in result.stderr, result.stderr


def test_kubectl_get_amdgpupools_shows_printer_columns(cluster) -> None:
    body = {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": "pool-columns"},
            "spec": {"nodeSelector": {"gpu": "columns"}, "sharing": {"operatingMode": "partition"}}}
    status = {"status": {"nodes": 2, "gpusTotal": 16, "gpusHealthy": 15, "vramTotalMiB": 1048576,
                         "vramAllocatedMiB": 53248,
                         "conditions": [{"type": "Ready", "status": "True", "reason": "GpusAvailable"}]}}
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(body))
    cluster.kubectl("patch", "amdgpupool", "pool-columns", "--subresource=status", "--type=merge",
                    "-p", json.dumps(status))
    try:
        header, row = cluster.kubectl("get", "amdgpupools", "pool-columns").stdout.splitlines()[:2]
        assert header.split() == ["NAME", "MODE", "NODES", "GPUS", "HEALTHY", "VRAM-MIB", "ALLOC-MIB", "READY", "AGE"]
        assert row.split()[:8] == ["pool-columns", "partition", "2", "16", "15", "1048576", "53248", "True"]
    finally:
        cluster.kubectl("delete", "amdgpupool", "pool-columns")


def test_kubectl_get_shows_printer_columns(cluster) -> None:
    body = share("columns", memoryMiB=20480, coresPercent=300)
    status = {"status": {"used": {"memoryMiB": 4096, "coresPercent": 25}, "podsTotal": 1,
                         "conditions": [{"type": "Ready", "status": "True", "reason": "QuotaApplied"}]}}
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(body))
    cluster.kubectl("patch", "amdgpushare", "columns", "-n", "default", "--subresource=status", "--type=merge",
                    "-p", json.dumps(status))
    try:
        output = cluster.kubectl("get", "amdgpushares", "-A").stdout  # other modules' shares may be listed too
        header, *rows = output.splitlines()
        (row,) = [line for line in rows if line.split()[:2] == ["default", "columns"]]
        assert header.split() == ["NAMESPACE", "NAME", "MEM-USED", "MEM-LIMIT", "CORES-USED", "CORES-LIMIT",
                                  "PODS", "READY", "AGE"]
        assert row.split()[:8] == ["default", "columns", "4096", "20480", "25", "300", "1", "True"]
        short = cluster.kubectl("get", "ags", "-n", "default", "-o", "name").stdout.strip()
        assert short == "amdgpushare.rocshare.io/columns"
        explained = cluster.kubectl("explain", "amdgpupools.spec.sharing.splitCount").stdout
        assert "How many pods may share one GPU" in explained
    finally:
        cluster.kubectl("delete", "amdgpushare", "columns", "-n", "default")


def _field_paths(schema: dict, path: str = ""):
    """(kubectl explain path, schema) of every field; list items are explained through their list."""
    for name, child in schema.get("properties", {}).items():
        where = f"{path}.{name}" if path else name
        yield where, child
        yield from _field_paths(child.get("items", child) if child.get("type") == "array" else child, where)


def _explained(cluster, path: str) -> str:
    """The DESCRIPTION block of `kubectl explain <path>`, whitespace collapsed."""
    out = cluster.kubectl("explain", path).stdout
    assert "DESCRIPTION:" in out, out
    block = out.split("DESCRIPTION:", 1)[1].split("\nFIELDS:", 1)[0]
    return " ".join(block.split())


@pytest.mark.parametrize("plural", ["amdgpupools", "amdgpunodes", "amdgpushares"])
def test_kubectl_explain_describes_every_field(cluster, plural: str) -> None:
    """Issue 33: `kubectl explain` shows a description for every field of the three kinds, read from
    the real API server's published schema (what the CRD in crds/ carries)."""
    crd = yaml.safe_load((PROJECT_ROOT / "crds" / f"{plural}.rocshare.io.yaml").read_text())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert root["description"].split()[0] in _explained(cluster, plural)
    fields = [(path, node) for path, node in _field_paths(root) if path not in ("apiVersion", "kind", "metadata")]
    assert len(fields) > 10
    for path, node in fields:
        shown = _explained(cluster, f"{plural}.{path}")
        assert shown and shown != "<empty>", f"kubectl explain {plural}.{path}: no description"
        assert " ".join(node["description"].split()[:5]) in shown, f"{plural}.{path}: {shown!r}"
