"""The operator process: Kopf with rocshare's handlers, plus whatever else must run
beside them.

Start it with ``rocshare operator [--kubeconfig PATH] [--namespace NS] [--standalone]``,
or from Python::

    await run_operator(kubeconfig=None, namespace="rocshare-system", standalone=False,
                       extra_tasks=(serve_extender, serve_webhook))

`run_operator` connects one `Kube`, builds the `OperatorContext` (handlers see it as
``memo.rocshare``), and runs Kopf cluster-wide next to the cluster feed (the one watch
of Nodes, Pods, AmdGpuNodes, ResourceQuotas and AmdGpuPools, cluster_feed.py), the pool
loops that hang off its pool watch (pool_loops.py) and each extra task. Kopf watches only
AmdGpuShares and the agent DaemonSets (and its own ClusterKopfPeering and CRDs). An extra task is a callable
taking the context and returning an awaitable that runs until cancelled (the scheduler
extender and the admission webhook join this way, sharing the connection and the feed;
the callable itself runs before the feed starts, so it may subscribe). When any of them
ends, the rest are stopped; an error is raised.

Kopf runs standalone in tests (``--standalone``); in a cluster it peers through the
``ClusterKopfPeering`` named ``rocshare`` (created at start when missing), so
that only one replica handles events at a time, under an identity of our own
(both in leadership.py). Kopf's own bookkeeping goes into ``rocshare.io/*`` annotations and the
finalizer ``rocshare.io/operator`` (the pool loops put the same one on pools); status
belongs to rocshare alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import kopf

from rocshare.kube.client import Kube
from rocshare_operator.reconcilers import login, nodes_status, shares  # noqa: F401  (registers handlers)
from rocshare_operator.reconcilers.agent_daemonset import AgentDeployment
from rocshare_operator.reconcilers.pool_loops import FINALIZER, PoolLoops
from rocshare_operator.feed.cluster_feed import ClusterFeed
from rocshare_operator.context import OperatorContext
from rocshare_operator.leadership import PEERING_NAME, ensure_peering_object, stop_on_sigterm, this_process_identity

ExtraTask = Callable[[OperatorContext], Awaitable[Any]]
ANNOTATIONS_PREFIX = "rocshare.io"


def operator_settings(*, standalone: bool) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATIONS_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATIONS_PREFIX, key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # events on objects are for problems, not for "handler succeeded"
    settings.peering.standalone = standalone
    settings.peering.name = PEERING_NAME
    settings.peering.clusterwide = True
    # Kopf pauses every watch on a missing peering CRD when peering is mandatory, even standalone.
    settings.peering.mandatory = not standalone
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.error_backoffs = [1, 2, 4, 8, 15, 30]
    return settings


async def run_operator(*, kubeconfig: str | None, namespace: str, standalone: bool,
                       extra_tasks: Iterable[ExtraTask] = (), settings: kopf.OperatorSettings | None = None) -> None:
    """Run until a signal stops Kopf or any task ends; `namespace` is where agent DaemonSets go."""
    kube = await Kube.connect(kubeconfig)
    if not standalone:
        await ensure_peering_object(kube)
    context = OperatorContext(kube=kube, agent=AgentDeployment(namespace=namespace), feed=ClusterFeed(kube),
                              kubeconfig=kubeconfig)
    nodes_status.subscribe(context)
    pool_loops = PoolLoops(context)
    context.feed.subscribe(on_pool=pool_loops.on_pool)
    stop_flag = asyncio.Event()
    try:
        # Extra tasks first: kopf.operator() treats tasks that exist when it starts as not its own.
        extras = [asyncio.create_task(factory(context), name=f"extra-{index}")
                  for index, factory in enumerate(extra_tasks)]
        extras.append(asyncio.create_task(context.feed.run(), name="cluster-feed"))
        extras.append(asyncio.create_task(pool_loops.run(), name="pool-loops"))
        ready_flag = asyncio.Event()
        operator = asyncio.create_task(kopf.operator(
            settings=settings or operator_settings(standalone=standalone), standalone=standalone,
            clusterwide=True, stop_flag=stop_flag, ready_flag=ready_flag, memo=kopf.Memo(rocshare=context),
            identity=this_process_identity()), name="kopf")
        extras.append(asyncio.create_task(_drain_on_sigterm(context, ready_flag, stop_flag), name="sigterm"))
        done, _ = await asyncio.wait([operator, *extras], return_when=asyncio.FIRST_COMPLETED)
        await _stop(operator, extras, stop_flag)
        for task in done:
            if not task.cancelled():  # cancelled on the way down (SIGTERM) is no failure
                task.result()  # raise the first failure, if any
    finally:
        await kube.close()


async def _drain_on_sigterm(context: OperatorContext, ready_flag: asyncio.Event, stop_flag: asyncio.Event) -> None:
    """Once Kopf is up (it installs its own SIGTERM handler), take SIGTERM over: the extender stops
    deciding and drains first, then Kopf stops (leadership.py)."""
    await ready_flag.wait()
    stop_on_sigterm(context.gate, stop_flag.set)
    await asyncio.Event().wait()  # runs until the operator stops


async def _stop(operator: asyncio.Task, extras: list[asyncio.Task], stop_flag: asyncio.Event) -> None:
    stop_flag.set()  # Kopf stops gracefully: daemons exit, watches close
    for task in extras:
        task.cancel()
    await asyncio.gather(operator, *extras, return_exceptions=True)
