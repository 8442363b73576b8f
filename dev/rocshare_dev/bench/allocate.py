"""`rocshare-dev bench allocate`: Allocate latency under a burst of pods on one node.

Target (issue 5): p99 <= 20 ms for a burst of 200 pods. The kubelet admits a node's pods one
at a time and the extender keeps one pod in flight per node, so a burst reaches the plugin as
200 back-to-back cycles: the test binds a pod (the extender's bind: the record is already on
the pod), then immediately calls Allocate over the plugin's real unix socket with a real
grpcio client, as the kubelet does when it sees the binding. Timed: the Allocate RPC, which
includes finding the pod (watch cache, or a fresh list when the watch lags the binding) and
rendering the container (``allocate_*``, the target). Serving writes nothing to the API
server (since issue 18 the extender's next bind on the node waits for the kubelet's own
status write, not for an agent mark), so there is no second figure.

With --kubeconfig the pods live in that API server; without it a throw-away control plane is
started (etcd + kube-apiserver from .cache/bin). --in-memory measures the plugin alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

NODE = "bench-allocate-node"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, default=200, help="pods in the burst (default 200)")
    parser.add_argument("--kubeconfig", default=None, help="API server to use (default: start a throw-away one)")
    parser.add_argument("--in-memory", action="store_true", help="no API server: the plugin and its socket alone")


def run(args: argparse.Namespace) -> int:
    report = asyncio.run(_run(args))
    print(json.dumps(report, indent=2))
    return 0 if report["p99_ms"] <= 20.0 else 1


async def _run(args: argparse.Namespace) -> dict:
    if args.in_memory:
        return await bench_allocate(None, pods=args.pods)
    if args.kubeconfig:
        return await bench_allocate(args.kubeconfig, pods=args.pods)
    from rocshare_dev.devcluster.controlplane import ControlPlane, Ports

    with tempfile.TemporaryDirectory(prefix="bench-allocate-") as root:
        control_plane = ControlPlane(root=Path(root), ports=Ports.free())
        control_plane.start()
        try:
            return await bench_allocate(str(control_plane.kubeconfig), pods=args.pods)
        finally:
            control_plane.stop()


def _inventory(gpu_count: int, split_count: int):
    from rocshare.api.models import GpuInfo

    return [GpuInfo(id=f"GPU-{0xbe0000 + i:016x}", index=i, render_minor=128 + i, gfx_target_version=90402,
                    vram_mib=196592, cu_count=304, pci_bdf=f"0000:{0x10 + i:02x}:00.0", numa=i // 4,
                    split_count=split_count, healthy=True) for i in range(gpu_count)]


def _record(i: int, gpu_count: int) -> str:
    from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice, encode_record

    gpu_id = f"GPU-{0xbe0000 + i % gpu_count:016x}"
    start = (i // gpu_count) * 12 % 300
    device = DeviceSlice(gpu_id=gpu_id, memory_mib=8192, cu_ranges=[(start, start + 11)], cu_count=12)
    return encode_record(AllocationRecord(node=NODE, containers=[ContainerAllocation(name="main", devices=[device])]))


def _pod(name: str, namespace: str, record: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": {"rocshare.io/allocation": record}},
            "spec": {"schedulerName": "bench-binds-itself", "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "registry.invalid/app:1",
                                     "resources": {"limits": {"amd.com/gpu": "1"}}}]}}


async def bench_allocate(kubeconfig: str | None, *, pods: int = 200, gpu_count: int = 8) -> dict:
    from rocshare_agent.deviceplugin.service import DevicePluginService
    from rocshare_dev.devcluster.multiagent import simulated_hook

    source, binder, cleanup = await _pod_source(kubeconfig, pods, gpu_count)
    service = DevicePluginService(node_name=NODE, pods=source, hook_host_dir="/usr/local/vgpu",
                                  hook_check=simulated_hook)
    service.set_inventory(_inventory(gpu_count, split_count=-(-pods // gpu_count)))
    try:
        rpc_ms = await _burst(service, binder, pods)
    finally:
        await cleanup()
    return {"pods": pods, "api_server": kubeconfig is not None, **_summary(rpc_ms, "allocate"),
            "p99_ms": _summary(rpc_ms, "")["_p99_ms"], "target_p99_ms": 20.0}


def _summary(timings_ms: list[float], prefix: str) -> dict:
    ordered = sorted(timings_ms)
    return {f"{prefix}_p50_ms": round(statistics.median(ordered), 2),
            f"{prefix}_p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], 2),
            f"{prefix}_max_ms": round(ordered[-1], 2)}


async def _burst(service, binder, pods: int) -> list[float]:
    import grpc

    from rocshare_agent.deviceplugin import deviceplugin_pb2 as pb
    from rocshare_agent.deviceplugin import deviceplugin_pb2_grpc as pb_grpc
    from rocshare_agent.deviceplugin.server import DevicePluginServicer

    with tempfile.TemporaryDirectory(prefix="bench-dp-") as folder:
        socket_path = Path(folder) / "plugin.sock"
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(DevicePluginServicer(service), server)
        server.add_insecure_port(f"unix://{socket_path}")
        await server.start()
        rpc_ms = []
        try:
            async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                await stub.GetDevicePluginOptions(pb.Empty())  # connect before timing
                for i in range(pods):
                    await binder(i)
                    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[f"d{i}"])])
                    started = time.perf_counter()
                    await stub.Allocate(request, timeout=10)
                    rpc_ms.append((time.perf_counter() - started) * 1000)
        finally:
            await server.stop(grace=None)
    return rpc_ms


async def _pod_source(kubeconfig: str | None, pods: int, gpu_count: int):
    if kubeconfig is None:
        return _memory_source(pods, gpu_count)
    return await _kube_source(kubeconfig, pods, gpu_count)


def _memory_source(pods: int, gpu_count: int):
    items = []
    for i in range(pods):
        pod = _pod(f"p{i}", "bench", _record(i, gpu_count))
        pod["metadata"]["uid"] = f"uid-{i}"
        pod["status"] = {"phase": "Pending"}
        items.append(pod)

    class MemoryPods:
        def cached(self):
            return items

        async def next_event(self, timeout_s):
            return False

        async def fresh(self):
            return items

        async def mark_refused(self, ref, reason):
            raise RuntimeError(reason)

    async def bind(i: int) -> None:
        items[i]["spec"]["nodeName"] = NODE

    async def cleanup() -> None:
        return None

    return MemoryPods(), bind, cleanup


async def _kube_source(kubeconfig: str, pods: int, gpu_count: int):
    from rocshare.kube.client import Kube, object_path
    from rocshare_agent.deviceplugin.pods import KubePods
    from rocshare_dev.bench.e2e import wait_default_service_account

    kube = await Kube.connect(kubeconfig)
    namespace = f"bench-allocate-{uuid.uuid4().hex[:6]}"
    await kube.create(object_path("v1", "namespaces"), {"metadata": {"name": namespace}})
    await wait_default_service_account(kube, namespace, timeout_s=5, required=False)  # no controller-manager here
    for i in range(pods):  # the burst arrives before the first bind
        await kube.create(object_path("v1", "pods", namespace=namespace), _pod(f"p{i}", namespace, _record(i, gpu_count)))
    source = KubePods(kube, NODE)
    watching = asyncio.create_task(source.run())
    await source.synced.wait()

    async def bind(i: int) -> None:
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": f"p{i}", "namespace": namespace},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}
        await kube.create(object_path("v1", "pods", f"p{i}", namespace=namespace, subresource="binding"), binding)

    async def cleanup() -> None:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await kube.delete(object_path("v1", "namespaces", namespace))
        await kube.close()

    return source, bind, cleanup

