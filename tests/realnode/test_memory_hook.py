"""A node without a usable memory hook, on the real node (docs/memory-hook.md). The pool names
an External library (agent.hookLibrary: External) and its hookPath is emptied -- the agent then
only checks, and installs nothing. The agent says so (AmdGpuNode condition MemoryHook, a
MemoryHookMissing event on the Node, the monitor's gauge); with the pool's default
agent.hookMissing (Refuse) a slice pod fails at the kubelet's Allocate with a message naming the
missing file while a whole-GPU pod runs; a file that is not an audit library (the text file the
suite used to mount as "the hook") is reported missing too, and refused; with RunWithoutLimit the
slice runs in its real container with no LD_AUDIT and a NoMemoryLimit event saying it has no
memory limit. At the end the pool goes back to hookLibrary Rocshare and the agent installs its
hook again, for the modules after this one."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest
import yaml

from rocshare_dev.realnode import deploy
from tests.realnode.conftest import (AGENT_LABEL, NAMESPACE, WORKLOADS, Deployed, describe, hook_version,
                                    wait_for)
from tests.realnode.conftest import hook_condition as condition_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
NOT_A_HOOK = b"rocshare test: a text file where the hook library should be\n"


def hook_condition(deployed: Deployed) -> dict | None:
    return condition_of(deployed.cluster, deployed.node.node_name)


def agent_pod(deployed: Deployed, **settings: str) -> dict | None:
    """The agent pod Running and ready with `--<setting>=<value>` for each of `settings`
    (hook_missing="Refuse" means --hook-missing=Refuse), if there is one."""
    wanted = {f"--{key.replace('_', '-')}={value}" for key, value in settings.items()}
    for pod in deployed.json("get", "pods", "-n", NAMESPACE, "-l", AGENT_LABEL)["items"]:
        ready = pod["status"].get("phase") == "Running" and all(
            s.get("ready") for s in pod["status"].get("containerStatuses", []))
        if ready and wanted <= set(pod["spec"]["containers"][0]["args"]) and not pod["metadata"].get(
                "deletionTimestamp"):
            return pod
    return None


def set_agent(deployed: Deployed, **settings: str) -> None:
    """Patch the pool's agent settings (camelCase keys) and wait for the agent restarted with them."""
    deployed.kubectl("patch", "amdgpupool", deploy.POOL, "--type=merge", "-p", json.dumps({"spec": {"agent": settings}}))
    flags = {"".join("_" + c.lower() if c.isupper() else c for c in key): value for key, value in settings.items()}
    wait_for(f"the agent restarted with {settings}", lambda: agent_pod(deployed, **flags), timeout_s=300,
             explain=lambda: describe(deployed.cluster, f"pods -n {NAMESPACE}"))


def empty(folder) -> None:
    for path in folder.iterdir():
        path.unlink() if path.is_symlink() or not path.is_dir() else shutil.rmtree(path)


@pytest.fixture(scope="module")
def without_hook(deployed: Deployed) -> Iterator[str]:
    library = deployed.host.hook_library
    set_agent(deployed, hookLibrary="External")
    empty(deployed.host.hook_dir)
    try:
        yield str(library)
    finally:
        set_agent(deployed, hookLibrary="Rocshare", hookMissing="Refuse")
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
    agent = agent_pod(deployed, hook_missing="Refuse", hook_library="External")["metadata"]["name"]
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
    set_agent(deployed, hookMissing="RunWithoutLimit")
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


def test_a_file_that_is_not_an_audit_library_is_missing_and_refused(deployed: Deployed, without_hook: str) -> None:
    """The old stand-in, a readable text file, passed the old check while the loader would skip it."""
    if agent_pod(deployed, hook_missing="Refuse") is None:
        set_agent(deployed, hookMissing="Refuse")
    deployed.host.hook_library.write_bytes(NOT_A_HOOK)
    try:
        condition = wait_for("MemoryHook False naming the text file", lambda: (lambda c: c if c and "ELF" in c[
            "message"] else None)(hook_condition(deployed)), timeout_s=120)
        assert condition["status"] == "False" and condition["reason"] == "MemoryHookMissing"
        assert condition["message"].startswith(f"{without_hook} is not a readable ELF file"), condition
        pod = deploy.slice_pod("texthook-slice", WORKLOADS, memory_mib=2048, cores_pct=10)
        deployed.kubectl("create", "-f", "-", input_text=yaml.safe_dump(pod))
        failed = wait_for("the slice pod Failed", lambda: (lambda p: p if p["status"].get("phase") == "Failed" else None)(
            pod_phase(deployed, "texthook-slice")), timeout_s=180,
            explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} texthook-slice"))
        assert f"the memory hook {without_hook} is not a readable ELF file" in failed["status"]["message"], failed[
            "status"]
    finally:
        delete(deployed, "texthook-slice")
        deployed.host.hook_library.unlink(missing_ok=True)


def test_back_on_rocshare_the_agent_installs_its_hook_again(deployed: Deployed, without_hook: str) -> None:
    """Run last in this module (pytest keeps file order): the External setting ends, the agent
    replaces whatever is in the folder with its own hook behind the link."""
    set_agent(deployed, hookLibrary="Rocshare", hookMissing="Refuse")
    condition = wait_for("MemoryHook True", lambda: (lambda c: c if c and c["status"] == "True" else None)(
        hook_condition(deployed)), timeout_s=120)
    assert condition["message"].startswith(f"{without_hook} is {hook_version()},"), condition
    assert deployed.host.hook_library.is_symlink()
