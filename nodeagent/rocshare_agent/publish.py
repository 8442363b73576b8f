"""Publishing one node's GPU inventory to the API server, for that node only.

`NodePublisher` is bound to one node name at construction and every path it writes is
built from that name: the agent cannot write another node's objects by mistake. It writes

* the `AmdGpuNode` named after the node (created if missing, owned by the Node so it goes
  away with it), its status by server-side apply on `/status`, field manager `rocshare-agent`;
* the Node's labels (AMD node-labeller style) and the HAMi `hami.io/node-amd-register`
  annotation, by server-side apply with the same manager, so labels it stops setting are
  removed by the server. It never creates a Node: without a known uid it writes nothing;
* Events on the Node for health transitions (AMDGPUUnhealthy, AMDGPURecovered, AMDGPUMissing).

The label and transition logic above the I/O is pure and unit-tested.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rocshare.api.models import API_VERSION, AmdGpuNodeStatus, GpuInfo
from rocshare.api.node_settings import HAMI_NODE_REGISTER_ANNOTATION
from rocshare.kube.client import Conflict, Kube, NotFound, object_path
from rocshare_agent.discovery.pci import family

log = logging.getLogger(__name__)

FIELD_MANAGER = "rocshare-agent"
EVENT_NAMESPACE = "default"  # where the kubelet posts Node events too
AMD_GPU_NODE_PLURAL = "amdgpunodes"

LABEL_PRODUCT = "amd.com/gpu.product-name"
LABEL_CU_COUNT = "amd.com/gpu.cu-count"
LABEL_VRAM = "amd.com/gpu.vram"
LABEL_FAMILY = "amd.com/gpu.family"
LABEL_DEVICE_ID = "amd.com/gpu.device-id"

REASON_UNHEALTHY = "AMDGPUUnhealthy"
REASON_RECOVERED = "AMDGPURecovered"
REASON_MISSING = "AMDGPUMissing"


_LABEL_VALUE_MAX = 63
_NOT_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_MIB_PER_GIB = 1024


# ---- pure: labels ---------------------------------------------------------------------------


def sanitize_label_value(text: str) -> str:
    """A valid label value: [A-Za-z0-9_.-], at most 63, alphanumeric at both ends ("" allowed)."""
    value = _NOT_LABEL_CHARS.sub("_", text.strip())[:_LABEL_VALUE_MAX]
    return value.strip("_.-")


def node_labels(gpus: Sequence[GpuInfo]) -> dict[str, str]:
    """Labels describing the node's GPUs; on a mixed node, distinct values joined by `_`."""
    candidates = {
        LABEL_PRODUCT: [gpu.product for gpu in gpus],
        LABEL_CU_COUNT: [str(gpu.cu_count) for gpu in gpus],
        LABEL_VRAM: [f"{round(gpu.vram_mib / _MIB_PER_GIB)}G" for gpu in gpus if gpu.vram_mib],
        LABEL_FAMILY: [family(gpu.gfx_target_version) for gpu in gpus],
        LABEL_DEVICE_ID: [gpu.device_id.removeprefix("0x") for gpu in gpus],
    }
    labels = {key: sanitize_label_value("_".join(dict.fromkeys(v for v in values if v)))
              for key, values in candidates.items()}
    return {key: value for key, value in labels.items() if value}


# ---- pure: transitions ----------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    reason: str
    gpu_id: str
    message: str
    event_type: str = "Warning"


def health_transitions(previous: Sequence[GpuInfo] | None, current: Sequence[GpuInfo]) -> list[Transition]:
    """What changed between two checks. Before the first check every GPU counts as healthy."""
    before = {gpu.id: gpu for gpu in previous or []}
    now = {gpu.id: gpu for gpu in current}
    transitions = [Transition(REASON_MISSING, gpu.id, f"GPU {gpu.id} ({gpu.pci_bdf}) is no longer found")
                   for gpu_id, gpu in before.items() if gpu_id not in now]
    for gpu in current:
        transition = _transition(before.get(gpu.id), gpu, first_check=previous is None)
        if transition is not None:
            transitions.append(transition)
    return transitions


def _transition(before: GpuInfo | None, gpu: GpuInfo, *, first_check: bool) -> Transition | None:
    was_healthy = before.healthy if before is not None else True
    if was_healthy and not gpu.healthy:
        return Transition(REASON_UNHEALTHY, gpu.id, f"GPU {gpu.id} ({gpu.pci_bdf}) is unhealthy: {gpu.health_reason}")
    if gpu.healthy and (not was_healthy or (before is None and not first_check)):
        # A GPU that comes back after it went missing counts as recovered too.
        return Transition(REASON_RECOVERED, gpu.id, f"GPU {gpu.id} ({gpu.pci_bdf}) is healthy again", "Normal")
    return None


# ---- I/O ------------------------------------------------------------------------------------


class NodePublisher:
    """Writes the objects of one node, and only of that node."""

    def __init__(self, kube: Kube, node_name: str) -> None:
        self.kube = kube
        self.node_name = node_name
        self._gpu_node_exists = False

    @property
    def node_path(self) -> str:
        return object_path("v1", "nodes", self.node_name)

    @property
    def gpu_node_path(self) -> str:
        return object_path(API_VERSION, AMD_GPU_NODE_PLURAL, self.node_name)

    async def read_node(self) -> dict[str, Any] | None:
        try:
            return await self.kube.get(self.node_path)
        except NotFound:
            return None

    async def publish_status(self, status: AmdGpuNodeStatus, *, node_uid: str | None) -> None:
        await self._ensure_gpu_node(node_uid)
        body = {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": self.node_name},
                "status": status.to_json_dict()}
        try:
            await self._apply(self.gpu_node_path + "/status", body)
        except NotFound:
            self._gpu_node_exists = False  # deleted under us: create it again next time
            raise

    async def _ensure_gpu_node(self, node_uid: str | None) -> None:
        if self._gpu_node_exists:
            return
        metadata: dict[str, Any] = {"name": self.node_name}
        if node_uid:
            metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": node_uid}]
        try:
            await self.kube.create(object_path(API_VERSION, AMD_GPU_NODE_PLURAL),
                                   {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": metadata, "spec": {}})
        except Conflict:
            pass  # it exists already: that is all we wanted
        self._gpu_node_exists = True

    async def publish_node_metadata(self, *, node_uid: str, labels: dict[str, str], register: str) -> None:
        """Labels and the HAMi annotation. The uid makes the apply fail rather than create a Node."""
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": self.node_name, "uid": node_uid, "labels": labels,
            "annotations": {HAMI_NODE_REGISTER_ANNOTATION: register},
        }}
        await self._apply(self.node_path, body)

    async def _apply(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply as `rocshare-agent`."""
        return await self.kube.apply(path, body, field_manager=FIELD_MANAGER)

    async def emit_event(self, transition: Transition, *, node_uid: str | None, now_rfc3339: str) -> None:
        await self.kube.create(object_path("v1", "events", namespace=EVENT_NAMESPACE), {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.node_name}.", "namespace": EVENT_NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": node_uid or self.node_name},
            "reason": transition.reason,
            "message": transition.message,
            "type": transition.event_type,
            "source": {"component": FIELD_MANAGER, "host": self.node_name},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": self.node_name,
            "firstTimestamp": now_rfc3339,
            "lastTimestamp": now_rfc3339,
            "count": 1,
        })
