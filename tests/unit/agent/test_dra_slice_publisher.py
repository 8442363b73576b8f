"""The ResourceSlice publisher (rocshare_agent.dra.slices) against an in-memory API: it writes only
when the devices change, raises the pool generation each time, resumes from a stored slice after a
restart, and writes nothing without the Node's uid. The real API server's view is in
tests/e2e/dra/test_dra_slices.py."""

from __future__ import annotations

import asyncio

from rocshare.api.models import Sharing
from rocshare.kube.client import NotFound
from rocshare_agent.discovery import discover
from rocshare_agent.dra.slices import DIGEST_ANNOTATION, SlicePublisher

PATH = "/apis/resource.k8s.io/v1/resourceslices/node-a-gpu.rocshare.io"


class SliceStore:
    """Holds one object per path, as apply and delete leave it."""

    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.writes = 0

    async def get(self, path: str) -> dict:
        if path not in self.objects:
            raise NotFound(404, "NotFound", path)
        return self.objects[path]

    async def apply(self, path: str, body: dict, *, field_manager: str) -> dict:
        assert field_manager == "rocshare-agent"
        self.writes += 1
        self.objects[path] = body
        return body

    async def delete(self, path: str, *, missing_ok: bool = True) -> dict:
        self.objects.pop(path, None)
        return {}

    async def request(self, method: str, path: str, *, body: dict, query: dict) -> dict:
        """The dry-run probe for shared counters: answered as an API server that drops them (1.35)."""
        assert (method, query) == ("POST", {"dryRun": "All"}) and "sharedCounters" in body["spec"]
        return {**body, "spec": {key: value for key, value in body["spec"].items() if key != "sharedCounters"}}


def test_writes_on_change_only_and_raises_the_generation(sysfs):
    gpus = discover(sysfs / "mi210-8gpu-xgmi").gpus
    store = SliceStore()
    publisher = SlicePublisher(store, "node-a")

    async def scenario():
        assert await publisher.publish(gpus, Sharing(), node_uid="uid-a") is True
        assert await publisher.publish(gpus, Sharing(), node_uid="uid-a") is False
        sick = [g.model_copy(update={"healthy": False}) if g.index == 0 else g for g in gpus]
        assert await publisher.publish(sick, Sharing(), node_uid="uid-a") is True
        assert await publisher.publish(sick, Sharing(split_count=4), node_uid="uid-a") is False  # GpuInfo decides
        assert await publisher.publish(sick, Sharing(omitted_cores="Shared"), node_uid="uid-a") is True

    asyncio.run(scenario())
    stored = store.objects[PATH]
    assert store.writes == 3
    assert stored["spec"]["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 1}
    assert len(stored["spec"]["devices"]) == 7
    assert stored["metadata"]["ownerReferences"][0]["uid"] == "uid-a"


def test_a_restarted_agent_resumes_from_the_stored_slice(sysfs):
    gpus = discover(sysfs / "vega10-1gpu").gpus
    store = SliceStore()

    async def scenario():
        await SlicePublisher(store, "node-a").publish(gpus, Sharing(), node_uid="uid-a")
        again = SlicePublisher(store, "node-a")  # a new process: nothing in memory
        assert await again.publish(gpus, Sharing(), node_uid="uid-a") is False
        assert await again.publish([], Sharing(), node_uid="uid-a") is True

    asyncio.run(scenario())
    assert store.writes == 2
    assert store.objects[PATH]["spec"]["pool"]["generation"] == 2
    assert store.objects[PATH]["spec"]["devices"] == []
    assert store.objects[PATH]["metadata"]["annotations"][DIGEST_ANNOTATION]


def test_nothing_without_the_nodes_uid_and_withdraw_deletes(sysfs):
    gpus = discover(sysfs / "vega10-1gpu").gpus
    store = SliceStore()
    publisher = SlicePublisher(store, "node-a")

    async def scenario():
        assert await publisher.publish(gpus, Sharing(), node_uid=None) is False
        assert store.objects == {}
        await publisher.publish(gpus, Sharing(), node_uid="uid-a")
        await publisher.withdraw()
        assert store.objects == {}
        assert await publisher.publish(gpus, Sharing(), node_uid="uid-a") is True  # written again after a withdraw

    asyncio.run(scenario())


def test_a_slice_deleted_by_someone_else_is_written_again_at_the_next_read_back(sysfs):
    gpus = discover(sysfs / "vega10-1gpu").gpus
    store = SliceStore()
    now = [0.0]
    publisher = SlicePublisher(store, "node-a", verify_s=60.0, clock=lambda: now[0])

    async def scenario():
        await publisher.publish(gpus, Sharing(), node_uid="uid-a")
        del store.objects[PATH]  # kubectl delete resourceslice ...
        now[0] = 59.0
        assert await publisher.publish(gpus, Sharing(), node_uid="uid-a") is False  # not read back yet
        now[0] = 61.0
        assert await publisher.publish(gpus, Sharing(), node_uid="uid-a") is True

    asyncio.run(scenario())
    assert store.objects[PATH]["spec"]["pool"]["generation"] == 1  # a new pool: its generation starts again


class CountersStore(SliceStore):
    """An API server that serves shared counters (1.36 and later)."""

    async def request(self, method: str, path: str, *, body: dict, query: dict) -> dict:
        return body


def test_with_counters_served_the_counters_slice_is_written_first_and_withdrawn_with_the_devices(sysfs):
    gpus = discover(sysfs / "vega10-1gpu").gpus
    store = CountersStore()
    order: list[str] = []
    apply = store.apply

    async def recording_apply(path: str, body: dict, *, field_manager: str) -> dict:
        order.append(path.rsplit("/", 1)[1])
        return await apply(path, body, field_manager=field_manager)

    store.apply = recording_apply
    publisher = SlicePublisher(store, "node-a", whole_twins=True)

    async def scenario():
        assert await publisher.publish(gpus, Sharing(), node_uid="uid-a") is True
        assert await publisher.publish(gpus, Sharing(), node_uid="uid-a") is False
        await publisher.withdraw()

    asyncio.run(scenario())
    assert order == ["node-a-gpu.rocshare.io-counters", "node-a-gpu.rocshare.io"]
    assert publisher.counters is True and store.objects == {}


def test_a_pool_that_loses_its_twins_deletes_its_counters_slice(sysfs):
    gpus = discover(sysfs / "vega10-1gpu").gpus
    store = CountersStore()
    publisher = SlicePublisher(store, "node-a", whole_twins=True)

    async def scenario():
        await publisher.publish(gpus, Sharing(), node_uid="uid-a")
        assert set(store.objects) == {PATH, PATH + "-counters"}
        sick = [gpu.model_copy(update={"healthy": False}) for gpu in gpus]  # no shared GPU left to twin
        assert await publisher.publish(sick, Sharing(), node_uid="uid-a") is True

    asyncio.run(scenario())
    assert set(store.objects) == {PATH}
    assert store.objects[PATH]["spec"]["pool"] == {"name": "node-a", "generation": 2, "resourceSliceCount": 1}


def test_without_whole_twins_asked_the_pool_is_one_slice_even_where_counters_are_served(sysfs):
    gpus = discover(sysfs / "vega10-1gpu").gpus
    store = CountersStore()
    publisher = SlicePublisher(store, "node-a")

    asyncio.run(publisher.publish(gpus, Sharing(), node_uid="uid-a"))
    assert set(store.objects) == {PATH} and publisher.counters is False
    assert [device["name"] for device in store.objects[PATH]["spec"]["devices"]] == ["gpu-c34ec50444dd0a6c"]
