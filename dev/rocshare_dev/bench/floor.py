"""`rocshare-dev bench floor`: what rocshare's configuration costs end to end when rocshare's own
processes cost nothing -- the ceiling of `bench e2e`'s ratio on this machine (issue 18).

A harness figure, not rocshare's behaviour. One control plane, one baseline fleet (the kubelet
peer's plain amd.com/gpu plugin, 8 GPUs a node, as `bench e2e`'s baseline); rounds alternate
two bursts of the same pods count, each timed create -> Running as `bench e2e` times them:

* plain -- kube-scheduler with no extender, pods `amd.com/gpu: 1` naming it (namespace
  bench-plain, which the admission policies' bindings leave out);
* floor -- everything rocshare configures and none of rocshare running: the pod
  ValidatingAdmissionPolicy and pod-defaults MutatingAdmissionPolicy (their parameters written as
  the operator writes them), kube-scheduler with the manifests' configuration (profile; extender
  filter, bind, node cache), and as the extender dev/floor-extender, a Go program that decides
  nothing: filter keeps the nodes it has bound the fewest pods to (the bench pool's spread), bind
  posts the Binding with the annotations of a rocshare record. `bench e2e`'s slice pods, no
  scheduler name (namespace bench-floor).

Alternating rounds, because one burst's rate moves by +-15 % on this shared machine. The floor
round has no operator, no agents and no device plugin of rocshare's: whatever it costs above
plain is the configuration's, and `bench e2e`'s ratio cannot beat `floor_ratio_to_plain`.

    run_floor(*, nodes=500, pods=2000, rounds=2, burst_timeout_s=180.0, drop=(), json_out=DEFAULT_JSON_OUT) -> dict

`drop` leaves parts of the configuration out ("admission", "full-scoring"), to price each. The
figures: `floor_ratio_to_plain` (the mean of the rounds' floor / plain pods/s), per round, CPU per
pod and by process (means), and checks that the floor measured what it says
(`floor_extender_binds_by_round`: the burst's pods and the warm-up; `floor_pods_as_rocshare_binds_by_round`:
pods on rocshare's profile carrying a record).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from rocshare_dev.bench import e2e
from rocshare_dev.bench.burst import BurstResult, delete_all
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, SCHEDULER_CONFIG, ControlPlane, Ports, stop_process
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simfleet import SimulatedFleet
from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, DeviceSlice, encode_record
from rocshare.api.hami import companion_annotations
from rocshare.kube.client import Kube, object_path
from rocshare_operator.admission.policy_params import CONFIGMAP, admission_params

DEFAULT_JSON_OUT = PROJECT_ROOT / ".cache" / "bench" / "floor.json"
SOURCE = PROJECT_ROOT / "dev" / "floor-extender"
BINARY = PROJECT_ROOT / ".cache" / "bench" / "floor-extender"
PLAIN, FLOOR = "bench-plain", "bench-floor"
GPUS_PER_NODE = 8
DROPPABLE = ("admission", "full-scoring")
POLICY_BINDINGS = ("validatingadmissionpolicybinding/rocshare-pods", "mutatingadmissionpolicybinding/rocshare-pod-defaults")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=500, help="simulated nodes (default: 500)")
    parser.add_argument("--pods", type=int, default=2000, help="pods per burst (default: 2000)")
    parser.add_argument("--rounds", type=int, default=2, help="plain + floor burst pairs (default: 2)")
    parser.add_argument("--burst-timeout-s", type=float, default=180.0, help="deadline per burst (default: 180.0)")
    parser.add_argument("--drop", action="append", choices=DROPPABLE, default=[],
                        help="leave one part of rocshare's configuration out of the floor, to see what it costs: "
                             "admission (no pod policies; the floor's pods name the profile themselves), "
                             "full-scoring (the profile without percentageOfNodesToScore: 100); repeatable")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_JSON_OUT, help="where to write the figures")


def run(args: argparse.Namespace) -> int:
    figures = run_floor(nodes=args.nodes, pods=args.pods, rounds=args.rounds, burst_timeout_s=args.burst_timeout_s,
                        drop=tuple(args.drop), json_out=args.json_out)
    print(json.dumps(figures, indent=2))
    return 0 if figures["floor_all_ran"] else 1


def run_floor(*, nodes: int = 500, pods: int = 2000, rounds: int = 2, burst_timeout_s: float = 180.0,
              drop: tuple[str, ...] = (), json_out: Path | None = DEFAULT_JSON_OUT) -> dict[str, Any]:
    if nodes * GPUS_PER_NODE < pods:
        raise ValueError(f"{pods} pods of one GPU each do not fit on {nodes} nodes of {GPUS_PER_NODE} GPUs")
    binary = build_floor_extender()
    with tempfile.TemporaryDirectory(prefix="rocshare-bench-floor-") as work:
        bursts = asyncio.run(_run(Path(work), binary, nodes=nodes, pods=pods, rounds=rounds,
                                  burst_timeout_s=burst_timeout_s, drop=drop))
    figures = {**floor_figures(bursts, nodes=nodes, pods=pods), "floor_dropped": sorted(drop)}
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def build_floor_extender() -> Path:
    """dev/floor-extender built with the machine's Go (standard library only)."""
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["go", "build", "-o", str(BINARY), "."], cwd=SOURCE, capture_output=True, text=True,
                            check=False, env={**os.environ, "CGO_ENABLED": "0"})
    if result.returncode != 0:
        raise RuntimeError(f"go build in {SOURCE} failed: {result.stderr.strip()[-2000:]}")
    return BINARY


async def _run(root: Path, binary: Path, *, nodes: int, pods: int, rounds: int, burst_timeout_s: float,
               drop: tuple[str, ...]) -> list[dict[str, Any]]:
    cluster = ControlPlane(root=root / "cluster", ports=Ports.free(), with_scheduler=False)
    stack = e2e.Stack(cluster)
    extender: subprocess.Popen | None = None
    try:
        cluster.start()
        async with await Kube.connect(cluster.kubeconfig) as kube:
            for namespace in (PLAIN, FLOOR, "rocshare-system"):
                await kube.create(object_path("v1", "namespaces"), {"metadata": {"name": namespace}})
            fleet = SimulatedFleet(kubeconfig=cluster.kubeconfig, work_dir=root / "nodes", node_count=nodes,
                                   baseline_gpus=GPUS_PER_NODE, prefix="base-", labels=e2e.SIM_LABEL)
            stack.fleets.append(fleet)
            await fleet.start(kube)
            profile = _profile_name()
            floor_spec = {"schedulerName": profile} if "admission" in drop else {}
            if "admission" not in drop:
                await _install_rocshare_admission(cluster, kube, profile)
            config = _floor_scheduler_config(cluster, full_scoring="full-scoring" not in drop)
            extender = _start_floor_extender(cluster, binary, root)
            stack.extra_pids["floor-extender"] = extender.pid
            bursts = []
            for _ in range(rounds):
                bursts.append(await _plain_burst(stack, kube, pods, burst_timeout_s))
                bursts.append(await _floor_burst(stack, kube, pods, burst_timeout_s, config, floor_spec, profile))
            return bursts
    finally:
        if extender is not None:
            stop_process(extender.pid, "floor-extender")
        stack.stop()


async def _plain_burst(stack: e2e.Stack, kube: Kube, pods: int, timeout_s: float) -> dict[str, Any]:
    stack.baseline_scheduler = e2e.start_baseline_scheduler(stack.cluster)
    try:
        result = await e2e.measured_burst(stack, kube, PLAIN, pods, {"amd.com/gpu": "1"},
                                          {"schedulerName": e2e.BASELINE_SCHEDULER}, timeout_s)
        await delete_all(kube, PLAIN)
    finally:
        stack.stop_baseline_scheduler()
    return {"kind": "plain", **result}


async def _floor_burst(stack: e2e.Stack, kube: Kube, pods: int, timeout_s: float, config: Path,
                       spec: dict[str, Any], profile: str) -> dict[str, Any]:
    cluster = stack.cluster
    _extender_call(cluster, "reset")
    cluster.start_scheduler(config_path=config)
    try:
        result = await e2e.measured_burst(stack, kube, FLOOR, pods, e2e.SLICE, spec, timeout_s)
        binds = _extender_call(cluster, "binds")["binds"]
        as_rocshare = await _pods_as_rocshare_binds(kube, profile)
        await delete_all(kube, FLOOR)
    finally:
        stop_process(cluster.pids.pop("kube-scheduler"), "kube-scheduler")
    return {"kind": "floor", "floor_extender_binds": binds, "floor_pods_as_rocshare_binds": as_rocshare, **result}


async def _pods_as_rocshare_binds(kube: Kube, profile: str) -> int:
    """The burst's pods that are what rocshare's bind leaves: on rocshare's profile, with the record."""
    pods = (await kube.list(object_path("v1", "pods", namespace=FLOOR))).get("items", [])
    return sum(1 for pod in pods if pod["spec"].get("schedulerName") == profile
               and ALLOCATION_ANNOTATION in (pod["metadata"].get("annotations") or {}))


def _profile_name() -> str:
    return yaml.safe_load(SCHEDULER_CONFIG.read_text())["profiles"][0]["schedulerName"]


def _floor_scheduler_config(cluster: ControlPlane, *, full_scoring: bool) -> Path:
    """The manifests' kube-scheduler configuration as the dev control plane runs it (extender on
    its port), without percentageOfNodesToScore when `full_scoring` is off."""
    config = yaml.safe_load(cluster._write_scheduler_config().read_text())
    if not full_scoring:
        config["profiles"][0].pop("percentageOfNodesToScore", None)
    path = cluster.root / "kube-scheduler-floor.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def _install_rocshare_admission(cluster: ControlPlane, kube: Kube, profile: str) -> None:
    """rocshare's pod policies as `bench e2e` installs them, their bindings also leaving out the
    plain namespace, and the parameters the operator would write; then wait until dry-run creates
    show a floor pod defaulted and a plain one left alone (the API server's policy caches are filled)."""
    operator = OperatorProcess(cluster)
    operator.install_admission_policies()
    if not operator.serves_mutating_admission_policy():
        raise RuntimeError("this kube-apiserver does not serve MutatingAdmissionPolicy: the floor needs it")
    for binding in POLICY_BINDINGS:
        cluster.kubectl("patch", binding, "--type=json", "-p", json.dumps([
            {"op": "add", "path": "/spec/matchResources/namespaceSelector/matchExpressions/0/values/-", "value": PLAIN}]))
    await kube.create(object_path("v1", "configmaps", namespace="rocshare-system"),
                      {"metadata": {"name": CONFIGMAP}, "data": admission_params({}, scheduler_name=profile)})
    plain_spec = {"schedulerName": e2e.BASELINE_SCHEDULER}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        floor_pod = await _dry_run_create(kube, FLOOR, e2e.SLICE, {})
        plain_pod = await _dry_run_create(kube, PLAIN, {"amd.com/gpu": "1"}, plain_spec)
        if floor_pod["spec"].get("schedulerName") == profile and plain_pod["spec"]["schedulerName"] == e2e.BASELINE_SCHEDULER:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"rocshare's pod-defaults policy did not set schedulerName {profile} in {FLOOR} "
                       f"and leave {PLAIN} alone within 60 s")


async def _dry_run_create(kube: Kube, namespace: str, limits: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return await kube.request("POST", object_path("v1", "pods", namespace=namespace),
                              body=e2e.bench_pod("dry-run", namespace, limits, spec), query={"dryRun": "All"})


def _start_floor_extender(cluster: ControlPlane, binary: Path, root: Path) -> subprocess.Popen:
    annotations = root / "record-annotations.json"
    annotations.write_text(json.dumps(record_annotations("@NODE@")))
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    with open(cluster.logs / "floor-extender.log", "ab") as log:
        process = subprocess.Popen([str(binary), f"--listen=127.0.0.1:{cluster.ports.extender}", f"--server={server}",
                                    f"--cert={cluster.pki / 'admin.crt'}", f"--key={cluster.pki / 'admin.key'}",
                                    f"--ca={cluster.pki / 'ca.crt'}", f"--annotations={annotations}",
                                    f"--gpus-per-node={GPUS_PER_NODE}"],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"floor-extender exited; see {cluster.logs / 'floor-extender.log'}")
        try:
            _extender_call(cluster, "binds")
            return process
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("floor-extender did not answer within 30 s")


def _extender_call(cluster: ControlPlane, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.ports.extender}/{path}", timeout=5) as answer:
        return json.loads(answer.read())


def record_annotations(node: str) -> dict[str, str]:
    """The annotations rocshare's bind writes for `bench e2e`'s slice pod (4 GiB, 25 % of an MI210's
    104 CUs) on one GPU of `node`: the record and HAMi's companions, so the floor's pods are about as
    large (the GPU id is PCI-style, 8 characters shorter than an MI210's GPU-<16 hex> id)."""
    gpu_id = "0000:c3:00.0"
    record = AllocationRecord(node=node, containers=[ContainerAllocation(name="c0", devices=[
        DeviceSlice(gpuId=gpu_id, memoryMiB=4096, cuRanges=[(0, 25)], cuCount=26, coresPct=25)])])
    return {ALLOCATION_ANNOTATION: encode_record(record),
            **companion_annotations(record, device_types={gpu_id: "AMD Instinct MI210"}, container_names=["c0"],
                                    now_s=int(time.time()))}


def floor_figures(bursts: list[dict[str, Any]], *, nodes: int, pods: int) -> dict[str, Any]:
    """Per-round and overall figures; a round whose bursts did not all run has no ratio."""
    plain = [b for b in bursts if b["kind"] == "plain"]
    floor = [b for b in bursts if b["kind"] == "floor"]
    ratios = [_ratio(f["burst"], p["burst"]) for p, f in zip(plain, floor)]
    measured = [r for r in ratios if r is not None]
    return {
        "floor_nodes": nodes, "floor_pods": pods, "floor_rounds": len(ratios),
        "floor_all_ran": all(b["burst"].running == pods for b in bursts),
        "floor_plain_pods_per_s_by_round": [round(b["burst"].pods_per_s, 1) for b in plain],
        "floor_pods_per_s_by_round": [round(b["burst"].pods_per_s, 1) for b in floor],
        "floor_ratio_to_plain_by_round": [round(r, 3) if r is not None else None for r in ratios],
        "floor_ratio_to_plain": round(sum(measured) / len(measured), 3) if measured else None,
        "floor_target_ratio": e2e.TARGET_RATIO,
        "floor_plain_cpu_ms_per_pod": _mean(e2e.cpu_ms_per_pod(b["cpu_s"], b["burst"].running) for b in plain),
        "floor_cpu_ms_per_pod": _mean(e2e.cpu_ms_per_pod(b["cpu_s"], b["burst"].running) for b in floor),
        "floor_plain_cpu_s_by_process": _mean_by_process(plain),
        "floor_cpu_s_by_process": _mean_by_process(floor),
        "floor_extender_binds_by_round": [b["floor_extender_binds"] for b in floor],
        "floor_pods_as_rocshare_binds_by_round": [b["floor_pods_as_rocshare_binds"] for b in floor],
        "floor_api_requests_per_pod": e2e.requests_per_pod(floor[-1]["requests"], floor[-1]["burst"].running)
        if floor else {},
        "floor_note": "harness figure: rocshare's admission policies, scheduler profile and extender protocol "
                      "with a Go extender that decides nothing, and no operator or agent; bench e2e's ratio "
                      "cannot beat it",
    }


def _ratio(ours: BurstResult, plain: BurstResult) -> float | None:
    return ours.pods_per_s / plain.pods_per_s if ours.pods_per_s and plain.pods_per_s else None


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 1) if values else None


def _mean_by_process(bursts: list[dict[str, Any]]) -> dict[str, float]:
    names = sorted({name for b in bursts for name in b["cpu_s"]})
    return {name: round(sum(b["cpu_s"].get(name, 0.0) for b in bursts) / len(bursts), 1) for name in names} if bursts else {}
