"""The device plugin against the kubelet's own device manager (kubelet-peer) on the real
control plane, with simulated nodes on real sysfs captures (DESIGN.md sections 2, 4, 6, 7):
registration and allocatable = GPUs x splitCount; re-registration after a kubelet restart;
a GPU going unhealthy and allocatable dropping; multi-container and multi-GPU pods receiving
exactly the environment their record implies; partition mode on the MI300X capture; pods the
scheduler did not commit being refused by the kubelet with our reason.

No scheduler is involved: where a pod needs a committed record, THE TEST PLAYS THE SCHEDULER
(extender bind): it writes the allocation record on the pod, then creates the Binding, in that
order, exactly as the extender does.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rocshare.api.allocation import (
    ALLOCATED_ANNOTATION,
    ALLOCATION_ANNOTATION,
    ALLOCATION_ERROR_ANNOTATION,
    AllocationRecord,
    ContainerAllocation,
    DeviceSlice,
    encode_record,
)
from rocshare.api.models import OperatingMode, Sharing
from rocshare.api.node_settings import NodeSettings
from rocshare_dev.devcluster.simnode import SimulatedNode
from tests.e2e.fleet import runtime_of
from rocshare_agent.discovery import discover

pytestmark = pytest.mark.e2e

NAMESPACE = "dp-e2e"
HOOK = "/usr/local/vgpu/libamvgpu.so"


# ---- helpers ---------------------------------------------------------------------------------


def poll(check: Callable[[], Any], *, timeout_s: float = 30.0, every_s: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"{what} not reached within {timeout_s} s (last: {last!r})")


def get_json(cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def allocatable_gpus(cluster, node: str) -> int:
    return int(get_json(cluster, "node", node)["status"].get("allocatable", {}).get("amd.com/gpu", "0"))


def pod_manifest(name: str, containers: dict[str, int], *, init: dict[str, int] | None = None,
                 node: str | None = None) -> dict:
    def spec(c: str, n: int) -> dict:
        return {"name": c, "image": "registry.invalid/app:1", "resources": {"limits": {"amd.com/gpu": str(n)}}}

    pod_spec: dict[str, Any] = {"containers": [spec(c, n) for c, n in containers.items()],
                                "initContainers": [spec(c, n) for c, n in (init or {}).items()],
                                "schedulerName": "nobody-the-test-binds", "automountServiceAccountToken": False}
    if node:
        pod_spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": pod_spec}


def create_pod(cluster, manifest: dict) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))


def play_scheduler(cluster, pod: str, record: AllocationRecord) -> None:
    """The extender's bind: commit the record on the pod, then bind it to the record's node."""
    cluster.kubectl("annotate", "pod", "-n", NAMESPACE, pod, f"{ALLOCATION_ANNOTATION}={encode_record(record)}")
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod, "namespace": NAMESPACE},
               "target": {"apiVersion": "v1", "kind": "Node", "name": record.node}}
    cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/binding", "-f", "-",
                    input_text=json.dumps(binding))


def settled_pod(cluster, name: str) -> dict:
    def phase() -> dict | None:
        pod = get_json(cluster, "pod", "-n", NAMESPACE, name)
        return pod if pod["status"].get("phase") in ("Running", "Failed") else None

    return poll(phase, what=f"pod {name} Running or Failed")


def container_specs(pod: dict) -> dict:
    return runtime_of(pod)


def slice_(gpu_id: str, memory_mib: int, ranges=(), *, whole: bool = False, cu_count: int = 104) -> DeviceSlice:
    return DeviceSlice(gpu_id=gpu_id, memory_mib=memory_mib, cu_ranges=list(ranges), cu_count=cu_count, whole=whole)


def record(node: str, containers: dict[str, list[DeviceSlice]], *, init: tuple[str, ...] = (),
           oversubscribed: bool = False) -> AllocationRecord:
    return AllocationRecord(node=node, oversubscribed=oversubscribed, containers=[
        ContainerAllocation(name=name, init=name in init, devices=devices) for name, devices in containers.items()])


def agent_registrations(node: SimulatedNode) -> int:
    text = (node.root / "agent.log").read_text()
    return max([int(n) for n in re.findall(r"\(registration (\d+)\)", text)] or [0])


# ---- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def namespace(cluster) -> str:
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    poll(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False).returncode == 0,
         what="default ServiceAccount")
    return NAMESPACE


def start_node(cluster, tmp_path_factory, capture: str, **kwargs) -> SimulatedNode:
    sysfs = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "sysfs" / capture
    name = f"sim-{capture.split('-')[0]}-{uuid.uuid4().hex[:6]}"
    node = SimulatedNode(name=name, kubeconfig=cluster.kubeconfig, sysfs_root=sysfs.resolve(),
                         work_dir=tmp_path_factory.mktemp("simnodes"), bin_dir=cluster.bin_dir, **kwargs)
    node.start()
    return node


@pytest.fixture(scope="module")
def mi210(cluster, namespace, tmp_path_factory) -> Iterator[SimulatedNode]:
    node = start_node(cluster, tmp_path_factory, "mi210-8gpu-xgmi")
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def mi210_gpus(mi210) -> list[str]:
    return [g.id for g in sorted(discover(mi210.sysfs_root).gpus, key=lambda g: g.index)]


# ---- registration, capacity, restart, health -----------------------------------------------------


def test_registration_gives_gpus_times_split_count(cluster, mi210):
    assert poll(lambda: allocatable_gpus(cluster, mi210.name) == 80, what="allocatable amd.com/gpu 80 (8 x 10)")
    assert get_json(cluster, "node", mi210.name)["status"]["capacity"]["amd.com/gpu"] == "80"


def test_unhealthy_gpu_lowers_allocatable_and_recovers(cluster, mi210):
    poll(lambda: allocatable_gpus(cluster, mi210.name) == 80, what="80 allocatable")
    mi210.set_gpu_healthy(131, False)
    poll(lambda: allocatable_gpus(cluster, mi210.name) == 70, timeout_s=15, what="allocatable 70 after a GPU failed")
    assert get_json(cluster, "node", mi210.name)["status"]["capacity"]["amd.com/gpu"] == "80"  # still there, unhealthy
    mi210.set_gpu_healthy(131, True)
    poll(lambda: allocatable_gpus(cluster, mi210.name) == 80, timeout_s=15, what="allocatable 80 after recovery")


def test_kubelet_restart_is_followed_by_re_registration_within_5_s(cluster, mi210, mi210_gpus):
    poll(lambda: agent_registrations(mi210) >= 1, what="first registration")
    before = agent_registrations(mi210)
    mi210.restart_kubelet()
    started = time.monotonic()
    poll(lambda: agent_registrations(mi210) > before, timeout_s=10, every_s=0.1, what="re-registration")
    elapsed_s = time.monotonic() - started
    assert elapsed_s <= 5.0, f"re-registered after {elapsed_s:.1f} s"
    poll(lambda: allocatable_gpus(cluster, mi210.name) == 80, what="allocatable back to 80")
    # and the new kubelet can allocate through it
    create_pod(cluster, pod_manifest("after-restart", {"c": 1}))
    play_scheduler(cluster, "after-restart", record(mi210.name, {"c": [slice_(mi210_gpus[5], 1024, [(0, 9)])]}))
    assert settled_pod(cluster, "after-restart")["status"]["phase"] == "Running"


# ---- what containers receive -------------------------------------------------------------------


def test_multi_container_multi_gpu_pod_gets_exactly_its_record(cluster, mi210, mi210_gpus):
    g0, g1, g2 = mi210_gpus[0], mi210_gpus[1], mi210_gpus[2]
    create_pod(cluster, pod_manifest("multi", {"a": 1, "b": 2}, init={"setup": 1}))
    play_scheduler(cluster, "multi", record(mi210.name, {
        "setup": [slice_(g2, 1024, [(0, 9)])],
        "a": [slice_(g0, 4096, [(0, 51)])],
        "b": [slice_(g1, 65520, whole=True), slice_(g0, 2048, [(52, 103)])],
    }, init=("setup",)))
    pod = settled_pod(cluster, "multi")
    assert pod["status"]["phase"] == "Running", pod["status"].get("message")
    specs = container_specs(pod)
    hook_mount = [{"hostPath": f"{mi210.hook_dir}/libamvgpu.so", "containerPath": HOOK, "readOnly": True}]
    account_env = {"ROCSHARE_ACCOUNT_DIR": "/usr/local/vgpu/account", "ROCSHARE_SLICE_DIR": "/usr/local/vgpu/slice"}
    assert specs["setup"]["envs"] == {"ROCR_VISIBLE_DEVICES": g2, "HIP_VISIBLE_DEVICES": "0", "HSA_CU_MASK": "0:0-9",
                                      "HIP_DEVICE_MEMORY_LIMIT_0": "1024m", "LD_AUDIT": HOOK, **account_env}
    assert specs["a"]["envs"] == {"ROCR_VISIBLE_DEVICES": g0, "HIP_VISIBLE_DEVICES": "0", "HSA_CU_MASK": "0:0-51",
                                  "HIP_DEVICE_MEMORY_LIMIT_0": "4096m", "LD_AUDIT": HOOK, **account_env}
    assert specs["b"]["envs"] == {"ROCR_VISIBLE_DEVICES": f"{g1},{g0}", "HIP_VISIBLE_DEVICES": "0,1",
                                  "HSA_CU_MASK": "1:52-103", "HIP_DEVICE_MEMORY_LIMIT_1": "2048m", "LD_AUDIT": HOOK,
                                  **account_env}
    for name in ("setup", "a", "b"):  # the container's account folder (docs/container-account.md): usage rw, slice ro
        folder = mi210.account_dir / "pods" / pod["metadata"]["uid"] / name
        assert specs[name]["mounts"] == [*hook_mount,
                                         {"hostPath": f"{folder}/usage", "containerPath": "/usr/local/vgpu/account",
                                          "readOnly": False},
                                         {"hostPath": f"{folder}/slice", "containerPath": "/usr/local/vgpu/slice",
                                          "readOnly": True}]
        assert (folder / "slice" / "limits").is_file()
    dev = mi210.dev_root
    assert specs["b"]["devices"] == [
        {"hostPath": f"{dev}/kfd", "containerPath": "/dev/kfd", "permissions": "rw"},
        {"hostPath": f"{dev}/dri/renderD129", "containerPath": "/dev/dri/renderD129", "permissions": "rw"},
        {"hostPath": f"{dev}/dri/renderD128", "containerPath": "/dev/dri/renderD128", "permissions": "rw"}]
    # GetPreferredAllocation steered the kubelet's IDs onto the committed GPUs
    assert sorted(i.split("::")[0] for i in specs["b"]["deviceIDs"]["amd.com/gpu"]) == sorted([g0, g1])
    # serving writes nothing on the pod (issue 18): the kubelet's own status write (startTime)
    # is what releases the node's in-flight gate
    served = get_json(cluster, "pod", "-n", NAMESPACE, "multi")
    assert served["status"].get("startTime")
    assert set(served["metadata"]["annotations"]) & {ALLOCATED_ANNOTATION, ALLOCATION_ERROR_ANNOTATION} == set()


def test_whole_gpus_get_no_hook_and_no_limits_and_scaling_sets_oversubscribe(cluster, mi210, mi210_gpus):
    g3, g4, g6 = mi210_gpus[3], mi210_gpus[4], mi210_gpus[6]
    create_pod(cluster, pod_manifest("whole", {"c": 2}))
    play_scheduler(cluster, "whole", record(mi210.name, {"c": [slice_(g3, 65520, whole=True),
                                                               slice_(g4, 65520, whole=True)]}, oversubscribed=True))
    spec = container_specs(settled_pod(cluster, "whole"))["c"]
    assert spec["envs"] == {"ROCR_VISIBLE_DEVICES": f"{g3},{g4}", "HIP_VISIBLE_DEVICES": "0,1"}
    assert spec["mounts"] == []
    create_pod(cluster, pod_manifest("scaled", {"c": 1}))
    play_scheduler(cluster, "scaled", record(mi210.name, {"c": [slice_(g6, 30000)]}, oversubscribed=True))
    envs = container_specs(settled_pod(cluster, "scaled"))["c"]["envs"]
    assert envs["HIP_OVERSUBSCRIBE"] == "true" and envs["HIP_DEVICE_MEMORY_LIMIT_0"] == "30000m"
    assert envs["HSA_XNACK"] == "1"  # MI210 is CDNA: managed memory needs XNACK
    assert "HSA_CU_MASK" not in envs  # no ranges committed: every CU


# ---- refusals -------------------------------------------------------------------------------------


def refused(cluster, name: str) -> tuple[str, str]:
    pod = settled_pod(cluster, name)
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    return pod["status"]["message"], pod["metadata"].get("annotations", {}).get(ALLOCATION_ERROR_ANNOTATION, "")


def test_pod_bound_without_a_record_is_refused(cluster, mi210):
    create_pod(cluster, pod_manifest("uncommitted", {"c": 1}, node=mi210.name))  # bypasses the scheduler
    message, annotated = refused(cluster, "uncommitted")
    assert message.startswith("Pod was rejected: Allocate failed due to rpc error: code = FailedPrecondition")
    assert "no pod in flight" in message and "no pod in flight" in annotated
    assert ALLOCATED_ANNOTATION not in get_json(cluster, "pod", "-n", NAMESPACE, "uncommitted")["metadata"]["annotations"]


def test_record_committed_for_another_node_is_refused(cluster, mi210, mi210_gpus):
    create_pod(cluster, pod_manifest("misdirected", {"c": 1}))
    wrong = record("some-other-node", {"c": [slice_(mi210_gpus[7], 1024)]})
    cluster.kubectl("annotate", "pod", "-n", NAMESPACE, "misdirected", f"{ALLOCATION_ANNOTATION}={encode_record(wrong)}")
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "misdirected", "namespace": NAMESPACE},
               "target": {"apiVersion": "v1", "kind": "Node", "name": mi210.name}}
    cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/misdirected/binding", "-f", "-",
                    input_text=json.dumps(binding))
    message, annotated = refused(cluster, "misdirected")
    assert "its record names node some-other-node" in message and "its record names node some-other-node" in annotated


def test_record_disagreeing_with_the_pod_is_refused(cluster, mi210, mi210_gpus):
    create_pod(cluster, pod_manifest("mismatch", {"c": 2}))
    play_scheduler(cluster, "mismatch", record(mi210.name, {"c": [slice_(mi210_gpus[7], 1024)]}))
    message, annotated = refused(cluster, "mismatch")
    assert "record commits c=1 but the pod asks c=2" in message and annotated


# ---- partition mode ---------------------------------------------------------------------------------


def test_partition_mode_on_mi300x_offers_each_partition_whole(cluster, namespace, tmp_path_factory):
    settings = NodeSettings(pool="e2e-partitions", sharing=Sharing(operating_mode=OperatingMode.PARTITION))
    node = start_node(cluster, tmp_path_factory, "mi300x-8gpu-cpx", settings=settings)
    try:
        poll(lambda: allocatable_gpus(cluster, node.name) == 63, what="63 partitions allocatable")
        partitions = sorted(discover(node.sysfs_root, operating_mode=OperatingMode.PARTITION).gpus, key=lambda g: g.index)
        p0, p9 = partitions[0], partitions[9]
        create_pod(cluster, pod_manifest("partitions", {"c": 2}))
        play_scheduler(cluster, "partitions", record(node.name, {"c": [
            slice_(p9.id, p9.vram_mib or 0, whole=True, cu_count=38), slice_(p0.id, p0.vram_mib or 0, whole=True, cu_count=38)]}))
        pod = settled_pod(cluster, "partitions")
        assert pod["status"]["phase"] == "Running", pod["status"].get("message")
        spec = container_specs(pod)["c"]
        # partitions have no ROCr UUID of their own: named by KFD order inside the container
        assert spec["envs"] == {"ROCR_VISIBLE_DEVICES": "1,0", "HIP_VISIBLE_DEVICES": "0,1"}
        assert [d["containerPath"] for d in spec["devices"]] == [
            "/dev/kfd", f"/dev/dri/renderD{p9.render_minor}", f"/dev/dri/renderD{p0.render_minor}"]
        assert sorted(spec["deviceIDs"]["amd.com/gpu"]) == sorted([p0.id, p9.id])
    finally:
        node.stop()


# ---- the kubelet's own accounting: deletion frees devices; an agent restart re-registers ---------------


def test_deleting_a_pod_frees_its_devices_and_an_agent_restart_keeps_serving(cluster, namespace, tmp_path_factory):
    settings = NodeSettings(pool="e2e-small", sharing=Sharing(split_count=2))
    node = start_node(cluster, tmp_path_factory, "vega10-1gpu", settings=settings)
    try:
        poll(lambda: allocatable_gpus(cluster, node.name) == 2, what="1 GPU x splitCount 2")
        gpu = discover(node.sysfs_root).gpus[0].id

        def slice_pod(name: str, ranges: tuple[int, int]) -> dict:
            create_pod(cluster, pod_manifest(name, {"c": 1}))
            play_scheduler(cluster, name, record(node.name, {"c": [slice_(gpu, 4096, [ranges], cu_count=32)]}))
            return settled_pod(cluster, name)

        assert slice_pod("small-1", (0, 31))["status"]["phase"] == "Running"
        assert slice_pod("small-2", (32, 63))["status"]["phase"] == "Running"
        full = slice_pod("small-3", (0, 31))  # the kubelet itself has no device left: our plugin is not asked
        assert full["status"]["phase"] == "Failed"
        assert "requested number of devices unavailable for amd.com/gpu" in full["status"]["message"]
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, "small-1", "--wait=false")
        poll(lambda: cluster.kubectl("get", "pod", "-n", NAMESPACE, "small-1", check=False).returncode != 0,
             timeout_s=15, what="pod removed by the kubelet peer")
        node.restart_agent()
        poll(lambda: "(registration 1)" in (node.root / "agent.log").read_text().split("agent stopping")[-1],
             timeout_s=15, what="the restarted agent registered")
        assert slice_pod("small-4", (0, 31))["status"]["phase"] == "Running"
    finally:
        node.stop()
