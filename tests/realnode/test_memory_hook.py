"""A node without the memory hook, on the real node (docs/memory-hook.md): the agent says so
(AmdGpuNode condition MemoryHook, a MemoryHookMissing event on the Node, the monitor's gauge);
with the pool's default agent.hookMissing (Refuse) a slice pod fails at the kubelet's Allocate
with a message naming the missing file while a whole-GPU pod runs; with RunWithoutLimit the slice
runs in its real container with no LD_AUDIT and a NoMemoryLimit event saying it has no memory
limit. The hook library is put back at the end, for the modules after this one."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from rocshare_dev.realnode import deploy
from tests.realnode.conftest import AGENT_LABEL, HOOK_STAND_IN, NAMESPACE, WORKLOADS, Deployed, describe, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def hook_condition(deployed: Deployed) -> dict | None:
    status = deployed.json("get", "amdgpunode", deployed.node.node_name).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == "MemoryHook"), None)


def agent_pod(deployed: Deployed, *, hook_missing: str) -> dict | None:
    """The agent pod Running and ready with `--hook-missing=<hook_missing>`, if there is one."""
    for pod in deployed.json("get", "pods", "-n", NAMESPACE, "-l", AGENT_LABEL)["items"]:
        ready = pod["status"].get("phase") == "Running" and all(
            s.get("ready") for s in pod["status"].get("containerStatuses", []))
        if ready and f"--hook-missing={hook_missing}" in pod["spec"]["containers"][0]["args"] and not pod[
                "metadata"].get("deletionTimestamp"):
            return pod
    return None


def set_hook_missing(deployed: Deployed, value: str) -> None:
    patch = {"spec": {"agent": {"hookMissing": value}}}
    deployed.kubectl("patch", "amdgpupool", deploy.POOL, "--type=merge", "-p", json.dumps(patch))
    wait_for(f"the agent restarted with --hook-missing={value}", lambda: agent_pod(deployed, hook_missing=value),
             timeout_s=300, explain=lambda: describe(deployed.cluster, f"pods -n {NAMESPACE}"))


@pytest.fixture(scope="module")
def without_hook(deployed: Deployed) -> Iterator[str]:
    library = deployed.host.hook_library
    library.unlink(missing_ok=True)
    try:
        yield str(library)
    finally:
        library.write_bytes(HOOK_STAND_IN)
        if agent_pod(deployed, hook_missing="Refuse") is None:
            set_hook_missing(deployed, "Refuse")
        wait_for("the MemoryHook condition True again", lambda: (hook_condition(deployed) or {}).get("status") == "True",
                 timeout_s=120)


def pod_phase(deployed: Deployed, name: str) -> dict:
    return deployed.json("get", "pod", "-n", WORKLOADS, name)


def delete(deployed: Deployed, *names: str) -> None:
    deployed.kubectl("delete", "pod", "-n", WORKLOADS, *names, "--wait=true", "--timeout=120s", "--ignore-not-found",
                     check=False)


def test_the_agent_reports_the_missing_hook(deployed: Deployed, without_hook: str) -> None:
    condition = wait_for("MemoryHook False on the AmdGpuNode", lambda: (lambda c: c if c and c["status"] == "False"
                                                                        else None)(hook_condition(deployed)),
                         timeout_s=120)
    assert condition["reason"] == "MemoryHookMissing"
    assert condition["message"] == f"{without_hook} is missing: memory slices on this node are refused " \
                                   "(pool agent.hookMissing: Refuse)"
    events = wait_for("a MemoryHookMissing event on the Node", lambda: [
        e for e in deployed.json("get", "events", "-n", "default", "--field-selector",
                                 f"involvedObject.name={deployed.node.node_name},reason=MemoryHookMissing")["items"]],
        timeout_s=60)
    assert events[-1]["type"] == "Warning" and without_hook in events[-1]["message"]
    agent = agent_pod(deployed, hook_missing="Refuse")["metadata"]["name"]
    scrape = deployed.kubectl("exec", "-n", NAMESPACE, agent, "--", "python", "-c",
                              "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9394/metrics').read().decode())")
    gauge = [line for line in scrape.stdout.splitlines() if line.startswith("rocshare_node_memory_hook_present{")]
    assert gauge and gauge[0].endswith(" 0.0") and f'path="{without_hook}"' in gauge[0], gauge


def test_refuse_fails_a_slice_naming_the_file_and_runs_a_whole_gpu(deployed: Deployed, without_hook: str) -> None:
    slice_pod = deploy.slice_pod("hookless-slice", WORKLOADS, memory_mib=2048, cores_pct=10)
    whole = deploy.slice_pod("hookless-whole", WORKLOADS, memory_mib=0, cores_pct=0)
    whole["spec"]["containers"][0]["resources"]["limits"] = {"amd.com/gpu": "1"}
    try:
        for pod in (slice_pod, whole):
            deployed.kubectl("create", "-f", "-", input_text=yaml.safe_dump(pod))
        failed = wait_for("the slice pod Failed", lambda: (lambda p: p if p["status"].get("phase") == "Failed" else None)(
            pod_phase(deployed, "hookless-slice")), timeout_s=180,
            explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} hookless-slice"))
        assert f"the memory hook {without_hook} is missing on node {deployed.node.node_name}" in failed["status"][
            "message"], failed["status"]
        wait_for("the whole-GPU pod Running", lambda: pod_phase(deployed, "hookless-whole")["status"].get(
            "phase") == "Running", timeout_s=180, explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} hookless-whole"))
        env = deployed.kubectl("exec", "-n", WORKLOADS, "hookless-whole", "--", "env").stdout
        assert "HIP_VISIBLE_DEVICES=0" in env and "LD_AUDIT" not in env
    finally:
        delete(deployed, "hookless-slice", "hookless-whole")


def test_run_without_limit_runs_the_slice_and_says_it_has_no_limit(deployed: Deployed, without_hook: str) -> None:
    set_hook_missing(deployed, "RunWithoutLimit")
    wait_for("the condition to name the new setting", lambda: "RunWithoutLimit" in (hook_condition(deployed) or {}).get(
        "message", ""), timeout_s=120)
    pod = deploy.slice_pod("unlimited-slice", WORKLOADS, memory_mib=2048, cores_pct=10)
    try:
        deployed.kubectl("create", "-f", "-", input_text=yaml.safe_dump(pod))
        wait_for("the slice pod Running", lambda: pod_phase(deployed, "unlimited-slice")["status"].get(
            "phase") == "Running", timeout_s=180, explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} unlimited-slice"))
        env = deployed.kubectl("exec", "-n", WORKLOADS, "unlimited-slice", "--", "env").stdout
        assert "HSA_CU_MASK=" in env and "LD_AUDIT" not in env and "HIP_DEVICE_MEMORY_LIMIT_0" not in env, env
        events = wait_for("the NoMemoryLimit event on the pod", lambda: deployed.json(
            "get", "events", "-n", WORKLOADS, "--field-selector",
            "involvedObject.name=unlimited-slice,reason=NoMemoryLimit")["items"], timeout_s=60)
        assert events[0]["type"] == "Warning" and events[0]["source"]["host"] == deployed.node.node_name
        assert events[0]["message"] == (f"container {pod['spec']['containers'][0]['name']} has no memory limit: the "
                                        f"memory hook {without_hook} is missing on this node "
                                        "(pool agent.hookMissing: RunWithoutLimit)")
    finally:
        delete(deployed, "unlimited-slice")
