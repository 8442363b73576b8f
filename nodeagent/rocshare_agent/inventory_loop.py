"""The node agent's inventory loop: discover, check health, publish, tell the device plugin.

`run_inventory_loop` runs until cancelled. Every check (at most `interval_s`, 2 s by default, or the
pool's health interval when shorter) it applies device-file and exporter health to the GPUs; the
GPUs themselves are re-discovered from sysfs (< 100 ms even on 63 partitions, run in a worker
thread) on the first check, whenever the pool's sharing settings change, and at least every
`REDISCOVER_S` -- a sysfs topology changes only when a GPU or its partitioning does, and a device
that is lost shows at once in its device files, and, when the inventory or any GPU's health changed,
calls `on_inventory` with the new list, emits Events for the transitions and re-publishes. A GPU is
published healthy only once `on_inventory` (the device plugin, so the kubelet) took it healthy: a
failed call is made again on the next check, and meanwhile the AmdGpuNode shows what the kubelet has
(`told_health`). Without changes it re-publishes every `heartbeat_s` (lastHeartbeatTime). The pool
settings the operator writes on the Node (annotation rocshare.io/pool-settings) are re-read every
`settings_interval_s`; missing settings mean defaults (a node in no pool); settings that cannot be
decoded make the node offer nothing (every GPU unhealthy, condition PoolSettings False with why)
until they can (fail closed). Each pass also checks the memory hook library (hook.py): the
MemoryHook condition beside Ready, and a Node event when it appears or goes. With the device plugin
wired in (`plugin`), the DevicePlugin condition says whether the kubelet has the device list (True
only while it watches every resource offered), re-published as soon as that changes and set False
when the agent stops: the extender offers the node only while it is True, so no pod is bound in the
gap of an agent restart, when the kubelet would fail it. A failed publish is logged and retried on
the next check; nothing here ends the loop but cancellation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from rocshare.api.models import (AmdGpuNodeStatus, Condition, GpuInfo, HealthSource, HealthSourceKind, HookMissing,
                                 Sharing)
from rocshare.api.hami import encode_node_register
from rocshare.api.node_settings import POOL_SETTINGS_ANNOTATION, NodeSettings, SettingsError, decode_settings
from rocshare.kube.client import ApiError, Kube
from rocshare_agent.discovery import DiscoveryResult, discover
from rocshare_agent.dra.slices import SlicePublisher
from rocshare_agent.health import ExporterHealth, apply_device_file_health, apply_exporter_health
from rocshare_agent.hook import HookCheck, check_hook, hook_condition, hook_transition
from rocshare_agent.host_groups import read_device_groups
from rocshare.api.resource_names import named
from rocshare_agent.publish import NodePublisher, Transition, health_transitions, node_labels

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
DEFAULT_INTERVAL_S = 2.0
DEFAULT_HEARTBEAT_S = 60.0
DEFAULT_SETTINGS_INTERVAL_S = 30.0
REDISCOVER_S = 60.0
"""The longest a sysfs topology read stands before it is read again (device files are checked on
every pass): a full read on every 2 s check cost a 63-partition node ~2 % of a core, always."""

SETTINGS_CONDITION = "PoolSettings"
"""False (reason Unreadable) while the pool settings on the Node cannot be read."""
STOPPING_PUBLISH_S = 2.0
"""How long a stopping agent tries to publish DevicePlugin False before it exits anyway."""

InventoryCallback = Callable[[list[GpuInfo]], Awaitable[None] | None]


class PluginState(Protocol):
    """What the inventory loop reads of the device plugin (DevicePluginService)."""

    @property
    def resources(self) -> list[str]: ...
    def serving(self) -> bool: ...
    def serving_changed(self) -> asyncio.Event: ...


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_settings() -> NodeSettings:
    """The pool defaults, for a node with no (or an undecodable) settings annotation.

    NodeSettings requires a pool name; a node outside any pool has none, so build it unvalidated.
    """
    return NodeSettings.model_construct(version=1, pool="", sharing=Sharing(), health=HealthSource())


@dataclass
class _Published:
    status: AmdGpuNodeStatus | None = None
    metadata: tuple | None = None
    at: float = 0.0


class InventoryAgent:
    """One node's inventory state; `check()` is one pass of the loop (tests drive it directly)."""

    def __init__(self, kube: Kube, *, node_name: str, sysfs_root: Path, dev_root: Path | None,
                 exporter_url: str | None = None, on_inventory: InventoryCallback | None = None,
                 heartbeat_s: float = DEFAULT_HEARTBEAT_S, settings_interval_s: float = DEFAULT_SETTINGS_INTERVAL_S,
                 exporter_timeout_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 group_file: Path | None = None, hook_dir: str | None = None,
                 hook_missing: HookMissing = HookMissing.REFUSE, plugin: PluginState | None = None,
                 slices: SlicePublisher | None = None) -> None:
        self.publisher = NodePublisher(kube, node_name)
        self.slices = slices
        self.plugin = plugin
        self.stopping = False
        self.hook_dir, self.hook_missing = hook_dir, hook_missing
        self.hook: HookCheck | None = None
        self.sysfs_root, self.dev_root = Path(sysfs_root), (Path(dev_root) if dev_root else None)
        self.exporter_url_override = exporter_url
        self.group_file = group_file
        self.on_inventory = on_inventory
        self.heartbeat_s, self.settings_interval_s = heartbeat_s, settings_interval_s
        self.exporter_timeout_s = exporter_timeout_s
        self.clock = clock
        self.settings = default_settings()
        self.settings_problem: str | None = None
        """Why the pool settings on the Node cannot be read: then every GPU is offered unhealthy."""
        self.node_uid: str | None = None
        self.gpus: list[GpuInfo] | None = None
        self.discovery = DiscoveryResult()
        self._topology: tuple[tuple, float, DiscoveryResult] | None = None
        """(sharing settings, clock, discovery without health) of the last sysfs read."""
        self._settings_at: float | None = None
        self._exporter: ExporterHealth | None = None
        self._published = _Published()
        self._conditions: dict[str, Condition] = {}  # by type, as last published

    # -- settings -----------------------------------------------------------------------------

    async def refresh_settings(self) -> None:
        try:
            node = await self.publisher.read_node()
        except ApiError as error:
            log.warning("cannot read Node %s (keeping previous settings): %s", self.publisher.node_name, error)
            return
        self._settings_at = self.clock()
        if node is None:
            log.warning("Node %s does not exist: publishing only the AmdGpuNode", self.publisher.node_name)
            self.node_uid = None
            return
        self.node_uid = node["metadata"].get("uid")
        try:
            self.settings = settings_from_node(node)
        except SettingsError as error:
            if self.settings_problem != str(error):
                log.error("%s; the node offers no GPU until the pool's settings are readable", error)
            self.settings_problem = str(error)
            return
        self.settings_problem = None

    def exporter(self) -> ExporterHealth | None:
        url = self.exporter_url_override
        if url is None and self.settings.health.kind == HealthSourceKind.METRICS_EXPORTER:
            url = self.settings.health.exporter_url
        if url is None:
            return None
        if self._exporter is None or self._exporter.url != url:
            self._exporter = ExporterHealth(url, timeout_s=self.exporter_timeout_s)
        return self._exporter

    # -- one pass -----------------------------------------------------------------------------

    async def check(self) -> None:
        if self._settings_at is None or self.clock() - self._settings_at >= self.settings_interval_s:
            await self.refresh_settings()
        discovery = await self._discover()
        gpus = named(await self._with_exporter_health(discovery.gpus), self.settings.sharing)
        if self.settings_problem is not None:
            gpus = unoffered(gpus, f"the pool settings on the Node cannot be read: {self.settings_problem}")
        if discovery.product_sources != self.discovery.product_sources:
            _log_names(discovery)
        self.discovery = discovery
        if gpus != self.gpus and await self._notify(gpus):
            transitions = health_transitions(self.gpus, gpus)
            self.gpus = gpus
            await self._emit(transitions)
        await self._check_hook()
        offered = told_health(gpus, self.gpus)
        await self._publish(offered)
        await self._publish_slice(offered)

    async def _check_hook(self) -> None:
        if self.hook_dir is None:
            return
        hook = check_hook(self.hook_dir)
        transition = hook_transition(self.hook, hook, self.hook_missing)
        if hook != self.hook:
            (log.info if hook.present else log.warning)("memory hook: %s", hook_condition(hook, self.hook_missing).message)
        self.hook = hook
        if transition is not None:
            await self._emit([transition])

    async def _discover(self) -> DiscoveryResult:
        """The GPUs, with device-file health checked now; sysfs read again only when REDISCOVER_S
        has passed or the sharing settings discovery depends on changed."""
        sharing = self.settings.sharing
        wanted = (sharing.operating_mode, sharing.split_count)
        if self._topology is None or self._topology[0] != wanted or self.clock() - self._topology[1] >= REDISCOVER_S:
            found = await asyncio.to_thread(discover, self.sysfs_root, None, operating_mode=sharing.operating_mode,
                                            split_count=sharing.split_count)
            self._topology = (wanted, self.clock(), found)
        topology = self._topology[2]
        if self.dev_root is None:
            return topology
        return dataclasses.replace(topology, gpus=apply_device_file_health(topology.gpus, self.dev_root))

    async def _with_exporter_health(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        exporter = self.exporter()
        if exporter is None:
            return gpus
        reading = await exporter.poll()
        if reading.error:
            log.warning("metrics exporter: %s (%s)", reading.error,
                        "keeping last-known verdicts" if reading.verdicts else "device-file health only")
        return apply_exporter_health(gpus, reading.verdicts)

    async def _notify(self, gpus: list[GpuInfo]) -> bool:
        """Tell the device plugin (and so the kubelet); False when that failed: the next check
        tells it again, and until then the published health is what the kubelet has."""
        if self.on_inventory is None:
            return True
        try:
            result = self.on_inventory(list(gpus))
            if inspect.isawaitable(result):
                await result
        except Exception:  # the callback's bug must not stop inventory publishing
            log.exception("on_inventory callback failed; telling it again on the next check")
            return False
        return True

    async def _emit(self, transitions: list[Transition]) -> None:
        for transition in transitions:
            log.info("%s: %s", transition.reason, transition.message)
            try:
                await self.publisher.emit_event(transition, node_uid=self.node_uid, now_rfc3339=_now_rfc3339())
            except ApiError as error:
                log.warning("cannot post event %s: %s", transition.reason, error)

    # -- publishing ---------------------------------------------------------------------------

    def status(self, gpus: list[GpuInfo]) -> AmdGpuNodeStatus:
        return AmdGpuNodeStatus(
            gpus=gpus, problems=self.discovery.problems, operating_mode=self.settings.sharing.operating_mode,
            device_memory_scaling=self.settings.sharing.device_memory_scaling, agent_version=AGENT_VERSION,
            device_groups=read_device_groups(self.group_file),
            conditions=[self._stamped(condition) for condition in self._conditions_now(gpus)],
        )

    def _conditions_now(self, gpus: list[GpuInfo]) -> list[Condition]:
        conditions = [ready_condition(gpus), settings_condition(self.settings_problem)]
        if self.hook is not None:
            conditions.append(hook_condition(self.hook, self.hook_missing))
        if self.plugin is not None:
            conditions.append(device_plugin_condition(self.plugin.resources, serving=self.plugin.serving(),
                                                      stopping=self.stopping))
        return conditions

    async def publish_stopping(self) -> None:
        """The agent is going: DevicePlugin False, so the extender stops offering the node before
        the kubelet marks its devices unhealthy (nothing to publish before the first inventory)."""
        self.stopping = True
        if self.gpus is not None:
            await self._publish(self.gpus)

    def _stamped(self, condition: Condition) -> Condition:
        """The condition with its transition time: now when its status changed, else kept."""
        previous = self._conditions.get(condition.type)
        if previous is None or previous.status != condition.status:
            condition = condition.model_copy(update={"last_transition_time": _now_rfc3339()})
        else:
            condition = condition.model_copy(update={"last_transition_time": previous.last_transition_time})
        self._conditions[condition.type] = condition
        return condition

    async def _publish(self, gpus: list[GpuInfo]) -> None:
        status = self.status(gpus)
        heartbeat_due = self.clock() - self._published.at >= self.heartbeat_s
        if status == self._published.status and not heartbeat_due:
            return
        stamped = status.model_copy(update={"last_heartbeat_time": _now_rfc3339()})
        try:
            await self.publisher.publish_status(stamped, node_uid=self.node_uid)
            await self._publish_metadata(gpus, force=heartbeat_due)
        except ApiError as error:
            log.warning("publishing the inventory of %s failed (retrying next check): %s",
                        self.publisher.node_name, error)
            return
        self._published = _Published(status=status, metadata=self._published.metadata, at=self.clock())

    async def _publish_slice(self, gpus: list[GpuInfo]) -> None:
        """DRA mode: the ResourceSlice follows the inventory (it writes only when its devices change)."""
        if self.slices is None:
            return
        try:
            await self.slices.publish(gpus, self.settings.sharing, node_uid=self.node_uid)
        except ApiError as error:
            log.warning("publishing the ResourceSlice of %s failed (retrying next check): %s",
                        self.publisher.node_name, error)

    async def _publish_metadata(self, gpus: list[GpuInfo], *, force: bool) -> None:
        if self.node_uid is None:
            return
        sharing = self.settings.sharing
        labels = node_labels(gpus)
        register = encode_node_register(gpus, operating_mode=sharing.operating_mode,
                                        memory_scaling=sharing.device_memory_scaling,
                                        compute_queues=self.discovery.compute_queues)
        metadata = (tuple(sorted(labels.items())), register, self.node_uid)
        if metadata == self._published.metadata and not force:
            return
        await self.publisher.publish_node_metadata(node_uid=self.node_uid, labels=labels, register=register)
        self._published.metadata = metadata


def told_health(gpus: list[GpuInfo], told: list[GpuInfo] | None) -> list[GpuInfo]:
    """The GPUs as found, each healthy only if the kubelet was also told it is (`told`: the list the
    device plugin last took). Until the kubelet has the news, the AmdGpuNode never offers a GPU the
    kubelet would refuse; a GPU that failed shows at once (fail closed both ways)."""
    if told == gpus:
        return gpus
    healthy = {gpu.id for gpu in told or () if gpu.healthy}
    return [gpu if gpu.id in healthy or not gpu.healthy
            else gpu.model_copy(update={"healthy": False, "health_reason": "not yet told to the kubelet"})
            for gpu in gpus]


def settings_from_node(node: dict) -> NodeSettings:
    """The pool's settings as the operator wrote them on the Node; the defaults when it wrote
    none (a node in no pool). Raises SettingsError when they cannot be read: never a guess."""
    text = (node.get("metadata", {}).get("annotations") or {}).get(POOL_SETTINGS_ANNOTATION)
    if text is None:
        return default_settings()
    return decode_settings(text)


def unoffered(gpus: list[GpuInfo], why: str) -> list[GpuInfo]:
    """Every GPU unhealthy, with why: the kubelet's allocatable drops to 0 and the extender offers
    none of them (what a node that cannot be read must offer: nothing)."""
    return [gpu.model_copy(update={"healthy": False, "health_reason": why}) for gpu in gpus]


def settings_condition(problem: str | None) -> Condition:
    if problem is not None:
        return Condition(type=SETTINGS_CONDITION, status="False", reason="Unreadable",
                         message=f"{problem}; no GPU is offered until it is fixed")
    return Condition(type=SETTINGS_CONDITION, status="True", reason="Read", message="the pool settings were read")


def ready_condition(gpus: list[GpuInfo]) -> Condition:
    healthy = sum(gpu.healthy for gpu in gpus)
    if not gpus:
        return Condition(type="Ready", status="False", reason="NoGpus", message="no AMD GPU found")
    if healthy == 0:
        return Condition(type="Ready", status="False", reason="NoHealthyGpus", message=f"0/{len(gpus)} GPUs healthy")
    return Condition(type="Ready", status="True", reason="GpusFound", message=f"{healthy}/{len(gpus)} GPUs healthy")


def device_plugin_condition(resources: list[str], *, serving: bool, stopping: bool = False) -> Condition:
    names = ", ".join(resources)
    if stopping:
        return Condition(type="DevicePlugin", status="False", reason="AgentStopping",
                         message=f"the node agent is stopping; {names} is offered again once its successor serves")
    if not serving:
        return Condition(type="DevicePlugin", status="False", reason="NotWatched",
                         message=f"waiting for the kubelet to register the device plugin and watch {names}")
    return Condition(type="DevicePlugin", status="True", reason="Serving", message=f"the kubelet watches {names}")


async def run_inventory_loop(kube: Kube, *, node_name: str, sysfs_root: Path, dev_root: Path | None,
                             exporter_url: str | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                             heartbeat_s: float = DEFAULT_HEARTBEAT_S,
                             settings_interval_s: float = DEFAULT_SETTINGS_INTERVAL_S,
                             on_inventory: InventoryCallback | None = None, group_file: Path | None = None,
                             hook_dir: str | None = None, hook_missing: HookMissing = HookMissing.REFUSE,
                             plugin: PluginState | None = None, slices: SlicePublisher | None = None) -> None:
    """Discover, check health and publish for `node_name` until cancelled (then, with a `plugin`,
    publish DevicePlugin False, for at most STOPPING_PUBLISH_S).

    `on_inventory(gpus)` (sync or async) is called with the full list of `GpuInfo` on the
    first check and whenever the inventory or any GPU's health changes. `exporter_url`
    overrides the pool's metrics-exporter setting. Health is checked every `interval_s`, or
    the pool's `health.intervalSeconds` when that is shorter.
    """
    agent = InventoryAgent(kube, node_name=node_name, sysfs_root=sysfs_root, dev_root=dev_root,
                           exporter_url=exporter_url, on_inventory=on_inventory, heartbeat_s=heartbeat_s,
                           settings_interval_s=settings_interval_s, group_file=group_file, hook_dir=hook_dir,
                           hook_missing=hook_missing, plugin=plugin, slices=slices)
    try:
        while True:
            started = time.monotonic()
            plugin_changed = plugin.serving_changed() if plugin is not None else None  # before the check reads it
            try:
                await agent.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one pass must not stop the agent publishing
                log.exception("inventory check failed")
            period_s = min(interval_s, float(agent.settings.health.interval_seconds))
            await _sleep_unless(plugin_changed, max(0.0, period_s - (time.monotonic() - started)))
    except asyncio.CancelledError:
        if plugin is not None:
            await _publish_stopping(agent)
        raise


async def _sleep_unless(changed: asyncio.Event | None, duration_s: float) -> None:
    """Sleep `duration_s`, or less when `changed` (the device plugin's serving state) is set first."""
    if changed is None:
        await asyncio.sleep(duration_s)
        return
    try:
        await asyncio.wait_for(changed.wait(), timeout=duration_s)
    except TimeoutError:
        pass


async def _publish_stopping(agent: InventoryAgent) -> None:
    try:
        await asyncio.wait_for(agent.publish_stopping(), timeout=STOPPING_PUBLISH_S)
    except TimeoutError:
        log.warning("could not publish DevicePlugin False within %.0f s while stopping", STOPPING_PUBLISH_S)


def _log_names(discovery: DiscoveryResult) -> None:
    """Where each product name came from (amdgpu.ids, DRM, rocshare's table): once per change."""
    named: dict[tuple[str, str], int] = {}
    for gpu in discovery.gpus:
        key = (gpu.product, discovery.product_sources.get(gpu.id, ""))
        named[key] = named.get(key, 0) + 1
    for (product, source), count in sorted(named.items()):
        log.info("%d device(s) named %r (name from %s)", count, product, source or "nowhere")
