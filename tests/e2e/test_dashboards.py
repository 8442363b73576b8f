"""Both Grafana dashboards on a real Prometheus: rocshare's own
(manifests/observability/grafana-dashboard.json) and HAMi's published vGPU dashboard
(dashboards/hami-vgpu-dashboard.json in HAMi's repository at 4707fb0; its queries are restated
in HAMI_QUERIES below, the file is not copied).

The setting is `make demo`'s, started by the same function (demo.start_samples_fleet): the real
control plane, the operator (extender, webhook), samples/ applied (pools, shares, every sample
pod), and the demo's five simulated nodes — each the kubelet peer plus the real agent, here with
its monitor on a loopback port and its own copy of its capture:

* two MI210 nodes: the capture with a synthetic 64 GiB per GPU (as the demo) and synthetic DRM
  folders (the capture has none: sensors, VRAM used, PCI device 0x740f revision 0x02);
* the MI300X in CPX mode: KFD only (no DRM folder, so no host sensor series);
* the MI300X in SPX mode derived from it (captures.mi300x_spx), KFD only as well, holding the two
  inference pods its taint keeps for them;
* the Strix Point APU, whose DRM folder is real (its sensor values are the captured ones).

Once the sample pods run, the test plays their processes: for every container and GPU of the
allocation records it writes KFD per-process files (vram_<gpu_id>, stats_<gpu_id>/cu_occupancy)
into the node's sysfs copy and /proc/<pid>/cgroup + environ (the environment the kubelet peer
handed the container) into a proc root the agent reads. A Prometheus server (Debian package,
`make observability-deps`) scrapes the extender and the five monitors; every query of
both dashboards (panels and template variables) goes to its HTTP API, and each answer must hold
exactly the series the sample pods imply, with their values: computed here from the pods'
specs, their allocation records, the nodes' published inventory and the files written above.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT
from rocshare_dev.devcluster.demo import FLEET, NAMESPACES, start_samples_fleet
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from tests.e2e.fleet import record_of
from tests.e2e.gpu_world import (MIB, Gpu, PodKey, SliceKey, Truth, check_records, held_pct, play_processes, read_host,
                                 set_vram_used, synthetic_drm, synthetic_gpu_ids, writable_copy)
from tests.e2e.prometheus import Prometheus, free_port

pytestmark = pytest.mark.e2e

DASHBOARD = PROJECT_ROOT / "manifests" / "observability" / "grafana-dashboard.json"

# HAMi's vGPU dashboard at 4707fb0: (panel title, query) for every panel target, then its two variables.
HAMI_QUERIES = [
    ("Physical GPUs", 'count(hami_gpu_memory_limit_bytes{node=~"$node"})'),
    ("Total GPU memory", 'sum(hami_gpu_memory_limit_bytes{node=~"$node"})'),
    ("Allocated GPU memory", 'sum(hami_gpu_memory_allocated_bytes{node=~"$node"})'),
    ("GPU memory allocated %", '100 * sum(hami_gpu_memory_allocated_bytes{node=~"$node"}) / sum(hami_gpu_memory_limit_bytes{node=~"$node"})'),
    ("Shared containers", 'sum(hami_gpu_shared_count{node=~"$node"})'),
    ("Host GPU memory used", 'hami_host_gpu_memory_used_bytes and on (device_uuid) hami_gpu_memory_limit_bytes{node=~"$node"}'),
    ("Host GPU utilization", 'hami_host_gpu_utilization_ratio and on (device_uuid) hami_gpu_memory_limit_bytes{node=~"$node"}'),
    ("GPU memory: allocated", 'sum by (node) (hami_gpu_memory_allocated_bytes{node=~"$node"})'),
    ("GPU memory: limit", 'sum by (node) (hami_gpu_memory_limit_bytes{node=~"$node"})'),
    ("Node GPU memory allocated ratio", 'hami_node_gpu_memory_allocated_ratio{node=~"$node"}'),
    ("GPU core allocated ratio", 'hami_gpu_core_allocated_ratio{node=~"$node"}'),
    ("GPU shared count per device", 'hami_gpu_shared_count{node=~"$node"}'),
    ("vGPU memory: used", 'hami_vgpu_memory_used_bytes{namespace=~"$namespace"}'),
    ("vGPU memory: limit", 'hami_vgpu_memory_limit_bytes{namespace=~"$namespace"}'),
    ("Container device utilization", 'hami_container_device_utilization_ratio{namespace=~"$namespace"}'),
    ("vGPU memory used % of limit", '100 * hami_vgpu_memory_used_bytes{namespace=~"$namespace"} / hami_vgpu_memory_limit_bytes{namespace=~"$namespace"}'),
    ("Top 10 containers by vGPU memory", 'topk(10, hami_vgpu_memory_used_bytes{namespace=~"$namespace"})'),
]


# ---- the cluster ----------------------------------------------------------------------------------------


@dataclass
class Setting:
    prometheus: Prometheus
    truth: Truth
    nodes: list[str]
    bound_pods: int
    operator_instance: str = ""
    agent_instances: dict[str, str] = field(default_factory=dict)


def _json(cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def _wait(check, *, timeout_s: float, what: str, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; last: {last!r}")


def _settled(cluster) -> dict[PodKey, dict] | None:
    """The Running pods of the samples' namespaces, once every pod there runs or was found
    unschedulable (then it holds nothing: the extender reserves nothing for it)."""
    running, waiting = {}, 0
    for namespace in NAMESPACES:
        for pod in _json(cluster, "get", "pods", "-n", namespace)["items"]:
            status = pod.get("status", {})
            unschedulable = any(condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable"
                                for condition in status.get("conditions", []))
            if status.get("phase") == "Running":
                running[(namespace, pod["metadata"]["name"])] = pod
            elif not (unschedulable and not pod["spec"].get("nodeName")):
                waiting += 1
    return running if running and not waiting else None


def _stable(cluster, quiet_s: float = 6.0) -> dict[PodKey, dict] | None:
    """Settled twice, `quiet_s` apart, with the same pods running (a pod found unschedulable before
    every node was up is retried when the nodes come)."""
    first = _settled(cluster)
    if first is None:
        return None
    time.sleep(quiet_s)
    second = _settled(cluster)
    return second if second is not None and set(second) == set(first) else None


def _truth(cluster, nodes: list[str], pods: dict[PodKey, dict]) -> Truth:
    truth = Truth()
    pools = {pool["metadata"]["name"]: pool["spec"] for pool in _json(cluster, "get", "amdgpupools")["items"]}
    for name in nodes:
        node = _json(cluster, "get", "node", name)
        pool = pools[node["metadata"]["labels"]["rocshare.io/pool"]]
        scaling = pool.get("sharing", {}).get("deviceMemoryScaling", 1.0)
        for gpu in _json(cluster, "get", "amdgpunode", name)["status"]["gpus"]:
            # Only gfx9 (GCN5, CDNA) oversubscribes; RDNA registers its real VRAM (the pool's docs).
            factor = scaling if 90000 <= gpu["gfxTargetVersion"] < 100000 else 1.0
            truth.gpus[f"{name}/{gpu['id']}"] = Gpu(name, gpu["id"], gpu["index"], int((gpu.get("vramMiB") or 0) * factor),
                                                    gpu["cuCount"], gpu["gfxTargetVersion"], gpu["product"])
    truth.records = {key: record_of(pod) for key, pod in pods.items()}
    for namespace in NAMESPACES:
        hard: dict[str, list[int]] = defaultdict(list)
        for quota in _json(cluster, "get", "resourcequotas", "-n", namespace)["items"]:
            for key, value in quota["spec"]["hard"].items():
                if key in QUOTA_KEYS:
                    hard[QUOTA_KEYS[key]].append(int(value))
        truth.quota_limits[namespace] = {name: min(values) for name, values in hard.items()}
    return truth


QUOTA_KEYS = {"limits.amd.com/gpumem": "amd.com/gpumem", "limits.amd.com/gpucores": "amd.com/gpucores",
              "requests.amd.com/gpu": "amd.com/gpu"}


@pytest.fixture(scope="module")
def setting(cluster, tmp_path_factory) -> Iterator[Setting]:
    work = tmp_path_factory.mktemp("dashboards")
    # Nodes other modules left are deleted in the background: the samples must see only the demo's.
    _wait(lambda: not _json(cluster, "get", "nodes")["items"] or None, timeout_s=60, what="no nodes left")
    operator = OperatorProcess(cluster)
    ports = {name: free_port() for name, _capture, _class in FLEET}
    sysfs: dict[str, Path] = {}
    procs = {name: work / "proc" / name for name in ports}

    def node_setup(name: str, capture_root: Path) -> tuple[Path, tuple[str, ...]]:
        sysfs[name] = writable_copy(capture_root, work / "sysfs" / name)
        synthetic_gpu_ids(sysfs[name])
        if "mi210" in name:  # the KFD-only MI210 capture gets synthetic DRM folders
            synthetic_drm(sysfs[name])
        procs[name].mkdir(parents=True)
        return sysfs[name], (f"--monitor-port={ports[name]}", "--monitor-addr=127.0.0.1", f"--proc-root={procs[name]}")

    started: list = []
    prometheus = Prometheus(work, operator=f"127.0.0.1:{operator.metrics_port}",
                            agents={name: f"127.0.0.1:{port}" for name, port in ports.items()})
    try:
        prometheus.wait_ready()
        def first_scrape() -> None:
            # rate() sees only what a counter gains after its first scrape: Prometheus must read the
            # operator's counters at 0, before any sample pod reaches the extender.
            _wait(lambda: prometheus.query('up{job="rocshare-operator"} == 1', time.time()), timeout_s=60,
                  what="Prometheus's first scrape of the operator")
            counted = prometheus.query("sum(rocshare_extender_decisions_total)", time.time())
            assert list(counted.values()) == [0.0], f"decisions counted before any pod was applied: {counted}"

        start_samples_fleet(cluster, operator, work, started, node_setup=node_setup, operator_started=first_scrape)
        def published() -> bool:
            found = {item["metadata"]["name"]: item for item in _json(cluster, "get", "amdgpunodes")["items"]}
            return all(found.get(node.name, {}).get("status", {}).get("gpus") for node in started)

        _wait(published, timeout_s=120, what="every node's AmdGpuNode published")
        pods = _wait(lambda: _stable(cluster), timeout_s=240, what=f"every pod in {NAMESPACES} Running or unschedulable")
        nodes = [node.name for node in started]
        truth = _truth(cluster, nodes, pods)
        check_records(truth, pods)
        for name in nodes:
            used = play_processes(truth, name, sysfs[name], procs[name], pods)
            if "mi210" in name:
                set_vram_used(sysfs[name], used)
            read_host(truth, sysfs[name], name)
        expected_series = len(truth.used_bytes)

        def scraped_processes() -> bool:
            found = prometheus.query("count(hami_vgpu_memory_used_bytes)", time.time())
            return list(found.values()) == [expected_series]

        _wait(scraped_processes, timeout_s=90, what=f"{expected_series} container series scraped")
        yield Setting(prometheus, truth, nodes, bound_pods=len(pods))
    finally:
        prometheus.stop()
        cluster.kubectl("delete", "-k", str(PROJECT_ROOT / "samples"), "--ignore-not-found", "--wait=false", check=False)
        for namespace in NAMESPACES:
            cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0", check=False)
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "rocshare-pods",
                        "--ignore-not-found", check=False)
        # The pools go while the operator runs: their finalizer unmarks the nodes first.
        cluster.kubectl("delete", "amdgpupools", "--all", "--timeout=60s", check=False)
        for node in started:
            node.stop()
        operator.stop()


@pytest.fixture(scope="module")
def scraped(setting: Setting) -> Setting:
    """Every target up; the instance label Prometheus gave each."""
    prometheus, targets = setting.prometheus, 1 + len(setting.nodes)

    def all_up():
        up = prometheus.query("up", time.time())
        return up if len(up) == targets and all(value == 1 for value in up.values()) else None

    for key in _wait(all_up, timeout_s=90, what="every target up"):
        entry = dict(key)
        if entry["job"] == "rocshare-operator":
            setting.operator_instance = entry["instance"]
        else:
            setting.agent_instances[entry["node"]] = entry["instance"]
    return setting


# ---- expectations ---------------------------------------------------------------------------------------


def labels(**values: object) -> frozenset:
    return frozenset((key, str(value)) for key, value in values.items())


class Expect:
    """Label sets and values of the series each panel must return, from the Truth."""

    def __init__(self, setting: Setting) -> None:
        self.s, self.t = setting, setting.truth
        self.gpus = sorted(self.t.gpus.values(), key=lambda gpu: (gpu.node, gpu.index))
        self.host_gpus = [gpu for gpu in self.gpus if f"{gpu.node}/{gpu.id}" in self.t.host]

    def host(self, gpu: Gpu) -> dict[str, float]:
        return self.t.host[f"{gpu.node}/{gpu.id}"]

    def ledger_labels(self, gpu: Gpu) -> frozenset:
        return labels(node=gpu.node, device_uuid=gpu.id, device_index=gpu.index, device_type=gpu.product, zone="vGPU",
                      job="rocshare-operator", instance=self.s.operator_instance)

    def host_labels(self, gpu: Gpu) -> frozenset:
        return labels(node=gpu.node, device_uuid=gpu.id, device_index=gpu.index, device_type=gpu.product, zone="vGPU",
                      job="rocshare-node-agent", instance=self.s.agent_instances[gpu.node])

    def container_labels(self, key: SliceKey) -> frozenset:
        namespace, pod, container, gpu_id = key
        node = self.t.records[(namespace, pod)].node
        return labels(namespace=namespace, pod=pod, container=container, vdevice_index=self.t.vdevice[key],
                      device_uuid=gpu_id, zone="vGPU", job="rocshare-node-agent", node=node,
                      instance=self.s.agent_instances[node])

    def totals(self) -> tuple[int, int]:
        return (sum(gpu.offered_mib for gpu in self.gpus) * MIB,
                sum(self.t.allocated_mib(gpu) for gpu in self.gpus) * MIB)

    def per_node(self, value) -> dict[frozenset, float]:
        sums: dict[frozenset, float] = defaultdict(float)
        for gpu in self.gpus:
            sums[labels(node=gpu.node)] += value(gpu)
        return dict(sums)

    def containers(self, value, *, limited: bool = False) -> dict[frozenset, float]:
        keys = self.t.limit_bytes if limited else self.t.used_bytes
        return {self.container_labels(key): value(key) for key in keys}


def named(metric: str, series: dict[frozenset, float]) -> dict[frozenset, float]:
    """A plain selector, `a and on (...) b` and topk keep the metric's name; aggregations drop it."""
    return {key | {("__name__", metric)}: value for key, value in series.items()}


def hami_expected(setting: Setting) -> dict[str, dict[frozenset, float]]:
    e, t = Expect(setting), setting.truth
    offered, allocated = e.totals()
    return {
        "Physical GPUs": {frozenset(): len(e.gpus)},
        "Total GPU memory": {frozenset(): offered},
        "Allocated GPU memory": {frozenset(): allocated},
        "GPU memory allocated %": {frozenset(): 100 * allocated / offered},
        "Shared containers": {frozenset(): sum(len(t.on(gpu)) for gpu in e.gpus)},
        "Host GPU memory used": named("hami_host_gpu_memory_used_bytes",
                                      {e.host_labels(gpu): e.host(gpu)["used"] for gpu in e.host_gpus}),
        "Host GPU utilization": named("hami_host_gpu_utilization_ratio",
                                      {e.host_labels(gpu): e.host(gpu)["busy"] for gpu in e.host_gpus}),
        "GPU memory: allocated": e.per_node(lambda gpu: t.allocated_mib(gpu) * MIB),
        "GPU memory: limit": e.per_node(lambda gpu: gpu.offered_mib * MIB),
        # HAMi emits this one as a 0-1 fraction (its dashboard's "percent" unit then shows 0-1 %);
        # GPUs without a known VRAM size (the MI300X capture) have no ratio, as in HAMi.
        "Node GPU memory allocated ratio": named("hami_node_gpu_memory_allocated_ratio", {
            e.ledger_labels(gpu): t.allocated_mib(gpu) / gpu.offered_mib for gpu in e.gpus if gpu.offered_mib}),
        "GPU core allocated ratio": named("hami_gpu_core_allocated_ratio",
                                          {e.ledger_labels(gpu): t.cores_pct(gpu) for gpu in e.gpus}),
        "GPU shared count per device": named("hami_gpu_shared_count", {e.ledger_labels(gpu): len(t.on(gpu)) for gpu in e.gpus}),
        "vGPU memory: used": named("hami_vgpu_memory_used_bytes", e.containers(lambda key: t.used_bytes[key])),
        "vGPU memory: limit": named("hami_vgpu_memory_limit_bytes", e.containers(lambda key: t.limit_bytes[key], limited=True)),
        "Container device utilization": named("hami_container_device_utilization_ratio", e.containers(
            lambda key: 100 * t.busy_cus[key] / t.gpu(t.records[key[:2]].node, key[3]).cu_count)),
        "vGPU memory used % of limit": e.containers(lambda key: 100 * t.used_bytes[key] / t.limit_bytes[key], limited=True),
        "Top 10 containers by vGPU memory": named("hami_vgpu_memory_used_bytes", e.containers(lambda key: t.used_bytes[key])),
    }


def rocshare_expected(setting: Setting) -> dict[str, dict[frozenset, float]]:
    e, t = Expect(setting), setting.truth
    offered, allocated = e.totals()
    node_gpu = lambda gpu: labels(node=gpu.node, device_index=gpu.index)  # noqa: E731
    used = {namespace: {"amd.com/gpumem": 0, "amd.com/gpucores": 0, "amd.com/gpu": 0} for namespace in NAMESPACES}
    for (namespace, pod), _index, _container, device in t.slices():
        used[namespace]["amd.com/gpumem"] += device.memory_mib
        used[namespace]["amd.com/gpu"] += 1
        used[namespace]["amd.com/gpucores"] += held_pct(t, t.records[(namespace, pod)].node, device)
    by_container: dict[str, dict[frozenset, float]] = {"used": defaultdict(float), "limit": defaultdict(float)}
    for key in t.used_bytes:
        short = labels(namespace=key[0], pod=key[1], container=key[2])
        by_container["used"][short] += t.used_bytes[key]
        if key in t.limit_bytes:
            by_container["limit"][short] += t.limit_bytes[key]

    def slice_labels(key: PodKey, index: int, device) -> frozenset:
        return labels(namespace=key[0], pod=key[1], container_index=index, node=t.records[key].node,
                      device_uuid=device.gpu_id)

    return {
        "GPUs [A]": {frozenset(): len(e.gpus)},
        "VRAM offered [A]": {frozenset(): offered},
        "VRAM allocated [A]": {frozenset(): 100 * allocated / offered},
        "Containers holding slices [A]": {frozenset(): sum(len(t.on(gpu)) for gpu in e.gpus)},
        "VRAM allocated per GPU [A]": {node_gpu(gpu): t.allocated_mib(gpu) * MIB for gpu in e.gpus},
        "Compute units allocated per GPU [A]": {node_gpu(gpu): t.cores_pct(gpu) for gpu in e.gpus},
        "Containers sharing each GPU [A]": {node_gpu(gpu): len(t.on(gpu)) for gpu in e.gpus},
        "Slices by container [A]": {slice_labels(key, index, device): device.memory_mib * MIB
                                    for key, index, _c, device in t.slices()},
        "Compute by container [A]": {slice_labels(key, index, device): held_pct(t, t.records[key].node, device)
                                     for key, index, _c, device in t.slices()},
        "Quota held vs limit [A]": {labels(namespace=namespace, quota_name=name): value
                                    for namespace, values in used.items() for name, value in values.items()},
        "Quota held vs limit [B]": {labels(namespace=namespace, quota_name=name): value
                                    for namespace, values in t.quota_limits.items() for name, value in values.items()},
        "VRAM used by containers vs limit [A]": dict(by_container["used"]),
        "VRAM used by containers vs limit [B]": dict(by_container["limit"]),
        "Compute units busy per container [A]": {
            labels(namespace=key[0], pod=key[1], container=key[2], device_uuid=key[3]):
                100 * t.busy_cus[key] / t.gpu(t.records[key[:2]].node, key[3]).cu_count for key in t.busy_cus},
        "GPU utilisation [A]": {labels(node=gpu.node, device_index=gpu.index, device_type=gpu.product): e.host(gpu)["busy"]
                                for gpu in e.host_gpus},
        "VRAM used on the GPU [A]": {node_gpu(gpu): e.host(gpu)["used"] for gpu in e.host_gpus},
        "GPU temperature [A]": {node_gpu(gpu): e.host(gpu)["temperature"] for gpu in e.host_gpus},
        "GPU power [A]": {node_gpu(gpu): e.host(gpu)["power"] for gpu in e.host_gpus},
    }


def assert_result(title: str, got: dict[frozenset, float], want: dict[frozenset, float]) -> None:
    assert want, f"{title}: the expectation is empty (the sample pods imply series)"
    missing, extra = set(want) - set(got), set(got) - set(want)
    assert not missing and not extra, f"{title}: missing {sorted(map(sorted, missing))[:3]}, extra {sorted(map(sorted, extra))[:3]}"
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-9), f"{title} {sorted(key)}: {got[key]} != {value}"


def assert_topk(title: str, k: int, got: dict[frozenset, float], candidates: dict[frozenset, float]) -> None:
    """topk: k series of the candidates with their values, none smaller than any left out (ties allowed)."""
    assert len(got) == min(k, len(candidates)), (title, len(got))
    for key, value in got.items():
        assert key in candidates and candidates[key] == value, (title, sorted(key))
    smallest = min(got.values())
    assert all(value <= smallest for key, value in candidates.items() if key not in got), title


def substitute(expr: str, rate_window_s: int) -> str:
    """Grafana's variables as a user sets them: every node and job (All), the samples' namespaces
    (other test modules may leave namespaces with quotas in the shared control plane)."""
    return (expr.replace("$node", ".*").replace("$namespace", "|".join(NAMESPACES)).replace("$operator_job", ".*")
            .replace("$__rate_interval", f"{rate_window_s}s"))


def rocshare_queries() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [(f"{panel['title']} [{target['refId']}]", target["expr"])
              for panel in dashboard["panels"] for target in panel.get("targets", [])]
    variables = [(item["name"], item["query"]["query"]) for item in dashboard["templating"]["list"] if item["type"] == "query"]
    return panels, variables


RATE_PANELS = {"Extender latency p50 by verb [A]", "Extender latency p99 by verb [A]",
               "Extender requests per second by verb [A]", "Decisions by verb and outcome [A]",
               "Nodes filtered out by reason [A]"}


# ---- the tests ----------------------------------------------------------------------------------------


def test_hami_dashboard_variables(scraped: Setting) -> None:
    nodes = {gpu.node for gpu in scraped.truth.gpus.values()}
    namespaces = {key[0] for key in scraped.truth.used_bytes}
    assert scraped.prometheus.label_values("hami_gpu_memory_limit_bytes", "node") == nodes == set(scraped.nodes)
    assert scraped.prometheus.label_values("hami_vgpu_memory_used_bytes", "namespace") == namespaces == set(NAMESPACES)


def test_hami_dashboard_queries(scraped: Setting) -> None:
    expected = hami_expected(scraped)
    at = time.time()
    assert {title for title, _expr in HAMI_QUERIES} == set(expected)
    for title, expr in HAMI_QUERIES:
        got = scraped.prometheus.query(substitute(expr, 60), at)
        if expr.startswith("topk(10,"):
            assert_topk(title, 10, got, expected[title])
        else:
            assert_result(title, got, expected[title])


def test_rocshare_dashboard_variables(scraped: Setting) -> None:
    _panels, variables = rocshare_queries()
    expected = {"operator_job": {"rocshare-operator"}, "node": set(scraped.nodes), "namespace": set(NAMESPACES)}
    assert {name for name, _query in variables} == set(expected)
    for name, query in variables:
        metric, label = query.removeprefix("label_values(").removesuffix(")").split(", ")
        assert scraped.prometheus.label_values(metric, label) == expected[name], name


def test_rocshare_dashboard_queries(scraped: Setting) -> None:
    expected = rocshare_expected(scraped)
    panels, _variables = rocshare_queries()
    assert {title for title, _expr in panels} == set(expected) | RATE_PANELS
    # The shares' limits reached the namespaces' ResourceQuotas (samples/20-share.yaml for gpu-demo).
    share = yaml.safe_load((PROJECT_ROOT / "samples" / "20-share.yaml").read_text())["spec"]["limits"]
    assert scraped.truth.quota_limits["gpu-demo"] == {"amd.com/gpumem": share["memoryMiB"],
                                                      "amd.com/gpucores": share["coresPercent"], "amd.com/gpu": share["gpus"]}
    at = time.time()
    for title, expr in panels:
        if title not in RATE_PANELS:
            assert_result(title, scraped.prometheus.query(substitute(expr, 60), at), expected[title])


def test_rocshare_dashboard_rate_panels(scraped: Setting) -> None:
    """Over a window holding the whole run, rate x window is the counters' increase (the series
    exist at 0 from the first scrape): as many binds as pods placed, requests for every verb,
    latencies inside the histogram's buckets, rejections by reason as counted."""
    prometheus = scraped.prometheus
    # Evaluated at the operator's last scrape, over a window reaching back before the first: rate()
    # then extrapolates neither end (the counters start at 0), so rate x window is the increase.
    last = prometheus.query('timestamp(up{job="rocshare-operator"})', time.time())
    (at,) = last.values()
    window = int(at - prometheus.started) + 30
    panels = dict(rocshare_queries()[0])
    decisions = prometheus.query(substitute(panels["Decisions by verb and outcome [A]"], window), at)
    raw = prometheus.query("sum by (verb, outcome) (rocshare_extender_decisions_total)", at)
    assert set(decisions) == set(raw)
    for key, value in raw.items():
        assert math.isclose(decisions[key] * window, value, rel_tol=0.05, abs_tol=1e-9), (sorted(key), value)
    # Every pod that runs was bound once; the pods left unschedulable never were.
    assert raw[labels(verb="bind", outcome="bound")] == scraped.bound_pods
    requests = prometheus.query(substitute(panels["Extender requests per second by verb [A]"], window), at)
    counts = prometheus.query("sum by (verb) (rocshare_extender_request_duration_seconds_count)", at)
    # The shipped configurations: extender mode's profile declares the first four, DRA mode's the last.
    verbs = ("filter", "prioritize", "bind", "preempt", "prioritize-dra")
    assert set(requests) == set(counts) == {labels(verb=verb) for verb in verbs}
    for key, value in counts.items():
        assert math.isclose(requests[key] * window, value, rel_tol=0.05, abs_tol=1e-9), (sorted(key), value)
    # The shipped profile names no prioritize (filter answers with the best nodes): its series stay at 0.
    assert counts[labels(verb="filter")] > 0 and counts[labels(verb="bind")] > 0
    assert counts[labels(verb="prioritize")] == 0
    for quantile in ("p50", "p99"):
        latency = prometheus.query(substitute(panels[f"Extender latency {quantile} by verb [A]"], window), at)
        assert set(latency) == set(counts)
        for key, value in latency.items():  # a verb never called has no quantile (NaN: no point drawn)
            assert (0 < value <= 30) if counts[key] else math.isnan(value), (quantile, sorted(key), value)
    rejections = prometheus.query(substitute(panels["Nodes filtered out by reason [A]"], window), at)
    raw = prometheus.query("sum by (reason) (rocshare_extender_node_rejections_total)", at)
    assert raw and set(rejections) == set(raw)  # the 2-GPU and MI210-only samples leave nodes out
    for key, value in raw.items():
        assert math.isclose(rejections[key] * window, value, rel_tol=0.05), (sorted(key), rejections[key] * window, value)
