"""Helpers for e2e tests that run the whole path: pods built the way users write them,
polling with deadlines, and reading what the kubelet peer handed each container.

Sysfs captures are read in place from ../shared; the MI210 capture has no VRAM size, so tests
use `rocshare_dev.devcluster.captures.mi210_with_synthetic_vram` (a copy with a synthetic 64 GiB per
GPU) and say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, decode_record
from rocshare_dev.devcluster.captures import mi210_with_synthetic_vram  # noqa: F401  (re-exported for tests)
from rocshare.kube.client import Kube, NotFound, object_path
from rocshare.api.models import API_VERSION
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode, runtime_specs



def gpu_pod(name: str, *, namespace: str = "default", containers: list[dict[str, str]] | None = None,
            annotations: dict[str, str] | None = None, node_selector: dict[str, str] | None = None,
            **limits: str) -> dict[str, Any]:
    """A pod as a user writes it: amd.com limits per container (keyword form for one container)."""
    per_container = containers if containers is not None else [limits]
    spec: dict[str, Any] = {"containers": [
        {"name": f"c{index}", "image": "rocm/pytorch", "resources": {"limits": {
            f"amd.com/{key}": str(value) for key, value in asked.items()}}}
        for index, asked in enumerate(per_container)]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}}, "spec": spec}


def with_spec(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """`pod` with these spec fields set (e.g. nodeName, containers)."""
    return {**pod, "spec": {**pod["spec"], **spec}}


def privileged(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` with its first container privileged."""
    container = {**pod["spec"]["containers"][0], "securityContext": {"privileged": True}}
    return with_spec(pod, containers=[container])


async def wait_for(check: Callable[[], Awaitable[Any]], *, timeout_s: float, what: str, every_s: float = 0.2) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` and the last value."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; last: {last!r}")


async def create_pod(kube: Kube, pod: dict[str, Any]) -> dict[str, Any]:
    return await kube.create(object_path("v1", "pods", namespace=pod["metadata"]["namespace"]), pod)


async def read_pod(kube: Kube, name: str, namespace: str = "default") -> dict[str, Any] | None:
    try:
        return await kube.get(object_path("v1", "pods", name, namespace=namespace))
    except NotFound:
        return None


async def wait_running(kube: Kube, name: str, namespace: str = "default", timeout_s: float = 30) -> dict[str, Any]:
    async def running():
        pod = await read_pod(kube, name, namespace)
        return pod if pod and pod.get("status", {}).get("phase") == "Running" else None
    return await wait_for(running, timeout_s=timeout_s, what=f"pod {namespace}/{name} Running")


async def delete_pod(kube: Kube, name: str, namespace: str = "default", *, wait_s: float = 30) -> None:
    await kube.delete(object_path("v1", "pods", name, namespace=namespace))

    async def gone():
        return await read_pod(kube, name, namespace) is None
    await wait_for(gone, timeout_s=wait_s, what=f"pod {namespace}/{name} deleted")


def record_of(pod: dict[str, Any]) -> AllocationRecord:
    return decode_record(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])


def runtime_of(pod: dict[str, Any]) -> dict[str, Any]:
    """Per container: what the kubelet peer handed the runtime (envs, devices, mounts)."""
    specs = runtime_specs(pod)
    assert specs is not None, f"the kubelet peer has not admitted pod {pod['metadata'].get('name')}"
    return specs


def mask_bits(text: str) -> dict[int, set[int]]:
    """HSA_CU_MASK "<i>:<ranges>[;...]" as the test reads it: per GPU position, the bits."""
    found: dict[int, set[int]] = {}
    for part in text.split(";"):
        index, _, ranges = part.partition(":")
        bits = found.setdefault(int(index), set())
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            bits.update(range(int(low), int(high or low) + 1))
    return found


def mi300x_spx_xcd(bit: int) -> int:
    """The tests' own table, from amdkfd mqd_symmetrically_map_cu_mask's comment for GFX 9.4.3:
    with n XCCs under one node, cu_mask bit i goes to XCC i mod n (n = 8 on an MI300X in SPX mode)."""
    return bit % 8


async def scheduling_failures(kube: Kube, name: str, namespace: str = "default") -> list[str]:
    events = await kube.list(object_path("v1", "events", namespace=namespace),
                             fieldSelector=f"involvedObject.name={name},reason=FailedScheduling")
    return [event.get("message", "") for event in events.get("items", [])]


@contextlib.contextmanager
def one_pool_one_node(cluster, *, pool: str, sharing: dict, node: str, sysfs_root: Path, work_dir: Path,
                      operator: OperatorProcess | None = None) -> Iterator[SimulatedNode]:
    """An operator with its webhooks (`operator`, else a plain one), a pool with `sharing` selecting
    one simulated node (label rocshare.io/sim=<pool>) on `sysfs_root`; all removed afterwards, the pool
    while the operator still runs (its finalizer unmarks the node)."""
    operator = operator or OperatorProcess(cluster)
    operator.start()
    operator.install_webhooks()
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps({
        "apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": pool},
        "spec": {"nodeSelector": {"rocshare.io/sim": pool}, "sharing": sharing}}))
    sim = SimulatedNode(name=node, kubeconfig=cluster.kubeconfig, work_dir=work_dir, labels={"rocshare.io/sim": pool},
                        sysfs_root=sysfs_root)
    try:
        sim.start()
        yield sim
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        cluster.kubectl("delete", "amdgpupool", pool, "--ignore-not-found", "--timeout=30s", check=False)
        sim.stop()
        operator.stop()


async def add_kubeletless_node(kube: Kube, node: str, labels: dict[str, str], gpus: list[dict]) -> None:
    """A Node and its AmdGpuNode inventory with no kubelet: a pod bound there is never admitted."""
    await kube.create(object_path("v1", "nodes"), {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node, "labels": {**labels, "kubernetes.io/hostname": node}}})
    offered = {"amd.com/gpu": "10", "cpu": "8", "memory": "32Gi", "pods": "110"}
    await kube.merge_patch(object_path("v1", "nodes", node) + "/status",
                           {"status": {"capacity": offered, "allocatable": offered}})
    gpu_node = object_path(API_VERSION, "amdgpunodes", node)
    body = {"apiVersion": API_VERSION, "kind": "AmdGpuNode", "metadata": {"name": node}}
    await kube.apply(gpu_node, body, field_manager="rocshare-agent")
    await kube.apply(gpu_node + "/status", {**body, "status": {"gpus": gpus}}, field_manager="rocshare-agent")


async def remove_kubeletless_node(kube: Kube, node: str) -> None:
    await kube.delete(object_path(API_VERSION, "amdgpunodes", node))
    await kube.delete(object_path("v1", "nodes", node))
