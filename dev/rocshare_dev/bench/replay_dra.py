"""DRA mode of `rocshare-dev bench replay --mode dra`: the openb replay's nodes and pods placed by
kube-scheduler's DRA allocator, with no extender and no rocshare process on the path.

The same node sample and pod sequence as extender mode (replay.py), on a 1.37 control plane
(DRA_K8S_VERSION: consumable capacity is on by default from 1.36):

* Nodes: bare Node objects (no kubelet: nothing here prepares claims or runs containers), named as
  extender mode names them (replay_common.node_names), with the trace node's CPU and memory, and
  each its ResourceSlice made by the product's codec (rocshare.core.resource_slices) from the same
  resized MI210 capture extender mode's agents read: the trace node's GPU count, 100 CUs per GPU
  and the trace model's VRAM, so every share is exact.
* Pods: extender mode's pod (replay_common.pod_object, the same HAMi-style limits), turned into a
  claim by the admission webhook's own translation (rocshare_operator.admission.dra_pods.plan_dra,
  with the GPU shapes of the sample): the amd.com/* limits go, the container uses a claim from a
  ResourceClaimTemplate named by the claim spec's hash (created once per distinct spec before the
  run, as the webhook would write it). kube-controller-manager's resourceclaim controller makes each
  pod's claim; kube-scheduler with a plain profile (bench e2e's baseline, with extender mode's longer
  retry backoffs) allocates it. CPU-only pods go to the same scheduler with no claim.
* Node scores (`scored`, the default): the operator runs as in a cluster (its watches, hold index
  with claims, the pool's fragmentation model) beside an AmdGpuPool serving DRA with extender mode's
  policy and each node's AmdGpuNode as the DRA agent publishes it; kube-scheduler runs the profile
  of DRA mode (ControlPlane.start_dra_scheduler: the manifests' profile, its extender asked to score only), so the
  node choice is the extender's (`prioritize` for DRA pods) and the device choice the allocator's.
  Without it (`--dra-unscored`): the plain profile, no rocshare process on the path (the figure
  before issue 42).
* Decisions: awaited one pod at a time by extender mode's own loop (replay_common.submit), so the
  ratios at 100 % and 130 % come from the same computation, checked against a fresh list.

Invariant: the pods differ from extender mode's only in what the webhook changes (plus the
scheduler's name); the nodes only in having a ResourceSlice instead of a kubelet and an agent.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rocshare.api import dra as dra_api
from rocshare.api.dra import DRA_SCHEDULER_NAME
from rocshare.api.dra_request import DRA_REQUEST_ANNOTATION, encode_request

from rocshare.api.models import API_VERSION, AmdGpuNodeStatus, GpuInfo, Sharing
from rocshare.api.node_settings import POOL_LABEL
from rocshare.core.dra_claims import shape_classes_of
from rocshare.core.inventory import GpuSpec, NodeInventory
from rocshare.kube.client import Kube, object_path
from rocshare_dev.bench import e2e
from rocshare_dev.bench.dra import allocated_claims, dra_node, publish_nodes
from rocshare_dev.bench.replay_common import CU_COUNT, NAMESPACE, POOL, REPLAY_BACKOFFS, SIM_LABEL, node_names, \
    pod_object, submit
from rocshare_dev.bench.simulation import DEFAULT_VRAM_MIB, MODEL_VRAM_MIB
from rocshare_dev.bench.trace import TraceNode, TracePod
from rocshare_dev.devcluster.captures import FIXTURES, mi210_resized
from rocshare_dev.devcluster.controlplane import DRA_K8S_VERSION, PROJECT_ROOT, ControlPlane, Ports
from rocshare_dev.devcluster.operator_proc import OperatorProcess, _alive

WHAT_UNSCORED = (f"DRA mode: Kubernetes {DRA_K8S_VERSION} kube-apiserver, kube-controller-manager (resourceclaim "
                 "controller) and a plain kube-scheduler whose DRA plugin allocates; bare Nodes with the product's "
                 "ResourceSlices; claims from the admission webhook's translation; no extender")
WHAT = (f"DRA mode: Kubernetes {DRA_K8S_VERSION} kube-apiserver, kube-controller-manager (resourceclaim "
        "controller), kube-scheduler with DRA mode's profile (its DRA plugin allocates, the operator's extender "
        "scores the nodes); bare Nodes with the product's ResourceSlices and AmdGpuNodes; claims from the "
        "admission webhook's translation")
DEVICE_CLASS = PROJECT_ROOT / "manifests" / "base" / "dra" / "deviceclass.yaml"


async def run_dra(root: Path, subset: Sequence[TraceNode], sequence: Sequence[TracePod],
                  decision_timeout_s: float, scheduling: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`scheduling`: the DRA pool's policy, scored by the extender's prioritize; None: no extender."""
    cluster = ControlPlane(root=root / "cluster", ports=Ports.free(), version=DRA_K8S_VERSION, with_scheduler=False)
    stack = e2e.Stack(cluster)
    fleet = DraFleet(root / "nodes", subset, stack)
    shapes = pool_shapes(fleet.gpus.values())
    bodies, templates = dra_pods(sequence, shapes, e2e.BASELINE_SCHEDULER if scheduling is None else DRA_SCHEDULER_NAME)
    try:
        cluster.start()
        cluster.kubectl("apply", "--server-side", "-f", str(DEVICE_CLASS))
        if scheduling is not None:
            cluster.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "crds"))
            cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            stack.operator = OperatorProcess(cluster)
            stack.operator.start()
        async with await Kube.connect(cluster.kubeconfig) as kube:
            await kube.create(object_path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
            for device_class in template_classes(templates, shapes):  # as admission writes them, before templates
                await kube.create(f"/apis/{dra_api.RESOURCE_API_VERSION}/deviceclasses", device_class)
            for template in templates:
                await kube.create(object_path(dra_api.RESOURCE_API_VERSION, "resourceclaimtemplates",
                                              namespace=NAMESPACE), template)
            setup_started = time.monotonic()
            await publish_nodes(kube, {name: (trace_node_object(name, node), fleet.gpus[name])
                                       for name, node in fleet.nodes.items()})
            if scheduling is None:
                stack.baseline_scheduler = e2e.start_baseline_scheduler(cluster, **REPLAY_BACKOFFS)
            else:
                await kube.create(object_path(API_VERSION, "amdgpupools"), dra_pool(scheduling))
                await publish_gpu_nodes(kube, fleet.gpus)
                await wait_pooled(kube, set(fleet.nodes), deadline_s=300)
                cluster.start_dra_scheduler(f"http://127.0.0.1:{stack.operator.port}/extender",
                                            settings=REPLAY_BACKOFFS, qps=500, burst=1000)
            setup_s = time.monotonic() - setup_started
            result = await submit(kube, fleet, sequence, decision_timeout_s,
                                  pod_of=lambda _pod, serial: bodies[serial])
            result.update(nodes_ready_s=round(setup_s, 1), claim_templates=len(templates),
                          allocated_claims=await allocated_claims(kube, NAMESPACE),
                          extender_scores=None if stack.operator is None else scores_answered(stack.operator),
                          bound_gpu_pods=sum(1 for serial, node in enumerate(result["choices"])
                                             if node is not None and sequence[serial].num_gpu))
            return result
    finally:
        stack.stop()


def scores_answered(operator: OperatorProcess) -> dict[str, float]:
    """The operator's prioritize-dra answers by outcome, from its metrics (evidence the scores were asked)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("rocshare_extender_decisions_total{") and 'verb="prioritize-dra"' in line:
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            found[outcome] = float(line.rsplit(" ", 1)[1])
    return found


async def publish_gpu_nodes(kube: Kube, gpus: Mapping[str, list[GpuInfo]]) -> None:
    """Each node's AmdGpuNode with its GPUs, as the DRA agent publishes it."""
    gate = asyncio.Semaphore(32)

    async def one(name: str, found: list[GpuInfo]) -> None:
        async with gate:
            await kube.create(object_path(API_VERSION, "amdgpunodes"),
                              {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": name}, "spec": {}})
            await kube.apply(object_path(API_VERSION, "amdgpunodes", name) + "/status",
                             {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": name},
                              "status": AmdGpuNodeStatus(gpus=found).to_json_dict()}, field_manager="bench")

    await asyncio.gather(*(one(name, found) for name, found in gpus.items()))


async def wait_pooled(kube: Kube, names: set[str], *, deadline_s: float) -> None:
    """Every node labelled into the pool by the operator (it then scores them), and a moment for its watches."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        listed = await kube.list(object_path("v1", "nodes"), labelSelector=f"{POOL_LABEL}={POOL}")
        if names <= {node["metadata"]["name"] for node in listed.get("items", [])}:
            await asyncio.sleep(5.0)
            return
        await asyncio.sleep(2.0)
    raise RuntimeError(f"the operator did not label the nodes into pool {POOL} within {deadline_s:.0f} s")


def dra_pool(scheduling: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": POOL},
            "spec": {"nodeSelector": dict(SIM_LABEL), "scheduling": dict(scheduling), "agent": {"interface": "DRA"},
                     "health": {"intervalSeconds": 3600}}}


class DraFleet:
    """The sample's nodes in DRA mode: names, each node's discovered GPUs, and what to check when
    a decision is late (the scheduler process; the control plane is the cluster's)."""

    def __init__(self, work_dir: Path, subset: Sequence[TraceNode], stack: e2e.Stack) -> None:
        self.work_dir, self.stack = work_dir, stack
        self.nodes = node_names(subset)
        self.gpus = trace_gpus(work_dir / "captures", self.nodes)

    def check_alive(self) -> None:
        scheduler: subprocess.Popen | None = self.stack.baseline_scheduler
        if scheduler is not None and scheduler.poll() is not None:
            raise RuntimeError(f"kube-scheduler exited ({scheduler.returncode}); see {self.stack.cluster.logs}")
        scored = self.stack.cluster.pids.get("dra-scheduler")  # DRA mode's own (ControlPlane.start_dra_scheduler)
        if scored is not None and not _alive(scored):
            raise RuntimeError(f"DRA mode's kube-scheduler exited; see {self.stack.cluster.logs}")
        operator = self.stack.operator
        if operator is not None and operator.pid and not _alive(operator.pid):
            raise RuntimeError(f"the operator exited; see {operator.log_path}")


def trace_gpus(captures: Path, nodes: Mapping[str, TraceNode]) -> dict[str, list[GpuInfo]]:
    """Each node's GPUs as the agent discovers them from extender mode's resized capture."""
    from rocshare_agent.discovery import discover

    by_shape: dict[tuple[int, int], list[GpuInfo]] = {}
    gpus: dict[str, list[GpuInfo]] = {}
    for name, node in nodes.items():
        key = (node.gpus, MODEL_VRAM_MIB.get(node.model, DEFAULT_VRAM_MIB))
        if key not in by_shape:
            captures.mkdir(parents=True, exist_ok=True)
            by_shape[key] = discover(mi210_resized(FIXTURES, captures, gpus=key[0], cu_count=CU_COUNT,
                                                   vram_mib=key[1])).gpus
        gpus[name] = by_shape[key]
    return gpus


# ---- objects (pure) ----------------------------------------------------------------------------


def pool_shapes(gpu_lists: Iterable[list[GpuInfo]]) -> list[GpuSpec]:
    """The GPU shapes of the pool, as the webhook reads them from the nodes' inventories."""
    shapes: dict[tuple[int, int, int], GpuSpec] = {}
    for gpus in gpu_lists:
        for spec in NodeInventory.from_gpu_infos("shape", sorted(gpus, key=lambda gpu: gpu.index), Sharing()).gpus:
            shapes.setdefault((spec.cu_count, spec.cu_align, spec.memory_mib), spec)
    return [shapes[key] for key in sorted(shapes)]


def dra_pod_object(pod: TracePod, serial: int, shapes: Sequence[GpuSpec],
                   scheduler_name: str = e2e.BASELINE_SCHEDULER) -> tuple[dict[str, Any], tuple[dict, ...]]:
    """Extender mode's pod as the admission webhook leaves it in a DRA pool (and the templates it
    writes), sent to `scheduler_name` (DRA mode's profile, as admission sends it; or the plain one).
    A CPU-only pod is unchanged but for the scheduler."""
    from rocshare_operator.admission.dra_pods import plan_dra

    body = pod_object(pod, serial)
    body["spec"]["schedulerName"] = scheduler_name
    if not pod.num_gpu:
        return body, ()
    plan = plan_dra(body, (POOL,), shapes)
    body["spec"] = plan.spec
    if plan.request is not None:  # as the webhook writes it (rocshare.api.dra_request)
        body["metadata"].setdefault("annotations", {})[DRA_REQUEST_ANNOTATION] = encode_request(plan.request)
    return body, plan.templates


def dra_pods(sequence: Sequence[TracePod], shapes: Sequence[GpuSpec],
             scheduler_name: str = e2e.BASELINE_SCHEDULER) -> tuple[list[dict[str, Any]], list[dict]]:
    """Every pod's body, in sequence order, and the distinct templates they use (each once)."""
    bodies, templates = [], {}
    for serial, pod in enumerate(sequence):
        body, wanted = dra_pod_object(pod, serial, shapes, scheduler_name)
        bodies.append(body)
        templates.update((template["metadata"]["name"], template) for template in wanted)
    return bodies, list(templates.values())


def template_classes(templates: Sequence[dict], shapes: Sequence[GpuSpec]) -> list[dict]:
    """The DeviceClasses of GPU shapes the templates' claims name, each once."""
    classes = {body["metadata"]["name"]: body for template in templates
               for body in shape_classes_of(template["spec"]["spec"], shapes)}
    return [classes[name] for name in sorted(classes)]


def trace_node_object(name: str, node: TraceNode) -> dict[str, Any]:
    """bench dra's bare Node with the trace node's CPU and memory, room for the replay's pods (as
    extender mode's kubelet peers: 1,000) and the replay's label."""
    body = dra_node(name)
    for resources in (body["status"]["capacity"], body["status"]["allocatable"]):
        resources.update(cpu=f"{node.cpu_milli}m", memory=f"{node.memory_mib}Mi", pods="1000")
    body["metadata"]["labels"].update(SIM_LABEL)
    return body
