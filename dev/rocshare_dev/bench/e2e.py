"""`rocshare-dev bench e2e`: pods/s end to end on the real control plane, rocshare against a baseline.

One run, two bursts of the same number of pods onto the same number of simulated nodes, each
burst created at once and timed until every pod is Running (issue 10, item 2):

1. baseline — kube-scheduler (the same v1.35 build) with a profile that has no extender, pods
   asking `amd.com/gpu: 1`, nodes running a plain amd.com/gpu device plugin (the kubelet peer's
   baseline plugin, shaped like AMD's). Nothing of rocshare runs.
2. rocshare — the operator (extender, webhooks, reconcilers), kube-scheduler with the manifests'
   configuration (extender filter, prioritize, bind), rocshare's agents answering Allocate;
   slice pods asking `amd.com/gpu: 1, gpumem: 4096, gpucores: 25`. Admission by the API server
   alone where it can (`--admission policies`, the default: the pod ValidatingAdmissionPolicy
   and the pod-defaults MutatingAdmissionPolicy, which the dev control plane serves), or through
   the webhook for every GPU pod (`--admission webhook`, what an API server without
   MutatingAdmissionPolicy does).
3. HAMi (only with `--hami-src DIR`, a checkout of Project-HAMi/HAMi; bench/hami.py) — after
   rocshare's burst, on the same nodes (their `hami.io/node-amd-register`), rocshare's operator
   stopped and its admission removed: HAMi's scheduler built from that checkout as the
   extender of a kube-scheduler profile, the same slice pods, the bench harness standing in for
   HAMi's device plugin (it releases each node lock once the pod is bound, as HAMi's plugin
   does after Allocate: HAMi at its best; bench/hami.py NodeSide). HAMi's pods cannot run on
   rocshare's agents, so its burst ends when every pod is bound; every phase reports
   create -> bound too (`e2e_bound_pods_per_s`, `e2e_plain_bound_pods_per_s`,
   `e2e_hami_bound_pods_per_s`), and without a checkout the HAMi figures say "not run".

Nodes are the kubelet's own device manager, many per process (`kubelet-peer --node-count`),
and the rocshare agents are the agent's own code, many per process (rocshare_dev.devcluster.multiagent);
see devcluster/simfleet.py for why and what differs from one process per node. Every pod goes
through a real bind and a real Allocate before it is Running.

    run_e2e(*, nodes=500, pods=2000, gpus_per_node=8, burst_timeout_s=180.0,
            work_dir=None, keep=False, json_out=DEFAULT_JSON_OUT) -> dict

returns the figures (keys carry units: `e2e_pods_per_s`, `e2e_baseline_pods_per_s`,
`e2e_all_running_s`, `e2e_latency_p99_ms`, `e2e_cpu_ms_per_pod`, ...) and writes them as JSON
to `json_out` (None: not written); `rocshare-dev bench all` calls it and keeps the numeric ones.
`e2e_pods_per_s` is pods over first create → last Running, and 0 when not every pod ran before
`burst_timeout_s` (which bounds creating too): `e2e_running_pods` and `e2e_partial_pods_per_s`
then say how far it got. Everything it starts is stopped before it returns, also on errors and
SIGTERM; `work_dir` (a temp folder by default) is removed after a run that worked, unless `keep`.
The machine is shared: `e2e_cpu_s_other_users` is what other processes took meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rocshare_dev.bench import hami
from rocshare_dev.bench.burst import BurstResult, delete_all, run_burst
from rocshare_dev.devcluster.controlplane import (
    PROJECT_ROOT,
    SCHEDULER_CONFIG,
    ControlPlane,
    Ports,
    free_port,
    stop_process,
)
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.captures import FIXTURES, mi210_with_synthetic_vram
from rocshare_dev.devcluster.simfleet import SimulatedFleet, offered
from rocshare.api.models import API_VERSION
from rocshare.kube.client import Kube, NotFound, object_path

DEFAULT_JSON_OUT = PROJECT_ROOT / ".cache" / "bench" / "e2e.json"
BASELINE_SCHEDULER = "baseline-scheduler"
SIM_LABEL = {"rocshare.io/sim": "bench-e2e"}
POOL = "bench-e2e"
SLICE = {"amd.com/gpu": "1", "amd.com/gpumem": "4096", "amd.com/gpucores": "25"}
TARGET_RATIO = 0.6  # issue 18 (was 0.5, issue 10)
TARGET_PODS_PER_S = 100.0
NOT_RUN = "not run"
METRIC_LABEL = re.compile(r'(\w+)="([^"]*)"')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=500, help="simulated nodes (default: %(default)s)")
    parser.add_argument("--pods", type=int, default=2000, help="pods per burst (default: %(default)s)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="baseline GPUs per node; rocshare nodes "
                        "read the 8-GPU MI210 capture (default: %(default)s)")
    parser.add_argument("--burst-timeout-s", type=float, default=180.0,
                        help="deadline per burst (default: %(default)s)")
    parser.add_argument("--work-dir", type=Path, default=None, help="folder for the cluster (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) afterwards")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_JSON_OUT, help="where to write the figures")
    parser.add_argument("--admission", choices=("policies", "webhook"), default="policies",
                        help="rocshare's pod admission: the API server's policies where it can (default), "
                             "or the webhook for every GPU pod")
    parser.add_argument("--hami-src", type=Path, default=None,
                        help="a checkout of Project-HAMi/HAMi: also run HAMi's scheduler on the same fleet")
    parser.add_argument("--hami-node-lock-timeout", default="5m",
                        help="HAMi's --node-lock-timeout (default: HAMi's own, %(default)s)")


def run(args: argparse.Namespace) -> int:
    figures = run_e2e(nodes=args.nodes, pods=args.pods, gpus_per_node=args.gpus_per_node,
                      burst_timeout_s=args.burst_timeout_s, work_dir=args.work_dir, keep=args.keep,
                      json_out=args.json_out, admission=args.admission, hami_src=args.hami_src,
                      hami_node_lock_timeout=args.hami_node_lock_timeout)
    print(json.dumps(figures, indent=2))
    return 0 if figures["e2e_targets_met"] else 1


def run_e2e(*, nodes: int = 500, pods: int = 2000, gpus_per_node: int = 8, burst_timeout_s: float = 180.0,
            work_dir: Path | None = None, keep: bool = False,
            json_out: Path | None = DEFAULT_JSON_OUT, admission: str = "policies", hami_src: Path | None = None,
            hami_node_lock_timeout: str = "5m") -> dict[str, Any]:
    """Every burst in one run; see the module docstring."""
    return run_in_work_dir("e2e", work_dir, keep, json_out, lambda root: _run(
        root, nodes=nodes, pods=pods, gpus_per_node=gpus_per_node, burst_timeout_s=burst_timeout_s,
        admission=admission, hami_src=hami_src, hami_node_lock_timeout=hami_node_lock_timeout))


def run_in_work_dir(bench: str, work_dir: Path | None, keep: bool, json_out: Path | None,
                    measure: Callable[[Path], Any]) -> dict[str, Any]:
    """`measure(root)`'s figures (a coroutine's), with `{bench}_run_wall_s` added and written to
    `json_out`; the work folder (a temp one by default) is kept on failure or with `keep`, and
    SIGTERM too runs the coroutine's clean-up."""
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix=f"rocshare-bench-{bench}-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        figures = asyncio.run(measure(root))
    except BaseException:
        print(f"rocshare-dev bench {bench}: failed; logs kept in {root}", file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    figures[f"{bench}_run_wall_s"] = round(time.monotonic() - started, 1)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


async def _run(root: Path, *, nodes: int, pods: int, gpus_per_node: int, burst_timeout_s: float,
               admission: str = "policies", hami_src: Path | None = None,
               hami_node_lock_timeout: str = "5m") -> dict[str, Any]:
    hami_binary, hami_note = None, NOT_RUN
    if hami_src is not None:  # built first: a checkout that does not build stops only the HAMi part
        try:
            hami_binary = hami.build_scheduler(Path(hami_src))
        except hami.HamiNotBuilt as error:
            hami_note = f"not run: {error}"
            print(f"rocshare-dev bench e2e: HAMi's scheduler: {error}", file=sys.stderr)
    cluster = ControlPlane(root=root / "cluster", ports=Ports.free(), with_scheduler=False)
    stack = Stack(cluster)
    hami_result = None
    try:
        cluster.start()
        cluster.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        async with await Kube.connect(cluster.kubeconfig) as kube:
            for namespace in ("bench-baseline", "bench-rocshare", "bench-hami"):
                await kube.create(object_path("v1", "namespaces"), {"metadata": {"name": namespace}})
            for namespace in ("bench-baseline", "bench-rocshare", "bench-hami"):
                await wait_default_service_account(kube, namespace)
            baseline = await _baseline_phase(stack, kube, root, nodes=nodes, pods=pods,
                                             gpus_per_node=gpus_per_node, timeout_s=burst_timeout_s)
            rocshare = await _rocshare_phase(stack, kube, root, nodes=nodes, pods=pods, timeout_s=burst_timeout_s,
                                             admission=admission)
            if hami_binary is not None:
                try:
                    hami_result = await _hami_phase(stack, kube, hami_binary, nodes=nodes, pods=pods, timeout_s=burst_timeout_s,
                                                    node_lock_timeout=hami_node_lock_timeout)
                    hami_note = ""
                except (hami.HamiNotBuilt, RuntimeError) as error:
                    hami_note = f"not run: {error}"
                    print(f"rocshare-dev bench e2e: HAMi's phase: {error}", file=sys.stderr)
    finally:
        stack.stop()
    figures = _figures(nodes=nodes, pods=pods, gpus_per_node=gpus_per_node, baseline=baseline, rocshare=rocshare)
    figures["e2e_admission"] = admission
    figures.update(_hami_figures(hami_result, hami_note, hami_src=hami_src, rocshare=rocshare,
                                 node_lock_timeout=hami_node_lock_timeout))
    return figures


class Stack:
    """What the run started besides the control plane, stopped in reverse order."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.fleets: list[SimulatedFleet] = []
        self.operator: OperatorProcess | None = None
        self.baseline_scheduler: subprocess.Popen | None = None
        self.hami: hami.HamiScheduler | None = None
        self.extra_pids: dict[str, int] = {}
        """More processes to count, by name (bench floor's extender, which bench floor stops itself)."""

    def stop_baseline_scheduler(self) -> None:
        if self.baseline_scheduler is not None:
            stop_process(self.baseline_scheduler.pid, "baseline kube-scheduler")
            self.baseline_scheduler.wait(timeout=5)
            self.baseline_scheduler = None

    def stop(self) -> None:
        if self.hami is not None:
            self.hami.stop()
        for fleet in reversed(self.fleets):
            fleet.stop()
        if self.operator is not None:
            self.operator.stop()
        self.stop_baseline_scheduler()
        self.cluster.stop()

    def pids(self) -> dict[str, int]:
        pids = dict(self.cluster.pids)
        if self.baseline_scheduler is not None:
            pids["kube-scheduler"] = self.baseline_scheduler.pid
        if self.operator is not None and self.operator.pid:
            pids["operator"] = self.operator.pid
        for fleet in self.fleets:
            pids.update(fleet.pids)
        if self.hami is not None:
            pids.update(self.hami.pids)
        pids.update(self.extra_pids)
        return pids


# ---- phases ----------------------------------------------------------------------------------


async def _baseline_phase(stack: Stack, kube: Kube, root: Path, *, nodes: int, pods: int, gpus_per_node: int,
                          timeout_s: float) -> dict[str, Any]:
    stack.baseline_scheduler = start_baseline_scheduler(stack.cluster)
    fleet = SimulatedFleet(kubeconfig=stack.cluster.kubeconfig, work_dir=root / "baseline-nodes", node_count=nodes,
                           baseline_gpus=gpus_per_node, prefix="base-",
                           labels=SIM_LABEL, bin_dir=stack.cluster.bin_dir)
    stack.fleets.append(fleet)
    await fleet.start(kube)
    spec = {"schedulerName": BASELINE_SCHEDULER}
    result = await measured_burst(stack, kube, "bench-baseline", pods, {"amd.com/gpu": "1"}, spec, timeout_s)
    await delete_all(kube, "bench-baseline")
    fleet.stop()
    await kube.request("DELETE", object_path("v1", "nodes"), query={"labelSelector": _selector()},
                       timeout_s=120)
    stack.stop_baseline_scheduler()
    return result


async def _rocshare_phase(stack: Stack, kube: Kube, root: Path, *, nodes: int, pods: int,
                          timeout_s: float, admission: str = "policies") -> dict[str, Any]:
    cluster = stack.cluster
    stack.operator = OperatorProcess(cluster)
    stack.operator.start()
    stack.operator.install_webhooks(admission_policies=admission == "policies")
    await kube.create(object_path(API_VERSION, "amdgpupools"), _pool())
    cluster.start_scheduler()
    fleet = SimulatedFleet(kubeconfig=cluster.kubeconfig, work_dir=root / "rocshare-nodes", node_count=nodes,
                           sysfs_root=mi210_with_synthetic_vram(FIXTURES, root), prefix="roc-", labels=SIM_LABEL,
                           bin_dir=stack.cluster.bin_dir)
    stack.fleets.append(fleet)
    await fleet.start(kube)
    await _wait_inventories(kube, nodes, deadline_s=120)
    await _wait_admission_params(stack, deadline_s=60)
    return await measured_burst(stack, kube, "bench-rocshare", pods, SLICE, {}, timeout_s)


async def _wait_admission_params(stack: Stack, *, deadline_s: float) -> None:
    """The operator wrote the pod-defaults policy's parameters (else the webhook still mutates)."""
    if not stack.operator.policies:
        return
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if stack.cluster.kubectl("get", "configmap", "rocshare-admission", "-n", "rocshare-system",
                                 check=False).returncode == 0:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the operator did not write its admission parameters within {deadline_s:.0f} s")


async def _hami_phase(stack: Stack, kube: Kube, binary: Path, *, nodes: int, pods: int, timeout_s: float,
                      node_lock_timeout: str) -> dict[str, Any]:
    """HAMi's scheduler on the rocshare phase's nodes, rocshare's operator and admission gone."""
    await delete_all(kube, "bench-rocshare")
    stack.cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                          "--ignore-not-found", check=False)
    if stack.operator is not None:
        stack.operator.stop()  # and its admission policies
        stack.operator = None
    stack.hami = hami.HamiScheduler(stack.cluster, binary, node_lock_timeout=node_lock_timeout)
    stack.hami.start(nodes=nodes)
    spec = {"schedulerName": hami.SCHEDULER_NAME}
    node_side = hami.NodeSide(kube)
    try:
        result = await measured_burst(stack, kube, "bench-hami", pods, SLICE, spec, timeout_s, until="bound",
                                      on_pod=node_side.see)
    finally:
        await node_side.close()
    for error in node_side.errors[:5]:
        print(f"rocshare-dev bench e2e: HAMi's node side (harness): {error}", file=sys.stderr)
    return {**result, "locks_released": node_side.released, "node_side_errors": node_side.errors}


async def wait_default_service_account(kube: Kube, namespace: str, *, timeout_s: float = 120,
                                       required: bool = True) -> bool:
    """Wait for kube-controller-manager to give a new namespace its default ServiceAccount: until then
    the API server refuses the namespace's pods (a busy 2-core CI machine once took longer than the
    baseline's nodes took to start). True once it exists; after `timeout_s`, RuntimeError, or False
    when not `required` (a cluster without a controller-manager, whose pods mount no token)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await kube.get(object_path("v1", "serviceaccounts", "default", namespace=namespace))
            return True
        except NotFound:
            if time.monotonic() > deadline:
                if not required:
                    return False
                raise RuntimeError(f"no default ServiceAccount in {namespace} after {timeout_s:.0f} s") from None
            await asyncio.sleep(0.2)


async def measured_burst(stack: Stack, kube: Kube, namespace: str, count: int, limits: dict[str, str],
                         spec: dict[str, Any], timeout_s: float, until: str = "running",
                         on_pod: Callable[[dict[str, Any]], None] | None = None,
                         pod_of: Callable[..., dict[str, Any]] | None = None) -> dict[str, Any]:
    """One warm-up pod (every cache filled, every path taken once), then the burst; `on_pod` sees
    every pod state of both (run_burst). `pod_of(name, namespace, limits, spec)` makes each pod
    (bench_pod by default; bench dra's pods take a DRA claim instead)."""
    pod_of = pod_of or bench_pod
    warm = await run_burst(kube, [pod_of("warm-up", namespace, limits, spec)], namespace=namespace, timeout_s=120,
                           until=until, on_pod=on_pod)
    if (warm.running if until == "running" else warm.bound) != 1:
        raise RuntimeError(f"{namespace}: the warm-up pod did not get {until}: {warm.failed or 'timed out'}")
    await delete_all(kube, namespace)
    pids = {**stack.pids(), "bench": os.getpid()}
    requests_before = _api_requests(stack.cluster)
    cpu_before = {name: _cpu_s(pid) for name, pid in pids.items()}
    machine_before, load_before = _machine_cpu_s(), os.getloadavg()[0]
    burst = await run_burst(kube, [pod_of(f"p{index:05d}", namespace, limits, spec) for index in range(count)],
                            namespace=namespace, timeout_s=timeout_s, until=until, on_pod=on_pod)
    cpu = {name: round(_cpu_s(pid) - cpu_before[name], 1) for name, pid in pids.items()}
    requests = _api_requests(stack.cluster) - requests_before
    # Other users of the machine slow every figure down; say how much CPU they took meanwhile.
    others_s = _machine_cpu_s() - machine_before - sum(cpu.values())
    return {"burst": burst, "cpu_s": cpu, "others_cpu_s": round(max(0.0, others_s), 1), "requests": requests,
            "load_1m_before": round(load_before, 2)}


async def _wait_inventories(kube: Kube, nodes: int, *, deadline_s: float) -> None:
    """Every agent published its GPUs and says the kubelet watches its device plugin (the extender
    offers a node only then)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        items = (await kube.list(object_path(API_VERSION, "amdgpunodes"))).get("items", [])
        if sum(offered(item.get("status") or {}) for item in items) >= nodes:
            await asyncio.sleep(2.0)  # the operator's watch delivers them a moment later
            return
        await asyncio.sleep(1.0)
    raise RuntimeError(f"not every AmdGpuNode published its GPUs within {deadline_s:.0f} s")


# ---- objects ---------------------------------------------------------------------------------


def _selector() -> str:
    return ",".join(f"{key}={value}" for key, value in SIM_LABEL.items())


def bench_pod(name: str, namespace: str, limits: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {**spec, "terminationGracePeriodSeconds": 0, "containers": [
                {"name": "c0", "image": "rocm/pytorch", "resources": {"limits": dict(limits)}}]}}


def _pool() -> dict[str, Any]:
    # spread: with binpack every pod of the burst queues on the same few nodes, one in flight
    # per node (DESIGN.md section 2); health every hour: 500 nodes' checks would be noise here.
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": POOL},
            "spec": {"nodeSelector": dict(SIM_LABEL), "scheduling": {"nodePolicy": "spread"},
                     "health": {"intervalSeconds": 3600}}}


def start_baseline_scheduler(cluster: ControlPlane, **settings: Any) -> subprocess.Popen:
    """A second kube-scheduler, same binary and client settings, one profile and no extender;
    `settings` are more top-level configuration fields (bench replay's longer backoffs)."""
    config = {**yaml.safe_load(SCHEDULER_CONFIG.read_text()), **settings}
    config.pop("extenders", None)
    config["profiles"] = [{"schedulerName": BASELINE_SCHEDULER}]
    config["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig), "qps": 500, "burst": 1000}
    config["leaderElection"] = {"leaderElect": False}
    path = cluster.root / "kube-scheduler-baseline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with open(cluster.logs / "kube-scheduler-baseline.log", "ab") as log:
        return subprocess.Popen([str(cluster.bin_dir / "kube-scheduler"), f"--config={path}",
                                 "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "-v=1"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _api_requests(cluster: ControlPlane) -> Counter[str]:
    """kube-apiserver's count of requests so far, by "VERB resource[/subresource]" (its /metrics),
    and of admission webhook calls, by "webhook <name>"."""
    counts: Counter[str] = Counter()
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(METRIC_LABEL.findall(line))
            resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            counts[f"{labels.get('verb', '')} {resource}".strip()] += int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("apiserver_admission_webhook_request_total{"):
            counts[f"webhook {dict(METRIC_LABEL.findall(line)).get('name', '')}"] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def requests_per_pod(requests: Counter[str], pods: int) -> dict[str, float]:
    """Requests per Running pod, the kinds that happen at least once per ten pods."""
    return {kind: round(count / pods, 2) for kind, count in requests.most_common() if pods and count * 10 >= pods}


def _machine_cpu_s() -> float:
    """CPU seconds the whole machine spent busy (not idle or waiting) since boot."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


# ---- figures ---------------------------------------------------------------------------------


def _figures(*, nodes: int, pods: int, gpus_per_node: int, baseline: dict[str, Any],
             rocshare: dict[str, Any]) -> dict[str, Any]:
    ours: BurstResult = rocshare["burst"]
    base: BurstResult = baseline["burst"]
    ratio = ours.pods_per_s / base.pods_per_s if base.pods_per_s else None
    met = bool(ratio is not None and ratio >= TARGET_RATIO and ours.pods_per_s >= TARGET_PODS_PER_S)
    figures: dict[str, Any] = {
        "e2e_nodes": nodes, "e2e_pods": pods, "e2e_gpus_per_node": gpus_per_node,
        "e2e_pods_per_s": round(ours.pods_per_s, 1), "e2e_baseline_pods_per_s": round(base.pods_per_s, 1),
        "e2e_ratio_to_baseline": round(ratio, 3) if ratio is not None else None,
        # issue 18's names: create -> Running against plain kube-scheduler's create -> Running, and
        # create -> bound for every scheduler (HAMi's in _hami_figures)
        "e2e_plain_pods_per_s": round(base.pods_per_s, 1),
        "e2e_ratio_to_plain_scheduler": round(ratio, 3) if ratio is not None else None,
        "e2e_bound_pods_per_s": round(ours.bound_per_s, 1), "e2e_plain_bound_pods_per_s": round(base.bound_per_s, 1),
        "e2e_all_bound_s": _r(ours.all_bound_s), "e2e_plain_all_bound_s": _r(base.all_bound_s),
        "e2e_all_running_s": _r(ours.all_running_s), "e2e_baseline_all_running_s": _r(base.all_running_s),
        "e2e_latency_p50_ms": _r(ours.percentile_ms(0.5)), "e2e_latency_p99_ms": _r(ours.percentile_ms(0.99)),
        "e2e_baseline_latency_p50_ms": _r(base.percentile_ms(0.5)),
        "e2e_baseline_latency_p99_ms": _r(base.percentile_ms(0.99)),
        "e2e_create_s": _r(ours.create_s), "e2e_baseline_create_s": _r(base.create_s),
        "e2e_running_pods": ours.running, "e2e_baseline_running_pods": base.running,
        "e2e_failed_pods": len(ours.failed), "e2e_baseline_failed_pods": len(base.failed),
        "e2e_partial_pods_per_s": round(ours.running / ours.elapsed_s, 1) if ours.elapsed_s else None,
        # CPU per Running pod, over every process of the stack: a figure other users of the machine
        # barely move, unlike pods/s (the bench's own watch is left out).
        "e2e_cpu_ms_per_pod": cpu_ms_per_pod(rocshare["cpu_s"], ours.running),
        "e2e_baseline_cpu_ms_per_pod": cpu_ms_per_pod(baseline["cpu_s"], base.running),
        "e2e_operator_cpu_ms_per_pod": cpu_ms_per_pod({"operator": rocshare["cpu_s"].get("operator", 0.0)},
                                                      ours.running),
        "e2e_cpu_s_by_process": rocshare["cpu_s"], "e2e_baseline_cpu_s_by_process": baseline["cpu_s"],
        "e2e_api_requests_per_pod": requests_per_pod(rocshare["requests"], ours.running),
        "e2e_baseline_api_requests_per_pod": requests_per_pod(baseline["requests"], base.running),
        "e2e_cpu_s_other_users": rocshare["others_cpu_s"], "e2e_baseline_cpu_s_other_users": baseline["others_cpu_s"],
        "e2e_load_1m_before_burst": rocshare["load_1m_before"],
        "e2e_baseline_load_1m_before_burst": baseline["load_1m_before"],
        "e2e_target_ratio_min": TARGET_RATIO, "e2e_target_pods_per_s_min": TARGET_PODS_PER_S,
        "e2e_targets_met": met,
        "e2e_machine_cpus": os.cpu_count(), "e2e_machine_memory_gib": round(_memory_gib(), 1),
        "e2e_setup": {
            "rocshare_pod_limits": SLICE, "baseline_pod_limits": {"amd.com/gpu": "1"},
            "rocshare_nodes": "MI210 8-GPU capture with synthetic 64 GiB VRAM per GPU; pool nodePolicy spread",
            "simulation": "kubelet-peer --node-count (one device manager per node, one process); "
                          "rocshare_dev.devcluster.multiagent (one agent per node, one process)",
        },
    }
    if ours.failed or base.failed:
        figures["e2e_failed_examples"] = {**dict(list(base.failed.items())[:2]), **dict(list(ours.failed.items())[:3])}
    return figures


def _hami_figures(result: dict[str, Any] | None, note: str, *, hami_src: Path | None, rocshare: dict[str, Any],
                  node_lock_timeout: str) -> dict[str, Any]:
    if result is None:
        return {"e2e_hami_bound_pods_per_s": note or NOT_RUN, "e2e_hami_commit": (
            hami.commit_of(Path(hami_src)) if hami_src is not None and Path(hami_src).exists() else NOT_RUN)}
    burst: BurstResult = result["burst"]
    ours: BurstResult = rocshare["burst"]
    partial = burst.bound / burst.elapsed_s if burst.elapsed_s else None
    return {
        "e2e_hami_commit": hami.commit_of(Path(hami_src)),
        "e2e_hami_node_lock_timeout": node_lock_timeout,
        "e2e_hami_node_side": ("bench harness standing in for HAMi's device plugin: each node lock released "
                               "(bind-phase success) as soon as its pod is bound -- HAMi at its best"),
        "e2e_hami_locks_released": result["locks_released"],
        "e2e_hami_node_side_errors": len(result["node_side_errors"]),
        "e2e_hami_bound_pods_per_s": round(burst.bound_per_s, 1),
        "e2e_hami_bound_pods": burst.bound, "e2e_hami_all_bound_s": _r(burst.all_bound_s),
        "e2e_hami_partial_bound_pods_per_s": round(partial, 1) if partial else None,
        "e2e_hami_bound_latency_note": "HAMi's pods are refused by rocshare's agents after binding (no rocshare "
                                       "record): they end Failed; bound is the common measure",
        "e2e_hami_create_s": _r(burst.create_s),
        "e2e_hami_cpu_s_by_process": result["cpu_s"],
        "e2e_hami_api_requests_per_pod": requests_per_pod(result["requests"], max(burst.bound, 1)),
        "e2e_hami_load_1m_before_burst": result["load_1m_before"],
        "e2e_rocshare_to_hami_bound_ratio": (round(ours.bound_per_s / burst.bound_per_s, 2)
                                             if burst.bound_per_s else None),
        **_unfinished_hami_ratios(burst, ours, partial),
    }


def _unfinished_hami_ratios(burst: BurstResult, ours: BurstResult, partial: float | None) -> dict[str, Any]:
    """When HAMi binds only part of the burst before the deadline: rocshare's rate against HAMi's
    over that window, and a lower bound of rocshare's lead (HAMi would need at least the window for
    all pods, so its rate is at most pods / window)."""
    if burst.bound_per_s or not partial or not burst.elapsed_s or not ours.bound_per_s:
        return {}
    ceiling = burst.pods / burst.elapsed_s
    return {
        "e2e_rocshare_to_hami_partial_bound_ratio": round(ours.bound_per_s / partial, 2),
        "e2e_rocshare_to_hami_bound_ratio_at_least": round(ours.bound_per_s / ceiling, 2),
        "e2e_hami_unfinished_note": (f"HAMi bound {burst.bound} of {burst.pods} pods in the "
                                     f"{burst.elapsed_s:.0f} s deadline: its full-burst rate is at most "
                                     f"{ceiling:.1f} pods/s"),
    }


def cpu_ms_per_pod(cpu_s: dict[str, float], running: int) -> float | None:
    spent_s = sum(value for name, value in cpu_s.items() if name != "bench")
    return round(1000 * spent_s / running, 1) if running else None


def _r(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
