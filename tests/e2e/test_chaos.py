"""Chaos on the real control plane: a stream of GPU pods while the operator is SIGKILLed,
node agents and kubelet peers restart (their sockets vanish) and kube-apiserver restarts.

Simulated nodes come from the fixture captures: MI210 (copy with a synthetic 64 GiB VRAM per
GPU, see fleet.mi210_with_synthetic_vram), Strix Point APU, Vega10 and MI300X in partition mode
(63 CPX partitions). Pods ask for whole GPUs, slices, several GPUs, numa/link binding, in
three namespaces (two with quotas); each lives a few seconds once Running, then is deleted.

Invariants from what the containers received (rocshare_dev/devcluster/evidence.py): a watch sees every pod the
kubelet peer admitted, with the devices and environment it handed each container, and checks it
against every pod holding GPUs at that moment -- no GPU handed whole to two pods, disjoint CU
masks, memory limits within VRAM. At least MIN_PODS_CHECKED pods must have been checked so, and
every pod the polls saw Running among them; a failed pod stops counting at the version that
shows it failed (and one the kubelet rejected was never handed a device).

Besides, checked every couple of seconds and at the end, recomputed from every pod's
allocation record and the AmdGpuNode inventories (never from the extender's own view):
* no GPU over its memory, CUs or splitCount; a whole GPU has no co-tenant; no two holders of a
  GPU have overlapping CU ranges (a holder reserving every CU overlaps any other range holder);
* every Running pod's environment (what the kubelet peer handed the runtime) is what its own
  allocation record implies;
* after the faults stop, every pod still waiting is bound within 60 s;
* after every pod is deleted, every GPU is empty: no allocation record anywhere, the extender's
  `hami_gpu_memory_allocated_bytes` is 0 for every GPU, and a pod asking for all of a node's
  GPUs runs on every node.

Short form by default (6 nodes, ~90 s of faults, part of `make test`); `ROCSHARE_CHAOS=long`
(`make chaos`) runs 20 nodes for 6 minutes. Seeded (`ROCSHARE_CHAOS_SEED`, default 9).
The figures are printed, and written as JSON to `$ROCSHARE_CHAOS_REPORT` when set.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationError, AllocationRecord, decode_record
from rocshare.api.models import API_VERSION
from rocshare.core.cumask import render_hsa_cu_mask
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode
from rocshare.kube.client import ApiError, Kube, object_path
from rocshare_dev.devcluster.simnode import runtime_specs
from rocshare_dev.devcluster.evidence import PodEvidence, stop_tasks
from tests.e2e.fleet import gpu_pod, mi210_with_synthetic_vram

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

LONG = os.environ.get("ROCSHARE_CHAOS") == "long"
SEED = int(os.environ.get("ROCSHARE_CHAOS_SEED", "9"))
LABEL = "rocshare-chaos"
NAMESPACES = {"chaos-a": {"limits.amd.com/gpumem": "200000", "limits.amd.com/gpucores": "600"},
              "chaos-b": {"limits.amd.com/gpumem": "140000", "limits.amd.com/gpucores": "450"},
              "chaos-c": None}
BIND_DEADLINE_S = 60.0
AGENT_SOCKET = "rocshare-amdgpu.sock"
ROCR_UUID = re.compile(r"^GPU-[0-9a-fA-F]{16}$")


@dataclass(frozen=True)
class Profile:
    name: str
    nodes: dict[str, int]
    fault_phase_s: float
    fault_gap_s: tuple[float, float]
    pods_per_s: float
    live_per_node: int


SHORT = Profile("short", {"mi210": 2, "apu": 2, "vega10": 1, "mi300x": 1}, 90, (4, 8), 2.0, 3)
LONG_PROFILE = Profile("long", {"mi210": 7, "apu": 5, "vega10": 5, "mi300x": 3}, 360, (3, 7), 3.0, 3)
PROFILE = LONG_PROFILE if LONG else SHORT
MIN_PODS_CHECKED = 40 if not LONG else 300
"""The short run admits ~100 pods at seed 9; fewer checked means the run did not really run."""
FAULT_WEIGHTS = {"operator_sigkill": 3, "agent_restart": 3, "kubelet_restart": 3, "apiserver_restart": 1}


# ---- the fleet ---------------------------------------------------------------------------------


def sysfs_for(kind: str, fixtures: Path, work: Path) -> Path:
    return {"mi210": lambda: mi210_with_synthetic_vram(fixtures, work), "apu": lambda: fixtures / "strixpoint-apu",
            "vega10": lambda: fixtures / "vega10-1gpu", "mi300x": lambda: fixtures / "mi300x-8gpu-cpx"}[kind]()


def pool(kind: str) -> dict:
    sharing = {"operatingMode": "partition"} if kind == "mi300x" else {}
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": f"chaos-{kind}"},
            "spec": {"nodeSelector": {"rocshare.io/sim": f"chaos-{kind}"}, "sharing": sharing}}


@dataclass
class Fleet:
    operator: OperatorProcess
    nodes: dict[str, SimulatedNode]
    kinds: dict[str, str]


@pytest.fixture(scope="module")
def fleet(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("chaos")
    for namespace, hard in NAMESPACES.items():
        cluster.kubectl("create", "namespace", namespace)
        if hard:
            quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": namespace},
                     "spec": {"hard": hard}}
            cluster.kubectl("apply", "-f", "-", input_text=json.dumps(quota))
    operator = OperatorProcess(cluster)
    operator.start()
    operator.install_webhooks()
    kinds: dict[str, str] = {}
    nodes: dict[str, SimulatedNode] = {}
    for kind, count in PROFILE.nodes.items():
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pool(kind)))
        for index in range(count):
            name = f"chaos-{kind}-{index}"
            kinds[name] = kind
            nodes[name] = SimulatedNode(name=name, kubeconfig=cluster.kubeconfig, work_dir=work,
                                        sysfs_root=sysfs_for(kind, sysfs_fixtures, work), health_interval_s=2.0,
                                        labels={"rocshare.io/sim": f"chaos-{kind}", LABEL: "1"})
    try:
        with ThreadPoolExecutor(4) as pool_:
            list(pool_.map(lambda node: node.start(timeout_s=60), nodes.values()))
        yield Fleet(operator, nodes, kinds)
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        for namespace in NAMESPACES:
            cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0",
                            "--wait=false", check=False)
        for node in nodes.values():
            node.stop()
        operator.stop()
        cluster.kubectl("delete", "amdgpupools", *(f"chaos-{kind}" for kind in PROFILE.nodes), "--ignore-not-found",
                        "--wait=false", check=False)
        for namespace in NAMESPACES:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# ---- random requests -----------------------------------------------------------------------------


def random_pod(rng: random.Random, name: str, kind: str) -> dict:
    """A pod for one pool; every request fits an empty node of that pool and any namespace quota."""
    namespace = rng.choice(sorted(NAMESPACES))
    annotations: dict[str, str] = {}
    containers: list[dict[str, str]]
    if kind == "mi300x":  # partition mode: whole partitions only
        containers = [{"gpu": str(rng.choice((1, 1, 2, 4)))}]
        if rng.random() < 0.3:
            annotations["amd.com/numa-bind"] = "true"
    elif kind == "mi210":
        shape = rng.choice(("whole", "slice", "slice", "multi", "percent", "two-containers"))
        if shape == "whole":
            containers = [{"gpu": str(rng.choice((1, 2)))}]
        elif shape == "slice":
            containers = [{"gpu": "1", "gpumem": str(rng.randrange(1024, 16385, 512)),
                           "gpucores": str(rng.randrange(5, 51))}]
        elif shape == "multi":
            containers = [{"gpu": str(rng.choice((2, 3, 4))), "gpumem": str(rng.randrange(1024, 8193, 512)),
                           "gpucores": str(rng.randrange(5, 31))}]
            annotations[rng.choice(("amd.com/numa-bind", "amd.com/link-bind"))] = "true"
        elif shape == "percent":
            containers = [{"gpumem-percentage": str(rng.randrange(5, 31)), "gpucores": str(rng.randrange(5, 26))}]
        else:
            containers = [{"gpu": "1", "gpumem": "2048", "gpucores": "10"},
                          {"gpu": "1", "gpumem": "1024", "gpucores": str(rng.randrange(5, 21))}]
    else:  # one-GPU nodes: APU (12 CUs, RDNA) and Vega10
        if rng.random() < 0.15:
            containers = [{"gpu": "1"}]
        else:
            containers = [{"gpu": "1", "gpumem": str(rng.randrange(256, 4097, 256)),
                           "gpucores": str(rng.randrange(5, 41))}]
    pod = gpu_pod(name, namespace=namespace, containers=containers, annotations=annotations,
                  node_selector={"rocshare.io/pool": f"chaos-{kind}"})
    pod["metadata"]["labels"] = {LABEL: "1"}
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    return pod


# ---- invariants (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    memory_mib: int
    cu_count: int
    split_count: int


@dataclass(frozen=True)
class Holder:
    pod: str
    container: str
    memory_mib: int
    cu_count: int
    cu_ranges: tuple[tuple[int, int], ...]
    whole: bool
    reserves_all_cores: bool


def capacities(gpu_nodes: list[dict]) -> dict[tuple[str, str], Capacity]:
    """(node, gpu id) -> what it offers: registered VRAM, CUs, split count (1 for a partition)."""
    offered = {}
    for obj in gpu_nodes:
        status = obj.get("status") or {}
        scaling = float(status.get("deviceMemoryScaling", 1.0))
        for gpu in status.get("gpus", []):
            split = 1 if gpu.get("partition") or status.get("operatingMode") == "partition" else gpu["splitCount"]
            offered[(obj["metadata"]["name"], gpu["id"])] = Capacity(
                int((gpu.get("vramMiB") or 0) * scaling), gpu["cuCount"], split)
    return offered


def holding(pods: list[dict]) -> tuple[dict[tuple[str, str], list[Holder]], list[str]]:
    """Every live pod's committed slices per (node, GPU), and the pods whose record is undecodable."""
    held: dict[tuple[str, str], list[Holder]] = {}
    broken = []
    for pod in pods:
        text = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
        if text is None or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        try:
            record = decode_record(text)
        except AllocationError as error:
            broken.append(f"{name}: {error}")
            continue
        for container in record.containers:
            for device in container.devices:
                held.setdefault((record.node, device.gpu_id), []).append(Holder(
                    name, container.name, device.memory_mib, device.cu_count, tuple(map(tuple, device.cu_ranges)),
                    device.whole, device.reserves_all_cores))
    return held, broken


def gpu_violations(offered: dict[tuple[str, str], Capacity], held: dict[tuple[str, str], list[Holder]]) -> list[str]:
    problems = []
    for (node, gpu), holders in sorted(held.items()):
        where = f"{node}/{gpu}"
        capacity = offered.get((node, gpu))
        if capacity is None:
            problems.append(f"{where}: held by {[h.pod for h in holders]} but not in the node's inventory")
            continue
        pods = {h.pod for h in holders}
        if any(h.whole for h in holders) and len(holders) > 1:
            problems.append(f"{where}: a whole GPU shared by {sorted(pods)}")
        if len(pods) > capacity.split_count:
            problems.append(f"{where}: {len(pods)} pods > splitCount {capacity.split_count}")
        memory = sum(h.memory_mib for h in holders if not h.whole)
        if memory > capacity.memory_mib and not all(h.whole for h in holders):
            problems.append(f"{where}: {memory} MiB held > {capacity.memory_mib} MiB")
        cus = sum(h.cu_count for h in holders if h.cu_ranges)
        if cus > capacity.cu_count:
            problems.append(f"{where}: {cus} CUs pinned > {capacity.cu_count}")
        problems.extend(f"{where}: {problem}" for problem in overlaps(holders, capacity.cu_count))
    return problems


def overlaps(holders: list[Holder], cu_total: int) -> list[str]:
    spans = []
    for holder in holders:
        if holder.reserves_all_cores or holder.whole:
            spans.append((holder, {(0, cu_total - 1)}))
        elif holder.cu_ranges:
            spans.append((holder, set(holder.cu_ranges)))
    problems = []
    for i, (first, first_ranges) in enumerate(spans):
        for second, second_ranges in spans[i + 1:]:
            if any(a <= d and c <= b for a, b in first_ranges for c, d in second_ranges):
                problems.append(f"CU ranges of {first.pod}:{first.container} {sorted(first_ranges)} and "
                                f"{second.pod}:{second.container} {sorted(second_ranges)} overlap")
    return problems


def expected_envs(record: AllocationRecord, inventory: dict[str, dict]) -> dict[str, dict[str, str]]:
    """Per container, the variables its record alone implies (DESIGN.md section 4)."""
    expected = {}
    for container in record.containers:
        gpus = [inventory[device.gpu_id] for device in container.devices]
        kfd_position = {gpu["id"]: position for position, gpu in enumerate(sorted(gpus, key=lambda g: g["index"]))}
        envs = {"ROCR_VISIBLE_DEVICES": ",".join(gpu["id"] if ROCR_UUID.match(gpu["id"]) else str(kfd_position[gpu["id"]])
                                                 for gpu in gpus),
                "HIP_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpus)))}
        if mask := render_hsa_cu_mask(container.devices):
            envs["HSA_CU_MASK"] = mask
        for i, device in enumerate(container.devices):
            if not device.whole:
                envs[f"HIP_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.memory_mib}m"
        expected[container.name] = envs
    return expected


def env_violations(pods: list[dict], gpu_nodes: list[dict]) -> list[str]:
    inventories = {obj["metadata"]["name"]: {gpu["id"]: gpu for gpu in (obj.get("status") or {}).get("gpus", [])}
                   for obj in gpu_nodes}
    problems = []
    for pod in pods:
        annotations = pod["metadata"].get("annotations") or {}
        runtime = runtime_specs(pod)
        if pod.get("status", {}).get("phase") != "Running" or runtime is None:
            continue
        name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        if ALLOCATION_ANNOTATION not in annotations:
            problems.append(f"{name}: Running with GPUs but no allocation record")
            continue
        try:
            record = decode_record(annotations[ALLOCATION_ANNOTATION])
        except AllocationError as error:
            problems.append(f"{name}: Running with an undecodable allocation record: {error}")
            continue
        if record.node != pod["spec"].get("nodeName"):
            problems.append(f"{name}: record names {record.node}, pod runs on {pod['spec'].get('nodeName')}")
            continue
        try:
            wanted = expected_envs(record, inventories.get(record.node, {}))
        except KeyError as missing:
            problems.append(f"{name}: record names GPU {missing} unknown on {record.node}")
            continue
        for container, envs in wanted.items():
            got = (runtime.get(container) or {}).get("envs") or {}
            for key, value in envs.items():
                if got.get(key) != value:
                    problems.append(f"{name}:{container}: {key}={got.get(key)!r}, its record implies {value!r}")
    return problems


# ---- the run ----------------------------------------------------------------------------------------


@dataclass
class Figures:
    profile: str
    seed: int
    nodes: int
    gpus: int
    pods_created: int = 0
    pods_ran: int = 0
    pods_checked_from_containers: int = 0
    pods_failed: Counter = field(default_factory=Counter)
    create_refused: Counter = field(default_factory=Counter)
    faults: Counter = field(default_factory=Counter)
    recovery_s: dict[str, float] = field(default_factory=dict)
    checks: int = 0
    violations: list[str] = field(default_factory=list)
    api_errors: int = 0
    post_fault_bind_s: float = 0.0
    leaked_records: int = 0
    leaked_extender_bytes: int = 0
    probe_pods_ran: int = 0
    fault_phase_s: float = 0.0
    total_s: float = 0.0
    peak_rss_mib: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "seed": self.seed, "nodes": self.nodes, "gpus": self.gpus,
                "pods_created": self.pods_created, "pods_ran": self.pods_ran,
                "pods_checked_from_containers": self.pods_checked_from_containers,
                "pods_failed_by_reason": dict(self.pods_failed), "creates_refused_by_kind": dict(self.create_refused),
                "faults_by_kind": dict(self.faults), "longest_recovery_s_by_kind": self.recovery_s,
                "longest_recovery_s": max([self.post_fault_bind_s, *self.recovery_s.values()], default=0.0),
                "post_fault_all_bound_s": self.post_fault_bind_s, "invariant_checks": self.checks,
                "invariant_violations": len(self.violations), "violation_samples": self.violations[:20],
                "leaked_records": self.leaked_records, "leaked_extender_bytes": self.leaked_extender_bytes,
                "probe_pods_ran": self.probe_pods_ran, "transient_api_errors": self.api_errors,
                "fault_phase_s": round(self.fault_phase_s, 1), "total_s": round(self.total_s, 1),
                "fleet_rss_mib": round(self.peak_rss_mib)}


PODS = object_path("v1", "pods")


class Chaos:
    def __init__(self, kube: Kube, cluster, fleet: Fleet) -> None:
        self.kube, self.cluster, self.fleet = kube, cluster, fleet
        self.rng = random.Random(SEED)
        self.fault_rng = random.Random(SEED + 1)
        self.expected_gpus = {}
        self.figures = Figures(PROFILE.name, SEED, len(fleet.nodes), 0)
        self.running_since: dict[str, float] = {}
        self.lifetime: dict[str, float] = {}
        self.seen_running: set[str] = set()
        self.seen_failed: set[str] = set()
        self.faults_on = True
        self.creating = True
        self.serial = 0

    async def pods(self) -> list[dict]:
        return (await self.kube.list(PODS, labelSelector=f"{LABEL}=1")).get("items", [])

    async def gpu_nodes(self) -> list[dict]:
        items = (await self.kube.list(object_path(API_VERSION, "amdgpunodes"))).get("items", [])
        return [obj for obj in items if obj["metadata"]["name"] in self.fleet.nodes]

    # -- loops --

    async def create_loop(self) -> None:
        limit = PROFILE.live_per_node * len(self.fleet.nodes)
        while self.creating:
            await asyncio.sleep(1 / PROFILE.pods_per_s)
            if len(self.lifetime) >= limit:
                continue
            self.serial += 1
            node = self.rng.choice(sorted(self.fleet.nodes))
            pod = random_pod(self.rng, f"chaos-{self.serial:05d}", self.fleet.kinds[node])
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            try:
                await self.kube.create(object_path("v1", "pods", namespace=pod["metadata"]["namespace"]), pod)
            except ApiError as error:
                self.figures.create_refused[_refusal_kind(error)] += 1
                continue
            self.figures.pods_created += 1
            self.lifetime[key] = self.rng.uniform(1.0, 6.0)

    async def reap_loop(self) -> None:
        """Deletes pods whose time is up (Running ones) and failed ones, counting both."""
        while True:
            await asyncio.sleep(0.5)
            try:
                pods = await self.pods()
            except ApiError:
                self.figures.api_errors += 1
                continue
            now = time.monotonic()
            present = set()
            for pod in pods:
                key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
                present.add(key)
                phase = pod.get("status", {}).get("phase")
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                if phase == "Running" and key not in self.seen_running:
                    self.seen_running.add(key)
                    self.figures.pods_ran += 1
                    self.running_since[key] = now
                if phase == "Failed" and key not in self.seen_failed:
                    self.seen_failed.add(key)
                    self.figures.pods_failed[pod.get("status", {}).get("reason") or "Failed"] += 1
                    if not self.faults_on:
                        self.figures.violations.append(f"{key} failed after the faults stopped: "
                                                       f"{pod.get('status', {}).get('message')}")
                done = phase == "Failed" or (key in self.running_since
                                             and now - self.running_since[key] > self.lifetime.get(key, 0))
                if done:
                    await self._delete(key)
            for key in list(self.lifetime):
                if key not in present:
                    self.lifetime.pop(key, None)
                    self.running_since.pop(key, None)

    async def _delete(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        try:
            await self.kube.delete(object_path("v1", "pods", name, namespace=namespace))
        except ApiError:
            self.figures.api_errors += 1

    async def check_loop(self) -> None:
        """Checks every 2 s; an API error is counted (the API server restarts), anything else ends the
        loop with its exception, which the test raises (raise_failures)."""
        while True:
            await asyncio.sleep(2.0)
            try:
                await self.check()
            except ApiError:
                self.figures.api_errors += 1

    async def check(self) -> None:
        pods, gpu_nodes = await self.pods(), await self.gpu_nodes()
        held, broken = holding(pods)
        problems = broken + gpu_violations(capacities(gpu_nodes), held) + env_violations(pods, gpu_nodes)
        self.figures.checks += 1
        for problem in problems:
            if problem not in self.figures.violations:
                print("VIOLATION", problem)
                self.figures.violations.append(problem)

    async def fault_loop(self) -> None:
        kinds = list(FAULT_WEIGHTS)
        weights = [FAULT_WEIGHTS[k] for k in kinds]
        deadline = time.monotonic() + PROFILE.fault_phase_s
        first = self.fault_rng.sample(kinds, len(kinds))  # every kind at least once, even in the short run
        while time.monotonic() < deadline:
            await asyncio.sleep(self.fault_rng.uniform(*PROFILE.fault_gap_s))
            kind = first.pop() if first else self.fault_rng.choices(kinds, weights)[0]
            node = self.fleet.nodes[self.fault_rng.choice(sorted(self.fleet.nodes))]
            started, wall = time.monotonic(), time.time()
            await asyncio.to_thread(self._inject, kind, node)
            await self._recovered(kind, node, wall)
            took = time.monotonic() - started
            self.figures.faults[kind] += 1
            self.figures.recovery_s[kind] = round(max(took, self.figures.recovery_s.get(kind, 0.0)), 2)
            print(f"fault {kind} {node.name if 'restart' in kind and 'api' not in kind else ''}: recovered in {took:.1f} s")

    def _inject(self, kind: str, node: SimulatedNode) -> None:
        if kind == "operator_sigkill":
            self.fleet.operator.kill()
            time.sleep(self.fault_rng.uniform(0, 2))
            self.fleet.operator.start()
        elif kind == "agent_restart":
            node.restart_agent()
        elif kind == "kubelet_restart":
            node.restart_kubelet()
        else:
            self.cluster.restart_apiserver()

    async def _recovered(self, kind: str, node: SimulatedNode, since: float) -> None:
        """The component serves again: for a node, the agent re-registered (a new socket) and the
        kubelet offers all its devices again."""
        if kind not in ("agent_restart", "kubelet_restart"):
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not _socket_newer_than(node.plugin_dir / AGENT_SOCKET, since):
                await asyncio.sleep(0.1)
                continue
            try:
                obj = await self.kube.get(object_path("v1", "nodes", node.name))
                if int(obj.get("status", {}).get("allocatable", {}).get("amd.com/gpu", "0")) == \
                        self.expected_gpus[node.name]:
                    return
            except ApiError:
                pass
            await asyncio.sleep(0.25)
        self.figures.violations.append(f"{node.name}: devices not back within 60 s of a {kind}")

    # -- phases --

    async def wait_fleet_ready(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            nodes = {obj["metadata"]["name"]: obj for obj in
                     (await self.kube.list(object_path("v1", "nodes"), labelSelector=f"{LABEL}=1"))["items"]}
            counts = {name: int(obj.get("status", {}).get("allocatable", {}).get("amd.com/gpu", "0"))
                      for name, obj in nodes.items()}
            published = {obj["metadata"]["name"]: len((obj.get("status") or {}).get("gpus", []))
                         for obj in await self.gpu_nodes()}
            # allocatable counts plugin devices (slices): remembered to tell when a node is back.
            self.expected_gpus = counts
            if len(counts) == len(published) == len(self.fleet.nodes) and all(counts.values()) \
                    and all(published.values()):
                self.figures.gpus = sum(published.values())
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"fleet not ready: allocatable {self.expected_gpus}")

    async def wait_all_bound(self) -> float:
        """After the faults: every pod not failed is bound; returns how long that took."""
        started = time.monotonic()
        while True:
            pods = await self._pods_retrying()
            waiting = [p for p in pods if not p["spec"].get("nodeName")
                       and p.get("status", {}).get("phase") != "Failed" and not p["metadata"].get("deletionTimestamp")]
            if not waiting:
                return time.monotonic() - started
            if time.monotonic() - started > BIND_DEADLINE_S:
                why = [f"{p['metadata']['namespace']}/{p['metadata']['name']}: {_scheduled_message(p)}"
                       for p in waiting[:10]]
                self.figures.violations.append(f"{len(waiting)} pods not bound {BIND_DEADLINE_S:.0f} s after the "
                                               f"faults stopped: {why}")
                return time.monotonic() - started
            await asyncio.sleep(0.5)

    async def _pods_retrying(self) -> list[dict]:
        for _ in range(60):
            try:
                return await self.pods()
            except ApiError:
                await asyncio.sleep(1)
        return await self.pods()

    async def delete_everything(self) -> None:
        for namespace in NAMESPACES:
            await self.kube.request("DELETE", object_path("v1", "pods", namespace=namespace),
                                    query={"labelSelector": f"{LABEL}=1"})
        deadline = time.monotonic() + 60
        while await self.pods():
            assert time.monotonic() < deadline, "chaos pods were not deleted within 60 s"
            await asyncio.sleep(0.5)

    async def leaks(self) -> None:
        """Nothing left: no records on any pod, nothing in the extender's ledger."""
        everything = (await self.kube.list(PODS)).get("items", [])
        self.figures.leaked_records = sum(ALLOCATION_ANNOTATION in (p["metadata"].get("annotations") or {})
                                          and p["spec"].get("nodeName") in self.fleet.nodes for p in everything)
        deadline = time.monotonic() + 20
        while True:
            series = await asyncio.to_thread(extender_memory, self.fleet.operator.metrics_port)
            ours = {key: value for key, value in series.items() if key[0] in self.fleet.nodes}
            leaked = int(sum(ours.values()))
            if (not leaked and len(ours) == self.figures.gpus) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        self.figures.leaked_extender_bytes = leaked
        assert len(ours) == self.figures.gpus, f"the extender reports {len(ours)} GPUs of {self.figures.gpus}"

    async def probe(self) -> None:
        """Every node takes a pod asking for all its GPUs: no reservation outlived its pod."""
        gpu_nodes = {obj["metadata"]["name"]: len(obj["status"]["gpus"]) for obj in await self.gpu_nodes()}
        names = []
        for node, count in sorted(gpu_nodes.items()):
            pod = gpu_pod(f"probe-{node}", namespace="chaos-c", gpu=str(count),
                          node_selector={"kubernetes.io/hostname": node})
            pod["metadata"]["labels"] = {LABEL: "1"}
            await self.kube.create(object_path("v1", "pods", namespace="chaos-c"), pod)
            names.append(pod["metadata"]["name"])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            phases = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in await self.pods()}
            self.figures.probe_pods_ran = sum(phases.get(name) == "Running" for name in names)
            if self.figures.probe_pods_ran == len(names):
                break
            await asyncio.sleep(0.5)
        await self.check()


def _scheduled_message(pod: dict) -> str:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return f"{condition.get('reason')}: {condition.get('message')}"
    return "no PodScheduled condition"


def _socket_newer_than(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False


def _refusal_kind(error: ApiError) -> str:
    if "failed calling webhook" in error.message or "webhook" in error.message:
        return "webhook unavailable (fails closed)"
    if "exceeded quota" in error.message:
        return "quota"
    if error.status in (0, 500, 503, 504) or error.temporary:
        return "apiserver unavailable"
    return f"other ({error.status} {error.reason})"


def extender_memory(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    series = {}
    for line in text.splitlines():
        if line.startswith("hami_gpu_memory_allocated_bytes{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            series[(labels["node"], labels["device_uuid"])] = float(line.rsplit(" ", 1)[1])
    return series


def fleet_rss_mib(fleet: Fleet) -> float:
    total = 0
    for node in fleet.nodes.values():
        for pid in (node.kubelet_pid, node.agent_pid):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                total += int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
            except (OSError, AttributeError):
                pass
    return total / 1024


async def test_chaos_keeps_every_invariant(fleet: Fleet, kube: Kube, cluster) -> None:
    began = time.monotonic()
    chaos = Chaos(kube, cluster, fleet)
    await chaos.wait_fleet_ready()
    chaos.figures.peak_rss_mib = fleet_rss_mib(fleet)
    evidence = PodEvidence(kube, f"{LABEL}=1")
    loops = [asyncio.create_task(loop()) for loop in (evidence.run, chaos.create_loop, chaos.reap_loop,
                                                      chaos.check_loop)]
    try:
        fault_began = time.monotonic()
        await chaos.fault_loop()
        chaos.figures.fault_phase_s = time.monotonic() - fault_began
        chaos.creating = False
        await asyncio.sleep(1)  # the last creations land
        chaos.faults_on = False
        chaos.figures.post_fault_bind_s = round(await chaos.wait_all_bound(), 2)
        await asyncio.sleep(3)
    finally:
        await stop_tasks(loops)
    chaos.figures.pods_checked_from_containers = len(evidence.admitted)
    chaos.figures.violations.extend(evidence.violations)
    missed = chaos.seen_running - evidence.admitted
    assert not missed, f"pods seen Running but never checked from what they received: {sorted(missed)[:10]}"
    await chaos.check()
    await chaos.delete_everything()
    await chaos.check()
    await chaos.leaks()
    await chaos.probe()
    await chaos.delete_everything()
    await chaos.leaks()
    chaos.figures.total_s = time.monotonic() - began
    report = chaos.figures.as_json()
    print("chaos figures:", json.dumps(report, indent=1))
    if path := os.environ.get("ROCSHARE_CHAOS_REPORT"):
        Path(path).write_text(json.dumps(report, indent=1) + "\n")
    assert not chaos.figures.violations, "\n".join(chaos.figures.violations[:30])
    assert chaos.figures.leaked_records == 0 and chaos.figures.leaked_extender_bytes == 0
    assert chaos.figures.probe_pods_ran == len(fleet.nodes), "a node could not take a pod for all its GPUs"
    assert len(evidence.admitted) >= MIN_PODS_CHECKED, f"only {len(evidence.admitted)} pods checked"
    assert not set(evidence.failed) & set(evidence.live), "a failed pod still counts as holding GPUs"
    assert sum(chaos.figures.faults.values()) > 0



# ---- a directed regression ------------------------------------------------------------------------


async def test_restarted_operator_keeps_one_pod_in_flight_per_node(fleet: Fleet, kube: Kube) -> None:
    """DESIGN.md section 2, rule 2 across an operator SIGKILL: a pod bound before the crash and not
    yet served by its agent is still in flight afterwards, so a second pod is not bound to its node
    until the first is served (before the fix the restarted extender bound it at once, and the
    agent then refused both pods: two records in flight). A node without a kubelet keeps the
    first pod unadmitted for as long as the test needs; the test plays the kubelet's first status
    write (status.startTime), which is what releases the gate since issue 18."""
    node = "chaos-inflight"
    chaos = Chaos(kube, None, fleet)
    await chaos.wait_fleet_ready()
    template = next(obj for obj in await chaos.gpu_nodes() if fleet.kinds[obj["metadata"]["name"]] == "vega10")
    await kube.create(object_path("v1", "nodes"), {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node, "labels": {"rocshare.io/sim": "chaos-vega10", "kubernetes.io/hostname": node}}})
    await kube.merge_patch(object_path("v1", "nodes", node) + "/status",
                           {"status": {"capacity": {"amd.com/gpu": "10", "cpu": "8", "memory": "32Gi", "pods": "110"},
                                       "allocatable": {"amd.com/gpu": "10", "cpu": "8", "memory": "32Gi", "pods": "110"}}})
    gpu_node = object_path(API_VERSION, "amdgpunodes", node)
    body = {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": node}}
    await kube.apply(gpu_node, body, field_manager="rocshare-agent")
    await kube.apply(gpu_node + "/status", {**body, "status": {"gpus": template["status"]["gpus"]}},
                     field_manager="rocshare-agent")
    here = {"kubernetes.io/hostname": node}
    try:
        await kube.create(object_path("v1", "pods", namespace="chaos-c"),
                          gpu_pod("first", namespace="chaos-c", gpu="1", gpumem="1024", gpucores="10", node_selector=here))
        await _wait_pod(kube, "first", lambda pod: pod["spec"].get("nodeName") == node, "first bound")
        fleet.operator.kill()
        fleet.operator.start()
        await _create_when_webhook_answers(kube, gpu_pod("second", namespace="chaos-c", gpu="1", gpumem="1024",
                                                         gpucores="10", node_selector=here))
        await asyncio.sleep(8)
        second = await kube.get(object_path("v1", "pods", "second", namespace="chaos-c"))
        assert not second["spec"].get("nodeName"), "bound while the first pod was still in flight on the node"
        # The kubelet admits the first pod (its status write): the gate opens and the second is bound.
        await kube.merge_patch(object_path("v1", "pods", "first", namespace="chaos-c") + "/status",
                               {"status": {"startTime": "2026-01-01T00:00:00Z"}})
        await _wait_pod(kube, "second", lambda pod: pod["spec"].get("nodeName") == node, "second bound", timeout_s=60)
    finally:
        for name in ("first", "second"):
            try:
                await kube.request("DELETE", object_path("v1", "pods", name, namespace="chaos-c"),
                                   body={"gracePeriodSeconds": 0})
            except ApiError:
                pass
        await kube.delete(gpu_node)
        await kube.delete(object_path("v1", "nodes", node))


async def _create_when_webhook_answers(kube: Kube, pod: dict) -> None:
    """OperatorProcess.start returns when the extender is ready; the webhook may need a moment more."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await kube.create(object_path("v1", "pods", namespace=pod["metadata"]["namespace"]), pod)
            return
        except ApiError as error:
            if "failed calling webhook" not in error.message or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


async def _wait_pod(kube: Kube, name: str, check, what: str, *, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pod = await kube.get(object_path("v1", "pods", name, namespace="chaos-c"))
        if check(pod):
            return pod
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}: {pod.get('status')}")
