"""The DevicePlugin condition (service.py `serving`, inventory_loop.py): True only while the
kubelet has each offered resource's device list, re-published as soon as that changes, and False
when the agent stops, so the extender never offers a node in the gap of an agent restart, when
the kubelet would fail the pod with "no healthy devices"."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
from rocshare_agent.deviceplugin.service import DevicePluginService
from rocshare_agent.inventory_loop import InventoryAgent, run_inventory_loop
from tests.agent_fakes import MemoryPods, RecordingKube
from tests.unit.agent.test_memory_hook import GPU

NODE = "node-a"


def service() -> DevicePluginService:
    plugin = DevicePluginService(node_name=NODE, pods=MemoryPods([]), hook_host_dir="/nowhere")
    plugin.set_inventory([GPU])
    return plugin


def device_plugin(status: dict) -> tuple[str, str]:
    condition = next(c for c in status["conditions"] if c["type"] == "DevicePlugin")
    return condition["status"], condition["reason"]


class Kubelet:
    """The kubelet's side of one ListAndWatch stream: it took the first list and waits for more."""

    def __init__(self, plugin: DevicePluginService) -> None:
        self.stream = plugin.list_and_watch(pb.Empty())

    async def watch(self) -> None:
        await anext(self.stream)
        self.waiting = asyncio.ensure_future(anext(self.stream))
        await asyncio.sleep(0)

    async def hang_up(self) -> None:
        self.waiting.cancel()
        await asyncio.gather(self.waiting, return_exceptions=True)
        await self.stream.aclose()


async def test_serving_while_a_list_and_watch_stream_has_sent_its_list() -> None:
    plugin = service()
    assert not plugin.serving()
    changed = asyncio.ensure_future(plugin.serving_changed().wait())
    stream = plugin.list_and_watch(pb.Empty())
    await anext(stream)
    assert not plugin.serving()  # handed to gRPC, not yet written: gRPC asks for the next item once it is
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.wait_for(changed, 1)
    assert plugin.serving()
    changed = asyncio.ensure_future(plugin.serving_changed().wait())
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    await stream.aclose()
    await asyncio.wait_for(changed, 1)
    assert not plugin.serving()


async def test_the_agent_publishes_the_condition_and_false_when_it_stops(tmp_path: Path) -> None:
    plugin = service()
    kube = RecordingKube(NODE)
    agent = InventoryAgent(kube, node_name=NODE, sysfs_root=tmp_path / "sys", dev_root=None, plugin=plugin)
    await agent.check()
    assert device_plugin(kube.published_statuses()[-1]) == ("False", "NotWatched")
    kubelet = Kubelet(plugin)
    await kubelet.watch()
    await agent.check()
    assert device_plugin(kube.published_statuses()[-1]) == ("True", "Serving")
    await agent.publish_stopping()
    assert device_plugin(kube.published_statuses()[-1]) == ("False", "AgentStopping")
    await kubelet.hang_up()


async def test_the_loop_republishes_at_once_and_says_stopping_when_cancelled(tmp_path: Path) -> None:
    plugin = service()
    kube = RecordingKube(NODE)
    loop = asyncio.create_task(run_inventory_loop(kube, node_name=NODE, sysfs_root=tmp_path / "sys", dev_root=None,
                                                  interval_s=60.0, plugin=plugin))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if kube.published_statuses():
            break
    assert device_plugin(kube.published_statuses()[-1]) == ("False", "NotWatched")
    kubelet = Kubelet(plugin)
    await kubelet.watch()
    for _ in range(100):  # well before the 60 s check interval
        await asyncio.sleep(0.01)
        if device_plugin(kube.published_statuses()[-1])[0] == "True":
            break
    assert device_plugin(kube.published_statuses()[-1]) == ("True", "Serving")
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)
    assert loop.cancelled()
    assert device_plugin(kube.published_statuses()[-1]) == ("False", "AgentStopping")
    await kubelet.hang_up()


class FlipDuringCheck:
    """A plugin whose serving state changes while the loop's first check reads it."""

    resources = ["amd.com/gpu"]

    def __init__(self) -> None:
        self.reads = 0
        self._changed = asyncio.Event()

    def serving(self) -> bool:
        self.reads += 1
        if self.reads == 1:
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
        return self.reads > 1

    def serving_changed(self) -> asyncio.Event:
        return self._changed


async def test_a_change_during_a_check_is_not_missed(tmp_path: Path) -> None:
    """The loop takes the change event before its check reads the state: a stream opening while
    discovery runs wakes it at once, not a check period (60 s here) later."""
    plugin = FlipDuringCheck()
    kube = RecordingKube(NODE)
    loop = asyncio.create_task(run_inventory_loop(kube, node_name=NODE, sysfs_root=tmp_path / "sys", dev_root=None,
                                                  interval_s=60.0, plugin=plugin))
    try:
        for _ in range(200):
            await asyncio.sleep(0.01)
            if plugin.reads >= 2 and kube.published_statuses():
                break
        assert plugin.reads >= 2
        assert device_plugin(kube.published_statuses()[-1]) == ("True", "Serving")
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
