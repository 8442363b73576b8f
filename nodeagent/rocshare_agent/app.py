"""The node agent process: inventory loop, pod cache, device plugin (or DRA driver) and monitor, wired.

Order: the inventory loop starts first and the device plugin serves only once the first
inventory is known, so the kubelet never sees an empty list that is merely not read yet.
Every part keeps its state in the API server or rebuilds it (pods by list+watch, GPUs by
discovery); the process can be killed at any time. The device plugin unit re-registers by
itself when the kubelet restarts; any other part that ends unexpectedly ends the process
(the DaemonSet restarts it) rather than leaving a half-working agent. The pool's agent
interface picks the kubelet side: the device plugin, or (DRA) the node's ResourceSlice and the DRA
kubelet plugin; a node never serves both, so device-plugin mode deletes a slice left from DRA mode.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from rocshare.api.container_account import DEFAULT_ACCOUNT_ROOT
from rocshare.api.models import AgentInterface, GpuInfo, HookLibrary, HookMissing
from rocshare.kube.client import ApiError, Kube
from rocshare_agent.accounts import AccountStore
from rocshare_agent.deviceplugin.pods import KubePods
from rocshare_agent.slice_limits import follow_resizes
from rocshare_agent.deviceplugin.server import DEFAULT_PLUGIN_DIR, run_plugin_units
from rocshare_agent.deviceplugin.service import DevicePluginService
from rocshare_agent.dra.cdi import DEFAULT_CDI_DIR
from rocshare_agent.dra.plugin import DraPluginService
from rocshare_agent.dra.server import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, serve_dra_plugin
from rocshare_agent.dra.slices import SlicePublisher
from rocshare_agent.hook_install import SHIPPED_HOOK, InstallError, install_hook
from rocshare_agent.load_check import (
    DEFAULT_LOAD_CHECK_DIR,
    LOAD_CHECK_FILE,
    install_load_check,
    write_device_plugin_spec,
)
from rocshare_agent.deviceplugin.container_spec import HOOK_LIBRARY
from rocshare_agent.inventory_loop import run_inventory_loop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    kubeconfig: str | None = None
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    device_plugin_dir: Path = Path(DEFAULT_PLUGIN_DIR)
    hook_path: str = "/usr/local/vgpu"
    hook_missing: HookMissing = HookMissing.REFUSE
    hook_library: HookLibrary = HookLibrary.ROCSHARE
    hook_source: Path = SHIPPED_HOOK
    group_file: Path | None = None
    pod_device_dir: Path | None = None
    exporter_url: str | None = None
    health_interval_s: float = 2.0
    cgroup_root: Path | None = Path("/sys/fs/cgroup")
    proc_root: Path = Path("/proc")
    monitor_port: int = 9394
    monitor_addr: str = "0.0.0.0"
    interface: AgentInterface = AgentInterface.DEVICE_PLUGIN
    dra_plugins_dir: Path = Path(DEFAULT_PLUGINS_DIR)
    dra_registry_dir: Path = Path(DEFAULT_REGISTRY_DIR)
    cdi_dir: Path = Path(DEFAULT_CDI_DIR)
    dra_whole_twins: bool = False
    """Offer each shared GPU whole too, by shared counters, where the API server serves them (docs/dra.md)."""
    load_check_dir: Path = Path(DEFAULT_LOAD_CHECK_DIR)
    account_dir: Path | None = Path(DEFAULT_ACCOUNT_ROOT)
    """Per-container account folders (docs/container-account.md); None: the hook keeps its own;
    resizes are not written."""


def _start_monitor(config: AgentConfig, pods: KubePods):
    if config.monitor_port <= 0:
        return None
    from rocshare_agent.hook import HookCollector
    from rocshare_agent.monitor import start_monitor

    server, _thread = start_monitor(sysfs_root=config.sysfs_root, proc_root=config.proc_root,
                                    port=config.monitor_port, addr=config.monitor_addr,
                                    node_name=config.node_name, pods=lambda: _snapshot(pods),
                                    accounts=_account_store(config),
                                    cdi_dir=config.cdi_dir if config.interface == AgentInterface.DRA else None,
                                    extra_collectors=[HookCollector(node_name=config.node_name,
                                                                    hook_dir=config.hook_path)])
    log.info("monitor serving /metrics on %s:%d", config.monitor_addr, config.monitor_port)
    return server


async def run_agent(config: AgentConfig) -> None:
    """Run until cancelled."""
    _install_hook(config)
    kube = await Kube.connect(config.kubeconfig)
    pods = KubePods(kube, config.node_name)
    monitor = _start_monitor(config, pods)
    try:
        await _run_parts(kube, config, pods)
    finally:
        if monitor is not None:
            monitor.shutdown()
        await kube.close()


def _install_hook(config: AgentConfig) -> None:
    """rocshare's hook into hookPath before anything offers slices. A failure is logged, not fatal:
    the hook check then reports the node's library as missing, and the pool's hookMissing decides."""
    if config.hook_library == HookLibrary.EXTERNAL:
        log.info("memory hook: the pool names an external library in %s; verifying it only", config.hook_path)
        return
    try:
        installed = install_hook(config.hook_source, Path(config.hook_path))
    except (OSError, InstallError) as error:
        log.error("memory hook: cannot install %s into %s: %s", config.hook_source, config.hook_path, error)
        return
    log.info("memory hook: %s %s -> %s (%s)", "installed" if installed.changed else "already installed",
             installed.link, installed.target, installed.version)


def _install_load_check(config: AgentConfig) -> bool:
    """The load check into its folder, and the device plugin's CDI spec naming it (load_check.py),
    whatever library the pool names: the check reads that library's own needs. A failure is logged
    and returns False: a runtime with CDI then fails every slice container (its CDI device or the
    hook's program cannot be found), which is closed, not open."""
    source = config.hook_source.parent / LOAD_CHECK_FILE
    try:
        changed = install_load_check(source, config.load_check_dir)
        spec = write_device_plugin_spec(config.cdi_dir, check_dir=config.load_check_dir,
                                        hook_host_dir=config.hook_path, library_file=HOOK_LIBRARY)
    except OSError as error:
        log.error("load check: cannot install %s into %s or its CDI spec into %s: %s", source,
                  config.load_check_dir, config.cdi_dir, error)
        return False
    log.info("load check: %s in %s; CDI spec %s", "installed" if changed else "already installed",
             config.load_check_dir, spec)
    return True


def _snapshot(pods: KubePods) -> list:
    """The pod cache as the monitor's scrape thread sees it: a copy, retried if the event loop's
    thread changed the cache while it was being copied."""
    for _ in range(3):
        try:
            return list(pods.cached())
        except RuntimeError:
            continue
    return []


async def _run_parts(kube: Kube, config: AgentConfig, pods: KubePods) -> None:
    slices = SlicePublisher(kube, config.node_name, whole_twins=config.dra_whole_twins)
    if config.interface == AgentInterface.DRA:
        await _run_dra_parts(kube, config, pods, slices)
        return
    await _withdraw_slice(slices)
    service = DevicePluginService(node_name=config.node_name, pods=pods, hook_host_dir=config.hook_path,
                                  hook_missing=config.hook_missing,
                                  load_check_dir=config.load_check_dir if _install_load_check(config) else None,
                                  dev_root=str(config.dev_root), cgroup_root=config.cgroup_root,
                                  pod_device_dir=config.pod_device_dir, accounts=_account_store(config))
    first_inventory = asyncio.Event()

    def on_inventory(gpus: list[GpuInfo]) -> None:
        service.set_inventory(gpus)
        first_inventory.set()
        log.info("inventory: %d devices, %d healthy", len(gpus), sum(g.healthy for g in gpus))

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(run_inventory_loop(kube, node_name=config.node_name, sysfs_root=config.sysfs_root,
                                             dev_root=config.dev_root, exporter_url=config.exporter_url,
                                             group_file=config.group_file, hook_dir=config.hook_path,
                                             hook_missing=config.hook_missing,
                                             interval_s=config.health_interval_s, on_inventory=on_inventory,
                                             plugin=service))
        tasks.create_task(pods.run())
        tasks.create_task(_sweep_pod_devices(service, pods))
        if config.account_dir is not None:
            tasks.create_task(follow_resizes(pods, config.account_dir))
        await first_inventory.wait()
        tasks.create_task(run_plugin_units(service, plugin_dir=config.device_plugin_dir))


async def _run_dra_parts(kube: Kube, config: AgentConfig, pods: KubePods, slices: SlicePublisher) -> None:
    """DRA mode: the inventory becomes the node's ResourceSlice, and the DRA kubelet plugin prepares
    claims from what that slice offers; no device plugin registers."""
    service = DraPluginService(kube=kube, node_name=config.node_name, inventory=lambda: slices.offered,
                               cdi_dir=config.cdi_dir, hook_host_dir=config.hook_path,
                               hook_missing=config.hook_missing, dev_root=str(config.dev_root),
                               load_check_dir=str(config.load_check_dir), accounts=_account_store(config))
    _install_load_check(config)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(run_inventory_loop(kube, node_name=config.node_name, sysfs_root=config.sysfs_root,
                                             dev_root=config.dev_root, exporter_url=config.exporter_url,
                                             group_file=config.group_file, hook_dir=config.hook_path,
                                             hook_missing=config.hook_missing,
                                             interval_s=config.health_interval_s, slices=slices))
        tasks.create_task(pods.run())
        tasks.create_task(serve_dra_plugin(service, plugins_dir=config.dra_plugins_dir,
                                           registry_dir=config.dra_registry_dir))
        tasks.create_task(_sweep_claim_accounts(service))


async def _withdraw_slice(slices: SlicePublisher) -> None:
    """Device plugin mode: a slice left from DRA mode goes first (never both on one node)."""
    try:
        await slices.withdraw()
    except ApiError as error:
        log.warning("cannot delete this node's ResourceSlice left from DRA mode: %s", error)


async def _sweep_pod_devices(service: DevicePluginService, pods: KubePods, period_s: float = 30.0) -> None:
    """Per-pod device files go with their pods; swept only from a synced pod cache."""
    await pods.synced.wait()
    while True:
        service.forget_gone_pods()
        service.audit_load_check()
        await asyncio.sleep(period_s)


async def _sweep_claim_accounts(service: DraPluginService, period_s: float = 30.0) -> None:
    """Account folders of claims no longer prepared go (unprepare removes them; this catches the rest)."""
    while True:
        service.forget_unprepared_accounts()
        await asyncio.sleep(period_s)


def _account_store(config: AgentConfig) -> AccountStore | None:
    return AccountStore(config.account_dir) if config.account_dir is not None else None


def main(config: AgentConfig) -> int:
    """Blocking entry point: SIGTERM and SIGINT stop the agent cleanly."""
    return run_until_signalled(lambda: run_agent(config), stopping="agent stopping")


def run_until_signalled(start: Callable[[], Awaitable[None]], *, stopping: str) -> int:
    """Run `start()` until it ends or SIGTERM/SIGINT cancels it; then log `stopping`."""

    async def guarded() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        try:
            await start()
        except asyncio.CancelledError:
            log.info(stopping)

    asyncio.run(guarded())
    return 0
