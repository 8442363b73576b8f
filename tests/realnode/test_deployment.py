"""rocshare deployed on a real kubelet node as the README says, checked from the outside in:
the one apply, the operator Deployment (operator + kube-scheduler from images built here) under
its service account, the webhook through its Service with the certificate the operator made,
the agent DaemonSet registered on the real kubelet.sock, and a slice pod whose environment is
read from inside its real container. Issue 17's defects 2-4 each fail one of these. Issue 29:
the pool's hookPath starts empty and the agent installs rocshare's own memory hook there, which
the slice container mounts (test_hook_enforces.py proves it limits a real container)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import time

import pytest
import yaml

from rocshare.api.allocation import ALLOCATION_ANNOTATION, decode_record
from rocshare.core.cumask import render_hsa_cu_mask
from rocshare_dev.devcluster.captures import FIXTURES
from rocshare_dev.devcluster.controlplane import k8s_version
from rocshare_dev.realnode import deploy
from rocshare_operator.leadership import LEADER_PRIORITY
from rocshare_dev.realnode.kubelet import DEVICE_PLUGIN_DIR
from rocshare_agent.discovery.names import SOURCE_BUILTIN, SOURCE_IDS_DEVICE
from tests.realnode.conftest import (AGENT_LABEL, ISSUE_39_ENV, NAMESPACE, TIMINGS, WORKLOADS, Deployed,
                                    attempt_widening, describe, hook_version, wait_for)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
HOOK = "/usr/local/vgpu/libamvgpu.so"


def test_one_apply_installs_everything_on_an_empty_cluster(deployed: Deployed) -> None:
    """Defect 2: the ClusterKopfPeering CRD and an object of it in one apply failed the first run."""
    lines = [line for line in deployed.first_apply.splitlines() if line.strip()]
    assert lines and all("serverside-applied" in line for line in lines), deployed.first_apply
    assert any(line.startswith("customresourcedefinition") and "clusterkopfpeerings.kopf.dev" in line for line in lines)
    # Both replicas made or found the peering object and keep their heartbeat there under their
    # pod's name; the one whose kube-scheduler leads holds the leader's priority (issue 30).
    names = {pod["metadata"]["name"] for pod in operator_pods(deployed)}

    def both_peers_one_leader() -> dict | None:
        peering = deployed.json("get", "clusterkopfpeering", "rocshare").get("status") or {}
        leaders = [peer for peer, entry in peering.items() if (entry or {}).get("priority", 0) >= LEADER_PRIORITY]
        return peering if names <= set(peering) and len(leaders) == 1 and leaders[0] in names else None

    wait_for("both replicas' peering heartbeats, one at the leader's priority", both_peers_one_leader, timeout_s=90)


def operator_pods(deployed: Deployed) -> list[dict]:
    pods = deployed.json("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=rocshare-operator")["items"]
    assert len(pods) == 2, [pod["metadata"]["name"] for pod in pods]  # replicas: 2 (issue 30)
    return pods


def test_operator_pods_run_both_containers_unprivileged_without_restarts(deployed: Deployed) -> None:
    """Defect 3: Kopf's getpass.getuser() crashed the operator (uid 65532 has no passwd entry).
    The operator is a native sidecar (an init container that keeps running), kube-scheduler (extender
    mode's profile) and kube-scheduler-dra (DRA mode's, issue 42) the containers."""
    for pod in operator_pods(deployed):
        statuses = {status["name"]: status for status in
                    [*pod["status"].get("initContainerStatuses", []), *pod["status"]["containerStatuses"]]}
        assert set(statuses) == {"operator", "kube-scheduler", "kube-scheduler-dra"}
        for name, status in statuses.items():
            assert status["ready"] and status["restartCount"] == 0, (name, status)
        assert statuses["operator"]["image"].endswith("localhost/rocshare/operator:dev")
        # The scheduler image is the control plane's own build (make images), tagged with its version.
        for scheduler in ("kube-scheduler", "kube-scheduler-dra"):
            assert statuses[scheduler]["image"].endswith(f"localhost/rocshare/kube-scheduler:v{k8s_version()}")
        uid = deployed.kubectl("exec", "-n", NAMESPACE, pod["metadata"]["name"], "-c", "operator", "--", "id", "-u")
        assert uid.stdout.strip() == "65532"
        logs = deployed.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"], "-c", "operator").stdout
        assert "Traceback" not in logs and "Forbidden" not in logs, logs[-3000:]


def test_operator_made_the_webhook_certificate_and_the_ca_bundle(deployed: Deployed) -> None:
    """Defect 4: nothing made the Secret the dev overlay relies on; the operator crash-looped."""
    secret = deployed.json("get", "secret", "-n", NAMESPACE, "rocshare-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls" and {"tls.crt", "tls.key", "ca.crt"} <= set(secret["data"])
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        config = wait_for(f"caBundle on {kind}", lambda kind=kind: deployed.json("get", kind, "rocshare-pods")[
            "webhooks"][0]["clientConfig"].get("caBundle"), timeout_s=60)
        assert config == secret["data"]["ca.crt"], kind
    assert b"BEGIN CERTIFICATE" in base64.b64decode(secret["data"]["ca.crt"])


def test_webhook_refuses_a_bad_gpu_pod_through_its_service(deployed: Deployed) -> None:
    """The API server calls the webhook on the Service's endpoint (TLS verified against the
    caBundle the operator wrote); the refusal is the webhook's own message."""
    bad = deploy.slice_pod("privileged-slice", WORKLOADS, memory_mib=1024, cores_pct=10)
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    refused = deployed.kubectl("create", "-f", "-", input_text=yaml.safe_dump(bad), check=False)
    assert refused.returncode != 0
    assert 'admission webhook "pods.mutate.rocshare.io" denied the request' in refused.stderr, refused.stderr
    assert "privileged container sees every GPU" in refused.stderr, refused.stderr


def test_agent_registered_on_the_real_kubelet_and_the_node_advertises_gpus(deployed: Deployed) -> None:
    def advertised() -> dict | None:
        # The kubelet shows 0 between the plugin's registration and its first device list.
        node = deployed.json("get", "node", deployed.node.node_name)
        return node if int(node["status"]["allocatable"].get("amd.com/gpu", "0")) > 0 else None

    node = wait_for("amd.com/gpu on the node", advertised, timeout_s=120,
                    explain=lambda: describe(deployed.cluster, f"node {deployed.node.node_name}"))
    assert int(node["status"]["allocatable"]["amd.com/gpu"]) == 8 * 8  # 8 MI210s, splitCount 8
    assert (DEVICE_PLUGIN_DIR / "kubelet.sock").is_socket()
    assert [path for path in DEVICE_PLUGIN_DIR.iterdir() if path.name != "kubelet.sock" and path.is_socket()]
    gpu_node = deployed.json("get", "amdgpunode", deployed.node.node_name)
    assert len(gpu_node["status"]["gpus"]) == 8, gpu_node["status"]


def test_agent_image_names_gpus_from_libdrms_table(deployed: Deployed) -> None:
    # `rocshare discover` as a user runs it on the node, inside the agent's own container: the
    # image carries libdrm's amdgpu.ids (Debian's libdrm-common), which names the MI210 by its
    # device id; without it the name would come from rocshare's built-in table.
    pod = deployed.json("get", "pods", "-n", NAMESPACE, "-l", AGENT_LABEL)["items"][0]
    out = deployed.kubectl("exec", "-n", NAMESPACE, pod["metadata"]["name"], "-c", "agent", "--",
                           "rocshare", "discover", "--json", f"--sysfs-root={deployed.host.sysfs_root}").stdout
    gpus = json.loads(out)["gpus"]
    assert len(gpus) == 8
    assert {(gpu["product"], gpu["productSource"]) for gpu in gpus} == {("AMD Instinct MI210", SOURCE_IDS_DEVICE)}


def test_agent_image_names_an_mi308x(deployed: Deployed) -> None:
    """Issue 29: the image's names are current. `rocshare discover` in the agent image (a pod of
    its own) on the MI300X capture with its KFD device id changed to the MI308X's 0x74a2: the
    image's Debian 13 amdgpu.ids lacks that id, so rocshare's own table must name it."""
    tree = deployed.node.root / "mi308x-sysfs"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(FIXTURES / "mi300x-8gpu-cpx", tree)
    changed = 0
    for properties in (tree / "class" / "kfd" / "kfd" / "topology" / "nodes").glob("*/properties"):
        text = properties.read_text()
        if "device_id 29857\n" in text:  # 0x74a1, the MI300X
            properties.write_text(text.replace("device_id 29857\n", f"device_id {0x74A2}\n"))
            changed += 1
    assert changed == 63  # the capture's partition nodes (DESIGN.md section 5)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "discover-mi308x", "namespace": WORKLOADS},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [{
               "name": "discover", "image": deploy.AGENT_IMAGE, "imagePullPolicy": "Never",
               "args": ["discover", "--json", "--sysfs-root=/capture"],
               "volumeMounts": [{"name": "capture", "mountPath": "/capture", "readOnly": True}]}],
               "volumes": [{"name": "capture", "hostPath": {"path": str(tree), "type": "Directory"}}]}}
    deployed.kubectl("delete", "pod", "-n", WORKLOADS, "discover-mi308x", "--ignore-not-found", "--wait=true")
    deployed.kubectl("create", "-f", "-", input_text=yaml.safe_dump(pod))
    try:
        wait_for("the discover pod Succeeded", lambda: deployed.json("get", "pod", "-n", WORKLOADS, "discover-mi308x")[
            "status"].get("phase") == "Succeeded", timeout_s=120,
            explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} discover-mi308x"))
        gpus = json.loads(deployed.kubectl("logs", "-n", WORKLOADS, "discover-mi308x").stdout)["gpus"]
    finally:
        deployed.kubectl("delete", "pod", "-n", WORKLOADS, "discover-mi308x", "--ignore-not-found", "--wait=false")
    assert len(gpus) == changed
    assert {(gpu["product"], gpu["productSource"]) for gpu in gpus} == {("AMD Instinct MI308X", SOURCE_BUILTIN)}


@pytest.fixture(scope="module")
def slice_pod(deployed: Deployed) -> dict:
    pod = deploy.slice_pod("slice-4g-25pct", WORKLOADS, memory_mib=4096, cores_pct=25)
    started = time.monotonic()
    deployed.kubectl("create", "-f", "-", input_text=yaml.safe_dump(pod))
    running = wait_for("the slice pod Running", lambda: (lambda p: p if p["status"].get("phase") == "Running" else None)(
        deployed.json("get", "pod", "-n", WORKLOADS, "slice-4g-25pct")), timeout_s=180,
        explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} slice-4g-25pct"))
    TIMINGS["slice pod Running (from create)"] = time.monotonic() - started
    return running


def container_env(deployed: Deployed, pod: dict) -> dict[str, str]:
    out = deployed.kubectl("exec", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"], "--", "env").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_slice_pod_environment_inside_the_container_matches_its_record(deployed: Deployed, slice_pod: dict) -> None:
    assert slice_pod["spec"]["schedulerName"] == "rocshare-scheduler"  # the webhook routed it to rocshare's scheduler
    assert slice_pod["spec"]["nodeName"] == deployed.node.node_name
    record = decode_record(slice_pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    (container,) = record.containers
    (device,) = container.devices
    assert device.memory_mib == 4096 and not device.whole
    env = container_env(deployed, slice_pod)
    assert env["HSA_CU_MASK"] == render_hsa_cu_mask(container.devices)
    assert env["HIP_VISIBLE_DEVICES"] == "0"
    assert env["HIP_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert env["LD_AUDIT"] == HOOK
    listing = deployed.kubectl("exec", "-n", WORKLOADS, "slice-4g-25pct", "--", "ls", "-l", "/dev/kfd", "/dev/dri")
    assert "/dev/kfd" in listing.stdout and "renderD" in listing.stdout


def test_slice_container_has_the_hook_mount(deployed: Deployed, slice_pod: dict) -> None:
    """The container's libamvgpu.so is, byte for byte, the file the agent installed on the host."""
    installed = deployed.host.hook_library.resolve(strict=True)
    digest = deployed.kubectl("exec", "-n", WORKLOADS, "slice-4g-25pct", "--", "sha256sum", HOOK).stdout.split()[0]
    assert digest == hashlib.sha256(installed.read_bytes()).hexdigest()
    mounts = deployed.kubectl("exec", "-n", WORKLOADS, "slice-4g-25pct", "--", "cat", "/proc/self/mounts").stdout
    assert any(line.split()[1] == HOOK and "ro" in line.split()[3].split(",") for line in mounts.splitlines()), mounts


def test_the_agent_installed_its_hook_into_the_empty_hook_path(deployed: Deployed) -> None:
    """Issue 29: nothing placed by hand. The empty hookPath gets one versioned file, named by the
    hook's version and the first 12 hex digits of its SHA-256, the very library the agent image
    ships, with libamvgpu.so a relative link to it; the MemoryHook condition names the version."""
    assert deployed.hook_dir_empty_before
    listing = deployed.hook_dir_after_agent
    versioned = {name for name, target in listing.items() if target == "file"}
    assert len(versioned) == 1 and set(listing) == versioned | {"libamvgpu.so"}, listing
    (name,) = versioned
    content = (deployed.host.hook_dir / name).read_bytes()
    number = hook_version().removeprefix("rocshare-hook ")
    assert name == f"rocshare-hook-{number}-{hashlib.sha256(content).hexdigest()[:12]}.so"
    assert listing["libamvgpu.so"] == name
    assert content[:4] == b"\x7fELF" and hook_version().encode() + b"\0" in content
    agent = deployed.json("get", "pods", "-n", NAMESPACE, "-l", AGENT_LABEL)["items"][0]["metadata"]["name"]
    shipped = deployed.kubectl("exec", "-n", NAMESPACE, agent, "-c", "agent", "--", "sha256sum",
                               "/opt/rocshare/hook/librocshare-hook.so").stdout.split()[0]
    assert shipped == hashlib.sha256(content).hexdigest()
    condition = deployed.hook_condition_after_agent
    assert (condition["status"], condition["reason"]) == ("True", "MemoryHookFound"), condition
    assert condition["message"] == (f"{deployed.host.hook_library} is {hook_version()}, an audit library for this "
                                    "node: memory slices get their limit")


def test_a_slice_pod_cannot_set_its_own_limit_cu_mask_or_hook(deployed: Deployed, slice_pod: dict) -> None:
    """Issue 39, device-plugin mode: the kubelet applies the pod's env after the device plugin's, so
    before the fix this pod ran with a 64 GiB limit, every CU and no hook (the failure message shows
    `env` from inside it). Now the webhook refuses it, naming the reason."""
    attack = deploy.slice_pod("widen-env", WORKLOADS, memory_mib=2048, cores_pct=25)
    attack["spec"]["containers"][0]["env"] = [{"name": key, "value": value} for key, value in ISSUE_39_ENV.items()]
    refused = attempt_widening(deployed, attack)
    assert 'admission webhook "pods.mutate.rocshare.io" denied the request: ProtectedEnvVar' in refused, refused


def test_a_slice_pod_cannot_take_them_from_a_config_map(deployed: Deployed, slice_pod: dict) -> None:
    """The same values from a ConfigMap through envFrom (no prefix): admission cannot see them, so
    the source is refused by its prefix; before the fix the pod ran with them."""
    deployed.kubectl("create", "configmap", "widen", "-n", WORKLOADS, *(f"--from-literal={key}={value}"
                                                                       for key, value in ISSUE_39_ENV.items()))
    try:
        attack = deploy.slice_pod("widen-envfrom", WORKLOADS, memory_mib=2048, cores_pct=25)
        attack["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "widen"}}]
        refused = attempt_widening(deployed, attack)
        assert "ProtectedEnvFrom" in refused and "configMapRef widen without a prefix" in refused, refused
    finally:
        deployed.kubectl("delete", "configmap", "widen", "-n", WORKLOADS, "--ignore-not-found")


SPEC_DOORS = [  # (reason, the container's added fields, the pod's volumes, a word of the refusal)
    ("HookPathMount", {"volumeMounts": [{"name": "cover", "mountPath": "/usr/local/vgpu"}]},
     [{"name": "cover", "emptyDir": {}}], "volume cover mounted at /usr/local/vgpu"),
    ("HostDeviceVolume", {"volumeMounts": [{"name": "kfd", "mountPath": "/host/kfd"}]},
     [{"name": "kfd", "hostPath": {"path": "/dev/kfd"}}], "is the host's /dev/kfd"),
    ("HostDeviceVolume", {"volumeMounts": [{"name": "dri", "mountPath": "/host/dri"}]},
     [{"name": "dri", "hostPath": {"path": "/dev/dri"}}], "is the host's /dev/dri"),
    ("PrivilegedSlice", {"securityContext": {"privileged": True}}, [], "a privileged container sees every GPU"),
]
"""Issue 39's pod-spec doors beside env: a mount over the hook's folder (it would hide the library
LD_AUDIT names), the host's GPU device nodes by hostPath, a privileged slice (every GPU, no CU mask)."""


def test_a_slice_pod_cannot_cover_the_hook_reach_host_devices_or_be_privileged(deployed: Deployed,
                                                                                slice_pod: dict) -> None:
    """Device-plugin mode on the real node, each door through the installed webhook: the well-formed
    slice pod (the positive control) is admitted and Running; the same pod with one door added is
    refused by the API server, naming the reason. A door left open fails with what the container got."""
    assert slice_pod["status"]["phase"] == "Running" and slice_pod["spec"]["nodeName"] == deployed.node.node_name
    for index, (reason, container_fields, volumes, detail) in enumerate(SPEC_DOORS):
        attack = deploy.slice_pod(f"door-{index}-{reason.lower()}", WORKLOADS, memory_mib=2048, cores_pct=25)
        attack["spec"]["containers"][0].update(container_fields)
        if volumes:
            attack["spec"]["volumes"] = volumes
        refused = attempt_widening(deployed, attack)
        assert f'admission webhook "pods.mutate.rocshare.io" denied the request: {reason}' in refused, refused
        assert detail in refused, refused


def test_deleting_the_pod_frees_its_slice(deployed: Deployed, slice_pod: dict) -> None:
    def pool_status() -> dict:
        return deployed.json("get", "amdgpupool", deploy.POOL).get("status", {})

    wait_for("the pool to count the slice", lambda: pool_status().get("vramAllocatedMiB", 0) >= 4096, timeout_s=60,
             explain=lambda: json.dumps(pool_status()))
    deployed.kubectl("delete", "pod", "-n", WORKLOADS, "slice-4g-25pct", "--wait=true", "--timeout=120s")
    wait_for("the pool to free the slice", lambda: pool_status().get("vramAllocatedMiB", 0) == 0, timeout_s=60,
             explain=lambda: json.dumps(pool_status()))
