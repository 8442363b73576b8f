"""`rocshare-dev bench dra`: create -> Running pods/s of DRA mode beside extender mode and plain kube-scheduler.

One Kubernetes 1.37.2 control plane (DRA_K8S_VERSION: consumable capacity is on by default only
from 1.36), the same node count and the same number of pods for three bursts, one after another,
each timed from the first create to the last pod Running:

1. dra — simulated nodes with DRA (SimulatedFleet(dra=True)): one `kubelet-peer --node-count --dra`
   process, each node running the kubelet's own DRA manager and plugin manager, and one
   multiagent process playing each node's rocshare agent as a DRA driver (it publishes the node's
   ResourceSlice with the product's code from the same MI210 capture with synthetic 64 GiB VRAM
   the extender phase's agents read, and answers NodePrepareResources over its own sockets, writing
   the claim's CDI spec). One ResourceClaimTemplate whose spec is the product's claim for bench
   e2e's slice (rocshare.core.dra_claims.claim_spec of `amd.com/gpu: 1, gpumem: 4096, gpucores:
   25`); each pod takes a claim from it. kube-scheduler with a plain profile (its DRA plugin
   allocates; no extender and no operator), kube-controller-manager's resourceclaim controller
   making each pod's claim from the template. A pod is Running once the peer prepared its claim
   and resolved its CDI device.
2. plain kube-scheduler and 3. rocshare extender mode — bench e2e's own phases
   (e2e._baseline_phase, e2e._rocshare_phase), unchanged, on the same control plane.

Every phase also reports create -> bound (spec.nodeName set: where kube-scheduler's part ends).
The DRA phase needs one inotify instance per node (each node's plugin watcher, in the kubelet's
plugin manager): fs.inotify.max_user_instances is 128 by default, so more than about 120 nodes
need it raised (the fleet says so before it starts; simfleet.check_inotify_instances).
`--bound-only` runs the DRA phase as before issue 42's peer: bare Node objects and the
ResourceSlices the agent would publish, no peer and no agent, timed to bound only (the scheduler's
share of the cost alone). `--upstream-shape` is upstream scheduler_perf's
SchedulingWithResourceClaimTemplate size, 500 nodes and 2,000 pods (long on a 2-core machine,
and with peers it needs the inotify limit raised; the defaults fit both).

    run_dra(*, nodes=DEFAULT_NODES, pods=DEFAULT_PODS, burst_timeout_s=180.0, work_dir=None,
            keep=False, json_out=DEFAULT_JSON_OUT, bound_only=False) -> dict

returns the figures (`dra_running_pods_per_s`, `dra_extender_running_pods_per_s`,
`dra_plain_running_pods_per_s` and their ratios; the same for bound; CPU per pod in all, and per
process for each mode: `dra_[extender_|plain_]cpu_ms_per_bound_pod_<process>`, over the whole
burst to Running; the API requests per pod in the JSON) and writes them as JSON to `json_out`.
A rate is 0 when not every pod got there before the deadline (`dra_*_bound_pods`,
`dra_*_running_pods` say how many).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rocshare.api import dra
from rocshare.api.allocation import ALLOCATION_ANNOTATION
from rocshare.api.models import GpuInfo, Sharing
from rocshare.core.dra_claims import REQUEST_NAME, claim_spec, shape_classes_of
from rocshare.core.inventory import NodeInventory
from rocshare.core.request import parse_pod
from rocshare.core.resource_slices import resource_slice
from rocshare.kube.client import Kube, object_path
from rocshare_dev.bench import e2e
from rocshare_dev.bench.burst import BurstResult, delete_all
from rocshare_dev.bench.fleet import node_object
from rocshare_dev.devcluster.captures import FIXTURES, mi210_with_synthetic_vram
from rocshare_dev.devcluster.controlplane import DRA_K8S_VERSION, PROJECT_ROOT, ControlPlane, Ports
from rocshare_dev.devcluster.simfleet import SimulatedFleet

DEFAULT_JSON_OUT = PROJECT_ROOT / ".cache" / "bench" / "dra.json"
NAMESPACE = "bench-dra"
TEMPLATE = "bench-slice"
NODE_PREFIX = "dra-"
DRA_LABEL = {"rocshare.io/sim": "bench-dra"}
RESOURCE = f"/apis/{dra.RESOURCE_API_VERSION}"
FLEET_PREFIX = "dra-"
DEFAULT_NODES = 100
DEFAULT_PODS = 500
UPSTREAM_NODES = 500
UPSTREAM_PODS = 2000
MEASURE = ("create -> Running in every mode (DRA pods prepared by each node's DRA driver through the "
           "kubelet's DRA manager); create -> bound too")
MEASURE_BOUND_ONLY = ("create -> bound (spec.nodeName set); --bound-only: no kubelet runs the DRA pods, so the "
                      "DRA phase is not timed to Running")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=None,
                        help=f"simulated nodes per phase (default: {DEFAULT_NODES}; "
                             f"{UPSTREAM_NODES} with --upstream-shape)")
    parser.add_argument("--pods", type=int, default=None,
                        help=f"pods per burst (default: {DEFAULT_PODS}; {UPSTREAM_PODS} with --upstream-shape)")
    parser.add_argument("--upstream-shape", action="store_true",
                        help=f"scheduler_perf's SchedulingWithResourceClaimTemplate size: {UPSTREAM_NODES} nodes, "
                             f"{UPSTREAM_PODS} pods (--nodes/--pods still override; without --bound-only it needs "
                             f"fs.inotify.max_user_instances above {UPSTREAM_NODES})")
    parser.add_argument("--bound-only", action="store_true",
                        help="DRA nodes without kubelet peers or agents (bench-published slices), timed to bound")
    parser.add_argument("--burst-timeout-s", type=float, default=180.0,
                        help="deadline per burst (default: %(default)s)")
    parser.add_argument("--work-dir", type=Path, default=None, help="folder for the cluster (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) afterwards")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_JSON_OUT, help="where to write the figures")
    parser.add_argument("--write-inputs", type=Path, default=None, metavar="DIR",
                        help="only write one node's ResourceSlice and the pods' claim spec (slice.json, claim.json) "
                             "for dev/dra-allocbench, and exit")


def run(args: argparse.Namespace) -> int:
    if args.write_inputs is not None:
        write_inputs(args.write_inputs)
        return 0
    nodes, pods = shape(args.nodes, args.pods, upstream=args.upstream_shape)
    figures = run_dra(nodes=nodes, pods=pods, burst_timeout_s=args.burst_timeout_s,
                      work_dir=args.work_dir, keep=args.keep, json_out=args.json_out, bound_only=args.bound_only)
    print(json.dumps(figures, indent=2))
    return 0 if figures["dra_bound_pods_per_s"] and (args.bound_only or figures["dra_running_pods_per_s"]) else 1


def shape(nodes: int | None, pods: int | None, *, upstream: bool) -> tuple[int, int]:
    """Nodes and pods per burst: the given ones, else the defaults (or upstream's size)."""
    default_nodes, default_pods = (UPSTREAM_NODES, UPSTREAM_PODS) if upstream else (DEFAULT_NODES, DEFAULT_PODS)
    return (default_nodes if nodes is None else nodes), (default_pods if pods is None else pods)


def run_dra(*, nodes: int = DEFAULT_NODES, pods: int = DEFAULT_PODS, burst_timeout_s: float = 180.0,
            work_dir: Path | None = None, keep: bool = False, json_out: Path | None = DEFAULT_JSON_OUT,
            bound_only: bool = False) -> dict[str, Any]:
    """The three bursts on one control plane; see the module docstring."""
    return e2e.run_in_work_dir("dra", work_dir, keep, json_out, lambda root: _run(
        root, nodes=nodes, pods=pods, burst_timeout_s=burst_timeout_s, bound_only=bound_only))


async def _run(root: Path, *, nodes: int, pods: int, burst_timeout_s: float, bound_only: bool) -> dict[str, Any]:
    cluster = ControlPlane(root=root / "cluster", ports=Ports.free(), version=DRA_K8S_VERSION, with_scheduler=False)
    stack = e2e.Stack(cluster)
    try:
        cluster.start()
        cluster.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "crds"))
        cluster.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "manifests/base/dra/deviceclass.yaml"))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        async with await Kube.connect(cluster.kubeconfig) as kube:
            for namespace in (NAMESPACE, "bench-baseline", "bench-rocshare"):
                await kube.create(object_path("v1", "namespaces"), {"metadata": {"name": namespace}})
            for namespace in (NAMESPACE, "bench-baseline", "bench-rocshare"):
                await e2e.wait_default_service_account(kube, namespace)
            phase = _dra_phase_bound_only if bound_only else _dra_phase
            dra_result = await phase(stack, kube, root, nodes=nodes, pods=pods, timeout_s=burst_timeout_s)
            plain = await e2e._baseline_phase(stack, kube, root, nodes=nodes, pods=pods, gpus_per_node=8,
                                              timeout_s=burst_timeout_s)
            extender = await e2e._rocshare_phase(stack, kube, root, nodes=nodes, pods=pods, timeout_s=burst_timeout_s)
    finally:
        stack.stop()
    return figures(nodes=nodes, pods=pods, dra_phase=dra_result, plain=plain, extender=extender,
                   bound_only=bound_only)


# ---- the DRA phase -----------------------------------------------------------------------------


async def _dra_phase(stack: e2e.Stack, kube: Kube, root: Path, *, nodes: int, pods: int,
                     timeout_s: float) -> dict[str, Any]:
    """DRA pods onto simulated nodes whose agents are DRA drivers, timed to Running."""
    from rocshare_agent.discovery import discover

    sysfs = mi210_with_synthetic_vram(FIXTURES, root)
    await create_template(kube, discover(sysfs).gpus)
    fleet = SimulatedFleet(kubeconfig=stack.cluster.kubeconfig, work_dir=root / "dra-nodes", node_count=nodes,
                           sysfs_root=sysfs, prefix=FLEET_PREFIX, labels=DRA_LABEL, dra=True,
                           bin_dir=stack.cluster.bin_dir)  # the peer of the cluster's version: its DRA manager
    stack.fleets.append(fleet)
    await fleet.start(kube)
    stack.baseline_scheduler = e2e.start_baseline_scheduler(stack.cluster)  # a plain profile: DRA alone allocates
    spec = {"schedulerName": e2e.BASELINE_SCHEDULER}
    result = await e2e.measured_burst(stack, kube, NAMESPACE, pods, {}, spec, timeout_s, pod_of=templated_pod)
    result["allocated_claims"] = await allocated_claims(kube, NAMESPACE)
    result["prepared_claims"] = await prepared_claims(kube, NAMESPACE)
    await delete_all(kube, NAMESPACE)
    stack.stop_baseline_scheduler()
    fleet.stop()
    stack.fleets.remove(fleet)
    await _delete_dra_nodes(kube)
    return result


async def _delete_dra_nodes(kube: Kube) -> None:
    """The DRA phase's Nodes and their ResourceSlices (the next phases publish nodes of their own)."""
    selector = ",".join(f"{key}={value}" for key, value in DRA_LABEL.items())
    await kube.request("DELETE", object_path("v1", "nodes"), query={"labelSelector": selector}, timeout_s=120)
    await kube.request("DELETE", f"{RESOURCE}/resourceslices",
                       query={"fieldSelector": f"spec.driver={dra.DRIVER_NAME}"}, timeout_s=120)


async def _dra_phase_bound_only(stack: e2e.Stack, kube: Kube, root: Path, *, nodes: int, pods: int,
                                timeout_s: float) -> dict[str, Any]:
    """--bound-only: bare Nodes with bench-published slices, no peer and no agent; timed to bound."""
    from rocshare_agent.discovery import discover

    gpus = discover(mi210_with_synthetic_vram(FIXTURES, root)).gpus
    await create_template(kube, gpus)
    names = [f"{NODE_PREFIX}{index:05d}" for index in range(nodes)]
    await publish_nodes(kube, {name: (dra_node(name), gpus) for name in names})
    stack.baseline_scheduler = e2e.start_baseline_scheduler(stack.cluster)  # a plain profile: DRA alone allocates
    spec = {"schedulerName": e2e.BASELINE_SCHEDULER}
    result = await e2e.measured_burst(stack, kube, NAMESPACE, pods, {}, spec, timeout_s, until="bound",
                                      pod_of=templated_pod)
    result["allocated_claims"] = await allocated_claims(kube, NAMESPACE)
    await delete_all(kube, NAMESPACE)
    stack.stop_baseline_scheduler()
    await _delete_dra_nodes(kube)
    return result


async def create_template(kube: Kube, gpus: list[GpuInfo]) -> None:
    """The bench's ResourceClaimTemplate, after the GPU-shape DeviceClasses its claim names (as
    admission writes them: the classes first)."""
    template = claim_template(TEMPLATE, NAMESPACE, e2e.SLICE, gpus)
    for device_class in template_classes(template, gpus):
        await kube.create(f"{RESOURCE}/deviceclasses", device_class)
    await kube.create(object_path(dra.RESOURCE_API_VERSION, "resourceclaimtemplates", namespace=NAMESPACE), template)


def write_inputs(folder: Path) -> None:
    """The DRA phase's slice (of node dra-00000) and claim spec as JSON, for dev/dra-allocbench, and the
    CEL selector of the class the claim names (class-selector.txt, for its -class-selector)."""
    from rocshare_agent.discovery import discover

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as sysfs:
        gpus = discover(mi210_with_synthetic_vram(FIXTURES, Path(sysfs))).gpus
    name = f"{NODE_PREFIX}{0:05d}"
    (folder / "slice.json").write_text(json.dumps(resource_slice(node_name=name, node_uid=None, gpus=gpus,
                                                                  sharing=Sharing(), generation=1)))
    template = claim_template(TEMPLATE, NAMESPACE, e2e.SLICE, gpus)
    (folder / "claim.json").write_text(json.dumps(template["spec"]["spec"]))
    [device_class] = template_classes(template, gpus) or [dra.device_class()]
    (folder / "class-selector.txt").write_text(device_class["spec"]["selectors"][0]["cel"]["expression"])


async def publish_nodes(kube: Kube, nodes: Mapping[str, tuple[dict[str, Any], list[GpuInfo]]]) -> None:
    """Each Node (name -> its body and GPUs), then its ResourceSlice (owned by it), a few at a time."""
    gate = asyncio.Semaphore(32)

    async def one(name: str, node: dict[str, Any], gpus: list[GpuInfo]) -> None:
        async with gate:
            created = await kube.create(object_path("v1", "nodes"), node)
            await kube.create(f"{RESOURCE}/resourceslices", resource_slice(
                node_name=name, node_uid=created["metadata"]["uid"], gpus=gpus, sharing=Sharing(), generation=1))

    await asyncio.gather(*(one(name, node, gpus) for name, (node, gpus) in nodes.items()))


async def allocated_claims(kube: Kube, namespace: str) -> int:
    """Claims in `namespace` the scheduler allocated (evidence the DRA allocator did the binding)."""
    listed = await kube.list(object_path(dra.RESOURCE_API_VERSION, "resourceclaims", namespace=namespace))
    return sum(1 for claim in listed.get("items", []) if (claim.get("status") or {}).get("allocation"))


async def prepared_claims(kube: Kube, namespace: str) -> int:
    """Claims in `namespace` a node's DRA driver prepared: it writes what it handed out on the claim
    (rocshare's allocation record, naming the node) when NodePrepareResources succeeds."""
    listed = await kube.list(object_path(dra.RESOURCE_API_VERSION, "resourceclaims", namespace=namespace))
    return sum(1 for claim in listed.get("items", [])
               if (claim["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION))


# ---- objects (pure) ----------------------------------------------------------------------------


def dra_node(name: str) -> dict[str, Any]:
    """bench fleet's realistic MI210 Node, with no device-plugin resource (DRA offers the GPUs) and
    the DRA phase's label (its clean-up selects by it)."""
    node = node_object(name, "mi210")
    for resources in (node["status"]["capacity"], node["status"]["allocatable"]):
        resources.pop("amd.com/gpu", None)
    node["metadata"]["labels"].update(DRA_LABEL)
    return node


def claim_template(name: str, namespace: str, limits: dict[str, str], gpus: list[GpuInfo]) -> dict[str, Any]:
    """The ResourceClaimTemplate rocshare writes for a pod with `limits` in a pool of these GPUs."""
    container = parse_pod(e2e.bench_pod("template", namespace, limits, {})).gpu_containers[0]
    shapes = NodeInventory.from_gpu_infos("template", sorted(gpus, key=lambda gpu: gpu.index), Sharing()).gpus
    return {"apiVersion": dra.RESOURCE_API_VERSION, "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": claim_spec(container, shapes)}}


def template_classes(template: dict[str, Any], gpus: list[GpuInfo]) -> list[dict[str, Any]]:
    """The DeviceClasses of GPU shapes the template's claim names (admission writes them with it)."""
    shapes = NodeInventory.from_gpu_infos("template", sorted(gpus, key=lambda gpu: gpu.index), Sharing()).gpus
    return shape_classes_of(template["spec"]["spec"], shapes)


def templated_pod(name: str, namespace: str, limits: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    """measured_burst's pod factory: the DRA pod (its limits are in the template, not the pod)."""
    return dra_pod(name, namespace, TEMPLATE, spec)


def dra_pod(name: str, namespace: str, template: str, spec: dict[str, Any]) -> dict[str, Any]:
    """bench e2e's pod without device-plugin limits, its container using a claim from `template`."""
    pod = e2e.bench_pod(name, namespace, {}, spec)
    pod["spec"]["resourceClaims"] = [{"name": REQUEST_NAME, "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": REQUEST_NAME}]}
    return pod


# ---- figures (pure) ----------------------------------------------------------------------------


def figures(*, nodes: int, pods: int, dra_phase: dict[str, Any], plain: dict[str, Any],
            extender: dict[str, Any], bound_only: bool = False) -> dict[str, Any]:
    ours: BurstResult = dra_phase["burst"]
    base: BurstResult = plain["burst"]
    ext: BurstResult = extender["burst"]
    running = {} if bound_only else {
        "dra_running_pods_per_s": round(ours.pods_per_s, 1),
        "dra_to_plain_running_ratio": _ratio(ours.pods_per_s, base.pods_per_s),
        "dra_to_extender_running_ratio": _ratio(ours.pods_per_s, ext.pods_per_s),
        "dra_running_pods": ours.running, "dra_failed_pods": len(ours.failed),
        "dra_all_running_s": e2e._r(ours.all_running_s),
        "dra_latency_p50_ms": e2e._r(ours.percentile_ms(0.5)), "dra_latency_p99_ms": e2e._r(ours.percentile_ms(0.99)),
        **({"dra_failed_examples": dict(list(ours.failed.items())[:3])} if ours.failed else {}),
    }
    return {
        "dra_nodes": nodes, "dra_pods": pods, "dra_measure": MEASURE_BOUND_ONLY if bound_only else MEASURE,
        "dra_bound_only": bound_only, **running,
        "dra_extender_running_pods": ext.running, "dra_plain_running_pods": base.running,
        "dra_extender_all_running_s": e2e._r(ext.all_running_s), "dra_plain_all_running_s": e2e._r(base.all_running_s),
        "dra_bound_pods_per_s": round(ours.bound_per_s, 1),
        "dra_extender_bound_pods_per_s": round(ext.bound_per_s, 1),
        "dra_plain_bound_pods_per_s": round(base.bound_per_s, 1),
        "dra_to_plain_bound_ratio": _ratio(ours.bound_per_s, base.bound_per_s),
        "dra_to_extender_bound_ratio": _ratio(ours.bound_per_s, ext.bound_per_s),
        "dra_bound_pods": ours.bound, "dra_extender_bound_pods": ext.bound, "dra_plain_bound_pods": base.bound,
        "dra_allocated_claims": dra_phase.get("allocated_claims"),
        **({} if bound_only else {"dra_prepared_claims": dra_phase.get("prepared_claims")}),
        "dra_all_bound_s": e2e._r(ours.all_bound_s), "dra_extender_all_bound_s": e2e._r(ext.all_bound_s),
        "dra_plain_all_bound_s": e2e._r(base.all_bound_s),
        "dra_extender_running_pods_per_s": round(ext.pods_per_s, 1),
        "dra_plain_running_pods_per_s": round(base.pods_per_s, 1),
        "dra_cpu_ms_per_bound_pod": e2e.cpu_ms_per_pod(dra_phase["cpu_s"], ours.bound),
        "dra_extender_cpu_ms_per_bound_pod": e2e.cpu_ms_per_pod(extender["cpu_s"], ext.bound),
        "dra_plain_cpu_ms_per_bound_pod": e2e.cpu_ms_per_pod(plain["cpu_s"], base.bound),
        **cpu_ms_per_pod_by_process("dra_", dra_phase["cpu_s"], ours.bound),
        **cpu_ms_per_pod_by_process("dra_extender_", extender["cpu_s"], ext.bound),
        **cpu_ms_per_pod_by_process("dra_plain_", plain["cpu_s"], base.bound),
        "dra_cpu_s_by_process": dra_phase["cpu_s"],
        "dra_extender_cpu_s_by_process": extender["cpu_s"],
        "dra_plain_cpu_s_by_process": plain["cpu_s"],
        "dra_requests_per_bound_pod": e2e.requests_per_pod(dra_phase.get("requests") or Counter(), ours.bound),
        "dra_extender_requests_per_bound_pod": e2e.requests_per_pod(extender.get("requests") or Counter(), ext.bound),
        "dra_plain_requests_per_bound_pod": e2e.requests_per_pod(plain.get("requests") or Counter(), base.bound),
        "dra_cpu_s_other_users": dra_phase["others_cpu_s"],
        "dra_extender_cpu_s_other_users": extender["others_cpu_s"],
        "dra_plain_cpu_s_other_users": plain["others_cpu_s"],
        "dra_k8s_version": DRA_K8S_VERSION,
    }


def cpu_ms_per_pod_by_process(prefix: str, cpu_s: Mapping[str, float], pods: int) -> dict[str, float | None]:
    """Each process's CPU per bound pod (`<prefix>cpu_ms_per_bound_pod_<process>`, the bench's own
    watch left out), so the report shows where a mode's CPU goes. The CPU is the whole burst's, to
    Running where the phase runs its pods (then every bound pod is a Running one)."""
    return {f"{prefix}cpu_ms_per_bound_pod_{name.replace('-', '_')}": e2e.cpu_ms_per_pod({name: spent_s}, pods)
            for name, spent_s in sorted(cpu_s.items()) if name != "bench"}


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator and numerator else None
