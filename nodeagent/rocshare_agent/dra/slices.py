"""Publishing the node's ResourceSlice (DRA mode), for this node only.

`SlicePublisher` is bound to one node; it writes the ResourceSlice named after it
(rocshare.api.dra.slice_name) by server-side apply, field manager ``rocshare-agent``, owned by
the Node so that it goes with it. The body comes from the pure codec
(rocshare.core.resource_slices); this module adds only the pool generation and the I/O.
With `whole_twins` (the agent's --dra-whole-twins) and where the API server serves shared counters
(asked once, by a dry-run create of a counters slice: an API server whose DRAPartitionableDevices
gate is off drops the field), the pool also offers each shared GPU whole and holds a second slice,
its counters (`counters_slice_name`), written before the devices that consume them. Off by default:
kube-scheduler 1.35's allocator (the operator's kube-scheduler-dra) does not count the counters a
shared device in use holds, so it would hand out a GPU's twin beside its shares.

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
from rocshare.core.resource_slices import pool_slices
from rocshare.kube.client import ApiError, Kube, NotFound, Unavailable, object_path

log = logging.getLogger(__name__)

FIELD_MANAGER = "rocshare-agent"
VERIFY_S = 60.0
"""How often the stored slice is read back even when nothing changed: a slice someone deleted or
edited is written again within this time (one GET per node per minute, as the AmdGpuNode heartbeat)."""
DIGEST_ANNOTATION = "rocshare.io/devices-digest"
"""sha256 of the devices and pool settings last written (kept on the slice, so restarts see it)."""


def devices_digest(spec: dict, *others: dict) -> str:
    """Of the devices slice's spec and the pool's other slices' (their counters)."""
    payload = json.dumps({"devices": spec["devices"], "nodeName": spec["nodeName"],
                          "counters": [other.get("sharedCounters") for other in others]}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


class SlicePublisher:
    def __init__(self, kube: Kube, node_name: str, *, verify_s: float = VERIFY_S,
                 clock: Callable[[], float] = time.monotonic, whole_twins: bool = False) -> None:
        self.kube = kube
        self.node_name = node_name
        self.verify_s, self.clock = verify_s, clock
        self._read_at = 0.0
        self.path = object_path(dra.RESOURCE_API_VERSION, "resourceslices", dra.slice_name(node_name))
        self.counters_path = object_path(dra.RESOURCE_API_VERSION, "resourceslices",
                                         dra.counters_slice_name(node_name))
        self.counters: bool | None = None if whole_twins else False
        """Whether the pool offers whole twins: asked for, and the API server serves shared counters (None:
        asked for, the API server not asked yet)."""
        self._written: tuple[str, int] | None = None
        """(digest, generation) of what the API server holds, once known."""
        self.offered: tuple[list[GpuInfo], Sharing] | None = None
        """The GPUs and pool settings the stored slice was made from (what the DRA plugin prepares from)."""

    async def publish(self, gpus: Sequence[GpuInfo], sharing: Sharing, *, node_uid: str | None) -> bool:
        """Write the pool's slices if its devices changed; True when it wrote. Raises ApiError."""
        if node_uid is None:
            return False
        if self.counters is None:
            self.counters = await self._counters_served(node_uid)
        bodies = pool_slices(node_name=self.node_name, node_uid=node_uid, gpus=gpus, sharing=sharing, generation=0,
                             counters=self.counters)
        main, others = bodies[0], bodies[1:]
        digest = devices_digest(main["spec"], *(other["spec"] for other in others))
        if self._written is None or self.clock() - self._read_at >= self.verify_s:
            self._written = await self._stored()
            self._read_at = self.clock()
        if self._written is not None and self._written[0] == digest:
            self.offered = (list(gpus), sharing)
            return False
        generation = (self._written[1] if self._written else 0) + 1
        for body in bodies:
            body["spec"]["pool"]["generation"] = generation
        main["metadata"]["annotations"] = {DIGEST_ANNOTATION: digest}
        for other in others:  # the counters first: the devices consume them
            await self.kube.apply(self.counters_path, other, field_manager=FIELD_MANAGER)
        await self.kube.apply(self.path, main, field_manager=FIELD_MANAGER)
        if not others:
            await self.kube.delete(self.counters_path)  # a pool that had twins has none now (missing is fine)
        self._written = (digest, generation)
        self.offered = (list(gpus), sharing)
        log.info("ResourceSlice %s: %d devices, %d counter sets, pool generation %d", dra.slice_name(self.node_name),
                 len(main["spec"]["devices"]), sum(len(other["spec"]["sharedCounters"]) for other in others),
                 generation)
        return True

    async def _counters_served(self, node_uid: str) -> bool:
        """Does the API server keep a slice's sharedCounters? A dry-run create (nothing is stored)."""
        probe = {"apiVersion": dra.RESOURCE_API_VERSION, "kind": "ResourceSlice",
                 "metadata": {"generateName": f"{dra.slice_name(self.node_name)}-probe-"},
                 "spec": {"driver": dra.DRIVER_NAME, "nodeName": self.node_name,
                          "pool": {"name": self.node_name, "generation": 0, "resourceSliceCount": 1},
                          "sharedCounters": [{"name": "probe", "counters": {dra.COUNTER_GPU: {"value": "1"}}}]}}
        try:
            reply = await self.kube.request("POST", object_path(dra.RESOURCE_API_VERSION, "resourceslices"),
                                            body=probe, query={"dryRun": "All"})
        except Unavailable:
            raise  # asked again at the next publish
        except ApiError as error:
            log.warning("the API server refused a counters slice (%s): GPUs are offered as shares only", error)
            return False
        served = bool((reply.get("spec") or {}).get("sharedCounters"))
        log.info("shared counters %s: %s", "served" if served else "not served (DRAPartitionableDevices off)",
                 "each shared GPU is also offered whole" if served else "GPUs are offered as shares only")
        return served

    async def _stored(self) -> tuple[str, int] | None:
        try:
            stored = await self.kube.get(self.path)
        except NotFound:
            return None
        digest = (stored["metadata"].get("annotations") or {}).get(DIGEST_ANNOTATION, "")
        return digest, int(stored["spec"]["pool"].get("generation", 0))

    async def withdraw(self) -> None:
        """Delete the node's slices (the node serves the device plugin now). Raises ApiError."""
        await self.kube.delete(self.path)
        await self.kube.delete(self.counters_path)
        self._written = None
        self.offered = None
