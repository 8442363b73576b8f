"""`rocshare-dev bench cost`: what the operator and one node agent cost, measured on a real control plane.

Operator: a real etcd + kube-apiserver + controller-manager (no kube-scheduler: pods are
created already bound) is filled with N Nodes, N AmdGpuNodes with status (8 GPUs each,
fleet.py) and 4 pods per node, each bound through spec.nodeName and carrying the allocation
record the core allocator made for it (no webhook runs here). Then ``rocshare operator
--standalone --no-webhook`` starts as a subprocess; once /readyz answers (every cache
listed) its resident memory is read from /proc/<pid>/status (VmRSS, and the peak VmHWM)
over a settling window. The fleet grows 100 -> 1,000 -> 5,000 nodes in one cluster, with a
fresh operator at each size.

Agent: one simulated node (simnode.py: kubelet peer + ``rocshare agent``) on the MI210
capture with synthetic 64 GiB VRAM (devcluster.captures) and splitCount 25, so 200 slices fit
at once. Idle: CPU (utime + stime from /proc/<pid>/stat) and RSS over a quiet window. Burst:
200 pods of 2 GiB / 3 % of cores (4 CUs), bound one after the other as the extender's in-flight gate
releases them (each once the previous one runs), until all run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterable
from pathlib import Path

FLEET_SIZES = (100, 1000, 5000)
PODS_PER_NODE = 4
TARGET_OPERATOR_RSS_MIB = 300
AGENT_BURST_PODS = 200
AGENT_SPLIT_COUNT = 25
BURST_POD = {"amd.com/gpu": "1", "amd.com/gpumem": "2048", "amd.com/gpucores": "3"}
AGENT_HEALTH_INTERVAL_S = 2.0  # the agent's default
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", default=",".join(map(str, FLEET_SIZES)),
                        help="fleet sizes, growing, comma-separated (default: %(default)s)")
    parser.add_argument("--pods-per-node", type=int, default=PODS_PER_NODE)
    parser.add_argument("--concurrency", type=int, default=48, help="requests in flight while filling")
    parser.add_argument("--skip-agent", action="store_true", help="measure the operator only")
    parser.add_argument("--skip-operator", action="store_true", help="measure the agent only")
    parser.add_argument("--work-dir", default=None, help="folder for the cluster (default: a temp folder)")
    parser.add_argument("--json", action="store_true", help="print the JSON report (default: lines)")


def run(args: argparse.Namespace) -> int:
    sizes = [int(n) for n in args.nodes.split(",")]
    report = measure(sizes, pods_per_node=args.pods_per_node, concurrency=args.concurrency,
                     agent=not args.skip_agent, operator=not args.skip_operator,
                     work_dir=Path(args.work_dir) if args.work_dir else None, progress=not args.json)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


def measure(sizes: Iterable[int], *, pods_per_node: int = PODS_PER_NODE, concurrency: int = 48, agent: bool = True,
            operator: bool = True, work_dir: Path | None = None, progress: bool = False) -> dict:
    from rocshare_dev.devcluster.controlplane import ControlPlane, Ports

    with tempfile.TemporaryDirectory(prefix="rocshare-cost-") as scratch:
        root = work_dir or Path(scratch)
        cluster = ControlPlane(root=root / "cluster", ports=Ports.free(), with_scheduler=False)
        report: dict = {}
        try:
            cluster.start()
            _install_crds(cluster)
            say = _printer(progress)
            if agent:
                report["agent"] = asyncio.run(_measure_agent(cluster, root / "agent", say))
            if operator:
                report["operator"] = asyncio.run(_measure_operator(cluster, list(sizes), pods_per_node,
                                                                   concurrency, say))
        finally:
            cluster.stop()
        return report


def _printer(progress: bool):
    def say(text: str) -> None:
        if progress:
            print(text, flush=True)
    return say


def _install_crds(cluster) -> None:
    from rocshare_dev.devcluster.controlplane import PROJECT_ROOT

    cluster.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")


# ---- /proc -----------------------------------------------------------------------------------


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def cpu_s(pid: int) -> float:
    """utime + stime of the process, in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


# ---- operator --------------------------------------------------------------------------------


async def _measure_operator(cluster, sizes: list[int], pods_per_node: int, concurrency: int, say) -> dict:
    from rocshare_dev.bench.e2e import wait_default_service_account
    from rocshare_dev.bench.fleet import NAMESPACE, pool_object
    from rocshare.kube.client import Kube

    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("create", "namespace", "rocshare-system")
    results: dict = {"pods_per_node": pods_per_node, "sizes": []}
    kube = await Kube.connect(cluster.kubeconfig)
    try:
        await wait_default_service_account(kube, NAMESPACE, timeout_s=60)
        await kube.create("/apis/rocshare.io/v1alpha1/amdgpupools", pool_object())
        built = 0
        for size in sizes:
            started = time.monotonic()
            await _fill(kube, range(built, size), pods_per_node, concurrency)
            fill_s = time.monotonic() - started
            built = size
            say(f"cluster holds {size} nodes and {size * pods_per_node} pods (added in {fill_s:.0f} s)")
            try:
                result = _operator_rss(cluster)
            except RuntimeError as error:  # e.g. the informers' first LIST outlived the client's timeout
                say(f"operator at {size} nodes failed ({error}); measuring again with a 300 s request timeout")
                result = {**_operator_rss(cluster, request_timeout_s=300), "stock_error": str(error)}
            result.update(nodes=size, pods=size * pods_per_node, fill_s=round(fill_s, 1))
            results["sizes"].append(result)
            say(f"operator at {size} nodes: RSS {result['rss_mib']:.0f} MiB (peak {result['peak_rss_mib']:.0f}), "
                f"ready in {result['ready_s']:.1f} s")
        # The same process without the extender (Kopf's reconcilers only): what the extender's caches add.
        results["without_extender"] = {**_operator_rss(cluster, extender=False, request_timeout_s=300), "nodes": built}
        say(f"operator without the extender at {built} nodes: RSS {results['without_extender']['rss_mib']:.0f} MiB")
    finally:
        await kube.close()
    return results


async def _fill(kube, indexes: range, pods_per_node: int, concurrency: int) -> None:
    """Create the nodes, their AmdGpuNodes with status, then their pods, `concurrency` at a time."""
    from rocshare_dev.bench.fleet import node_kind, node_name

    gate = asyncio.Semaphore(concurrency)
    await _bounded(gate, (_create_node(kube, node_name(i), node_kind(i)) for i in indexes))
    await _bounded(gate, (_create_pod(kube, body) for i in indexes
                          for body in _bound_pods(node_name(i), node_kind(i), pods_per_node, i)))


async def _bounded(gate: asyncio.Semaphore, jobs: Iterable[Awaitable], chunk: int = 2000) -> None:
    async def gated(job: Awaitable) -> None:
        async with gate:
            await job

    batch: list[Awaitable] = []
    for job in jobs:
        batch.append(gated(job))
        if len(batch) >= chunk:
            await asyncio.gather(*batch)
            batch = []
    await asyncio.gather(*batch)


async def _create_node(kube, name: str, kind: str) -> None:
    from rocshare.api.models import API_VERSION
    from rocshare_dev.bench.fleet import gpu_node_object, node_object
    from rocshare.kube.client import object_path

    await _retrying(lambda: kube.create("/api/v1/nodes", node_object(name, kind)))
    body = gpu_node_object(name, kind)
    status = body.pop("status")
    path = object_path(API_VERSION, "amdgpunodes")
    await _retrying(lambda: kube.create(path, body))
    await _retrying(lambda: kube.merge_patch(f"{path}/{name}/status", {"status": status}))


def _bound_pods(node: str, kind: str, count: int, seed: int) -> list[dict]:
    """`count` pods of the mix placed on the node by the core allocator, as bound pod objects
    (drawn again from scratch when the first draws leave no room, e.g. two 4-GPU pods)."""
    from rocshare.api.models import Sharing
    from rocshare_dev.bench.fleet import draw_pods, gpu_node_status, pod_object
    from rocshare.core.allocate import allocate
    from rocshare.core.fit import FitFailure
    from rocshare.core.inventory import NodeInventory
    from rocshare.core.ledger import Ledger
    from rocshare.core.policies import Policy

    inventory = NodeInventory.from_gpu_infos(node, gpu_node_status(node, kind).gpus, Sharing())
    pods = draw_pods(random.Random(seed), f"{node}-pod")
    for _draw in range(20):
        ledger, bodies = Ledger(), []
        for pod in (next(pods) for _ in range(4 * count)):
            record = allocate(inventory, ledger.usage(inventory), pod.request, Policy())
            if isinstance(record, FitFailure):
                continue
            ledger.apply(record, pod.name)
            bodies.append(pod_object(pod.name, pod.resources, node=node, record=record))
            if len(bodies) == count:
                return bodies
    raise RuntimeError(f"{count} pods of the mix never fit on {node}")


async def _create_pod(kube, body: dict) -> None:
    from rocshare_dev.bench.fleet import NAMESPACE

    await _retrying(lambda: kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", body))


async def _retrying(call, attempts: int = 6) -> None:
    from rocshare.kube.client import Conflict, Unavailable

    for attempt in range(1, attempts + 1):
        try:
            await call()
            return
        except Conflict:
            return  # exists already (a retried create that had landed)
        except Unavailable:
            if attempt == attempts:
                raise
            await asyncio.sleep(0.2 * attempt)


# Runs `rocshare operator` with the API client's per-request timeout raised: at 20,000 pods the
# informers' first (unpaginated) LIST can take longer than the stock 30 s on a loaded machine, and the
# operator then exits (see the report). Used only when the stock run failed that way, and said so.
PATIENT_LAUNCHER = ("import sys; from rocshare.kube.client import Kube; "
                    "Kube.request.__kwdefaults__['timeout_s'] = float(sys.argv.pop(1)); "
                    "from rocshare.cli import main; sys.exit(main())")


def _operator_rss(cluster, settle_s: float = 20.0, *, extender: bool = True,
                  request_timeout_s: float | None = None) -> dict:
    """Start the operator, wait for /readyz (without the extender: until its CPU goes quiet),
    then sample its RSS while it settles."""
    from rocshare_dev.devcluster.controlplane import free_port, stop_process

    port, metrics_port = free_port(), free_port()
    log = open(cluster.logs / "bench-operator.log", "ab")  # noqa: SIM115 - owned by the child
    python = ([sys.executable, "-c", PATIENT_LAUNCHER, str(request_timeout_s)] if request_timeout_s
              else [sys.executable, "-m", "rocshare.cli"])
    command = [*python, "operator", f"--kubeconfig={cluster.kubeconfig}", "--standalone",
               "--no-webhook", "--namespace=rocshare-system", f"--extender-port={port}",
               f"--metrics-port={metrics_port}", *(() if extender else ("--no-extender",))]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    log.close()
    try:
        started = time.monotonic()
        if extender:
            _wait_ready(f"http://127.0.0.1:{port}/readyz", process, timeout_s=600)
        else:
            _wait_quiet(process, timeout_s=180)
        ready_s = time.monotonic() - started
        samples = []
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            samples.append(rss_mib(process.pid))
            time.sleep(1.0)
        return {"rss_mib": round(samples[-1], 1), "rss_max_mib": round(max(samples), 1),
                "request_timeout_s": request_timeout_s or 30.0,
                "peak_rss_mib": round(rss_mib(process.pid, "VmHWM"), 1), "ready_s": round(ready_s, 1),
                "cpu_s_to_settle": round(cpu_s(process.pid), 1)}
    finally:
        stop_process(process.pid, "operator")
        process.wait()


def _wait_ready(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    from rocshare_dev.devcluster.operator_proc import wait_ready

    def exited() -> str | None:
        return None if process.poll() is None else f"the operator exited ({process.returncode}) before it was ready"

    if not wait_ready(url, timeout_s, exited=exited):
        raise RuntimeError(f"the operator was not ready after {timeout_s:.0f} s")


def _wait_quiet(process: subprocess.Popen, timeout_s: float, window_s: float = 5.0) -> None:
    """Until the process used under 5 % of a core over the last window (its lists are done), or
    the timeout: Kopf alone may stay busy for minutes with tens of thousands of objects."""
    deadline = time.monotonic() + timeout_s
    time.sleep(window_s)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the operator exited ({process.returncode})")
        before = cpu_s(process.pid)
        time.sleep(window_s)
        if cpu_s(process.pid) - before < 0.05 * window_s:
            return


# ---- agent -----------------------------------------------------------------------------------


async def _measure_agent(cluster, work: Path, say, idle_s: float = 30.0) -> dict:
    from rocshare.api.models import Sharing
    from rocshare.api.node_settings import NodeSettings
    from rocshare_dev.devcluster.captures import FIXTURES, mi210_with_synthetic_vram
    from rocshare_dev.bench.e2e import wait_default_service_account
    from rocshare_dev.devcluster.simnode import SimulatedNode
    from rocshare.kube.client import Kube

    work.mkdir(parents=True, exist_ok=True)
    cluster.kubectl("create", "namespace", "agent-bench")
    settings = NodeSettings(pool="agent-bench", sharing=Sharing(split_count=AGENT_SPLIT_COUNT))
    node = SimulatedNode(name="agent-bench", kubeconfig=cluster.kubeconfig, work_dir=work, settings=settings,
                         sysfs_root=mi210_with_synthetic_vram(FIXTURES, work),
                         health_interval_s=AGENT_HEALTH_INTERVAL_S)
    kube = await Kube.connect(cluster.kubeconfig)
    try:
        await wait_default_service_account(kube, "agent-bench", timeout_s=60)
        node.start()
        status = await _published_status(kube, node.name)
        await asyncio.sleep(5.0)  # start-up work (discovery, first publish, registration) done
        pid = node.agent_pid
        cpu_before, idle_started = cpu_s(pid), time.monotonic()
        await asyncio.sleep(idle_s)
        idle = {"rss_mib": round(rss_mib(pid), 1),
                "cpu_pct": round(100 * (cpu_s(pid) - cpu_before) / (time.monotonic() - idle_started), 2)}
        say(f"agent idle: RSS {idle['rss_mib']:.0f} MiB, CPU {idle['cpu_pct']:.2f} %")
        burst = await _agent_burst(kube, node, status, settings.sharing)
        say(f"agent burst of {AGENT_BURST_PODS} pods: RSS peak {burst['peak_rss_mib']:.0f} MiB, "
            f"CPU {burst['cpu_pct']:.1f} % over {burst['wall_s']:.1f} s")
        return {"idle": idle, "burst": burst, "idle_window_s": idle_s, "split_count": AGENT_SPLIT_COUNT}
    finally:
        node.stop()
        await kube.close()


async def _published_status(kube, name: str, timeout_s: float = 60):
    from rocshare.api.models import API_VERSION, AmdGpuNodeStatus
    from rocshare.kube.client import NotFound, object_path

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            node = await kube.get(object_path("v1", "nodes", name))
            gpu_node = await kube.get(object_path(API_VERSION, "amdgpunodes", name))
            if int(node["status"].get("allocatable", {}).get("amd.com/gpu", "0")) and gpu_node.get("status"):
                return AmdGpuNodeStatus.model_validate(gpu_node["status"])
        except NotFound:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"node {name} published no GPUs within {timeout_s:.0f} s")


async def _agent_burst(kube, node, status, sharing) -> dict:
    from rocshare_dev.bench.fleet import pod_object
    from rocshare.core.allocate import allocate
    from rocshare.core.fit import FitFailure
    from rocshare.core.inventory import NodeInventory
    from rocshare.core.ledger import Ledger
    from rocshare.core.policies import Policy
    from rocshare.core.request import parse_pod

    inventory = NodeInventory.from_gpu_infos(node.name, status.gpus, sharing)
    ledger = Ledger()
    pid = node.agent_pid
    cpu_before, started = cpu_s(pid), time.monotonic()
    peak = rss_mib(pid)
    for serial in range(AGENT_BURST_PODS):
        body = pod_object(f"burst-{serial:03d}", BURST_POD, node=node.name)
        body["metadata"]["namespace"] = "agent-bench"
        request = parse_pod(body)
        record = allocate(inventory, ledger.usage(inventory), request, Policy())
        if isinstance(record, FitFailure):
            raise RuntimeError(f"burst pod {serial} does not fit: {record.summary()}")
        ledger.apply(record, request.name)
        pod = pod_object(request.name, BURST_POD, node=node.name,
                         record=record)
        pod["metadata"]["namespace"] = "agent-bench"
        await kube.create("/api/v1/namespaces/agent-bench/pods", pod)
        await _wait_running(kube, request.name)
        peak = max(peak, rss_mib(pid))
    wall = time.monotonic() - started
    return {"pods": AGENT_BURST_PODS, "wall_s": round(wall, 1),
            "cpu_pct": round(100 * (cpu_s(pid) - cpu_before) / wall, 1),
            "cpu_ms_per_pod": round(1000 * (cpu_s(pid) - cpu_before) / AGENT_BURST_PODS, 1),
            "peak_rss_mib": round(max(peak, rss_mib(pid, "VmHWM")), 1), "rss_after_mib": round(rss_mib(pid), 1)}


async def _wait_running(kube, name: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pod = await kube.get(f"/api/v1/namespaces/agent-bench/pods/{name}")
        phase = pod.get("status", {}).get("phase")
        if phase == "Running":  # the kubelet peer got the agent's Allocate answer (and set startTime)
            return
        if phase == "Failed":
            raise RuntimeError(f"burst pod {name} failed: {pod['status'].get('message')}")
        await asyncio.sleep(0.02)
    raise RuntimeError(f"burst pod {name} not Running after {timeout_s:.0f} s")
