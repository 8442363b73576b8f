"""An in-memory stand-in for the device plugin's pod source (`KubePods`), for unit and
integration tests of the gRPC handlers: the pods are a plain list; refusals are recorded.
Serving a pod writes nothing (the kubelet's own status write releases it); `admit` plays
that write: status.startTime set, as the kubelet does after allocating a pod's devices."""

from __future__ import annotations

from rocshare_agent.hook import HookCheck, hook_library_path


class MemoryPods:
    def __init__(self, pods: list[dict] | None = None) -> None:
        self.pods = pods if pods is not None else []
        self.refused: list[tuple[str, str]] = []
        self.warnings: list[tuple[str, str, str]] = []

    def cached(self):
        return self.pods

    async def next_event(self, timeout_s):
        return False

    async def fresh(self):
        return self.pods

    def admit(self, name: str) -> None:
        """The kubelet's first status write after admitting the pod."""
        for pod in self.pods:
            if pod["metadata"]["name"] == name:
                pod.setdefault("status", {})["startTime"] = "2026-01-01T00:00:00Z"

    async def mark_refused(self, ref, reason):
        self.refused.append((ref.name, reason))

    async def warn(self, ref, reason, message):
        self.warnings.append((ref.name, reason, message))


def hook_present(hook_dir: str) -> HookCheck:
    """The device plugin's hook check on a node that has the library (hook.py)."""
    return HookCheck(hook_library_path(hook_dir))


class RecordingKube:
    """Just enough of Kube for InventoryAgent passes: a Node without pool settings, the writes recorded."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self.applied: list[tuple[str, dict]] = []
        self.created: list[tuple[str, dict]] = []

    async def get(self, path: str) -> dict:
        return {"metadata": {"name": self.node_name, "uid": "node-uid"}}

    async def create(self, path: str, body: dict) -> dict:
        self.created.append((path, body))
        return body

    async def apply(self, path: str, body: dict, *, field_manager: str) -> dict:
        self.applied.append((path, body))
        return body

    def published_statuses(self) -> list[dict]:
        return [body["status"] for path, body in self.applied if path.endswith("/status")]
