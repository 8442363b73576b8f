"""The scheduler extender's HTTP service: JSON in and out with the extender API's Go
field names, served by aiohttp. It refuses to answer (503) until every cache has been
listed once, so a freshly restarted operator never decides from a partial ledger.

Routes: POST /extender/filter, /extender/prioritize, /extender/bind, /extender/preempt, /extender/prioritize-dra
(DRA mode's profile) (503 from a replica that
does not decide: standby or stopping, leadership.py); GET /healthz, /readyz (synced and not
stopping; the body names the role), /leaderz (200 only while this replica decides). Metrics are
served on their own port by prometheus-client.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import start_http_server

from rocshare.api.dra_request import DraRequestError, request_of, with_limits
from rocshare.core.ids import pod_key
from rocshare.core.holdings import placement_request
from rocshare.core.request import RequestError
from rocshare.kube.client import Kube
from rocshare.kube.informer import Informer
from rocshare_operator.feed.cluster_feed import ClusterFeed
from rocshare_operator.extender.binder import Binder, BindRefused
from rocshare_operator.extender.decisions import best_nodes, prioritize, prioritize_dra
from rocshare_operator.extender.replies import Priorities
from rocshare_operator.extender.failure_metrics import FailureCollector
from rocshare_operator.extender.events import PodEvents
from rocshare_operator.extender.heap import settle_heap
from rocshare_operator.extender.metrics import ExtenderMetrics
from rocshare_operator.extender.preemption import pod_priority
from rocshare_operator.extender.preemptor import Preemptor
from rocshare_operator.extender.refresh import Refresher
from rocshare_operator.extender.resizer import Resizer
from rocshare_operator.extender.retry import Retrier
from rocshare_operator.extender.state import SchedulerState
from rocshare_operator.leadership import DecisionGate, NotDeciding

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
PRIORITIZE_DRA = "prioritize-dra"
UNGATED_VERBS = frozenset({PRIORITIZE_DRA})
"""Verbs any synced replica answers, standby too: a score read from the caches, nothing written.
DRA mode's kube-scheduler elects its own leader (Lease rocshare-dra-scheduler), which may sit
beside a standby operator."""


class BadRequest(Exception):
    pass


@dataclass
class ExtenderService:
    state: SchedulerState
    binder: Binder
    metrics: ExtenderMetrics
    ready: Callable[[], bool]
    problems: Callable[[], dict[str, str]] = dict
    """Watch events not taken yet -> why: readiness reports them (the decisions go on, with what
    the affected pods may hold kept blocked)."""
    gate: DecisionGate = field(default_factory=DecisionGate)
    """Whether this replica decides (leadership.py): a standby or a stopping replica answers 503."""
    preemptor: Preemptor | None = None
    """Preemption's side effects (preemptor.py); None: the extender preempts nothing (unit tests)."""

    async def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        names = _node_names(args)
        try:
            request = placement_request(_pod(args))
        except RequestError as error:
            self.metrics.decisions.labels("filter", "error").inc()
            return {"NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": str(error)}
        result = best_nodes(self.state.snapshot(), request, names, self.binder.queued, pod_priority(_pod(args)))
        if result.feasible:
            self.binder.saw(_pod(args))
        else:
            self.binder.forget(pod_key(request.namespace, request.name))
            if self.preemptor is not None and names:
                self.preemptor.consider(_pod(args), request, names)
        if self.state.retrier is not None:
            key = pod_key(request.namespace, request.name)
            if result.feasible:
                self.state.retrier.forget(key)
            else:
                self.state.retrier.note_waiting(key, request.namespace)
        for reason, nodes in result.reason_counts().items():
            self.metrics.node_rejections.labels(reason).inc(nodes)
        self.metrics.decisions.labels("filter", "fit" if result.feasible else "unfit").inc()
        return result.to_json()

    async def prioritize(self, args: dict[str, Any]) -> orjson.Fragment:
        """Not called by the shipped profile (filter already keeps only the best nodes); served for
        configurations that still name a prioritizeVerb: over filter's reply every level is equal."""
        names = _node_names(args)
        try:
            request = placement_request(_pod(args))
        except RequestError:
            return Priorities(names, [0] * len(names)).to_json()
        self.metrics.decisions.labels("prioritize", "scored").inc()
        scores = prioritize(self.state.snapshot(), request, names)
        queued = self.binder.queued
        if queued:
            scores = scores.lowered(queued)
        return scores.to_json()

    async def prioritize_dra(self, args: dict[str, Any]) -> orjson.Fragment:
        """The one verb of DRA mode's profile (kube-scheduler-dra-config.yaml), over the nodes of
        pools serving DRA: a pod with the request admission kept (rocshare.api.dra_request) is
        scored as extender mode scores its pods, a pod asking no GPU as extender mode ranks those
        (the GPUs its CPU would strand). A score only: the allocator decides what fits."""
        names = _node_names(args)
        pod = _pod(args)
        try:
            dra = request_of(pod)
            request = placement_request(pod if dra is None else with_limits(pod, dra))
        except (RequestError, DraRequestError):
            self.metrics.decisions.labels(PRIORITIZE_DRA, "error").inc()
            return Priorities(names, [0] * len(names)).to_json()
        self.metrics.decisions.labels(PRIORITIZE_DRA, "scored").inc()
        return prioritize_dra(self.state.dra_snapshot(), request, names).to_json()

    async def preempt(self, args: dict[str, Any]) -> dict[str, Any]:
        """kube-scheduler's ProcessPreemption (ExtenderPreemptionArgs -> ExtenderPreemptionResult, the
        meta form: the profile is nodeCacheCapable). Without a preemptor: the victims unchanged."""
        _pod(args)
        self.metrics.decisions.labels("preempt", "answered").inc()
        if self.preemptor is None:
            return {"NodeNameToMetaVictims": args.get("NodeNameToMetaVictims") or {}}
        return await self.preemptor.process(args)

    async def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            namespace, name = str(args["PodNamespace"]), str(args["PodName"])
            uid, node = str(args.get("PodUID", "")), str(args["Node"])
        except KeyError as missing:
            raise BadRequest(f"ExtenderBindingArgs lacks {missing}") from None
        try:
            record = await self.binder.bind(namespace, name, uid, node)
        except BindRefused as refused:
            self.metrics.decisions.labels("bind", "refused").inc()
            log.info("bind %s/%s -> %s refused: %s", namespace, name, node, refused)
            return {"Error": str(refused)}
        self.metrics.decisions.labels("bind", "bound").inc()
        log.info("bound %s/%s -> %s (%s)", namespace, name, node, ", ".join(record.gpu_ids()) if record else "no GPU")
        return {"Error": ""}


def _pod(args: dict[str, Any]) -> dict[str, Any]:
    pod = args.get("Pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise BadRequest("ExtenderArgs.Pod is missing or not an object")
    return pod


def _node_names(args: dict[str, Any]) -> list[str]:
    names = args.get("NodeNames")
    if names is None and isinstance(args.get("Nodes"), dict):  # nodeCacheCapable=false senders
        names = [item["metadata"]["name"] for item in args["Nodes"].get("items", [])]
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise BadRequest("ExtenderArgs.NodeNames must be a list of node names")
    return names


def make_app(service: ExtenderService) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    verbs: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
        "filter": service.filter, "prioritize": service.prioritize, "bind": service.bind, "preempt": service.preempt,
        PRIORITIZE_DRA: service.prioritize_dra}

    async def handle(request: web.Request) -> web.Response:
        verb = request.match_info["verb"]
        if verb not in verbs:
            return web.json_response({"Error": f"unknown extender verb {verb!r}"}, status=404)
        if not service.ready():
            return web.json_response({"Error": "rocshare extender is still building its caches"}, status=503)
        started = time.perf_counter()
        try:
            args = orjson.loads(await request.read())
            if not isinstance(args, dict):
                raise BadRequest("the request body must be a JSON object")
            answer = verbs[verb]
            reply = await (answer(args) if verb in UNGATED_VERBS else service.gate.run(lambda: answer(args)))
        except NotDeciding as error:  # kube-scheduler retries the pod later (or the leader does)
            return web.json_response({"Error": str(error)}, status=503)
        except orjson.JSONDecodeError as error:
            return web.json_response({"Error": f"the request body is not JSON: {error}"}, status=400)
        except BadRequest as error:
            return web.json_response({"Error": str(error)}, status=400)
        finally:
            service.metrics.latency.labels(verb).observe(time.perf_counter() - started)
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        # Ready means "synced, able to decide when leading": a standby is ready (so a
        # PodDisruptionBudget counts it and a drain can move the leader); the body says its role.
        if not service.ready():
            return web.Response(status=503, text="caches not synced")
        if service.gate.draining:
            return web.Response(status=503, text="shutting down")
        problems = service.problems()
        if problems:
            listed = "\n".join(f"{what}: {why}" for what, why in sorted(problems.items())[:20])
            return web.Response(status=503,
                                text=f"{len(problems)} watch event(s) not handled yet (retrying):\n{listed}")
        return web.Response(text=f"ok ({service.gate.role()})")

    async def leaderz(_: web.Request) -> web.Response:
        deciding = service.ready() and service.gate.deciding()
        return web.Response(status=200 if deciding else 503, text=service.gate.role())

    app.router.add_post("/extender/{verb}", handle)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/leaderz", leaderz)
    return app


@dataclass
class ExtenderSettings:
    host: str = "127.0.0.1"
    port: int = 31990
    metrics_port: int = 31993
    tls_cert: str | None = None
    tls_key: str | None = None
    bind_wait_s: float = 25.0


def subscribe(feed: ClusterFeed, state: SchedulerState) -> None:
    """Feed the state from the process's one watch per kind (before the feed runs)."""
    feed.subscribe(on_node=state.on_node_facts, on_gpu_node=state.on_gpu_node_facts, on_pod=state.on_pod_facts,
                   on_quota=state.on_quota_facts, on_pool=lambda kind, body, _before: state.on_pool(kind, body))


async def run_extender(kube: Kube, settings: ExtenderSettings, state: SchedulerState | None = None,
                       feed: ClusterFeed | None = None, gate: DecisionGate | None = None) -> None:
    """Serve until cancelled: caches from watches, the HTTP service, the metrics port. `feed`: the
    operator's cluster feed, `state` already subscribed to it; without one the extender runs its own."""
    state = state or SchedulerState()
    gate = gate or DecisionGate()  # one gate: the verbs, the retrier and the pod events follow it
    state.retrier = Retrier(kube, gate)
    own_feed = feed is None
    if feed is None:
        feed = ClusterFeed(kube)
        subscribe(feed, state)
    watches = list(feed.informers())
    metrics = ExtenderMetrics(state)
    metrics.registry.register(FailureCollector(state.accounts, lambda: watches))
    state.accounts.on_unaccountable.append(PodEvents(kube, gate).unaccountable)
    service = ExtenderService(state, Binder(kube, state, settings.bind_wait_s), metrics,
                              ready=lambda: feed.synced,
                              problems=lambda: _failing(watches), gate=gate,
                              preemptor=Preemptor(kube, state, metrics))
    metrics.registry.register(service.gate)
    resizer = Resizer(kube, state, gate)
    state.on_resize.append(resizer.on_pod)
    metrics_server, _ = start_http_server(settings.metrics_port, addr=settings.host, registry=metrics.registry)
    runner = web.AppRunner(make_app(service), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, ssl_context=_tls(settings))
    await site.start()
    log.info("extender serving on %s:%d (metrics :%d)", settings.host, settings.port, settings.metrics_port)
    tasks = []
    if own_feed:
        tasks.append(asyncio.create_task(feed.run(), name="cluster-feed"))
    tasks.append(asyncio.create_task(state.retrier.run(), name="retrier"))
    tasks.append(asyncio.create_task(Refresher(state).run(), name="plan-refresher"))
    tasks.append(asyncio.create_task(_freeze_when_synced(feed), name="gc-freeze"))
    tasks.append(asyncio.create_task(_resize_when_synced(feed, resizer), name="resizer"))
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await runner.cleanup()
        metrics_server.shutdown()


def _failing(watches: list[Informer]) -> dict[str, str]:
    return {f"{informer.name} {key}": failure.error
            for informer in watches for key, failure in informer.failing.items()}


async def _freeze_when_synced(feed: ClusterFeed) -> None:
    """Move the first full caches out of the garbage collector's sight: they live as long as
    the process, and scanning them on every collection shows up as decision-latency spikes."""
    await feed.wait_synced()
    settle_heap()  # the bench calls the same


async def _resize_when_synced(feed: ClusterFeed, resizer: Resizer) -> None:
    """Resize requests are decided from full caches only, as binds are."""
    await feed.wait_synced()
    await resizer.run()


def _tls(settings: ExtenderSettings) -> ssl.SSLContext | None:
    if not settings.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context
