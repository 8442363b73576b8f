"""One real kubelet node with rocshare deployed on it as the README says, for the whole
session (dev/rocshare_dev/realnode): control plane, containerd and kubelet v1.35 in a network
namespace of their own; images built here (`make images`); then

    kubectl apply --server-side -k <overlay over manifests/overlays/dev, local image names>

once, on the empty cluster -- its output is kept for the tests -- the GPU node labelled for a
pool whose agent reads a real sysfs capture and fake device nodes, and the agent DaemonSet pod
Running. The pool's hookPath starts EMPTY and nothing is placed there by hand: the agent
installs rocshare's memory hook from its image (what it left there is kept for the tests).
Everything is torn down at the end (processes, mounts, cgroups, iptables, netns, sysctls).
Missing images or binaries fail the session: an e2e test that skips proves nothing.

The container runtime is `ROCSHARE_REALNODE_RUNTIME` (`make ... REAL_NODE_RUNTIME=`):
`containerd2` by default (containerd 2.x built here, CDI on), `containerd` for Debian's 1.6
(test_cdi.py asserts what each delivers).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, SERVICE_CIDR, ControlPlane
from rocshare_dev.realnode import deploy
from rocshare_dev.realnode.containerd import DEFAULT_RUNTIME
from rocshare_dev.realnode.deploy import HostPaths
from rocshare_dev.realnode.rig import RealNode

RUN_ROOT = PROJECT_ROOT / "run" / "realnode-test"
RUNTIME = os.environ.get("ROCSHARE_REALNODE_RUNTIME") or DEFAULT_RUNTIME
NAMESPACE = "rocshare-system"
WORKLOADS = "realnode-e2e"
AGENT_LABEL = "app.kubernetes.io/name=rocshare-node-agent"


def hook_version() -> str:
    """What the agent image's hook says it is: "rocshare-hook " + the version its build is stamped with."""
    return "rocshare-hook " + (PROJECT_ROOT / "hook" / "VERSION").read_text().strip()
TIMINGS: dict[str, float] = {}  # seconds from the session's start of each step, for the summary


@dataclass
class Deployed:
    node: RealNode
    cluster: ControlPlane
    host: HostPaths
    first_apply: str  # kubectl's output of the one `apply --server-side -k`
    hook_dir_empty_before: bool  # the pool's hookPath had nothing in it before the pool was applied
    hook_dir_after_agent: dict[str, str]  # what it held once the agent ran: name -> link target or "file"
    hook_condition_after_agent: dict  # the agent's MemoryHook condition then
    timings: dict[str, float]

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None):
        return self.cluster.kubectl(*args, check=check, input_text=input_text)

    def json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)


ISSUE_39_ENV = {"HIP_DEVICE_MEMORY_LIMIT_0": "65536m", "HSA_CU_MASK": "0:0-103", "LD_AUDIT": "/nonexistent.so"}
"""Issue 39's attack: a slice pod's own env giving it 64 GiB, every CU of an MI210 and no hook."""


def attempt_widening(deployed: Deployed, pod: dict) -> str:
    """Create `pod` (a slice pod carrying what a tenant wrote to widen it) and return the refusal
    kubectl printed. Where it is admitted (the code before issue 39), fail with what its container
    really received: the variables from `env` inside it, and whether it is privileged."""
    created = deployed.kubectl("create", "-f", "-", input_text=json.dumps(pod), check=False)
    if created.returncode != 0:
        return created.stderr
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    try:
        def phase() -> str | None:
            return deployed.json("get", "pod", "-n", namespace, name)["status"].get("phase")

        wait_for(f"{name} Running", lambda: phase() == "Running", timeout_s=180,
                 explain=lambda: describe(deployed.cluster, f"pod -n {namespace} {name}"))
        out = deployed.kubectl("exec", "-n", namespace, name, "--", "env").stdout
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        shown = {key: env.get(key) for key in (*ISSUE_39_ENV, "ROCR_VISIBLE_DEVICES")}
        status = deployed.kubectl("exec", "-n", namespace, name, "--", "grep", "CapEff", "/proc/self/status").stdout
        pytest.fail(f"{name} was admitted and runs; inside it: {shown}, {status.strip()}")
    finally:
        deployed.kubectl("delete", "pod", "-n", namespace, name, "--ignore-not-found", "--wait=true", "--timeout=120s",
                         check=False)


def wait_for(what: str, probe, *, timeout_s: float, interval_s: float = 1.0, explain=None):
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            detail = explain() if explain else ""
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{detail}")
        time.sleep(interval_s)


def describe(cluster: ControlPlane, *targets: str) -> str:
    out = []
    for target in targets:
        kind, _, rest = target.partition(" ")
        out.append(cluster.kubectl("describe", kind, *rest.split(), check=False).stdout[-4000:])
    out.append(cluster.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False).stdout[-4000:])
    return "\n".join(out)


@pytest.fixture(scope="session")
def real_node() -> Iterator[RealNode]:
    node = RealNode(RUN_ROOT, netns="rocshare-rn-test", node_name="realnode", runtime=RUNTIME)
    node.down()  # a previous session killed mid-way
    started = time.monotonic()
    node.up()
    TIMINGS["node Ready"] = time.monotonic() - started
    TIMINGS.update({f"  of which {name}": seconds for name, seconds in node.step_seconds.items()})
    try:
        yield node
    finally:
        node.down()


@pytest.fixture(scope="session")
def deployed(real_node: RealNode) -> Deployed:
    cluster = real_node.control_plane
    timings = TIMINGS
    started = time.monotonic() - TIMINGS["node Ready"]
    overlay = deploy.write_overlay(real_node.root / "overlay", service_cidr=SERVICE_CIDR)
    applied = cluster.kubectl("apply", "--server-side", "-k", str(overlay), check=False)
    assert applied.returncode == 0, f"first `kubectl apply --server-side -k` failed:\n{applied.stderr}"
    ready = cluster.kubectl("rollout", "status", "-n", NAMESPACE, "deployment/rocshare-operator", "--timeout=300s",
                            check=False, timeout_s=330)
    assert ready.returncode == 0, describe(cluster, f"pods -n {NAMESPACE}") + cluster.kubectl(
        "logs", "-n", NAMESPACE, "deployment/rocshare-operator", "-c", "operator", "--tail=60", check=False).stdout
    timings["operator Deployment available"] = time.monotonic() - started

    host = deploy.prepare_host(real_node.root / "host")
    empty_before = not host.hook_dir.exists() or not any(host.hook_dir.iterdir())
    cluster.kubectl("label", "node", real_node.node_name, f"{deploy.NODE_CLASS_LABEL}={deploy.NODE_CLASS}",
                    "--overwrite")
    cluster.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump(deploy.pool_manifest(host)))

    def agent_running() -> bool:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", AGENT_LABEL,
                                          "-o", "json").stdout)["items"]
        return any(pod["status"].get("phase") == "Running" and all(
            status.get("ready") for status in pod["status"].get("containerStatuses", [])) for pod in pods)

    wait_for("the node-agent DaemonSet pod Running", agent_running, timeout_s=240,
             explain=lambda: describe(cluster, f"pods -n {NAMESPACE}"))
    timings["agent Running"] = time.monotonic() - started
    # Issue 29: the agent installs its own hook into the empty hookPath before it offers slices.
    condition = wait_for("the agent's MemoryHook condition", lambda: hook_condition(cluster, real_node.node_name),
                         timeout_s=60)
    cluster.kubectl("create", "namespace", WORKLOADS, check=False)
    cluster.kubectl("wait", "-n", WORKLOADS, "--for=jsonpath={.metadata.name}=default", "serviceaccount/default",
                    "--timeout=60s")
    return Deployed(node=real_node, cluster=cluster, host=host, first_apply=applied.stdout,
                    hook_dir_empty_before=empty_before, hook_dir_after_agent=folder_listing(host.hook_dir),
                    hook_condition_after_agent=condition, timings=timings)


def hook_condition(cluster: ControlPlane, node_name: str) -> dict | None:
    got = cluster.kubectl("get", "amdgpunode", node_name, "-o", "json", check=False)
    status = json.loads(got.stdout).get("status", {}) if got.returncode == 0 else {}
    return next((c for c in status.get("conditions", []) if c["type"] == "MemoryHook"), None)


def folder_listing(folder: Path) -> dict[str, str]:
    """name -> the link's target for a symlink, "file" for anything else; {} when the folder is absent."""
    if not folder.is_dir():
        return {}
    return {path.name: os.readlink(path) if path.is_symlink() else "file" for path in folder.iterdir()}


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Say how long the real node took (docs/benchmarks-analysis.md quotes these)."""
    if TIMINGS:
        terminalreporter.write_line("real node: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMINGS.items()))


def pytest_collection_modifyitems(session, config, items) -> None:
    """Helm's tests last: they replace the session's kustomize install on the same node."""
    items.sort(key=lambda item: item.path.name == "test_helm.py")
