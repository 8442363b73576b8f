"""The device plugin's handlers, as plain async functions over protobuf messages.

`DevicePluginService` holds the current inventory and answers the kubelet; `server.py` only
binds these methods to a gRPC socket, so tests call them directly. Errors are typed:
`Refusal` (the request does not match a committed allocation: the kubelet must fail the pod)
and `kube.ApiError` (the API server could not be read or written); the gRPC adapter maps them
to status codes once.

Invariants: Allocate calls are served one at a time (the kubelet admits pods serially, and
container progress must not interleave). Serving a pod writes nothing to the API server
(DESIGN.md section 2): the pod stops being in flight when the kubelet, having admitted it,
writes its first status (status.startTime). Until the watch shows that write, a pod whose
last GPU container was served is remembered as served, so it never counts as in flight
again. A refusal writes the reason annotation (off the per-pod path: refusals only).
Progress through a pod's containers lives in memory only: an agent restart drops its socket,
so the kubelet fails a half-served pod anyway, and `reset_progress` is called when the
kubelet restarts.

`serving()` says whether the kubelet has every resource's device list: a ListAndWatch stream
that has sent its list is open for each. Until then (the agent just started, or the kubelet
restarted) the kubelet holds the devices unhealthy or not at all and fails any pod bound here;
the agent publishes it as the DevicePlugin condition, which the extender reads before offering
the node.

A container with a memory slice needs the hook library (hook.py), checked on each such
Allocate: when it is missing, the pool's `agent.hookMissing` decides: Refuse (the refusal names
the file) or RunWithoutLimit (no hook, no limit, and a Warning event on the pod says so).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rocshare.api.allocation import ContainerAllocation
from rocshare.api.container_account import file_generation, limits_for
from rocshare.api.models import GpuInfo, HookMissing
from rocshare.api.resource_names import GPU_RESOURCE
from rocshare.kube.client import ApiError
from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin import dmem
from rocshare_agent.accounts import AccountStore
from rocshare_agent.deviceplugin.container_spec import AccountFolders, ContainerSpec, SpecError, render_container
from rocshare_agent.deviceplugin.devices import plugin_devices
from rocshare_agent.deviceplugin.inflight import InFlightFinder, InFlightPod, PodRef, Refusal, next_container
from rocshare_agent.deviceplugin.pod_devices import PodDeviceDir, container_identity
from rocshare_agent.deviceplugin.preferred import preferred_ids
from rocshare_agent.load_check import (
    CDI_DEVICE_NAME,
    gets_load_check,
    read_witnesses,
    remove_witnesses,
    started_unchecked,
    unchecked_message,
)
from rocshare_agent.hook import HookCheck, check_hook, missing_message, unlimited_message

log = logging.getLogger(__name__)

WATCH_GRACE_S = 0.25
"""How long Allocate waits for the pod watch to catch up with a binding before it lists afresh:
the watch event usually arrives within milliseconds, and a list of every pod on a busy node
costs more than waiting for it."""

PREFERENCE_LOOKUP_S = 5.0
"""How long GetPreferredAllocation may look for the in-flight pod. The preference is advice: when
the API server is slow or unreachable, the kubelet gets an answer without it (device IDs in KFD
order) rather than an error, which would fail the pod's admission; Allocate still checks the
record against what the kubelet asks."""

SERVED_MEMORY = 4096  # fully served pod uids remembered until the kubelet's status write is surely visible


class AccountError(Exception):
    """The container's account folder could not be made."""


class PodSource(Protocol):
    """The node's pods (API server dicts) and the refusal the agent writes."""

    def cached(self) -> Sequence[Mapping[str, Any]]: ...
    async def next_event(self, timeout_s: float) -> bool: ...
    async def fresh(self) -> Sequence[Mapping[str, Any]]: ...
    async def mark_refused(self, pod: PodRef, reason: str) -> None: ...
    async def warn(self, pod: PodRef, reason: str, message: str) -> None: ...


class DevicePluginService:
    def __init__(self, *, node_name: str, pods: PodSource, hook_host_dir: str,
                 dev_root: str = "/dev", cgroup_root: Path | None = None,
                 pod_device_dir: Path | None = None, hook_missing: HookMissing = HookMissing.REFUSE,
                 hook_check: Callable[[str], HookCheck] = check_hook, load_check_dir: Path | None = None,
                 accounts: AccountStore | None = None) -> None:
        self.node_name = node_name
        self._pods = pods
        self._hook_host_dir = hook_host_dir
        self._hook_missing = hook_missing
        self._hook_check = hook_check
        self._accounts = accounts  # per-container account folders (accounts.py); None: the hook's /tmp
        self.load_check_dir = load_check_dir  # set once the check and its CDI spec are installed (app.py)
        self._dev_root = dev_root
        self._cgroup_root = cgroup_root
        self._pod_devices = PodDeviceDir(pod_device_dir) if pod_device_dir is not None else None
        self._background: set[asyncio.Task] = set()  # dmem writers in progress
        self._gpus: list[GpuInfo] = []
        self._gpus_by_id: dict[str, GpuInfo] = {}
        self._changed = asyncio.Event()  # set and replaced on every inventory change
        self._allocating = asyncio.Lock()
        self._progress: dict[str, int] = {}  # pod uid -> GPU containers served
        self._served: OrderedDict[str, None] = OrderedDict()  # uids fully served, newest last
        self._finder = InFlightFinder(node_name)
        self._lookup_failing = False  # the last preference lookup failed (warned once until one succeeds)
        self._checked: OrderedDict[str, set[str]] = OrderedDict()  # pod uid -> containers named the load check
        self._unchecked_seen: set[tuple[str, str]] = set()  # (pod uid, container) reported as started unchecked
        self.runtime_ignores_cdi = False  # a container named the load check started without it
        self._watchers: dict[str, int] = {}  # resource -> open ListAndWatch streams that sent their list
        self._serving_changed = asyncio.Event()  # set and replaced when `serving()` may have changed

    # ---- inventory -------------------------------------------------------------------

    def set_inventory(self, gpus: Sequence[GpuInfo]) -> None:
        """New inventory or health: every ListAndWatch stream sends the new list at once.
        Synchronous, so the inventory loop may call it as a plain callback."""
        if list(gpus) == self._gpus:
            return
        self._gpus = list(gpus)
        self._gpus_by_id = {gpu.id: gpu for gpu in gpus}
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    @property
    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    @property
    def resources(self) -> list[str]:
        """The resource names the inventory is offered under (one plugin socket each)."""
        return sorted({gpu.resource for gpu in self._gpus}) or [GPU_RESOURCE]

    def list_response(self, resource: str = GPU_RESOURCE) -> pb.ListAndWatchResponse:
        devices = [pb.Device(ID=d.id, health=d.health,
                             topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa)]) if d.numa is not None else None)
                   for d in plugin_devices([gpu for gpu in self._gpus if gpu.resource == resource])]
        return pb.ListAndWatchResponse(devices=devices)

    async def inventory_changed(self) -> None:
        """Return at the next inventory or health change."""
        await self._changed.wait()

    def serving(self) -> bool:
        """Whether the kubelet has been sent the device list of every resource offered."""
        return all(self._watchers.get(resource, 0) > 0 for resource in self.resources)

    def serving_changed(self) -> asyncio.Event:
        """The event set when a ListAndWatch stream next opens or closes: take it before reading
        `serving()`, and no change can slip between."""
        return self._serving_changed

    def _count_watcher(self, resource: str, delta: int) -> None:
        self._watchers[resource] = self._watchers.get(resource, 0) + delta
        changed, self._serving_changed = self._serving_changed, asyncio.Event()
        changed.set()

    def reset_progress(self) -> None:
        self._progress.clear()

    async def settle(self) -> None:
        """Wait for the background work started so far (dmem writes)."""
        await asyncio.gather(*list(self._background), return_exceptions=True)

    # ---- handlers --------------------------------------------------------------------

    async def get_device_plugin_options(self, request: pb.Empty) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def list_and_watch(self, request: pb.Empty,
                             resource: str = GPU_RESOURCE) -> AsyncIterator[pb.ListAndWatchResponse]:
        sent = False
        try:
            while True:
                changed = self._changed  # taken before sending, so no change can slip between
                yield self.list_response(resource)
                if not sent:  # gRPC asks for the next item once it has written this one
                    sent = True
                    self._count_watcher(resource, +1)
                await changed.wait()
        finally:
            if sent:
                self._count_watcher(resource, -1)

    async def get_preferred_allocation(self, request: pb.PreferredAllocationRequest) -> pb.PreferredAllocationResponse:
        responses = []
        looked_up = True
        for container in request.container_requests:
            committed = (await self._committed_or_none(container.allocation_size)) if looked_up else None
            looked_up = committed is not None  # one failed lookup per call: the next would wait as long
            ids = preferred_ids(list(container.available_deviceIDs), list(container.must_include_deviceIDs),
                                container.allocation_size, committed_gpu_ids=committed or [], gpus=self._gpus_by_id)
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        async with self._allocating:
            try:
                responses = [await self._allocate_one(len(c.devices_ids)) for c in request.container_requests]
            except Refusal as refusal:
                log.warning("Allocate refused: %s", refusal.message)
                if refusal.pod is not None:
                    await self._pods.mark_refused(refusal.pod, refusal.message)
                raise
        return pb.AllocateResponse(container_responses=responses)

    async def pre_start_container(self, request: pb.PreStartContainerRequest) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    # ---- allocation ------------------------------------------------------------------

    async def _allocate_one(self, device_count: int) -> pb.ContainerAllocateResponse:
        in_flight = await self._in_flight()
        uid = in_flight.pod.uid
        served = self._progress.get(uid, 0)
        container = next_container(in_flight, served, device_count)
        memory_hook = self._memory_hook(container, in_flight.pod)
        try:
            account = self._account_for(uid, container) if memory_hook else None
            spec = render_container(container, self._gpus_by_id, oversubscribed=in_flight.record.oversubscribed,
                                    hook_host_dir=self._hook_host_dir, memory_hook=memory_hook,
                                    dev_root=self._dev_root, account=account)
            spec = await self._for_its_user(spec, in_flight.pod, container.name)
        except SpecError as error:
            raise Refusal(f"pod {in_flight.pod}: {error}", in_flight.pod) from None
        except AccountError as error:
            raise Refusal(f"pod {in_flight.pod}: cannot make its account folder: {error}", in_flight.pod) from None
        except OSError as error:
            raise Refusal(f"pod {in_flight.pod}: cannot make device files for its user: {error}", in_flight.pod) from None
        if gets_load_check(spec):
            self._remember_checked(uid, container.name)
        self._progress = {uid: served + 1}  # one pod in flight: older entries are finished or failed
        if served + 1 == len(in_flight.record.containers):
            self._progress.pop(uid, None)
            self._remember_served(uid)
            self._cap_vram(in_flight)
        log.info("Allocate: pod %s container %s (%d devices)", in_flight.pod, container.name, device_count)
        return to_response(spec)

    def _account_for(self, pod_uid: str, container: ContainerAllocation) -> AccountFolders | None:
        """The container's account folder with its limits written, for a slice; None without a store."""
        if self._accounts is None or all(device.whole for device in container.devices):
            return None
        try:
            folder = self._accounts.pod_folder(pod_uid, container.name)
            return self._accounts.prepare(folder, limits_for(container.devices, generation=file_generation(0)))
        except (OSError, ValueError) as error:
            raise AccountError(str(error)) from None

    def _memory_hook(self, container: ContainerAllocation, pod: PodRef) -> bool:
        """Whether a slice container gets the hook; raises Refusal when it needs it and the pool
        refuses slices without it. A container of whole GPUs needs none (nothing is checked)."""
        if all(device.whole for device in container.devices):
            return True
        if self.runtime_ignores_cdi and self._hook_missing == HookMissing.REFUSE:
            raise Refusal(f"pod {pod}: this node's container runtime ignores CDI devices, so rocshare-loadcheck "
                          f"cannot refuse a container the memory hook cannot load; enable CDI in the runtime "
                          f"(containerd >= 1.7 with enable_cdi) or set the pool's agent.hookMissing to "
                          f"RunWithoutLimit", pod)
        check = self._hook_check(self._hook_host_dir)
        if check.present:
            return True
        if self._hook_missing == HookMissing.REFUSE:
            raise Refusal(f"pod {pod}: {missing_message(check, node=self.node_name)}", pod)
        message = unlimited_message(check, container=container.name)
        log.warning("pod %s: %s", pod, message)
        self._in_background(self._pods.warn(pod, "NoMemoryLimit", message))
        return False

    async def _for_its_user(self, spec: ContainerSpec, pod: PodRef, container: str) -> ContainerSpec:
        """Device files the container's user can open (pod_devices.py); unchanged for root."""
        if self._pod_devices is None:
            return spec
        body = next((p for p in self._pods.cached() if p["metadata"].get("uid") == pod.uid), None)
        if body is None:
            body = next((p for p in await self._pods.fresh() if p["metadata"].get("uid") == pod.uid), {})
        identity = container_identity(body, container)
        if identity is None:
            return spec
        return self._pod_devices.grant(spec, pod_uid=pod.uid, container=container, identity=identity)

    def _remember_checked(self, uid: str, container: str) -> None:
        self._checked.setdefault(uid, set()).add(container)
        self._checked.move_to_end(uid)
        while len(self._checked) > SERVED_MEMORY:
            self._checked.popitem(last=False)

    def audit_load_check(self) -> None:
        """Containers named the load check that started without its witness prove the runtime ignored
        the CDI device: each gets a Warning event, and from then on the pool's hookMissing decides
        (Refuse: slices are refused here). Witnesses of pods gone are removed. Nothing is judged
        until this agent installed the check (else no runtime could have run it)."""
        if self.load_check_dir is None:
            return
        pods = list(self._pods.cached())
        check_dir = self.load_check_dir
        try:
            witnessed = read_witnesses(check_dir)
        except OSError as error:  # unknown is not "not run": no verdict this round
            log.warning("load check: cannot read its witnesses in %s: %s", check_dir, error)
            return
        for body, container in started_unchecked(pods, self._checked, witnessed):
            meta = body["metadata"]
            key = (meta["uid"], container)
            if key in self._unchecked_seen:
                continue
            self._unchecked_seen.add(key)
            self.runtime_ignores_cdi = True
            message = unchecked_message(container, refusing=self._hook_missing == HookMissing.REFUSE)
            pod = PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
            log.error("pod %s: %s", pod, message)
            self._in_background(self._pods.warn(pod, "LoadCheckNotRun", message))
        live = {p["metadata"].get("uid") for p in pods}
        remove_witnesses(check_dir, [name for name in witnessed if name.split("_", 1)[0] not in live])

    def forget_gone_pods(self) -> None:
        """Remove per-pod device files and account folders of pods no longer on this node."""
        if self._accounts is not None:
            gone = self._accounts.remove_pods_except(p["metadata"].get("uid") for p in self._pods.cached())
            if gone:
                log.info("removed the account folders of %d finished pods", len(gone))
        if self._pod_devices is not None:
            removed = self._pod_devices.forget_all_but(p["metadata"].get("uid") for p in self._pods.cached())
            if removed:
                log.info("removed device files of %d finished pods", len(removed))

    async def _in_flight(self) -> InFlightPod:
        """From the watch cache, re-checked on each watch event for WATCH_GRACE_S (the watch may
        lag the binding); then from a fresh list, which alone may refuse."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WATCH_GRACE_S
        while True:
            try:
                return self._finder.find(self._unserved(self._pods.cached()))
            except Refusal:
                remaining_s = deadline - loop.time()
                if remaining_s <= 0 or not await self._pods.next_event(remaining_s):
                    break
        return self._finder.find(self._unserved(await self._pods.fresh()))

    def _unserved(self, pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return [pod for pod in pods if pod["metadata"].get("uid") not in self._served]

    def _remember_served(self, uid: str) -> None:
        self._served[uid] = None
        while len(self._served) > SERVED_MEMORY:
            self._served.popitem(last=False)

    def _in_background(self, work) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _committed_or_none(self, size: int) -> list[str] | None:
        """`_committed_gpus_for`, or None when the API server did not answer within
        PREFERENCE_LOOKUP_S. The request names no pod, so the warning is once per outage: the
        first failure warns, later ones are debug until a lookup succeeds again."""
        try:
            committed = await asyncio.wait_for(self._committed_gpus_for(size), PREFERENCE_LOOKUP_S)
        except (ApiError, TimeoutError) as error:
            reason = str(error) or f"no answer within {PREFERENCE_LOOKUP_S:.0f} s"
            log.log(logging.DEBUG if self._lookup_failing else logging.WARNING,
                    "GetPreferredAllocation: in-flight pod not found (%s); answering without a preference", reason)
            self._lookup_failing = True
            return None
        self._lookup_failing = False
        return committed

    async def _committed_gpus_for(self, size: int) -> list[str]:
        """The in-flight pod's GPUs for its next container, found as Allocate finds the pod: the
        kubelet may ask as soon as it sees the binding, before this agent's watch shows it."""
        try:
            in_flight = await self._in_flight()
        except Refusal:
            return []
        served = self._progress.get(in_flight.pod.uid, 0)
        containers = in_flight.record.containers
        if served < len(containers) and len(containers[served].devices) == size:
            return [device.gpu_id for device in containers[served].devices]
        return in_flight.record.gpu_ids()

    def _cap_vram(self, in_flight: InFlightPod) -> None:
        if self._cgroup_root is None or not dmem.dmem_available(self._cgroup_root):
            return
        caps = dmem.vram_caps_bytes(in_flight.record, self._gpus_by_id)
        limits = dmem.region_limits(dmem.read_regions(self._cgroup_root), caps)
        self._in_background(dmem.apply_when_ready(self._cgroup_root, in_flight.pod.uid, limits))


def to_response(spec: ContainerSpec) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=spec.envs,
        devices=[pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
                 for d in spec.devices],
        mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in spec.mounts],
        # A container given the hook is also given the load check, through the agent's CDI spec
        # (load_check.py): a runtime with CDI refuses it where the hook cannot load.
        cdi_devices=[pb.CDIDevice(name=CDI_DEVICE_NAME)] if gets_load_check(spec) else [],
    )
