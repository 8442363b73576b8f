"""`rocshare-dev bench failover`: what a user waits when the leading operator replica goes (issue 30).

A control plane of its own (no kube-scheduler of the cluster's), two operator replicas each with
its own kube-scheduler electing on the shipped Lease and timings (devcluster/replica.py), two
simulated MI210 nodes (8 GPUs each, synthetic 64 GiB VRAM), pods admitted by the pod admission
policies (no webhook). A stream of slice pods (1 GPU, 2 GiB, 10 % of the CUs) is created at
`--rate` per second and each is deleted a moment after it runs. Per trial, once the standby is
ready, the leader is stopped -- `sigkill` (both processes SIGKILLed, as a lost node) or `graceful`
(SIGTERM to kube-scheduler, which releases the Lease, then to the operator, the kubelet's order for
a pod deletion) -- while the stream goes on; the stopped replica is then started again as the
next standby.

Reported per kind (worst and median over `--trials`):
* `failover_<kind>_s`: from the stop to the next GPU pod bound once the old leader's kube-scheduler
  has exited (any pod: one that waited through the handover counts; only the new leader binds then);
* pods refused: creations the API server refused, plus pods that ended Failed;
* double bookings: violations found from what the containers received (devcluster/evidence.py).
Goals: graceful <= 2 s, SIGKILL <= 10 s, 0 refused, 0 double bookings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocshare.api.models import API_VERSION
from rocshare.kube.client import ApiError, Kube, object_path
from rocshare.kube.informer import Informer
from rocshare_dev.devcluster.captures import FIXTURES, mi210_with_synthetic_vram
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, ControlPlane, Ports
from rocshare_dev.devcluster.evidence import PodEvidence, stop_tasks
from rocshare_dev.devcluster.replica import OperatorReplica, install_peering
from rocshare_dev.devcluster.simnode import SimulatedNode

NAMESPACE = "failover"
LABEL = "rocshare-bench-failover"
KINDS = ("graceful", "sigkill")
GOALS_S = {"graceful": 2.0, "sigkill": 10.0}
NODES = 2
LIFETIME_S = 2.0
GIVE_UP_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=3, help="stops per kind (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=10.0, help="pods created per second (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    figures = measure(trials=args.trials, rate_per_s=args.rate)
    print(json.dumps(figures, indent=1) if args.json else "\n".join(f"{k}: {v}" for k, v in figures.items()))
    return 0


def measure(*, trials: int = 3, rate_per_s: float = 10.0, progress: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rocshare-failover-") as root:
        return asyncio.run(_measure(Path(root), trials=trials, rate_per_s=rate_per_s, progress=progress))


@dataclass
class Stream:
    """Creates slice pods at a steady rate, deletes each a moment after it runs, and notes binds."""

    kube: Kube
    rate_per_s: float
    created_at: dict[str, float] = field(default_factory=dict)
    bound_at: dict[str, float] = field(default_factory=dict)
    deleting: set[str] = field(default_factory=set)
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    refused: int = 0
    serial: int = 0

    async def create_loop(self) -> None:
        while True:
            self.serial += 1
            name = f"pod-{self.serial:05d}"
            created = time.monotonic()
            try:
                await self.kube.create(object_path("v1", "pods", namespace=NAMESPACE), slice_pod(name))
                self.created_at[name] = created
            except ApiError as error:
                self.refused += 1
                print(f"   refused {name}: {error}", flush=True)
            await asyncio.sleep(max(0.0, 1 / self.rate_per_s - (time.monotonic() - created)))

    async def on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind != "DELETED" and pod["spec"].get("nodeName") and name not in self.bound_at:
            self.bound_at[name] = time.monotonic()
        if kind != "DELETED" and (pod.get("status") or {}).get("phase") == "Running" and name not in self.deleting:
            self.deleting.add(name)
            self.timers.append(asyncio.get_running_loop().call_later(
                LIFETIME_S, lambda: asyncio.ensure_future(self._delete(name))))

    async def _delete(self, name: str) -> None:
        try:
            await self.kube.request("DELETE", object_path("v1", "pods", name, namespace=NAMESPACE),
                                    body={"gracePeriodSeconds": 0})
        except ApiError:
            pass  # already gone

    def first_bind_after(self, stopped: float, gone: float) -> float | None:
        """Seconds from `stopped` to the first bind seen once the old leader's scheduler was `gone`."""
        after = [at for at in self.bound_at.values() if at >= gone]
        return min(after) - stopped if after else None


def slice_pod(name: str) -> dict[str, Any]:
    limits = {"amd.com/gpu": "1", "amd.com/gpumem": "2048", "amd.com/gpucores": "10"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {LABEL: "1"}},
            "spec": {"schedulerName": "rocshare-scheduler", "terminationGracePeriodSeconds": 0,
                     "nodeSelector": {"rocshare.io/pool": "failover"},
                     "containers": [{"name": "c0", "image": "rocm/pytorch", "resources": {"limits": limits}}]}}


async def _measure(root: Path, *, trials: int, rate_per_s: float, progress: bool) -> dict[str, Any]:
    cluster = ControlPlane(root=root / "cluster", ports=Ports.free(), with_scheduler=False)
    replicas = [OperatorReplica(cluster, f"rocshare-operator-{letter}") for letter in "ab"]
    nodes: list[SimulatedNode] = []
    try:
        cluster.start()
        cluster.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "crds"))
        cluster.kubectl("create", "namespace", NAMESPACE)
        install_peering(cluster)
        for replica in replicas:
            replica.start()
        replicas[0].operator.install_admission_policies()
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps({
            "apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": "failover"},
            "spec": {"nodeSelector": {"rocshare.io/sim": "failover"}}}))
        sysfs = mi210_with_synthetic_vram(FIXTURES, root)
        nodes = [SimulatedNode(name=f"failover-{index}", kubeconfig=cluster.kubeconfig, work_dir=root,
                               sysfs_root=sysfs, labels={"rocshare.io/sim": "failover"}) for index in range(NODES)]
        for node in nodes:
            node.start()
        async with await Kube.connect(cluster.kubeconfig) as kube:
            await _wait(lambda: _published(kube), "both nodes' GPUs published")
            return await _trials(kube, replicas, trials=trials, rate_per_s=rate_per_s, progress=progress)
    finally:
        for node in nodes:
            node.stop()
        for replica in replicas:
            replica.delete()
        cluster.stop()


async def _trials(kube: Kube, replicas: list[OperatorReplica], *, trials: int, rate_per_s: float,
                  progress: bool) -> dict[str, Any]:
    stream = Stream(kube, rate_per_s)
    evidence = PodEvidence(kube, f"{LABEL}=1")
    watch = Informer(kube, object_path("v1", "pods", namespace=NAMESPACE), stream.on_pod, name="stream",
                     label_selector=f"{LABEL}=1", decode=lambda obj: obj)
    tasks = [asyncio.create_task(coro) for coro in (evidence.run(), watch.run(), stream.create_loop())]
    gaps: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        await asyncio.sleep(3)  # the stream runs
        for trial in range(trials):
            for kind in KINDS:
                gaps[kind].append(await _one_stop(stream, replicas, kind))
                if progress:
                    print(f"   trial {trial + 1} {kind}: next pod bound {gaps[kind][-1]:.2f} s after the stop",
                          flush=True)
    finally:
        for timer in stream.timers:
            timer.cancel()  # deletions due after the run: the cluster goes anyway
        await stop_tasks(tasks)
    return _figures(gaps, stream, evidence, rate_per_s)


async def _one_stop(stream: Stream, replicas: list[OperatorReplica], kind: str) -> float:
    leader = await _wait(lambda: _only_leader(replicas), "one leading replica")
    (standby,) = [replica for replica in replicas if replica is not leader]
    await _wait(lambda: asyncio.to_thread(standby.standing_by), "the standby ready")
    await asyncio.sleep(2)  # the stream flows through the leader
    stopped = time.monotonic()
    if kind == "sigkill":
        await asyncio.to_thread(leader.crash)
        finishing = asyncio.sleep(0)
    else:  # kube-scheduler first (the kubelet's order); the operator drains on its own SIGTERM
        await asyncio.to_thread(leader.stop_scheduler, signal.SIGTERM)
        await _wait(lambda: _not(asyncio.to_thread(leader.leading)), "the old leader's extender to stop deciding")
        finishing = asyncio.to_thread(leader.operator.stop)
    gone = time.monotonic()  # from now on only the new leader binds (the old one's waiting binds are cancelled)
    gap = await _wait(lambda: _gap(stream, stopped, gone), f"a pod bound after the {kind} stop")
    await finishing
    await asyncio.to_thread(leader.start)  # the next standby
    return round(gap, 2)


async def _not(check) -> bool:
    return not await check


async def _gap(stream: Stream, stopped: float, gone: float) -> float | None:
    return stream.first_bind_after(stopped, gone)


async def _only_leader(replicas: list[OperatorReplica]) -> OperatorReplica | None:
    leading = [replica for replica in replicas if await asyncio.to_thread(replica.leading)]
    return leading[0] if len(leading) == 1 else None


async def _published(kube: Kube) -> bool:
    items = (await kube.list(object_path(API_VERSION, "amdgpunodes")))["items"]
    return sum(bool((obj.get("status") or {}).get("gpus")) for obj in items) == NODES


async def _wait(check, what: str) -> Any:
    deadline = time.monotonic() + GIVE_UP_S
    while time.monotonic() < deadline:
        found = await check()
        if found is not None and found is not False:
            return found
        await asyncio.sleep(0.05)
    raise RuntimeError(f"bench failover: no {what} within {GIVE_UP_S:.0f} s")


def _figures(gaps: dict[str, list[float]], stream: Stream, evidence: PodEvidence, rate_per_s: float) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for kind, values in gaps.items():
        figures[f"failover_{kind}_s"] = max(values)
        figures[f"failover_{kind}_median_s"] = round(statistics.median(values), 2)
    figures["failover_pods_created"] = len(stream.created_at)
    figures["failover_pods_checked_from_containers"] = len(evidence.admitted)
    figures["failover_pods_refused"] = stream.refused + len(evidence.failed)
    figures["failover_double_bookings"] = len(evidence.violations)
    figures["failover_stream_pods_per_s"] = rate_per_s
    if evidence.violations:
        print("   double bookings:", *evidence.violations[:10], sep="\n   ")
    return figures
