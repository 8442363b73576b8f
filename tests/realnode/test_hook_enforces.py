"""Issue 29 item 4: on the real node, deployed as the README says with an EMPTY hookPath, the
hook rocshare's agent installed limits a slice inside a real container. The slice pod runs the
hook's probe (hook/, `make -C hook install-probe`, in the workload image) on the stub ROCm
runtime, with nothing but what the kubelet gave the container (LD_AUDIT, the mounted library,
HIP_DEVICE_MEMORY_LIMIT_0): hipMemGetInfo and the device properties report the slice's MiB,
every allocation entry point fails one MiB past them, and a stream asking for every CU gets the
slice's CU mask. A whole-GPU pod gets no hook: no LD_AUDIT, no mount, the whole GPU's memory.

The same pods are checked against values worked out HERE from the request and the sysfs capture
the node's agent reads (never from rocshare's renderer): the device nodes the container sees
(/dev/kfd and its own GPU's render node; the capture has no DRM card folders, so no card node)
and HSA_CU_MASK's CU count, ceil(CUs x gpucores / 100) (DESIGN.md section 3), inside the GPU."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rocshare.api.allocation import ALLOCATION_ANNOTATION, decode_record
from rocshare.api.models import API_VERSION
from rocshare.api.resize import RESIZED_CONDITION
from rocshare_dev.realnode import deploy
from tests.realnode.conftest import AGENT_LABEL, NAMESPACE, WORKLOADS, Deployed, describe, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
SLICE_MIB = 2048
CORES_PCT = 30  # of the MI210's 104 CUs: 31.2, so the ceiling matters
HOOK = "/usr/local/vgpu/libamvgpu.so"
PROBE = "/opt/rocm-stub/bin/hook-probe"
MIB = 1024 * 1024


def kfd_gpu_nodes(sysfs_root: Path) -> dict[int, dict[str, int]]:
    """unique_id -> the KFD node's properties, for the capture's GPU nodes (simd_count > 0)."""
    nodes = {}
    for properties in (sysfs_root / "class" / "kfd" / "kfd" / "topology" / "nodes").glob("*/properties"):
        values = {key: int(value) for key, value in (line.split() for line in properties.read_text().splitlines()
                                                      if len(line.split()) == 2)}
        if values.get("simd_count", 0) > 0:
            nodes[values["unique_id"]] = values
    return nodes


def gpu_of(deployed: Deployed, env: dict[str, str]) -> dict[str, int]:
    """The capture's node for the one GPU the container was given (ROCR_VISIBLE_DEVICES=GPU-<hex>)."""
    (name,) = env["ROCR_VISIBLE_DEVICES"].split(",")
    return kfd_gpu_nodes(deployed.host.sysfs_root)[int(name.removeprefix("GPU-"), 16)]


def vram_mib(gpu: dict[str, int], sysfs_root: Path) -> int:
    """The GPU's VRAM, from its KFD node's memory bank (the rig's capture has one per GPU)."""
    for node in (sysfs_root / "class" / "kfd" / "kfd" / "topology" / "nodes").iterdir():
        properties = (node / "properties").read_text()
        if f"unique_id {gpu['unique_id']}\n" in properties:
            bank = (node / "mem_banks" / "0" / "properties").read_text()
            return int(re.search(r"^size_in_bytes (\d+)$", bank, re.M).group(1)) // MIB
    raise AssertionError(f"no node for {gpu['unique_id']}")


def exec_in(deployed: Deployed, pod: str, *command: str, check: bool = True):
    return deployed.kubectl("exec", "-n", WORKLOADS, pod, "--", *command, check=check)


def container_env(deployed: Deployed, pod: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in exec_in(deployed, pod, "env").stdout.splitlines() if "=" in line)


def gpu_device_nodes(deployed: Deployed, pod: str) -> set[str]:
    """Every character device the container has under /dev that is a GPU's: /dev/kfd and /dev/dri/*."""
    listing = exec_in(deployed, pod, "sh", "-c", "find /dev -type c | sort").stdout.split()
    return {path for path in listing if path == "/dev/kfd" or path.startswith("/dev/dri/")}


def hook_mounted(deployed: Deployed, pod: str) -> bool:
    mounts = exec_in(deployed, pod, "cat", "/proc/self/mounts").stdout
    return any(line.split()[1] == HOOK for line in mounts.splitlines())


def stub_env(deployed: Deployed) -> list[dict[str, str]]:
    """The stub runtime's one simulated device, sized like the node's GPU (an MI210 of the capture)."""
    gpu = next(iter(kfd_gpu_nodes(deployed.host.sysfs_root).values()))
    return [{"name": "ROCM_STUB_DEVICES", "value": "1"},
            {"name": "ROCM_STUB_VRAM_MIB", "value": str(vram_mib(gpu, deployed.host.sysfs_root))},
            {"name": "ROCM_STUB_CUS", "value": str(gpu["simd_count"] // gpu["simd_per_cu"])}]


def run_pod(deployed: Deployed, name: str, limits: dict[str, str], image: str = deploy.WORKLOAD_IMAGE) -> dict:
    pod = deploy.slice_pod(name, WORKLOADS, memory_mib=SLICE_MIB, cores_pct=CORES_PCT, image=image)
    container = pod["spec"]["containers"][0]
    container["resources"]["limits"] = limits
    container["env"] = stub_env(deployed)
    deployed.kubectl("create", "-f", "-", input_text=yaml.safe_dump(pod))
    return wait_for(f"{name} Running", lambda: (lambda p: p if p["status"].get("phase") == "Running" else None)(
        deployed.json("get", "pod", "-n", WORKLOADS, name)), timeout_s=180,
        explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} {name}"))


SLICE_LIMITS = {"amd.com/gpu": "1", "amd.com/gpumem": str(SLICE_MIB), "amd.com/gpucores": str(CORES_PCT)}
# The slice pod of each glibc generation's workload image (deploy.WORKLOAD_IMAGES_BY_GLIBC);
# trixie's is probe-slice itself.
SLICE_PODS = {glibc: "probe-slice" if image == deploy.WORKLOAD_IMAGE else f"probe-slice-{image.rpartition(':')[2]}"
              for glibc, image in deploy.WORKLOAD_IMAGES_BY_GLIBC.items()}


@pytest.fixture(scope="module")
def pods(deployed: Deployed) -> Iterator[dict[str, dict]]:
    running = {}
    try:
        running["slice"] = run_pod(deployed, "probe-slice", SLICE_LIMITS)
        running["whole"] = run_pod(deployed, "probe-whole", {"amd.com/gpu": "1"})
        for glibc, name in SLICE_PODS.items():
            if name != "probe-slice":
                running[name] = run_pod(deployed, name, SLICE_LIMITS, image=deploy.WORKLOAD_IMAGES_BY_GLIBC[glibc])
        yield running
    finally:
        deployed.kubectl("delete", "pod", "-n", WORKLOADS, "probe-whole", *sorted(set(SLICE_PODS.values())),
                         "--wait=true", "--timeout=120s", "--ignore-not-found", check=False)


def probe(deployed: Deployed, pod: str, *args: str) -> dict:
    """hook-probe's JSON (hook/test/probe.c: it reports what the runtime answered, decides nothing)."""
    done = exec_in(deployed, pod, PROBE, *args, check=False)
    assert done.returncode == 0, \
        f"{PROBE} {' '.join(args)} in {pod}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)


def audit_library_loaded(deployed: Deployed, pod: str) -> bool:
    """Whether the loader mapped the mounted hook into a process of the container (cat's own maps)."""
    return HOOK in exec_in(deployed, pod, "cat", "/proc/self/maps").stdout


def cu_ids(mask: str) -> list[int]:
    """The CU ids of one GPU's HSA_CU_MASK entry "0:<a>-<b>,<c>"."""
    index, _, ranges = mask.partition(":")
    assert index == "0", mask
    ids: list[int] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        ids += range(int(low), int(high or low) + 1)
    return ids


def test_the_slice_sees_its_mib_and_cannot_allocate_past_them(deployed: Deployed, pods: dict) -> None:
    env = container_env(deployed, "probe-slice")
    assert env["LD_AUDIT"] == HOOK and env["HIP_DEVICE_MEMORY_LIMIT_0"] == f"{SLICE_MIB}m"
    assert hook_mounted(deployed, "probe-slice") and audit_library_loaded(deployed, "probe-slice")
    result = probe(deployed, "probe-slice")
    slice_bytes = SLICE_MIB * MIB
    assert result["limit"] == slice_bytes, result  # the probe read the limit the kubelet gave the container
    assert result["memGetInfo"]["result"] == "hipSuccess" and result["memGetInfo"]["total"] == slice_bytes, result
    assert result["totalGlobalMem"]["bytes"] == slice_bytes, result
    entries = {name: value for name, value in result.items() if isinstance(value, dict) and "past_limit" in value}
    assert "hipMalloc" in entries and "hipMemCreate" in entries, sorted(entries)
    for name, outcome in entries.items():  # each way to get device memory: the slice fits, one MiB more fails
        assert (outcome["at_limit"], outcome["past_limit"]) == ("hipSuccess", "hipErrorOutOfMemory"), (name, outcome)
    one_more = probe(deployed, "probe-slice", "alloc", str(slice_bytes + MIB))
    assert one_more["result"] == "hipErrorOutOfMemory", one_more


@pytest.mark.parametrize("glibc", sorted(SLICE_PODS, key=lambda v: tuple(map(int, v.split(".")))))
def test_the_installed_hook_loads_and_limits_under_every_glibc_generation(deployed: Deployed, pods: dict,
                                                                           glibc: str) -> None:
    """Issue 39 item 1: the library the agent installed from its image, loaded by the loader of
    images of three glibc generations (Debian bullseye, bookworm, trixie; hook/GLIBC_FLOOR is
    below them all): it is mapped, hook-probe sees the slice, and one MiB past it is refused.
    A library needing a newer glibc is ignored by the loader ("cannot be loaded as audit
    interface") and the stub then grants the whole GPU's memory."""
    pod = SLICE_PODS[glibc]
    assert exec_in(deployed, pod, "getconf", "GNU_LIBC_VERSION").stdout.split() == ["glibc", glibc]
    env = container_env(deployed, pod)
    assert env["LD_AUDIT"] == HOOK and env["HIP_DEVICE_MEMORY_LIMIT_0"] == f"{SLICE_MIB}m", env
    slice_bytes = SLICE_MIB * MIB
    assert probe(deployed, pod, "alloc", str(slice_bytes))["result"] == "hipSuccess"  # the slice itself fits
    past = exec_in(deployed, pod, PROBE, "alloc", str(slice_bytes + MIB), check=False)
    assert past.returncode == 0, (past.stdout, past.stderr)
    # Refused by the hook; the stderr shows the loader's complaint when it ignored the library.
    assert json.loads(past.stdout)["result"] == "hipErrorOutOfMemory", (past.stdout, past.stderr)
    assert "cannot be loaded as audit interface" not in past.stderr, past.stderr
    maps = exec_in(deployed, pod, "cat", "/proc/self/maps")
    assert HOOK in maps.stdout, maps.stderr
    info = probe(deployed, pod, "info")["memGetInfo"]
    assert info["result"] == "hipSuccess" and info["total"] == slice_bytes, info


def test_a_stream_cu_mask_is_narrowed_to_the_slice(deployed: Deployed, pods: dict) -> None:
    """The probe asks for every CU through hipExtStreamCreateWithCUMask; the queue gets the slice's."""
    env = container_env(deployed, "probe-slice")
    result = probe(deployed, "probe-slice")
    assert result["cu_mask"]["result"] == "hipSuccess", result["cu_mask"]
    assert result["cu_mask"]["cus"] == sorted(cu_ids(env["HSA_CU_MASK"])), (result["cu_mask"], env["HSA_CU_MASK"])


def test_a_whole_gpu_pod_gets_no_hook_and_the_whole_gpu(deployed: Deployed, pods: dict) -> None:
    env = container_env(deployed, "probe-whole")
    assert "LD_AUDIT" not in env and not any(key.startswith("HIP_DEVICE_MEMORY_LIMIT") for key in env), env
    assert not hook_mounted(deployed, "probe-whole") and not audit_library_loaded(deployed, "probe-whole")
    gpu_mib = vram_mib(gpu_of(deployed, env), deployed.host.sysfs_root)
    info = probe(deployed, "probe-whole", "info")["memGetInfo"]
    assert info["result"] == "hipSuccess" and info["total"] == gpu_mib * MIB, info
    assert probe(deployed, "probe-whole", "alloc", str((SLICE_MIB + 1) * MIB))["result"] == "hipSuccess"


@pytest.mark.parametrize("pod", ["probe-slice", "probe-whole"])
def test_the_container_sees_only_its_own_gpus_device_nodes(deployed: Deployed, pods: dict, pod: str) -> None:
    assert not (deployed.host.sysfs_root / "class" / "drm").exists()  # KFD-only capture: no card nodes to expect
    gpu = gpu_of(deployed, container_env(deployed, pod))
    assert gpu_device_nodes(deployed, pod) == {"/dev/kfd", f"/dev/dri/renderD{gpu['drm_render_minor']}"}


def test_the_cu_mask_holds_ceil_of_the_requested_share(deployed: Deployed, pods: dict) -> None:
    env = container_env(deployed, "probe-slice")
    gpu = gpu_of(deployed, env)
    cus = gpu["simd_count"] // gpu["simd_per_cu"]  # DESIGN.md section 5: not array_count x cu_per_simd_array
    assert cus == 104  # the MI210: a sanity check on the capture, not on rocshare
    wanted = math.ceil(cus * CORES_PCT / 100)  # 32
    ids = cu_ids(env["HSA_CU_MASK"])
    assert len(ids) == len(set(ids)) == wanted and min(ids) >= 0 and max(ids) < cus, env["HSA_CU_MASK"]


ACCOUNT_ROOT = Path("/var/lib/rocshare/accounts")  # the agent's --account-dir, a hostPath on this node


def test_the_slice_takes_its_limit_from_a_folder_it_cannot_write(deployed: Deployed, pods: dict) -> None:
    """Issue 43 (docs/container-account.md), in a real container: the slice's account folder is on the
    node where the agent made it, the usage file the hook writes appears there; the tenant, root in
    its container, cannot write, replace or add to its slice folder (read-only bind), so it cannot
    raise its own limit; the agent's rewrite of the limits file (done here as the agent does it: a
    new file renamed over the old) lets the running pod allocate past its old limit, no restart."""
    pod = pods["slice"]
    env = container_env(deployed, "probe-slice")
    assert env["ROCSHARE_ACCOUNT_DIR"] == "/usr/local/vgpu/account"
    assert env["ROCSHARE_SLICE_DIR"] == "/usr/local/vgpu/slice"
    folder = ACCOUNT_ROOT / "pods" / pod["metadata"]["uid"] / pod["spec"]["containers"][0]["name"]
    limits = folder / "slice" / "limits"
    slice_bytes = SLICE_MIB * MIB
    original = limits.read_text()
    assert f"\nmemory 0 {slice_bytes}\n" in original and original.startswith("rocshare-limits 1\n"), original
    tenant_tries = ["echo 'rocshare-limits 1' > /usr/local/vgpu/slice/limits",
                    "mv /usr/local/vgpu/slice/limits /usr/local/vgpu/slice/old",
                    "printf 'rocshare-limits 1\\nmemory 0 99999999999\\n' > /usr/local/vgpu/slice/new",
                    "rm -f /usr/local/vgpu/slice/limits", "mount -o remount,rw /usr/local/vgpu/slice"]
    for command in tenant_tries:
        done = exec_in(deployed, "probe-slice", "sh", "-c", command, check=False)
        assert done.returncode != 0, (command, done.stdout, done.stderr)
    assert limits.read_text() == original and sorted(p.name for p in limits.parent.iterdir()) == ["limits"]
    held = probe(deployed, "probe-slice", "alloc", str(slice_bytes // 2))
    assert held["result"] == "hipSuccess", held
    usage = folder / "usage" / "usage.v3.acct"
    peak = int.from_bytes(usage.read_bytes()[37120:37128], "little")
    assert usage.stat().st_size == 37248 and peak >= slice_bytes // 2, peak
    past = probe(deployed, "probe-slice", "alloc", str(slice_bytes + MIB))
    assert past["result"] == "hipErrorOutOfMemory", past
    try:
        temporary = limits.parent / ".limits.tmp"
        temporary.write_text(original.replace(f"memory 0 {slice_bytes}\n", f"memory 0 {2 * slice_bytes}\n"))
        temporary.rename(limits)
        grown = probe(deployed, "probe-slice", "alloc", str(slice_bytes + MIB))
        assert grown["result"] == "hipSuccess", grown
        info = probe(deployed, "probe-slice", "info")
        assert info["memGetInfo"]["total"] == 2 * slice_bytes, info
    finally:
        temporary = limits.parent / ".limits.tmp"
        temporary.write_text(original)
        temporary.rename(limits)


# ---- issue 43: the whole resize chain, from inside the container --------------------------------

RESIZE_NS = "realnode-resize"
TENANT = "resize-tenant"
PLUGIN = Path(sys.executable).with_name("kubectl-rocshare")  # the wheel's console script
FIFO = "/tmp/probe-in"
SHARE_MIB = 6144  # the namespace's AmdGpuShare: room for the grown 4096 MiB


class ServingPod:
    """A slice pod whose ONE process is `hook-probe serve` (the container's main process, pid 1 of
    its namespace, restartPolicy Always): it reads requests from a FIFO in the container (opened
    read-write, so it never sees an end) and answers on its stdout, the container's log."""

    def __init__(self, deployed: Deployed, name: str) -> None:
        self.deployed, self.name = deployed, name

    def create(self) -> dict:
        pod = deploy.slice_pod(self.name, RESIZE_NS, memory_mib=SLICE_MIB, cores_pct=CORES_PCT)
        pod["spec"]["restartPolicy"] = "Always"  # a restart would show in restartCount, never hide as a failure
        container = pod["spec"]["containers"][0]
        container["command"] = ["sh", "-c", f"mkfifo {FIFO} && exec {PROBE} serve <> {FIFO}"]
        container["env"] = stub_env(self.deployed)
        self.deployed.kubectl("create", "-f", "-", input_text=yaml.safe_dump(pod))
        def running() -> dict | None:
            pod = self.pod()
            return pod if pod["status"].get("phase") == "Running" else None
        return wait_for(f"{self.name} Running", running, timeout_s=180,
                        explain=lambda: describe(self.deployed.cluster, f"pod -n {RESIZE_NS} {self.name}"))

    def pod(self) -> dict:
        return self.deployed.json("get", "pod", "-n", RESIZE_NS, self.name)

    def answers(self) -> list[dict]:
        log = self.deployed.kubectl("logs", "-n", RESIZE_NS, self.name).stdout
        return [json.loads(line) for line in log.splitlines() if line.startswith('{"op":')]

    def ask(self, line: str) -> dict:
        """One request to the running process; its answer (the next line of its log)."""
        before = len(self.answers())
        self.deployed.kubectl("exec", "-n", RESIZE_NS, self.name, "--", "sh", "-c", f"echo {line} > {FIFO}")
        got = wait_for(f"{self.name}'s answer to {line!r}", lambda: self.answers()[before:], timeout_s=30,
                       interval_s=0.3, explain=lambda: self.deployed.kubectl("logs", "-n", RESIZE_NS, self.name).stdout)
        assert len(got) == 1, got
        return got[0]

    def slice_file(self) -> str:
        """What the container reads as its limits (the file the hook re-reads), from inside it."""
        return self.deployed.kubectl("exec", "-n", RESIZE_NS, self.name, "--", "cat", "/usr/local/vgpu/slice/limits",
                                     check=False).stdout

    def restarts(self) -> tuple[int, str, str]:
        """(restartCount, containerID, startedAt) of its one container, from the API server."""
        (status,) = self.pod()["status"]["containerStatuses"]
        return status["restartCount"], status["containerID"], status["state"]["running"]["startedAt"]


def limits_generation(text: str) -> int:
    """The `generation <n>` line of a slice limits file (docs/container-account.md: larger on every write)."""
    return int(re.search(r"^generation (\d+)$", text, re.M).group(1))


def resized(pod: dict, generation: int) -> dict | None:
    """The pod's rocshare.io/Resized condition when it says `generation` was applied."""
    for condition in pod["status"].get("conditions") or ():
        if condition["type"] == RESIZED_CONDITION and condition["message"].startswith(f"generation {generation}: "):
            return condition
    return None


def quota_used_mib(deployed: Deployed) -> str | None:
    quota = deployed.json("get", "resourcequota", "-n", RESIZE_NS, "rocshare-team")
    return ((quota.get("status") or {}).get("used") or {}).get("limits.amd.com/gpumem")


def share_row(deployed: Deployed) -> dict[str, str]:
    """`kubectl get amdgpushares -n <ns>` as the tenant's terminal shows it: column -> value."""
    header, *rows = deployed.kubectl("get", "amdgpushares", "-n", RESIZE_NS).stdout.splitlines()
    (row,) = rows
    return dict(zip(header.split(), row.split()))


@pytest.fixture(scope="module")
def resize_world(deployed: Deployed) -> Iterator[Path]:
    """A namespace with an AmdGpuShare and a user who has only `edit` in it."""
    deployed.kubectl("create", "namespace", RESIZE_NS)
    try:
        deployed.kubectl("wait", "-n", RESIZE_NS, "--for=jsonpath={.metadata.name}=default",
                         "serviceaccount/default", "--timeout=60s")
        deployed.kubectl("create", "rolebinding", "tenant-edit", "--clusterrole=edit", f"--user={TENANT}",
                         "-n", RESIZE_NS)
        share = {"apiVersion": API_VERSION, "kind": "AmdGpuShare", "metadata": {"name": "team", "namespace": RESIZE_NS},
                 "spec": {"limits": {"memoryMiB": SHARE_MIB}}}
        deployed.kubectl("create", "-f", "-", input_text=json.dumps(share))
        yield deployed.cluster.user_kubeconfig(TENANT)
    finally:
        deployed.kubectl("delete", "namespace", RESIZE_NS, "--wait=true", "--timeout=120s", check=False)


def resize_as_tenant(tenant: Path, pod: str, mib: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PLUGIN), "resize", f"pod/{pod}", "--gpumem", str(mib), "-n", RESIZE_NS,
                           "--kubeconfig", str(tenant), "--wait", "90"], capture_output=True, text=True, timeout=120)


def test_a_running_slice_is_resized_up_and_down_without_a_restart(deployed: Deployed, resize_world: Path) -> None:
    """Issue 43 end to end on the real node, nothing written by hand: an edit-only tenant runs
    `kubectl rocshare resize`; the operator decides and writes the record and condition; the agent
    rewrites the container's slice file; the hook in the container's one running process reads it.
    2048 -> 4096 MiB: the same process (same pid, no restart) that was refused 3000 MiB holds it;
    4096 -> 1024 MiB while it holds 3000: nothing is freed behind its back, new allocations are
    refused until it has freed below 1024, then one fits. The share's figure follows each step."""
    tenant, name = resize_world, "notebook"
    serving = ServingPod(deployed, name)
    serving.create()
    started = serving.restarts()
    file_generation = limits_generation(serving.slice_file())  # as Allocate wrote it
    half = 1500 * MIB  # 2 x 1500 = 3000 MiB: over the 2048 of the spec, under the 4096 asked
    first = serving.ask(str(half))
    pid = first["pid"]
    assert (first["result"], first["held"], first["total"]) == ("hipSuccess", half, SLICE_MIB * MIB), first
    refused = serving.ask(str(half))
    assert (refused["result"], refused["held"], refused["pid"]) == ("hipErrorOutOfMemory", half, pid), refused
    wait_for(f"share used {SLICE_MIB} MiB", lambda: share_row(deployed).get("MEM-USED") == str(SLICE_MIB),
             timeout_s=60, explain=lambda: str(share_row(deployed)))

    for generation, mib in ((1, 2 * SLICE_MIB), (2, SLICE_MIB // 2)):
        done = resize_as_tenant(tenant, name, mib)
        assert done.returncode == 0 and f"Resized: generation {generation}: " in done.stdout, (done.stdout, done.stderr)
        pod = wait_for(f"condition {RESIZED_CONDITION} generation {generation}",
                       lambda: (lambda p: p if resized(p, generation) else None)(serving.pod()), timeout_s=30)
        record = decode_record(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])
        assert record.generation == generation and record.containers[0].devices[0].memory_mib == mib, record
        seen: list[str] = []
        wait_for(f"the container's slice file newer than generation {file_generation}, at {mib} MiB",
                 lambda: (seen.append(text := serving.slice_file()) or
                          (limits_generation(text) > file_generation and f"\nmemory 0 {mib * MIB}\n" in text)),
                 timeout_s=60, explain=lambda: f"the container read: {seen[-1]!r}\n" + deployed.kubectl(
                     "logs", "-n", NAMESPACE, "-l", AGENT_LABEL, "--tail=30", check=False).stdout)
        file_generation = limits_generation(seen[-1])
        wait_for(f"share used {mib} MiB", lambda: share_row(deployed).get("MEM-USED") == str(mib), timeout_s=60,
                 explain=lambda: str(share_row(deployed)))
        status = deployed.json("get", "amdgpushare", "-n", RESIZE_NS, "team")["status"]
        assert status["used"]["memoryMiB"] == mib and status["pods"][0]["memoryMiB"] == mib, status
        # The share's ResourceQuota too (its used entry is the operator's, under the manifests' RBAC).
        wait_for(f"ResourceQuota rocshare-team used {mib} MiB", lambda: quota_used_mib(deployed) == str(mib),
                 timeout_s=30,
                 explain=lambda: str(deployed.json("get", "resourcequota", "-n", RESIZE_NS, "rocshare-team")))
        if generation == 1:  # grown: the same process now holds 3000 MiB under 4096
            grown = serving.ask(str(half))
            assert grown == {"op": "alloc", "result": "hipSuccess", "free": mib * MIB - 2 * half,
                             "total": mib * MIB, "held": 2 * half, "pid": pid}, grown
        else:  # shrunk under what it holds: nothing freed for it, refused until it frees below
            over = serving.ask(str(MIB))
            assert over == {"op": "alloc", "result": "hipErrorOutOfMemory", "free": 0, "total": mib * MIB,
                            "held": 2 * half, "pid": pid}, over
            assert serving.ask("free")["held"] == half
            assert serving.ask(str(MIB))["result"] == "hipErrorOutOfMemory"  # 1500 MiB held: still over 1024
            assert serving.ask("free") == {"op": "free", "result": "hipSuccess", "free": mib * MIB,
                                           "total": mib * MIB, "held": 0, "pid": pid}
            fits = serving.ask(str(MIB))
            assert (fits["result"], fits["held"], fits["pid"]) == ("hipSuccess", MIB, pid), fits
    assert serving.restarts() == started and started[0] == 0, (started, serving.restarts())
