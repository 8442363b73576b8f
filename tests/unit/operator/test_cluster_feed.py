"""The operator process's one watch on Nodes and Pods (cluster_feed.py), on a scripted API.

Covers: the informer keeps decoded facts, not bodies, and drops events no fact changed
(heartbeats, status ticks); a relist reports vanished objects as deletions; the extender's
SchedulerState and the reconcilers' slices index are fed from the same list and watch (one
of each per kind); the reconcilers wake only the loops an event concerns; subscribing late
is refused; a failing reader does not starve the others.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, Self

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, encode_record
from rocshare.api.models import API_VERSION, GpuInfo
from rocshare.api.node_settings import POOL_LABEL
from rocshare.kube.client import WatchEvent, object_path
from rocshare.kube.informer import Informer
from rocshare_operator.reconcilers import nodes_status
from rocshare_operator.reconcilers.agent_daemonset import AgentDeployment
from rocshare_operator.feed.cluster_facts import GpuFacts, gpu_node_facts, node_facts, pod_facts
from rocshare_operator.feed.cluster_feed import ClusterFeed
from rocshare_operator.context import OperatorContext, pool_key, share_key
from rocshare_operator.extender.server import subscribe as extender_subscribe
from rocshare_operator.extender.state import SchedulerState
from rocshare_operator.reconcilers.pool_loops import PoolLoops
from rocshare_operator.status.pool_logic import pool_view
from rocshare_operator.status.pool_status import Inventory
from rocshare_operator.status.usage import SliceIndex, slices_of

NODES, PODS, GPU_NODES = "/api/v1/nodes", "/api/v1/pods", object_path(API_VERSION, "amdgpunodes")
QUOTAS = "/api/v1/resourcequotas"
POOLS = object_path(API_VERSION, "amdgpupools")
CLAIMS = object_path("resource.k8s.io/v1", "resourceclaims")
POOL = {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": "p", "creationTimestamp": "t0"},
        "spec": {"nodeSelector": {"gpu": "amd"}}}


class ScriptedKube:
    """Lists from `objects` in pages; watches stream what tests `push`, until cancelled."""

    def __init__(self, objects: dict[str, list[dict]], page: int = 2) -> None:
        self.objects = {NODES: [], PODS: [], GPU_NODES: [], QUOTAS: [], POOLS: [], CLAIMS: [], **objects}
        self.page = page
        self.calls: Counter[tuple[str, str]] = Counter()
        self.events: dict[str, asyncio.Queue] = {path: asyncio.Queue() for path in self.objects}

    async def list(self, path: str, **query: Any) -> dict:
        self.calls["list", path] += 1
        start = int(query.get("continue") or 0)
        items = self.objects[path][start:start + self.page]
        more = start + self.page < len(self.objects[path])
        return {"items": [dict(item) for item in items],
                "metadata": {"resourceVersion": "1", "continue": str(start + self.page) if more else ""}}

    async def watch(self, path: str, *, resource_version: str, **query: Any) -> AsyncIterator[WatchEvent]:
        self.calls["watch", path] += 1
        while True:
            kind, obj = await self.events[path].get()
            yield WatchEvent(kind, obj)

    def push(self, path: str, kind: str, obj: dict) -> None:
        self.events[path].put_nowait((kind, obj))


def node(name: str, *, pool: str | None = "p", heartbeat: str = "t0", gpus: str = "8", **labels: str) -> dict:
    all_labels = {**labels, **({POOL_LABEL: pool} if pool else {})}
    return {"metadata": {"name": name, "labels": all_labels, "resourceVersion": heartbeat,
                         "managedFields": [{"manager": "kubelet"}]},
            "status": {"allocatable": {"amd.com/gpu": gpus, "cpu": "64"}, "images": [{"names": ["big"]}],
                       "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}]}}


def record(node_name: str, gpu: str = "GPU-1", memory_mib: int = 1024) -> str:
    return encode_record(AllocationRecord.model_validate({
        "version": 1, "node": node_name,
        "containers": [{"name": "c", "devices": [{"gpuId": gpu, "memoryMiB": memory_mib, "cuCount": 4,
                                                  "cuRanges": [[0, 3]]}]}]}))


def pod(name: str, *, node_name: str = "n1", namespace: str = "ns", phase: str = "Pending",
        allocation: str | None = None, started: bool = False, ticks: int = 0) -> dict:
    annotations = {ALLOCATION_ANNOTATION: allocation} if allocation else {}
    status = {"phase": phase, "containerStatuses": [{"restartCount": ticks}]}
    if started:
        status["startTime"] = "2026-01-01T00:00:00Z"
    return {"metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"nodeName": node_name, "schedulerName": "rocshare-scheduler"}, "status": status}


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


# ---- the informer ------------------------------------------------------------------------------


async def test_informer_keeps_decoded_facts_and_drops_events_that_change_none() -> None:
    kube = ScriptedKube({NODES: [node("n1"), node("n2"), node("n3")]})
    seen: list[tuple[str, str, Any]] = []
    informer = Informer(kube, NODES, lambda kind, facts: seen.append((kind, facts.name, informer.store.get(
        f"/{facts.name}"))), decode=node_facts, changed_only=True)
    task = asyncio.create_task(informer.run())
    await informer.synced.wait()
    assert [(kind, name) for kind, name, _ in seen] == [("ADDED", "n1"), ("ADDED", "n2"), ("ADDED", "n3")]
    assert kube.calls["list", NODES] == 2  # pages of 2
    assert all(type(value).__name__ == "NodeFacts" for value in informer.store.values())

    kube.push(NODES, "MODIFIED", node("n1", heartbeat="t1"))  # a kubelet heartbeat: no fact changed
    kube.push(NODES, "MODIFIED", node("n2", zone="z1"))  # a label: a fact changed
    await settle()
    assert [(kind, name) for kind, name, _ in seen[3:]] == [("MODIFIED", "n2")]
    _, _, previous = seen[3]
    assert previous.view.label_map == {POOL_LABEL: "p"}  # the handler saw the value it replaces
    assert informer.store["/n2"].view.label_map == {POOL_LABEL: "p", "zone": "z1"}
    task.cancel()


async def test_a_relist_reports_objects_that_vanished_as_deleted_with_their_last_facts() -> None:
    kube = ScriptedKube({NODES: [node("n1"), node("n2")]})
    seen: list[tuple[str, str]] = []
    informer = Informer(kube, NODES, lambda kind, facts: seen.append((kind, facts.name)), decode=node_facts,
                        changed_only=True)
    await informer._relist()
    kube.objects[NODES] = [node("n2")]
    await informer._relist()
    assert seen == [("ADDED", "n1"), ("ADDED", "n2"), ("DELETED", "n1")]
    assert list(informer.store) == ["/n2"]


# ---- facts ---------------------------------------------------------------------------------------


def test_node_facts_keep_what_readers_use_and_share_repeated_strings() -> None:
    first, second = node_facts(node("n1", zone="z")), node_facts(node("n2", zone="z"))
    assert first.view.label_map == {POOL_LABEL: "p", "zone": "z"} and first.gpus_allocatable == "8"
    assert first.view.labels[0] is second.view.labels[0]  # one tuple per distinct label
    assert node_facts(node("n1", zone="z", heartbeat="t9")) == first  # heartbeats are not facts


def unschedulable(message: str) -> dict:
    body = pod("p", node_name="")
    body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": message}]
    return body


def test_pod_facts_compare_equal_when_no_reader_can_tell_the_difference() -> None:
    base = pod_facts(pod("p", allocation=record("n1")))
    assert pod_facts(pod("p", allocation=record("n1"), ticks=3)) == base
    # Another failed try of kube-scheduler is news to the extender's retrier.
    assert pod_facts(unschedulable("0/3 nodes")).unschedulable == "0/3 nodes"
    assert pod_facts(unschedulable("0/3 nodes")) != pod_facts(unschedulable("0/4 nodes"))
    assert pod_facts(pod("p")).unschedulable is None
    for changed in (pod("p", allocation=record("n1"), phase="Running"),
                    pod("p", allocation=record("n1"), started=True),
                    pod("p", allocation=record("n1", memory_mib=2048)), pod("p", node_name="n2",
                                                                             allocation=record("n1"))):
        assert pod_facts(changed) != base


def test_gpu_facts_carry_every_gpu_info_field() -> None:
    """NodeInventory.from_gpu_infos and the binder read GpuFacts as they read GpuInfo."""
    assert list(GpuFacts.__slots__) == list(GpuInfo.model_fields)
    facts = gpu_node_facts({"metadata": {"name": "n1"}, "status": {"gpus": [
        {"id": "GPU-a", "index": 0, "gfxTargetVersion": 90010, "cuCount": 104, "pciBDF": "0000:01:00.0",
         "splitCount": 10, "healthy": True, "product": "MI210", "xgmiPeers": ["0000:02:00.0"]}]}})
    assert facts.gpus[0].product == "MI210" and facts.gpus[0].xgmi_peers == ("0000:02:00.0",)
    refused = gpu_node_facts({"metadata": {"name": "n1"}, "status": {"gpus": [{"id": "GPU-a", "cuCount": 8}]}})
    assert refused.gpus is None and "invalid status" in refused.problem
    # The extender offers none of its GPUs; pool status still counts what the agent wrote.
    assert Inventory.of(refused).cu_counts() == {"GPU-a": 8}
    assert Inventory.of(gpu_node_facts({"metadata": {"name": "n1"}})).gpus == ()  # reporting, no GPUs yet


# ---- one feed, two readers ---------------------------------------------------------------------


def operator_context(kube: ScriptedKube) -> OperatorContext:
    return OperatorContext(kube=kube, agent=AgentDeployment(namespace="rocshare-system"), feed=ClusterFeed(kube))


def gpu_node(name: str, *, healthy: bool = True, heartbeat: str = "t0") -> dict:
    return {"metadata": {"name": name}, "status": {"lastHeartbeatTime": heartbeat, "gpus": [
        {"id": f"GPU-{name}", "index": 0, "gfxTargetVersion": 90010, "cuCount": 104, "vramMiB": 65520,
         "pciBDF": "0000:01:00.0", "splitCount": 10, "healthy": healthy, "product": "MI210"}]}}


async def test_extender_and_reconcilers_read_one_list_and_one_watch_per_kind() -> None:
    share_quota = {"metadata": {"name": "team-quota", "namespace": "ns",
                                "ownerReferences": [{"kind": "AmdGpuShare", "name": "team"}]},
                   "spec": {"hard": {"limits.amd.com/gpumem": "40k"}}}
    kube = ScriptedKube({NODES: [node("n1"), node("n2")], GPU_NODES: [gpu_node("n1"), gpu_node("n2")],
                         PODS: [pod("a", allocation=record("n1", gpu="GPU-n1")),
                                pod("b", node_name="n2", allocation=record("n2", gpu="GPU-n2")), pod("plain")],
                         QUOTAS: [share_quota], POOLS: [POOL]})
    ctx = operator_context(kube)
    ctx.gate.leading = False  # a standby replica: caches fed, no pool loop writing
    nodes_status.subscribe(ctx)
    loops = PoolLoops(ctx)
    ctx.feed.subscribe(on_pool=loops.on_pool)  # as run_operator wires the pool loops
    state = SchedulerState()
    extender_subscribe(ctx.feed, state)  # as the operator process wires the extender
    task = asyncio.create_task(ctx.feed.run())
    await ctx.feed.wait_synced()
    await settle()
    kinds = (NODES, GPU_NODES, PODS, QUOTAS, POOLS, CLAIMS)
    assert set(kube.calls) == {(verb, path) for verb in ("list", "watch") for path in kinds}
    assert [kube.calls["watch", path] for path in kinds] == [1, 1, 1, 1, 1, 1]
    # One pool watch, two readers: the extender's index and the pool loops.
    assert set(state.pools) == {"p"} and [view.name for view in loops.others("")] == ["p"]
    assert state.quota_limits("ns").memory_mib == 40000  # the extender's quota, from the one quota watch ...
    share = ctx.wakeups.register(share_key("ns", "team"))
    share.applied["quota_hard"] = {"limits.amd.com/gpumem": "40k"}
    kube.push(QUOTAS, "MODIFIED", {**share_quota, "spec": {"hard": {"limits.amd.com/gpumem": "1"}}})
    await settle()
    assert "quota" in share.take_reasons()  # ... and the share's loop, told its quota was edited
    share.applied["quota_hard"] = {"limits.amd.com/gpumem": "1"}
    share.take_reasons()
    counted = {"requests.amd.com/gpu": "2", "limits.amd.com/gpumem": "9"}  # Kubernetes' and rocshare's entries
    kube.push(QUOTAS, "MODIFIED", {**share_quota, "spec": {"hard": {"limits.amd.com/gpumem": "1"}},
                                   "status": {"used": counted}})
    await settle()
    assert ctx.feed.quotas.store.get("ns/team-quota").used_limits == {"limits.amd.com/gpumem": "9"}
    assert share.event.is_set() and share.take_reasons() == {""}  # checked again, not re-applied
    # The extender's caches ...
    assert set(state.ledger.records()) == {"ns/a", "ns/b"} and set(state.inventories) == {"n1", "n2"}
    assert state.index.nodes["n1"] is ctx.feed.node("n1")  # one object per node, shared with the reconcilers
    assert state.gpu_status["n1"] is ctx.feed.gpu_node("n1")
    # ... and the reconcilers' views, from the same events.
    assert [held.name for held in ctx.slices.on_node("n1")] == ["a"]
    assert sorted(held.name for held in ctx.slices.in_namespace("ns")) == ["a", "b"]
    assert ctx.inventory("n1").cu_counts() == {"GPU-n1": 104} and ctx.inventory("n3") is None

    kube.push(PODS, "DELETED", pod("a", allocation=record("n1", gpu="GPU-n1")))
    await settle()
    assert "ns/a" not in state.ledger and ctx.slices.on_node("n1") == []
    with pytest.raises(RuntimeError, match="before it runs"):
        ctx.feed.subscribe(on_pod=state.on_pod_facts)
    task.cancel()


@pytest.mark.parametrize("extender", [True, False], ids=["with the extender", "reconcilers alone"])
async def test_status_and_the_extender_read_one_hold_index(extender: bool) -> None:
    """The known disagreement of two indexes: a HAMi pod naming a GPU its node does not list. The
    fail-closed answer -- its hold is unknown: the node is blocked and status says the pod cannot be
    accounted for -- is the one answer, because status derives its slices from the extender's accounts."""
    stray = {"metadata": {"name": "h", "namespace": "ns", "annotations": {
                 "hami.io/amd-devices-allocated": "GPU-elsewhere,MI210,8000,26:;", "hami.io/vgpu-node": "n1"}},
             "spec": {"nodeName": "n1", "containers": [{"name": "c0"}]},
             "status": {"phase": "Running", "startTime": "t"}}
    kube = ScriptedKube({NODES: [node("n1")], GPU_NODES: [gpu_node("n1")], PODS: [stray]})
    ctx = operator_context(kube)
    nodes_status.subscribe(ctx)
    state = SchedulerState()
    if extender:
        extender_subscribe(ctx.feed, state)
        nodes_status.use_accounts(ctx, state.accounts)  # as scheduling.extender_task wires it
    task = asyncio.create_task(ctx.feed.run())
    await ctx.feed.wait_synced()
    await settle()
    [held] = ctx.slices.on_node("n1")
    assert not held.holding.accountable and "does not list" in held.error
    assert ctx.accounts.blocked_nodes() == {"n1"}
    assert (state.accounts is ctx.accounts) == extender
    kube.push(PODS, "DELETED", stray)
    await settle()
    assert ctx.slices.on_node("n1") == [] and not ctx.accounts.blocked_nodes()
    task.cancel()


async def test_a_failing_reader_does_not_starve_the_others() -> None:
    kube = ScriptedKube({NODES: [], PODS: [pod("a", allocation=record("n1"))]})
    feed = ClusterFeed(kube)
    heard: list[str] = []

    def broken(kind, facts, before):
        raise ValueError("bug")
    feed.subscribe(on_pod=broken)
    feed.subscribe(on_pod=lambda kind, facts, before: heard.append(facts.name))
    task = asyncio.create_task(feed.run())
    await feed.wait_synced()
    assert heard[:1] == ["a"]
    task.cancel()


async def test_a_failing_handler_keeps_the_event_retries_it_and_shows_it_until_taken() -> None:
    kube = ScriptedKube({NODES: [node("n1")]})
    seen: list[tuple[str, str]] = []
    failures = {"left": 2}

    def flaky(kind, facts):
        seen.append((kind, facts.name))
        if facts.view.label_map.get("zone") == "z1" and failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("transient")
    informer = Informer(kube, NODES, flaky, decode=node_facts, changed_only=True)
    task = asyncio.create_task(informer.run())
    await informer.synced.wait()
    kube.push(NODES, "MODIFIED", node("n1", zone="z1"))
    await settle()
    # Not taken: the store keeps what the handler last took, and the failure is visible.
    assert informer.store["/n1"].view.label_map == {POOL_LABEL: "p"}
    assert "/n1" in informer.failing and "transient" in informer.failing["/n1"].error
    assert informer.failures_total == 1
    for _ in range(100):  # retried with a backoff (0.1 s, then 0.5 s) until the handler takes it
        if not informer.failing:
            break
        await asyncio.sleep(0.05)
    assert not informer.failing and informer.failures_total == 2
    assert informer.store["/n1"].view.label_map == {POOL_LABEL: "p", "zone": "z1"}
    assert seen == [("ADDED", "n1")] + [("MODIFIED", "n1")] * 3
    task.cancel()


async def test_a_newer_event_replaces_a_failed_one() -> None:
    kube = ScriptedKube({NODES: [node("n1")]})
    seen: list[dict] = []

    def handler(kind, facts):
        seen.append(facts.view.label_map)
        if facts.view.label_map.get("zone") == "bad":
            raise RuntimeError("cannot take it")
    informer = Informer(kube, NODES, handler, decode=node_facts, changed_only=True)
    task = asyncio.create_task(informer.run())
    await informer.synced.wait()
    kube.push(NODES, "MODIFIED", node("n1", zone="bad"))
    kube.push(NODES, "MODIFIED", node("n1", zone="good"))
    await settle()
    assert not informer.failing and informer.store["/n1"].view.label_map["zone"] == "good"
    await asyncio.sleep(0.3)  # past the first retry: the stale event is not handed out again
    assert [labels.get("zone") for labels in seen] == [None, "bad", "good"]
    task.cancel()


async def test_the_feed_retries_an_event_any_reader_failed_and_every_reader_sees_it() -> None:
    kube = ScriptedKube({NODES: [], PODS: [pod("a", allocation=record("n1"))]})
    feed = ClusterFeed(kube)
    heard: list[str] = []
    failures = {"left": 1}

    def broken_once(kind, facts, before):
        if failures["left"]:
            failures["left"] -= 1
            raise ValueError("bug")
    feed.subscribe(on_pod=broken_once)
    feed.subscribe(on_pod=lambda kind, facts, before: heard.append(facts.name))
    task = asyncio.create_task(feed.run())
    await feed.wait_synced()
    assert heard == ["a"] and "pods ns/a" in feed.failing() and feed.failures_total()["pods"] == 1
    for _ in range(40):
        if not feed.failing():
            break
        await asyncio.sleep(0.05)
    assert not feed.failing() and heard == ["a", "a"]  # readers are idempotent: the retry goes to all
    task.cancel()


async def test_a_pod_the_extender_fails_to_account_keeps_its_node_blocked_until_retried() -> None:
    state = SchedulerState()
    original = state.accounts.on_pod
    calls = {"n": 0}

    def failing_once(kind, facts):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("bug")
        return original(kind, facts)
    state.accounts.on_pod = failing_once
    facts = pod_facts(pod("a", allocation=record("n1"), phase="Running"))
    with pytest.raises(RuntimeError):
        await state.on_pod_facts("ADDED", facts)
    assert state.accounts.blocked_nodes() == {"n1"}  # fail closed: its GPUs are not free meanwhile
    await state.on_pod_facts("ADDED", facts)  # the retry
    assert state.accounts.blocked_nodes() == set() and "ns/a" in state.ledger


def test_a_pod_object_the_decoder_chokes_on_is_kept_with_its_problem() -> None:
    facts = pod_facts({"metadata": {"name": "p", "namespace": "ns", "annotations": "not a mapping"},
                       "spec": {"nodeName": "n1"}})
    assert facts.problem and "cannot be read" in facts.problem
    assert (facts.namespace, facts.name, facts.node, facts.finished) == ("ns", "p", "n1", False)
    held = slices_of(facts)
    assert held is not None and held.error == facts.problem and held.node == "n1"


# ---- whom the reconcilers wake -----------------------------------------------------------------


def loops(ctx: OperatorContext, *keys) -> dict:
    return {key: ctx.wakeups.register(key) for key in keys}


def woken(states: dict) -> set:
    woke = {key for key, state in states.items() if state.event.is_set()}
    for state in states.values():
        state.take_reasons()
    return woke


class Fed:
    """An operator context whose feed runs on a scripted API that starts empty."""

    def __init__(self) -> None:
        self.kube = ScriptedKube({NODES: [], PODS: []})
        self.ctx = operator_context(self.kube)
        nodes_status.subscribe(self.ctx)

    async def __aenter__(self) -> Self:
        self.task = asyncio.create_task(self.ctx.feed.run())
        await self.ctx.feed.wait_synced()
        return self

    async def __aexit__(self, *_: object) -> None:
        self.task.cancel()

    async def push(self, path: str, kind: str, obj: dict) -> None:
        self.kube.push(path, kind, obj)
        await settle()


async def test_pods_wake_their_nodes_pool_and_their_namespaces_shares_only_when_a_slice_changed() -> None:
    async with Fed() as fed:
        states = loops(fed.ctx, pool_key("p"), pool_key("q"), share_key("ns", "s"), share_key("other", "s"))
        await fed.push(NODES, "ADDED", node("n1", pool="p"))
        woken(states)
        await fed.push(PODS, "ADDED", pod("plain"))  # holds nothing
        assert woken(states) == set()
        await fed.push(PODS, "ADDED", pod("a", allocation=record("n1")))
        assert woken(states) == {pool_key("p"), share_key("ns", "s")}
        await fed.push(PODS, "MODIFIED", pod("a", allocation=record("n1"), started=True))  # admitted: same slice
        assert woken(states) == set()
        await fed.push(PODS, "MODIFIED", pod("a", allocation=record("n1"), phase="Succeeded"))  # released
        assert woken(states) == {pool_key("p"), share_key("ns", "s")}
        assert fed.ctx.slices.in_namespace("ns") == []


async def test_nodes_wake_the_pools_they_name_or_that_select_them() -> None:
    async with Fed() as fed:
        states = loops(fed.ctx, pool_key("p"), pool_key("q"), pool_key("r"))
        for name, selector in (("p", {"team": "a"}), ("q", {"team": "b"}), ("r", {"team": "c"})):
            states[pool_key(name)].view = pool_view({"metadata": {"name": name}, "spec": {"nodeSelector": selector}})
        await fed.push(NODES, "ADDED", node("n1", pool="p", team="a"))
        assert woken(states) == {pool_key("p")}
        await fed.push(NODES, "MODIFIED", node("n1", pool="p", team="a", heartbeat="t1", gpus="0"))
        assert woken(states) == set()  # allocatable is the extender's business; heartbeats nobody's
        await fed.push(NODES, "MODIFIED", node("n1", pool="p", team="b"))  # leaves p, joins q
        assert woken(states) == {pool_key("p"), pool_key("q")}
        await fed.push(NODES, "DELETED", node("n1", pool="p", team="b"))
        assert woken(states) == {pool_key("p"), pool_key("q")}
        states[pool_key("r")].view = None  # a loop that has not reconciled yet hears of every node
        await fed.push(NODES, "ADDED", node("n2", pool=None))
        assert woken(states) == {pool_key("r")}


async def test_agents_wake_their_nodes_pool_and_the_shares_only_when_the_gpus_changed() -> None:
    async with Fed() as fed:
        await fed.push(NODES, "ADDED", node("n1", pool="p"))
        states = loops(fed.ctx, pool_key("p"), pool_key("q"), share_key("ns", "s"))
        await fed.push(GPU_NODES, "ADDED", gpu_node("n1"))
        assert woken(states) == {pool_key("p"), share_key("ns", "s")}
        await fed.push(GPU_NODES, "MODIFIED", gpu_node("n1", heartbeat="t1"))  # an agent heartbeat
        assert woken(states) == set()
        await fed.push(GPU_NODES, "MODIFIED", gpu_node("n1", healthy=False))
        assert woken(states) == {pool_key("p"), share_key("ns", "s")}
        assert fed.ctx.inventory("n1").gpus[0].healthy is False


def test_slice_index_moves_and_forgets_holds() -> None:
    index = SliceIndex()
    held = slices_of(pod_facts(pod("a", allocation=record("n1"))))
    assert index.put("ns", "a", held) is None
    moved = slices_of(pod_facts(pod("a", node_name="n2", allocation=record("n1"))))
    assert index.put("ns", "a", moved) == held
    assert index.on_node("n1") == [] and index.on_node("n2") == [moved]
    assert index.put("ns", "a", None) == moved
    assert index.in_namespace("ns") == [] and index.on_node("n2") == []

