"""Many node agents in one process, for benchmarks at hundreds of simulated nodes.

Each node runs the agent's own parts, wired as `app.py` wires them: the inventory loop
(discovery, health, AmdGpuNode and Node-label publishing), the node's pod cache (its own
list+watch, field selector on its node), and the device plugin unit on its own unix socket in
``<plugin-root>/<node>/``, registered with the kubelet peer's device manager listening there
(`kubelet-peer --node-count`). Nothing is shared between nodes but the event loop and the
API connections: one `Kube` per `nodes_per_client` nodes, since each node keeps a watch open
and a client holds at most 100 connections.

What differs from a node's own agent, and why: the periods of background work are longer
(health every `health_interval_s`, AmdGpuNode heartbeat every `heartbeat_s`, socket checks
every `plugin_poll_s`), because on one machine N agents' background work adds up while on a
real cluster it is spread over N machines; no monitor and no dmem cap (no GPUs here). Every
Allocate is still answered by `DevicePluginService` from the node's own pod cache.

With ``--dra`` each node runs the agent's DRA parts instead, wired as `app._run_dra_parts` wires
them: the inventory loop publishing the node's ResourceSlice (SlicePublisher) beside its
AmdGpuNode, and the DRA kubelet plugin (DraPluginService on its two sockets) registering in
``<plugin-root>/<node>/plugins_registry``, where ``kubelet-peer --node-count --dra`` watches for
it, and writing each prepared claim's CDI spec into ``<plugin-root>/<node>/cdi``, where the peer
reads it. No pod cache (the DRA plugin reads claims from the API server) and no account folders.

Run: ``python -m rocshare_dev.devcluster.multiagent --kubeconfig K --plugin-root DIR --sysfs-root S
--dev-root D NODE...`` (or ``--node-count N --node-name-prefix P`` for P0000..P<N-1>).
``--sysfs-map FILE`` (JSON ``{node: sysfs root}``) gives nodes captures of their own (the
trace replay's nodes differ in GPU count and VRAM); nodes it does not name read ``--sysfs-root``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rocshare.api.models import GpuInfo
from rocshare.kube.client import Kube
from rocshare_agent.app import run_until_signalled
from rocshare_agent.deviceplugin.pods import KubePods
from rocshare_agent.deviceplugin.server import PluginUnit
from rocshare_agent.deviceplugin.service import DevicePluginService
from rocshare_agent.dra.plugin import DraPluginService
from rocshare_agent.dra.server import serve_dra_plugin
from rocshare_agent.dra.slices import SlicePublisher
from rocshare_agent.hook import HookCheck, hook_library_path
from rocshare_agent.inventory_loop import run_inventory_loop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetConfig:
    node_names: tuple[str, ...]
    plugin_root: Path
    sysfs_root: Path
    dev_root: Path
    kubeconfig: str | None = None
    hook_path: str = "/usr/local/vgpu"
    health_interval_s: float = 60.0
    heartbeat_s: float = 300.0
    settings_interval_s: float = 60.0
    plugin_poll_s: float = 5.0
    nodes_per_client: int = 40
    sysfs_roots: Mapping[str, Path] = field(default_factory=dict)
    """Node name -> the capture that node reads, where it is not `sysfs_root`."""
    dra: bool = False
    """Each node runs the agent's DRA parts (run_dra_node) instead of its device plugin."""

    def plugin_dir(self, node_name: str) -> Path:
        return self.plugin_root / node_name

    def sysfs_for(self, node_name: str) -> Path:
        return self.sysfs_roots.get(node_name, self.sysfs_root)


def simulated_hook(hook_dir: str) -> HookCheck:
    """Every simulated node of a fleet has the memory hook (the fleet shares no host folder)."""
    return HookCheck(hook_library_path(hook_dir))


async def run_node(kube: Kube, node_name: str, config: FleetConfig) -> None:
    """One node's agent parts until cancelled (app._run_parts, with the fleet's periods)."""
    pods = KubePods(kube, node_name)
    service = DevicePluginService(node_name=node_name, pods=pods, hook_host_dir=config.hook_path,
                                  dev_root=str(config.dev_root), cgroup_root=None, hook_check=simulated_hook)
    unit = PluginUnit(service, plugin_dir=config.plugin_dir(node_name), poll_s=config.plugin_poll_s)
    first_inventory = asyncio.Event()

    def on_inventory(gpus: list[GpuInfo]) -> None:
        service.set_inventory(gpus)
        first_inventory.set()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(run_inventory_loop(
            kube, node_name=node_name, sysfs_root=config.sysfs_for(node_name), dev_root=config.dev_root,
            interval_s=config.health_interval_s, heartbeat_s=config.heartbeat_s,
            settings_interval_s=config.settings_interval_s, on_inventory=on_inventory, plugin=service))
        tasks.create_task(pods.run())
        await first_inventory.wait()
        tasks.create_task(unit.run())


async def run_dra_node(kube: Kube, node_name: str, config: FleetConfig) -> None:
    """One node's agent in DRA mode until cancelled (app._run_dra_parts, with the fleet's periods
    and folders): the DRA plugin serves first, then the inventory loop publishes the slice it
    prepares from."""
    folder = config.plugin_dir(node_name)
    slices = SlicePublisher(kube, node_name)
    service = DraPluginService(kube=kube, node_name=node_name, inventory=lambda: slices.offered,
                               cdi_dir=dra_cdi_dir(folder), hook_host_dir=config.hook_path,
                               dev_root=str(config.dev_root), hook_check=simulated_hook)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(serve_dra_plugin(service, plugins_dir=folder / "plugins",
                                           registry_dir=folder / "plugins_registry"))
        tasks.create_task(run_inventory_loop(
            kube, node_name=node_name, sysfs_root=config.sysfs_for(node_name), dev_root=config.dev_root,
            interval_s=config.health_interval_s, heartbeat_s=config.heartbeat_s,
            settings_interval_s=config.settings_interval_s, slices=slices))


def dra_cdi_dir(node_folder: Path) -> Path:
    """Where a fleet node's DRA plugin writes CDI specs: the folder `kubelet-peer --dra` reads."""
    return node_folder / "cdi"


def _groups(names: Sequence[str], size: int) -> list[Sequence[str]]:
    return [names[start:start + size] for start in range(0, len(names), max(1, size))]


async def run_fleet(config: FleetConfig) -> None:
    """Every node's agent until cancelled; one node's part failing ends them all."""
    clients = [await Kube.connect(config.kubeconfig) for _ in _groups(config.node_names, config.nodes_per_client)]
    try:
        async with asyncio.TaskGroup() as tasks:
            for kube, group in zip(clients, _groups(config.node_names, config.nodes_per_client), strict=True):
                for name in group:
                    run = run_dra_node if config.dra else run_node
                    tasks.create_task(run(kube, name, config), name=f"agent {name}")
            log.info("playing %d node agents with %d API clients", len(config.node_names), len(clients))
    finally:
        for kube in clients:
            await kube.close()


def node_names(*, names: Sequence[str], count: int, prefix: str) -> tuple[str, ...]:
    """Explicit names, or <prefix>0000 .. <prefix><count-1> as `kubelet-peer --node-count` names them."""
    return tuple(names) if names else tuple(f"{prefix}{index:04d}" for index in range(count))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rocshare_dev.devcluster.multiagent", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="node names (or use --node-count)")
    parser.add_argument("--node-count", type=int, default=0)
    parser.add_argument("--node-name-prefix", default="sim-")
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--plugin-root", type=Path, required=True, help="node N's kubelet.sock is in <root>/<N>/")
    parser.add_argument("--sysfs-root", type=Path, required=True)
    parser.add_argument("--sysfs-map", type=Path, default=None, help="JSON {node: sysfs root} for nodes with captures of their own")
    parser.add_argument("--dev-root", type=Path, required=True)
    parser.add_argument("--health-interval-s", type=float, default=60.0)
    parser.add_argument("--heartbeat-s", type=float, default=300.0)
    parser.add_argument("--dra", action="store_true", help="run each node's DRA driver instead of its device plugin")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    names = node_names(names=args.names, count=args.node_count, prefix=args.node_name_prefix)
    if not names:
        raise SystemExit("no nodes: give names or --node-count")
    roots = {name: Path(root) for name, root in json.loads(args.sysfs_map.read_text()).items()} if args.sysfs_map else {}
    config = FleetConfig(node_names=names, plugin_root=args.plugin_root, sysfs_root=args.sysfs_root,
                         dev_root=args.dev_root, kubeconfig=args.kubeconfig, sysfs_roots=roots,
                         health_interval_s=args.health_interval_s, heartbeat_s=args.heartbeat_s,
                         dra=args.dra)

    return run_until_signalled(lambda: run_fleet(config), stopping="node agents stopping")


if __name__ == "__main__":
    raise SystemExit(main())
