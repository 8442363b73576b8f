"""Publishing the node's ResourceSlice (DRA mode), for this node only.

`SlicePublisher` is bound to one node; it writes the one ResourceSlice named after it
(rocshare.api.dra.slice_name) by server-side apply, field manager ``rocshare-agent``, owned by
the Node so that it goes with it. The body comes from the pure codec
(rocshare.core.resource_slices); this module adds only the pool generation and the I/O.

Invariants: the pool generation grows whenever the devices change (the API's rule: consumers
take the highest generation); an unchanged inventory writes nothing (a digest of the devices is
kept on the slice, so a restarted agent finds it too), and the stored slice is read back every
`VERIFY_S`, so one deleted or edited by someone else is written again; without the Node's uid nothing is
written (the slice must have its owner). A node that serves the device plugin instead deletes
its slice (`withdraw`): never both on one node.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence

from rocshare.api import dra
from rocshare.api.models import GpuInfo, Sharing
from rocshare.core.resource_slices import resource_slice
from rocshare.kube.client import Kube, NotFound, object_path

log = logging.getLogger(__name__)

FIELD_MANAGER = "rocshare-agent"
VERIFY_S = 60.0
"""How often the stored slice is read back even when nothing changed: a slice someone deleted or
edited is written again within this time (one GET per node per minute, as the AmdGpuNode heartbeat)."""
DIGEST_ANNOTATION = "rocshare.io/devices-digest"
"""sha256 of the devices and pool settings last written (kept on the slice, so restarts see it)."""


def devices_digest(spec: dict) -> str:
    payload = json.dumps({"devices": spec["devices"], "nodeName": spec["nodeName"]}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


class SlicePublisher:
    def __init__(self, kube: Kube, node_name: str, *, verify_s: float = VERIFY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.node_name = node_name
        self.verify_s, self.clock = verify_s, clock
        self._read_at = 0.0
        self.path = object_path(dra.RESOURCE_API_VERSION, "resourceslices", dra.slice_name(node_name))
        self._written: tuple[str, int] | None = None
        """(digest, generation) of what the API server holds, once known."""
        self.offered: tuple[list[GpuInfo], Sharing] | None = None
        """The GPUs and pool settings the stored slice was made from (what the DRA plugin prepares from)."""

    async def publish(self, gpus: Sequence[GpuInfo], sharing: Sharing, *, node_uid: str | None) -> bool:
        """Write the slice if its devices changed; True when it wrote. Raises ApiError."""
        if node_uid is None:
            return False
        body = resource_slice(node_name=self.node_name, node_uid=node_uid, gpus=gpus, sharing=sharing, generation=0)
        digest = devices_digest(body["spec"])
        if self._written is None or self.clock() - self._read_at >= self.verify_s:
            self._written = await self._stored()
            self._read_at = self.clock()
        if self._written is not None and self._written[0] == digest:
            self.offered = (list(gpus), sharing)
            return False
        generation = (self._written[1] if self._written else 0) + 1
        body["spec"]["pool"]["generation"] = generation
        body["metadata"]["annotations"] = {DIGEST_ANNOTATION: digest}
        await self.kube.apply(self.path, body, field_manager=FIELD_MANAGER)
        self._written = (digest, generation)
        self.offered = (list(gpus), sharing)
        log.info("ResourceSlice %s: %d devices, pool generation %d", dra.slice_name(self.node_name),
                 len(body["spec"]["devices"]), generation)
        return True

    async def _stored(self) -> tuple[str, int] | None:
        try:
            stored = await self.kube.get(self.path)
        except NotFound:
            return None
        digest = (stored["metadata"].get("annotations") or {}).get(DIGEST_ANNOTATION, "")
        return digest, int(stored["spec"]["pool"].get("generation", 0))

    async def withdraw(self) -> None:
        """Delete the node's slice (the node serves the device plugin now). Raises ApiError."""
        await self.kube.delete(self.path)
        self._written = None
        self.offered = None
