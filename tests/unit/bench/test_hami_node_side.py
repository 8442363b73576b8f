"""The bench harness's stand-in for HAMi's device plugin (bench/hami.py NodeSide): after HAMi binds
a pod, the writes HAMi's plugin makes once Allocate succeeded -- the pod's to-allocate devices
erased, bind-phase `success`, the node lock deleted only when this pod holds it, conditional on
the node's resourceVersion. Lock values and annotations are written here in HAMi's formats
(pkg/util/nodelock: `<RFC3339>,<namespace>,<pod>`; pkg/device: `<uuid>,<type>,<MiB>,<cores>:;`).
The fake API below is a unit-test convenience; the bench run against HAMi's real scheduler is
what shows the locks released (`e2e_hami_locks_released`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rocshare.kube.client import Conflict
from rocshare_dev.bench import hami

LOCK_OF_P1 = "2026-12-03T14:00:00Z,bench-hami,p1"
DEVICES = "GPU-0,MI210,4096,25:;"


def pod(name: str = "p1", *, node: str | None = "roc-0", phase: str | None = "allocating",
        devices: str = DEVICES) -> dict[str, Any]:
    annotations = {hami.DEVICES_TO_ALLOCATE: devices}
    if phase is not None:
        annotations[hami.BIND_PHASE] = phase
    spec = {"containers": [{"name": "main"}]}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "bench-hami", "annotations": annotations}, "spec": spec}


def node(lock: str | None, version: str = "41") -> dict[str, Any]:
    annotations = {"hami.io/node-amd-register": "[]"}
    if lock is not None:
        annotations[hami.NODE_LOCK] = lock
    return {"metadata": {"name": "roc-0", "resourceVersion": version, "annotations": annotations}}


def test_only_a_bound_pod_still_allocating_awaits_the_node_side():
    assert hami.awaits_allocate(pod())
    assert not hami.awaits_allocate(pod(node=None))  # HAMi writes the phase before it binds
    assert not hami.awaits_allocate(pod(phase="success"))  # finished already
    assert not hami.awaits_allocate(pod(phase="failed"))
    assert not hami.awaits_allocate(pod(phase=None))  # not HAMi's pod


def test_erasing_leaves_one_empty_entry_per_container():
    assert hami.erased_devices_patch(pod()) == {"metadata": {"annotations": {hami.DEVICES_TO_ALLOCATE: ";"}}}
    two = pod(devices="GPU-0,MI210,4096,25:;GPU-1,MI210,4096,25:;")
    assert hami.erased_devices_patch(two)["metadata"]["annotations"][hami.DEVICES_TO_ALLOCATE] == ";;"


def test_a_lock_is_released_only_by_its_pod_or_when_it_names_none():
    assert hami.lock_held_by(LOCK_OF_P1, "bench-hami", "p1")
    assert not hami.lock_held_by(LOCK_OF_P1, "bench-hami", "p")  # a suffix of the name is not the owner
    assert not hami.lock_held_by(LOCK_OF_P1, "other", "p1")
    assert hami.lock_held_by("2026-12-03T14:00:00Z", "bench-hami", "p9")  # HAMi's legacy lock: a bare time


def test_the_release_patch_deletes_the_lock_at_the_node_version_read():
    assert hami.lock_release_patch(node(LOCK_OF_P1, "41"), "bench-hami", "p1") == {
        "metadata": {"annotations": {hami.NODE_LOCK: None}, "resourceVersion": "41"}}
    assert hami.lock_release_patch(node(LOCK_OF_P1), "bench-hami", "p2") is None
    assert hami.lock_release_patch(node(None), "bench-hami", "p1") is None


class FakeApi:
    """Records calls; answers node GETs from `nodes` (one per read) and raises `conflicts` times."""

    def __init__(self, nodes: list[dict[str, Any]], conflicts: int = 0) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.nodes = nodes
        self.conflicts = conflicts

    async def get(self, path: str) -> dict[str, Any]:
        self.calls.append(("GET", path, None))
        return self.nodes.pop(0) if "/nodes/" in path else {}

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("PATCH", path, patch))
        if "/nodes/" in path and self.conflicts:
            self.conflicts -= 1
            raise Conflict(409, "Conflict", "the object has been modified")
        return {}


def run_node_side(api: FakeApi, *pods: dict[str, Any]) -> hami.NodeSide:
    async def main() -> hami.NodeSide:
        side = hami.NodeSide(api)  # type: ignore[arg-type]
        for each in pods:
            side.see(each)
        await side.close()
        return side
    return asyncio.run(main())


def test_a_bound_pod_is_finished_in_hamis_order_once():
    api = FakeApi([node(LOCK_OF_P1, "41")])
    side = run_node_side(api, pod(), pod())  # the watch shows the pod twice (ADDED, MODIFIED)
    pod_path, node_path = "/api/v1/namespaces/bench-hami/pods/p1", "/api/v1/nodes/roc-0"
    assert api.calls == [
        ("PATCH", pod_path, {"metadata": {"annotations": {hami.DEVICES_TO_ALLOCATE: ";"}}}),
        ("GET", pod_path, None),
        ("PATCH", pod_path, {"metadata": {"annotations": {hami.BIND_PHASE: "success"}}}),
        ("GET", node_path, None),
        ("PATCH", node_path, {"metadata": {"annotations": {hami.NODE_LOCK: None}, "resourceVersion": "41"}}),
    ]
    assert (side.released, side.errors) == (1, [])


def test_a_conflicting_node_is_read_again_and_another_pods_lock_left_alone():
    api = FakeApi([node(LOCK_OF_P1, "41"), node(LOCK_OF_P1, "42")], conflicts=1)
    side = run_node_side(api, pod())
    patches = [call[2] for call in api.calls if call[0] == "PATCH" and "/nodes/" in call[1]]
    assert [patch["metadata"]["resourceVersion"] for patch in patches] == ["41", "42"]
    assert side.released == 1

    api = FakeApi([node("2026-12-03T14:00:00Z,bench-hami,p7")])
    side = run_node_side(api, pod())
    assert not [call for call in api.calls if call[0] == "PATCH" and "/nodes/" in call[1]]
    assert (side.released, side.errors) == (0, [])


def test_a_lock_that_keeps_conflicting_is_reported():
    api = FakeApi([node(LOCK_OF_P1, str(version)) for version in range(hami.RELEASE_ATTEMPTS)],
                  conflicts=hami.RELEASE_ATTEMPTS)
    side = run_node_side(api, pod())
    assert side.released == 0
    assert side.errors == [f"bench-hami/p1: node roc-0's lock still conflicting after {hami.RELEASE_ATTEMPTS} attempts"]


@pytest.mark.parametrize("bad", [pod(node=None), pod(phase="success")])
def test_pods_not_awaiting_allocate_cause_no_writes(bad):
    api = FakeApi([])
    run_node_side(api, bad)
    assert api.calls == []
