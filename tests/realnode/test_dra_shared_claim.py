"""Issue 31 (part D): a shared GPU through DRA on the REAL kubelet node. The session's pool is
switched to `spec.agent.interface: DRA` (the operator re-renders the agent DaemonSet); the agent
publishes its ResourceSlice and registers its kubelet plugin from /var/lib/kubelet/plugins_registry;
the rig's stock kube-scheduler allocates two ResourceClaims sharing one GPU; the real kubelet calls
NodePrepareResources and containerd 2 applies the CDI spec the agent wrote.

The evidence is what the containers really received (`env` inside them) and what the API server
stored: each sees HSA_CU_MASK and its memory limit; the two CU sets are disjoint and of the asked
sizes (parsed here); in each (one a glibc 2.36 image, one 2.41), the memory hook is mapped and
hook-probe is refused one MiB past its claim; a third claim that fits only once the first share is gone is refused, then
allocated and Running after the first pod and its claim are deleted. On 1.35 (the rig's default)
the whole control plane and the kubelet run with `DRAConsumableCapacity=true` (rig.py); 1.36+ need
nothing. The module puts the pool back to DevicePlugin and waits for `amd.com/gpu` again, so the
modules after it find the node as the session left it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from rocshare.core.quantity import memory_mib_quantity, whole_quantity
from rocshare_dev.realnode import deploy
from tests.realnode.conftest import (AGENT_LABEL, ISSUE_39_ENV, NAMESPACE, WORKLOADS, Deployed, attempt_widening,
                                    describe, wait_for)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
DRIVER = "gpu.rocshare.io"
RESOURCE = "resource.k8s.io/v1"
# Two shares of one GPU, then a third that fits only in what the first leaves behind.
FIRST_MIB, FIRST_CUS = 4096, 40
SECOND_MIB, SECOND_CUS = 8192, 48
THIRD_MIB = 2048
PROBE = "/opt/rocm-stub/bin/hook-probe"  # the workload image's (make -C hook install-probe)
MIB = 1024 * 1024


def set_interface(deployed: Deployed, interface: str) -> None:
    patch = json.dumps({"spec": {"agent": {"interface": interface}}})
    deployed.kubectl("patch", "amdgpupool", deploy.POOL, "--type=merge", "-p", patch)


def node_slice(deployed: Deployed) -> dict | None:
    got = deployed.kubectl("get", "resourceslice", f"{deployed.node.node_name}-{DRIVER}", "-o", "json", check=False)
    body = json.loads(got.stdout) if got.returncode == 0 else None
    return body if body and body["spec"].get("devices") else None


def agent_ready(deployed: Deployed) -> bool:
    pods = deployed.json("get", "pods", "-n", NAMESPACE, "-l", AGENT_LABEL)["items"]
    return len(pods) == 1 and pods[0]["metadata"].get("deletionTimestamp") is None and \
        pods[0]["status"].get("phase") == "Running" and all(
            status.get("ready") for status in pod_statuses(pods[0]))


def pod_statuses(pod: dict) -> list[dict]:
    return pod["status"].get("containerStatuses", [])


def gpus_advertised(deployed: Deployed) -> bool:
    node = deployed.json("get", "node", deployed.node.node_name)
    return int(node["status"]["allocatable"].get("amd.com/gpu", "0")) > 0


@pytest.fixture(scope="module")
def dra_slice(deployed: Deployed) -> Iterator[dict]:
    set_interface(deployed, "DRA")
    try:
        yield wait_for("the agent's ResourceSlice", lambda: node_slice(deployed), timeout_s=240,
                       explain=lambda: describe(deployed.cluster, f"pods -n {NAMESPACE}"))
    finally:
        deployed.kubectl("delete", "pods", "-n", WORKLOADS, "-l", "rocshare-test=dra", "--wait=true",
                         "--timeout=120s", check=False)
        deployed.kubectl("delete", "resourceclaims", "-n", WORKLOADS, "--all", "--wait=true", "--timeout=60s",
                         check=False)
        set_interface(deployed, "DevicePlugin")
        wait_for("the slice deleted", lambda: node_slice(deployed) is None, timeout_s=120)
        wait_for("the device-plugin agent Running", lambda: agent_ready(deployed), timeout_s=240,
                 explain=lambda: describe(deployed.cluster, f"pods -n {NAMESPACE}"))
        wait_for("amd.com/gpu on the node again", lambda: gpus_advertised(deployed), timeout_s=120)


def claim(name: str, pci_bus_id: str, *, memory_mib: int, cus: int) -> dict:
    """A claim on the one GPU at `pci_bus_id` (so all three meet on the same device)."""
    selector = f'device.attributes["resource.kubernetes.io"].pciBusID == "{pci_bus_id}"'
    return {"apiVersion": RESOURCE, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": WORKLOADS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "selectors": [{"cel": {"expression": selector}}],
                "capacity": {"requests": {"memory": f"{memory_mib}Mi", "compute": str(cus)}}}}]}}}


def pod(name: str, claim_name: str, image: str = deploy.WORKLOAD_IMAGE) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": WORKLOADS, "labels": {"rocshare-test": "dra"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                     "command": ["sleep", "infinity"],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def create_share(deployed: Deployed, name: str, pci_bus_id: str, *, memory_mib: int, cus: int,
                 image: str = deploy.WORKLOAD_IMAGE) -> None:
    manifests = [claim(name, pci_bus_id, memory_mib=memory_mib, cus=cus), pod(f"pod-{name}", name, image)]
    deployed.kubectl("create", "-f", "-", input_text=yaml.safe_dump_all(manifests))


def running(deployed: Deployed, name: str) -> dict:
    def probe() -> dict | None:
        body = deployed.json("get", "pod", "-n", WORKLOADS, name)
        return body if body["status"].get("phase") == "Running" else None

    return wait_for(f"{name} Running", probe, timeout_s=180,
                    explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} {name}") + kubelet_tail(deployed))


def kubelet_tail(deployed: Deployed) -> str:
    log = deployed.node.logs / "kubelet.log"
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


def allocation(deployed: Deployed, name: str) -> dict | None:
    body = deployed.json("get", "resourceclaim", "-n", WORKLOADS, name)
    return (body.get("status") or {}).get("allocation")


def container_env(deployed: Deployed, name: str) -> dict[str, str]:
    out = deployed.kubectl("exec", "-n", WORKLOADS, name, "--", "env").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def cu_set(mask: str) -> set[int]:
    """The CUs of HSA_CU_MASK `0:a-b,c,...` on GPU 0 (the container's only GPU)."""
    gpu, _, ranges = mask.partition(":")
    assert gpu == "0" and ranges, mask
    cus: set[int] = set()
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        cus.update(range(int(low), int(high or low) + 1))
    return cus


def probe_alloc(deployed: Deployed, name: str, size_bytes: int) -> str:
    """hook-probe's answer to one hipMalloc of size_bytes in the pod (the stub runtime: 16 GiB by itself)."""
    done = deployed.kubectl("exec", "-n", WORKLOADS, name, "--", PROBE, "alloc", str(size_bytes), check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "cannot be loaded as audit interface" not in done.stderr, done.stderr
    return json.loads(done.stdout)["result"]


def assert_the_hook_caps(deployed: Deployed, name: str, claim_mib: int) -> None:
    """Issue 39 item 5: in a DRA container the memory hook the CDI spec hands over is mapped (a
    process's own maps), the claim's memory fits and one MiB past it is refused. The stub runtime
    alone grants 16 GiB, more than either claim."""
    hook = container_env(deployed, name)["LD_AUDIT"]
    maps = deployed.kubectl("exec", "-n", WORKLOADS, name, "--", "cat", "/proc/self/maps", check=False)
    assert hook and hook in maps.stdout, (hook, maps.stderr)
    assert probe_alloc(deployed, name, claim_mib * MIB) == "hipSuccess"
    assert probe_alloc(deployed, name, claim_mib * MIB + MIB) == "hipErrorOutOfMemory"


def unschedulable(deployed: Deployed, name: str) -> str | None:
    body = deployed.json("get", "pod", "-n", WORKLOADS, name)
    for condition in body["status"].get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return condition.get("message") or condition.get("reason")
    return None


def test_two_claims_share_one_gpu_on_the_real_kubelet_and_deleting_one_frees_its_share(
        deployed: Deployed, dra_slice: dict) -> None:
    device = dra_slice["spec"]["devices"][0]
    assert dra_slice["spec"]["driver"] == DRIVER and dra_slice["spec"]["nodeName"] == deployed.node.node_name
    # Kept by the API server only when consumable capacity is on (the gate on 1.35).
    assert device.get("allowMultipleAllocations") is True, device
    total_cus = whole_quantity(device["capacity"]["compute"]["value"], name="compute", unit="CUs")
    total_mib = memory_mib_quantity(device["capacity"]["memory"]["value"])
    pci = device["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
    # The third share fits beside the second alone, never beside both.
    third_cus = total_cus - SECOND_CUS - 6
    assert total_cus - FIRST_CUS - SECOND_CUS < third_cus <= total_cus - SECOND_CUS, total_cus
    assert FIRST_MIB + SECOND_MIB + THIRD_MIB <= total_mib

    # The first share's container is Debian bookworm's (glibc 2.36), the others trixie's (2.41).
    create_share(deployed, "share-a", pci, memory_mib=FIRST_MIB, cus=FIRST_CUS,
                 image=deploy.WORKLOAD_IMAGES_BY_GLIBC["2.36"])
    create_share(deployed, "share-b", pci, memory_mib=SECOND_MIB, cus=SECOND_CUS)
    pods = {name: running(deployed, f"pod-{name}") for name in ("share-a", "share-b")}
    results = {name: allocation(deployed, name)["devices"]["results"][0] for name in pods}
    assert {(r["pool"], r["device"]) for r in results.values()} == {(deployed.node.node_name, device["name"])}
    assert results["share-a"]["shareID"] != results["share-b"]["shareID"]
    assert all(p["spec"]["nodeName"] == deployed.node.node_name for p in pods.values())

    env_a, env_b = container_env(deployed, "pod-share-a"), container_env(deployed, "pod-share-b")
    cus_a, cus_b = cu_set(env_a["HSA_CU_MASK"]), cu_set(env_b["HSA_CU_MASK"])
    assert len(cus_a) == FIRST_CUS and len(cus_b) == SECOND_CUS, (env_a["HSA_CU_MASK"], env_b["HSA_CU_MASK"])
    assert not cus_a & cus_b and cus_a | cus_b <= set(range(total_cus))
    assert env_a["HIP_DEVICE_MEMORY_LIMIT_0"] == f"{FIRST_MIB}m"
    assert env_b["HIP_DEVICE_MEMORY_LIMIT_0"] == f"{SECOND_MIB}m"
    for name, mib in (("pod-share-a", FIRST_MIB), ("pod-share-b", SECOND_MIB)):
        assert_the_hook_caps(deployed, name, mib)
    listing = deployed.kubectl("exec", "-n", WORKLOADS, "pod-share-a", "--", "ls", "/dev/kfd", "/dev/dri").stdout
    assert "/dev/kfd" in listing and "renderD" in listing, listing

    create_share(deployed, "share-c", pci, memory_mib=THIRD_MIB, cus=third_cus)
    message = wait_for("the third share refused while both are held", lambda: unschedulable(deployed, "pod-share-c"),
                       timeout_s=60)
    assert "cannot allocate all claims" in message, message
    assert allocation(deployed, "share-c") is None

    deployed.kubectl("delete", "pod", "-n", WORKLOADS, "pod-share-a", "--wait=true", "--timeout=120s")
    deployed.kubectl("delete", "resourceclaim", "-n", WORKLOADS, "share-a", "--wait=true", "--timeout=60s")
    running(deployed, "pod-share-c")
    env_c = container_env(deployed, "pod-share-c")
    cus_c = cu_set(env_c["HSA_CU_MASK"])
    assert len(cus_c) == third_cus and not cus_c & cus_b, env_c["HSA_CU_MASK"]
    assert cus_c & cus_a  # it could only fit in what the first share gave back
    assert env_c["HIP_DEVICE_MEMORY_LIMIT_0"] == f"{THIRD_MIB}m"


HAMI_LIMITS = {"amd.com/gpu": "1", "amd.com/gpumem-percentage": "50", "amd.com/gpucores": "25"}
SAME_ENV = ("HSA_CU_MASK", "HIP_DEVICE_MEMORY_LIMIT_0", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "LD_AUDIT")


def hami_pod(name: str, gpu_uuid: str) -> dict:
    """A pod as a HAMi user writes it (limits only), pinned to one GPU so both modes meet the same one."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": WORKLOADS, "labels": {"rocshare-test": "dra"},
                         "annotations": {"amd.com/use-gpu-uuid": gpu_uuid}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": deploy.WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["sleep", "infinity"], "resources": {"limits": dict(HAMI_LIMITS)}}]}}


def test_a_slice_pod_cannot_set_its_own_limit_in_a_dra_pool(deployed: Deployed, dra_slice: dict) -> None:
    """Issue 39, DRA mode: the webhook checked the pod after its amd.com/* limits became a claim, where
    nothing says it holds a slice. On the code before the fix this pod was admitted; containerd 2
    applies the CDI spec's env after the pod's, so the container still got its own limit, CU mask
    and hook there (measured: 32768m, 0:0-25, the hook). It is refused now, as in a device-plugin
    pool, whatever order a runtime applies them in."""
    gpu_uuid = dra_slice["spec"]["devices"][-1]["attributes"]["uuid"]["string"]
    env_pod = hami_pod("widen-dra-env", gpu_uuid)
    env_pod["spec"]["containers"][0]["env"] = [{"name": key, "value": value} for key, value in ISSUE_39_ENV.items()]
    refused = attempt_widening(deployed, env_pod)
    assert 'admission webhook "pods.mutate.rocshare.io" denied the request: ProtectedEnvVar' in refused, refused


def test_a_privileged_slice_is_refused_in_a_dra_pool(deployed: Deployed, dra_slice: dict) -> None:
    """Before the fix a privileged HAMi-style slice was admitted in a DRA pool and ran privileged
    (every capability, every device of the node: no slice holds); now it is refused by name."""
    gpu_uuid = dra_slice["spec"]["devices"][-1]["attributes"]["uuid"]["string"]
    privileged = hami_pod("widen-dra-privileged", gpu_uuid)
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    refused = attempt_widening(deployed, privileged)
    assert "PrivilegedSlice: containers[0] (main): a privileged container sees every GPU" in refused, refused


def test_a_hami_style_pod_gets_the_same_environment_in_a_dra_pool_as_in_a_device_plugin_pool(
        deployed: Deployed, dra_slice: dict) -> None:
    """Done-when of issue 31: the same pod, written with amd.com/* limits, runs in the DRA pool (the
    webhook writes its claim, kube-scheduler allocates, the real kubelet prepares, containerd applies
    CDI) and then, the pool switched back, through the device plugin; the container's environment
    is the same, and its figures are worked out here: 25 % of 104 CUs is 26, half the VRAM."""
    deployed.kubectl("delete", "pods", "-n", WORKLOADS, "-l", "rocshare-test=dra", "--wait=true", "--timeout=120s")
    deployed.kubectl("delete", "resourceclaims", "-n", WORKLOADS, "--all", "--wait=true", "--timeout=60s")
    device = dra_slice["spec"]["devices"][-1]
    gpu_uuid = device["attributes"]["uuid"]["string"]
    half_mib = memory_mib_quantity(device["capacity"]["memory"]["value"]) // 2
    total_cus = whole_quantity(device["capacity"]["compute"]["value"], name="compute", unit="CUs")
    assert total_cus == 104  # the MI210 capture: 25 % is ceil(26.0) = 26 CUs

    deployed.kubectl("create", "-f", "-", input_text=json.dumps(hami_pod("hami-dra", gpu_uuid)))
    stored = running(deployed, "hami-dra")
    assert stored["spec"].get("resourceClaims") and "amd.com/gpu" not in json.dumps(stored["spec"]["containers"])
    in_dra = container_env(deployed, "hami-dra")
    deployed.kubectl("delete", "pod", "-n", WORKLOADS, "hami-dra", "--wait=true", "--timeout=120s")

    set_interface(deployed, "DevicePlugin")
    wait_for("the slice deleted", lambda: node_slice(deployed) is None, timeout_s=120)
    wait_for("the device-plugin agent Running", lambda: agent_ready(deployed), timeout_s=240,
             explain=lambda: describe(deployed.cluster, f"pods -n {NAMESPACE}"))
    wait_for("amd.com/gpu on the node again", lambda: gpus_advertised(deployed), timeout_s=120)
    deployed.kubectl("create", "-f", "-", input_text=json.dumps(hami_pod("hami-dp", gpu_uuid)))
    running(deployed, "hami-dp")
    in_plugin = container_env(deployed, "hami-dp")

    assert {key: in_dra.get(key) for key in SAME_ENV} == {key: in_plugin.get(key) for key in SAME_ENV}
    assert len(cu_set(in_dra["HSA_CU_MASK"])) == 26 and in_dra["HIP_DEVICE_MEMORY_LIMIT_0"] == f"{half_mib}m"
    assert in_dra["LD_AUDIT"]  # the memory hook, in both
