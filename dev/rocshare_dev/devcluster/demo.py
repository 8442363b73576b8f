"""`make demo`: the whole system on this machine, without GPUs or Docker.

Brings up the local control plane (kube-apiserver, etcd, controller-manager, kube-scheduler
with rocshare's extender), the operator (reconcilers, extender, admission webhook), and a
simulated fleet — each node a kubelet peer (the kubelet's own device manager) and a
rocshare agent reading a real sysfs capture from ../shared/fixtures/sysfs — then applies
samples/ and shows where every sample pod landed: GPU, MiB and CU mask, as the kubelet
handed them to the container. Beside the device-plugin pools, one node serves its GPUs through DRA
(DRA_NODE): the control plane runs with consumable capacity on (dra_feature_gates), samples/dra/
adds its pool and two pods, one written as a claim and one with amd.com/* limits, which
kube-scheduler allocates and the node's kubelet peer prepares over the DRA plugin's socket.

Everything runs detached, recorded in run/demo/state.json; `make demo-down` stops it all.
Running `make demo` again while the demo is up only prints the status.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rocshare.api.allocation import ALLOCATION_ANNOTATION, decode_record
from rocshare_dev.devcluster.captures import FIXTURES, mi210_with_synthetic_vram, mi300x_spx
from rocshare_dev.devcluster.controlplane import (
    PROJECT_ROOT, ControlPlane, ControlPlaneError, Ports, dra_feature_gates, k8s_version, stop_process)
from rocshare_dev.devcluster.evidence import parse_cu_mask
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster import hook_workloads
from rocshare_dev.devcluster.simnode import SimulatedNode, runtime_specs

RUN = PROJECT_ROOT / "run" / "demo"
NAMESPACES = ("gpu-demo", "gpu-samples")
"""The samples' namespaces whose pods all run (gpu-quota-demo holds one back on purpose)."""
# (node name, capture, node class). The MI210 capture has no VRAM size: the demo copies it and
# adds a synthetic 64 GiB per GPU (the MI210's size). The MI300X in SPX mode is derived from the
# CPX capture (captures.mi300x_spx says which fields are computed). The classes match the
# samples' pools (13-pool-mi210-oversubscribed, 11-pool-mi300x-partition, 10-pool-mi300x-cu,
# 12-pool-radeon).
FLEET = (
    ("demo-mi210-a", "mi210-8gpu-xgmi", "mi210"),
    ("demo-mi210-b", "mi210-8gpu-xgmi", "mi210"),
    ("demo-mi300x-cpx", "mi300x-8gpu-cpx", "mi300x-cpx"),
    ("demo-mi300x-spx", "mi300x-8gpu-spx-derived", "mi300x-cu"),
    ("demo-radeon-apu", "strixpoint-apu", "radeon"),
)
TAINTS = {"demo-mi300x-spx": ("rocshare.io/dedicated=inference:NoSchedule",)}
"""The SPX node is kept for samples/34-pods-inference-pair.yaml (its pods tolerate this), so the
other samples cannot take its GPUs and the pair's placement is the same on every run."""


DRA_NODE = ("demo-mi210-dra", "mi210-8gpu-xgmi", "mi210-dra")
"""The node of samples/dra's pool (mi210-dra): its agent is a DRA driver, its kubelet peer prepares claims."""
DRA_SAMPLES = PROJECT_ROOT / "samples" / "dra"
DRA_POOL, DRA_NAMESPACE = "mi210-dra", "gpu-dra"
DRA_PODS = ("dra-claim", "dra-amd-limits")

METRICS_PORT = 31993
MONITOR_PORTS = {name: 39394 + position for position, (name, _capture, _class) in enumerate((*FLEET, DRA_NODE))}
"""Loopback ports of the agents' monitors in `make demo` (the tests give theirs free ports)."""


def _step(text: str) -> float:
    print(f"==> {text}", flush=True)
    return time.monotonic()


def _done(started: float) -> None:
    print(f"    done in {time.monotonic() - started:.1f} s", flush=True)


def _sysfs_for(capture: str, work_dir: Path) -> Path:
    if capture == "mi210-8gpu-xgmi":
        return mi210_with_synthetic_vram(FIXTURES, work_dir / "sysfs")
    if capture == "mi300x-8gpu-spx-derived":
        return mi300x_spx(FIXTURES, work_dir / "sysfs")
    return FIXTURES / capture


def start_samples_fleet(cluster: ControlPlane, operator: OperatorProcess, work_dir: Path, nodes: list[SimulatedNode],
                        *, announce=lambda text: None,
                        node_setup: Callable[[str, Path], tuple[Path, tuple[str, ...]]] | None = None,
                        operator_started: Callable[[], None] = lambda: None, dra: bool = False) -> None:
    """The operator, samples/ applied, and the FLEET's simulated nodes, each added to `nodes`
    before it starts (so a caller can stop what started when a later step fails).
    `make demo`, tests/e2e/test_samples.py and tests/e2e/test_dashboards.py run this; `node_setup`
    (node name, sysfs root) -> (sysfs root, extra agent arguments) lets a test give a node a
    copy of its capture and its agent a monitor port; `operator_started` runs once the operator
    is ready, before any sample is applied. With `dra` (the control plane must serve consumable
    capacity: `dra_feature_gates`) the DRA node, a plain kube-scheduler and DRA mode's start too; the caller
    applies samples/dra/ (apply_dra_samples) once it is done with pods of the other samples: a pod
    without a nodeSelector created after it matches pools of both kinds, which admission refuses."""
    operator.start()
    operator.install_webhooks()
    operator_started()
    cluster.kubectl("apply", "-k", str(PROJECT_ROOT / "samples"))
    for name, capture, node_class in (*FLEET, DRA_NODE) if dra else FLEET:
        is_dra = (name, capture, node_class) == DRA_NODE
        announce(f"starting simulated node {name}: kubelet peer + agent{' (DRA)' if is_dra else ''} "
                 f"on the {capture} capture")
        sysfs_root, agent_args = _sysfs_for(capture, work_dir), ()
        if node_setup is not None:
            sysfs_root, agent_args = node_setup(name, sysfs_root)
        node = SimulatedNode(name=name, kubeconfig=cluster.kubeconfig, sysfs_root=sysfs_root, agent_args=agent_args,
                             work_dir=work_dir / "nodes", labels={"rocshare.io/node-class": node_class},
                             taints=TAINTS.get(name, ()), dra=is_dra)
        nodes.append(node)
        node.start()
    if dra:
        announce("starting the cluster's own kube-scheduler (pods written with claims) and DRA mode's "
                 "(pods whose amd.com/* limits admission turned into claims)")
        cluster.start_default_scheduler()
        cluster.start_dra_scheduler(f"http://127.0.0.1:{operator.port}/extender")


def apply_dra_samples(cluster: ControlPlane, *, timeout_s: float = 60.0) -> None:
    """The DeviceClass (part of rocshare's install; the demo runs the operator as a process, not from
    the manifests), the pool, then the pods once its node carries the pool's label and has reported its GPUs,
    since admission works a pod's percentages out from the GPUs of the pool's nodes."""
    cluster.kubectl("apply", "-f", str(PROJECT_ROOT / "manifests" / "base" / "dra" / "deviceclass.yaml"))
    cluster.kubectl("apply", "-f", str(DRA_SAMPLES / "10-pool-mi210-dra.yaml"))
    deadline = time.monotonic() + timeout_s
    while not _dra_pool_ready(cluster):
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool {DRA_POOL} did not count {DRA_NODE[0]}'s GPUs within {timeout_s:.0f} s")
        time.sleep(0.5)
    cluster.kubectl("apply", "-k", str(DRA_SAMPLES))


def _dra_pool_ready(cluster: ControlPlane) -> bool:
    labelled = cluster.kubectl("get", "nodes", "-l", f"rocshare.io/pool={DRA_POOL}", "-o", "name").stdout.split()
    pool = json.loads(cluster.kubectl("get", "amdgpupool", DRA_POOL, "-o", "json").stdout)
    return bool(labelled) and (pool.get("status") or {}).get("gpusTotal", 0) > 0


def up() -> int:
    if (RUN / "state.json").exists():
        print("The demo is already up (make demo-down stops it). Its state:\n")
        _show(ControlPlane(root=RUN / "cluster", ports=Ports.fixed()))
        return 0
    if not FIXTURES.is_dir():
        print(f"error: {FIXTURES} is missing: the demo reads the sysfs captures in ../shared", file=sys.stderr)
        return 1
    shutil.rmtree(RUN, ignore_errors=True)
    RUN.mkdir(parents=True)
    cluster = ControlPlane(root=RUN / "cluster", ports=Ports.fixed(), feature_gates=dra_feature_gates(k8s_version()))
    pids: dict[str, int] = {}
    try:
        _start(cluster, pids)
    except (ControlPlaneError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        _save(cluster, pids)
        down()
        return 1
    _save(cluster, pids)
    _show(cluster)
    print(f"\nkubectl: export KUBECONFIG={cluster.kubeconfig} PATH={cluster.bin_dir}:$PATH")
    print(f"metrics: extender 127.0.0.1:{METRICS_PORT}, agents 127.0.0.1:{min(MONITOR_PORTS.values())}-"
          f"{max(MONITOR_PORTS.values())}; `prometheus --config.file={_write_prometheus_config()}` scrapes them "
          "for the dashboards (docs/metrics.md)")
    print("stop everything: make demo-down")
    return 0


def _start(cluster: ControlPlane, pids: dict[str, int]) -> None:
    gates = ", with " + " ".join(cluster.feature_gates) if cluster.feature_gates else ""
    started = _step(f"starting the control plane (etcd, kube-apiserver, controller-manager, kube-scheduler "
                    f"v{k8s_version()}{gates})")
    cluster.start()
    cluster.kubectl("apply", "--server-side", "-f", str(PROJECT_ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    _done(started)
    pids.update(cluster.pids)

    started = _step("starting the operator (reconcilers, scheduler extender, admission webhook), applying "
                    "samples/ and starting the simulated nodes")
    operator = OperatorProcess(cluster, metrics_port=METRICS_PORT, webhook_port=39443)
    nodes: list[SimulatedNode] = []
    try:
        start_samples_fleet(cluster, operator, RUN, nodes, announce=lambda text: print(f"    {text}", flush=True),
                            node_setup=_with_monitor, dra=True)
        print("    applying samples/dra: the DRA pool, then its pods once the pool has labelled its node", flush=True)
        apply_dra_samples(cluster)
    finally:
        pids["operator"] = operator.pid
        if "default-scheduler" in cluster.pids:
            pids["default-scheduler"] = cluster.pids["default-scheduler"]
        for node in nodes:
            pids[f"{node.name}/kubelet-peer"] = node.kubelet_pid
            pids[f"{node.name}/agent"] = node.agent_pid
    _done(started)

    started = _step(f"waiting for the sample pods in {', '.join((*NAMESPACES, DRA_NAMESPACE))} to run and the pools "
                    "to count their GPUs")
    _wait_running(cluster, timeout_s=180)
    _wait_pools_counted(cluster, timeout_s=60)
    _done(started)

    started = _step("starting one hook-probe per slice container under the real memory hook (stub ROCm runtime), "
                    "each holding half its slice in the container's account")
    pids.update(hook_workloads.start(_pods(cluster), RUN / "hook-probes"))
    _done(started)


def _with_monitor(name: str, sysfs_root: Path) -> tuple[Path, tuple[str, ...]]:
    """Each agent's monitor on its own loopback port, so a Prometheus can scrape the demo."""
    return sysfs_root, (f"--monitor-port={MONITOR_PORTS[name]}", "--monitor-addr=127.0.0.1")


def _write_prometheus_config() -> Path:
    """A scrape configuration for the demo (the labels as manifests/observability's ServiceMonitors give them)."""
    config = {"global": {"scrape_interval": "15s"}, "scrape_configs": [
        {"job_name": "rocshare-operator", "static_configs": [{"targets": [f"127.0.0.1:{METRICS_PORT}"]}]},
        {"job_name": "rocshare-node-agent", "honor_labels": True, "static_configs": [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"node": name}} for name, port in MONITOR_PORTS.items()]}]}
    path = RUN / "prometheus.yml"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def _wait_running(cluster: ControlPlane, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = _pods(cluster)
        phases = [pod.get("status", {}).get("phase") for pod in pods]
        if pods and all(phase == "Running" for phase in phases):
            return
        time.sleep(1)
    raise RuntimeError(f"sample pods not Running after {timeout_s:.0f} s: "
                       f"{cluster.kubectl('get', 'pods', '-A', '-l', 'app.kubernetes.io/part-of=rocshare-samples').stdout}")


def _pods(cluster: ControlPlane) -> list[dict]:
    return [pod for namespace in (*NAMESPACES, DRA_NAMESPACE)
            for pod in json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]]


def _wait_pools_counted(cluster: ControlPlane, *, timeout_s: float) -> None:
    """Pool status trails the agents' first publication by a reconcile pass."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pools = json.loads(cluster.kubectl("get", "amdgpupools", "-o", "json").stdout)["items"]
        if all(pool.get("status", {}).get("gpusTotal", 0) > 0 or not pool.get("status", {}).get("nodes")
               for pool in pools):
            return
        time.sleep(1)


def _show(cluster: ControlPlane) -> None:
    print(cluster.kubectl("get", "amdgpupools,amdgpunodes,amdgpushares", "-A").stdout)
    pods = _pods(cluster)
    print(f"{'POD':<18} {'NODE':<16} {'GPU':<24} {'MiB':>6} {'CUs':>4}  HSA_CU_MASK")
    for pod in pods:
        for line in _slices(pod):
            print(line)
    print(f"\n{'NODE':<16} {'GPU':<24} pods per XCD or shader engine (AmdGpuNode status.isolation)")
    for node in json.loads(cluster.kubectl("get", "amdgpunodes", "-o", "json").stdout)["items"]:
        for gpu in node.get("status", {}).get("isolation") or []:
            units = " ".join(f"{gpu['unit']}{unit['index']}:" + ("+".join(tenant["pod"].partition("/")[2]
                                                                        for tenant in unit["tenants"]) or "-")
                             for unit in gpu["units"])
            print(f"{node['metadata']['name']:<16} {gpu['gpuId']:<24} {units}")


def _slices(pod: dict) -> list[str]:
    meta = pod["metadata"]
    text = meta.get("annotations", {}).get(ALLOCATION_ANNOTATION)
    if text is None and pod["spec"].get("resourceClaims"):
        return _claim_slices(pod)
    if text is None:
        return [f"{meta['name']:<18} {'(pending)':<16}"]
    record = decode_record(text)
    runtime = runtime_specs(pod) or {}
    lines = []
    for container in record.containers:
        mask = runtime.get(container.name, {}).get("envs", {}).get("HSA_CU_MASK", "(all CUs)")
        for device in container.devices:
            lines.append(f"{meta['name']:<18} {record.node:<16} {device.gpu_id:<24} {device.memory_mib:>6} "
                         f"{device.cu_count:>4}  {mask}")
    return lines


def _claim_slices(pod: dict) -> list[str]:
    """A DRA pod: its allocation record is on its claim; what the container got is in the CDI edits
    the kubelet peer recorded (GPU, memory limit, CU mask)."""
    name, runtime = pod["metadata"]["name"], runtime_specs(pod)
    if runtime is None:
        return [f"{name:<18} {'(pending)':<16}"]
    lines = []
    for received in runtime.values():
        envs = received.get("envs") or {}
        masks = parse_cu_mask(envs.get("HSA_CU_MASK", ""))
        for index, gpu in enumerate(filter(None, envs.get("ROCR_VISIBLE_DEVICES", "").split(","))):
            memory = envs.get(f"HIP_DEVICE_MEMORY_LIMIT_{index}", "-").removesuffix("m")
            cus = sum(high - low + 1 for low, high in masks.get(index, ())) or "all"
            lines.append(f"{name:<18} {pod['spec'].get('nodeName', ''):<16} {gpu:<24} {memory:>6} {cus:>4}  "
                         f"{envs.get('HSA_CU_MASK', '(all CUs)')}  (DRA: {', '.join(received.get('cdiDevices', []))})")
    return lines


def _save(cluster: ControlPlane, pids: dict[str, int]) -> None:
    (RUN / "state.json").write_text(json.dumps({"pids": pids, "cluster": str(cluster.root)}))


def down() -> int:
    state_path = RUN / "state.json"
    if not state_path.exists():
        print("no demo is running")
        return 0
    pids = json.loads(state_path.read_text())["pids"]
    # Nodes and the operator first, the control plane last (reverse start order).
    for name, pid in reversed(list(pids.items())):
        if pid:
            stop_process(pid, name)
    state_path.unlink()
    (RUN / "cluster" / "state.json").unlink(missing_ok=True)
    print("demo stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rocshare-dev demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down"])
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("note: simulated nodes need root (mount namespaces for the kubelet peers)", file=sys.stderr)
    return up() if args.action == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
