"""The Argo CD health checks (manifests/argocd/argocd-cm-health.yaml) run for real in Lua 5.1
-- the language level of gopher-lua, which Argo CD embeds -- on sample objects, and return
Healthy, Progressing or Degraded as the conditions say."""

from __future__ import annotations

from typing import Any

import lupa.lua51 as lua51
import pytest
import yaml

from tests.unit.manifests.rendering import ROOT

HEALTH_CM = ROOT / "manifests" / "argocd" / "argocd-cm-health.yaml"
KEY = "resource.customizations.health.rocshare.io_{kind}"


def script(kind: str) -> str:
    return yaml.safe_load(HEALTH_CM.read_text())["data"][KEY.format(kind=kind)]


def _to_lua(runtime: lua51.LuaRuntime, value: Any) -> Any:
    if isinstance(value, dict):
        return runtime.table_from({key: _to_lua(runtime, item) for key, item in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, item) for item in value])
    return value


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    """Run the script as Argo CD does: `obj` is a global, the script's return is the health."""
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = _to_lua(runtime, obj)
    result = runtime.execute(script(kind))
    return result["status"], result["message"]


def condition(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


def pool(generation: int = 1, observed: int | None = 1, *conditions: dict) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)} if conditions else {}
    if observed is not None and conditions:
        status["observedGeneration"] = observed
    return {"apiVersion": "rocshare.io/v1alpha1", "kind": "AmdGpuPool",
            "metadata": {"name": "p", "generation": generation}, "spec": {"nodeSelector": {}},
            **({"status": status} if status else {})}


READY = condition("Ready", "True", "GpusAvailable", "16/16 GPUs healthy")
NOT_DEGRADED = condition("Degraded", "False", "AsExpected")


@pytest.mark.parametrize(("obj", "expected"), [
    (pool(), ("Progressing", "Waiting for the operator to report the pool")),
    (pool(2, 1, READY, NOT_DEGRADED), ("Progressing", "Waiting for the operator to act on generation 2")),
    (pool(1, 1, READY, NOT_DEGRADED), ("Healthy", "GpusAvailable: 16/16 GPUs healthy")),
    (pool(1, 1, condition("Ready", "False", "NoNodes", "no node is in the pool"), NOT_DEGRADED),
     ("Progressing", "NoNodes: no node is in the pool")),
    (pool(1, 1, condition("Ready", "False", "NoGpusReported", "waiting"), NOT_DEGRADED),
     ("Progressing", "NoGpusReported: waiting")),
    (pool(1, 1, condition("Ready", "False", "NoGpusReported", "1 node(s), none has reported GPUs"),
          condition("Degraded", "True", "NodesNotReporting", "1 node(s) without an AmdGpuNode")),
     ("Progressing", "NodesNotReporting: 1 node(s) without an AmdGpuNode")),
    (pool(1, 1, condition("Ready", "False", "NoHealthyGpus", "all 8 GPU(s) are unhealthy"), NOT_DEGRADED),
     ("Degraded", "NoHealthyGpus: all 8 GPU(s) are unhealthy")),
    (pool(1, 1, condition("Ready", "False", "InvalidPool", "bad selector")), ("Degraded", "InvalidPool: bad selector")),
    (pool(1, 1, READY, condition("Degraded", "True", "NodeConflicts", "node n1 is held by pool a")),
     ("Degraded", "NodeConflicts: node n1 is held by pool a")),
    (pool(1, 1, condition("Ready", "Unknown", "Starting")), ("Progressing", "Waiting for the operator to report the pool")),
    (pool(1, None, READY), ("Progressing", "Waiting for the operator to act on generation 1")),
])
def test_pool_health(obj: dict, expected: tuple[str, str]) -> None:
    assert health("AmdGpuPool", obj) == expected


def share(generation: int, observed: int | None, *conditions: dict) -> dict[str, Any]:
    obj = pool(generation, observed, *conditions)
    obj["kind"] = "AmdGpuShare"
    obj["metadata"]["namespace"] = "team"
    return obj


@pytest.mark.parametrize(("obj", "expected"), [
    (share(1, None), ("Progressing", "Waiting for the operator to apply the share")),
    (share(3, 2, condition("Ready", "True", "QuotaApplied")), ("Progressing", "Waiting for the operator to act on generation 3")),
    (share(3, 3, condition("Ready", "True", "QuotaApplied", "ResourceQuota rocshare-team applied")),
     ("Healthy", "QuotaApplied: ResourceQuota rocshare-team applied")),
    (share(1, 1, condition("Ready", "False", "PoolNotFound", "pool mi300x does not exist")),
     ("Degraded", "PoolNotFound: pool mi300x does not exist")),
])
def test_share_health(obj: dict, expected: tuple[str, str]) -> None:
    assert health("AmdGpuShare", obj) == expected


def gpu_node(*conditions: dict) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "rocshare.io/v1alpha1", "kind": "AmdGpuNode", "metadata": {"name": "n1"}}
    if conditions:
        obj["status"] = {"gpus": [], "conditions": list(conditions)}
    return obj


@pytest.mark.parametrize(("obj", "expected"), [
    (gpu_node(), ("Progressing", "Waiting for the node agent to publish")),
    (gpu_node(condition("Ready", "True", "GpusFound", "8/8 GPUs healthy")), ("Healthy", "GpusFound: 8/8 GPUs healthy")),
    (gpu_node(condition("Ready", "False", "NoHealthyGpus", "0/8 GPUs healthy")),
     ("Degraded", "NoHealthyGpus: 0/8 GPUs healthy")),
    (gpu_node(condition("Ready", "False", "NoGpus", "no AMD GPU found")), ("Degraded", "NoGpus: no AMD GPU found")),
    (gpu_node(condition("Ready", "True", "GpusFound"), condition("Degraded", "True", "Overheating")),
     ("Degraded", "Overheating")),
])
def test_node_health(obj: dict, expected: tuple[str, str]) -> None:
    assert health("AmdGpuNode", obj) == expected


def test_scripts_are_lua_5_1() -> None:
    assert lua51.LuaRuntime().execute("return _VERSION") == "Lua 5.1"
    for kind in ("AmdGpuPool", "AmdGpuShare", "AmdGpuNode"):
        lua51.LuaRuntime().compile(script(kind))  # a syntax error raises here, not in Argo CD


def test_every_long_running_sample_pod_counts_as_healthy_in_argocd() -> None:
    """Argo CD counts a running pod with restartPolicy Never or OnFailure as Progressing (a job not
    finished) unless it carries ignore-restart-policy; the sample pods run until deleted, so without
    it an Application syncing samples/ never turns Healthy (tests/e2e/test_argocd.py)."""
    pods = [(path.name, obj) for path in sorted((ROOT / "samples").glob("*.yaml"))
            for obj in yaml.safe_load_all(path.read_text()) if obj and obj.get("kind") == "Pod"]
    assert len(pods) >= 10, [name for name, _ in pods]
    missing = [name for name, pod in pods if pod["spec"].get("restartPolicy", "Always") != "Always"
               and pod["metadata"].get("annotations", {}).get("argocd.argoproj.io/ignore-restart-policy") != "true"]
    assert missing == []
