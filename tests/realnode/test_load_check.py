"""Issue 39 item 2 on the real node (a real kubelet and container runtime, rocshare deployed as the
README says): a slice container in which the memory hook cannot load does not run unlimited unseen.

* containerd 2 (CDI on; the default rig): a slice pod whose image runs a musl-built program, and one
  whose image runs a static glibc program (no loader, so nothing reads LD_AUDIT), fail to start, and
  their container status carries rocshare-loadcheck's line naming the program and the cause; a slice
  pod on the workload image (glibc) runs, and the check's witness for it is on the host.
* Debian's containerd 1.6 (`ROCSHARE_REALNODE_RUNTIME=containerd`, no CDI): the check never runs. The
  agent sees the slice container started without the check's witness and says `LoadCheckNotRun` on
  the pod; with the pool's default hookMissing (Refuse) the next slice pod is refused at Allocate.
  The agent is restarted at the end (it forgets the verdict), for the modules after this one.

The two images are made here: docker archives of one layer (the program, and for musl its loader,
from Debian's musl-tools; the static one from the host's glibc, libc6-dev's libc.a) imported into
the node's containerd. A glibc image whose libc lacks a version the shipped hook needs cannot be made
here: the hook in the built node-agent image needs GLIBC_2.2.5 alone (`readelf -V`; held at or below
hook/GLIBC_FLOOR, 2.17, by tests/hook/test_hook_in_image.py), the x86-64 baseline that every x86-64
glibc defines, and Debian's mirror serves no suite below bullseye (2.31). That refusal is proven on a
glibc 2.36 root against a library needing GLIBC_2.38 in tests/hook/test_loadcheck.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from rocshare_agent.load_check import DEFAULT_LOAD_CHECK_DIR, WITNESS_DIR
from rocshare_dev.realnode import deploy
from tests.realnode.conftest import AGENT_LABEL, NAMESPACE, RUNTIME, WORKLOADS, Deployed, describe, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
MUSL_IMAGE = "localhost/rocshare/loadcheck-musl:test"
STATIC_IMAGE = "localhost/rocshare/loadcheck-static:test"
MUSL_LOADER = Path("/usr/lib/x86_64-linux-musl/libc.so")
PROGRAM_C = "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n"
CDI = RUNTIME != "containerd"  # Debian's containerd 1.6 predates the CRI's CDI devices


def _tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, (content, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), mode
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def program_image_archive(folder: Path, image: str, compile_command: list[str]) -> Path:
    """A one-layer image of /app (PROGRAM_C built by `compile_command`), with musl's loader for musl."""
    folder = folder / image.rpartition("/")[2].replace(":", "-")
    folder.mkdir()
    source = folder / "app.c"
    source.write_text(PROGRAM_C)
    subprocess.run([*compile_command, "-O1", "-o", str(folder / "app"), str(source)], check=True, timeout=120)
    files = {"app": ((folder / "app").read_bytes(), 0o755)}
    if compile_command[0] == "musl-gcc":
        files["lib/ld-musl-x86_64.so.1"] = (MUSL_LOADER.read_bytes(), 0o755)
    layer = _tar_bytes(files)
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": ["PATH=/"], "Entrypoint": ["/app"]},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]}})
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [image], "Layers": ["layer.tar"]}])
    archive = folder / "image.tar"
    archive.write_bytes(_tar_bytes({"layer.tar": (layer, 0o644), "config.json": (config.encode(), 0o644),
                                    "manifest.json": (manifest.encode(), 0o644)}))
    return archive


def slice_pod(name: str, *, image: str | None = None) -> dict:
    pod = deploy.slice_pod(name, WORKLOADS, memory_mib=1024, cores_pct=10)
    if image is not None:
        container = pod["spec"]["containers"][0]
        container.update(image=image, imagePullPolicy="Never", command=["/app"])
        container.pop("args", None)
    return pod


def create(deployed: Deployed, pod: dict) -> None:
    deployed.kubectl("create", "-f", "-", input_text=yaml.safe_dump(pod))


def status_of(deployed: Deployed, name: str) -> dict:
    return deployed.json("get", "pod", "-n", WORKLOADS, name)


def start_failure(pod: dict) -> str | None:
    """The message of a container start that failed (waiting, or the last termination), if any."""
    for status in pod["status"].get("containerStatuses") or []:
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            for detail in state.values():
                if "rocshare: refusing to start" in (detail.get("message") or ""):
                    return detail["message"]
    return None


def running(deployed: Deployed, name: str) -> dict | None:
    pod = status_of(deployed, name)
    return pod if pod["status"].get("phase") == "Running" else None


def delete(deployed: Deployed, *names: str) -> None:
    deployed.kubectl("delete", "pod", "-n", WORKLOADS, *names, "--ignore-not-found", "--wait=true", "--timeout=60s")


@pytest.mark.skipif(not CDI, reason="the runtime has no CDI: see test_without_cdi_the_agent_says_so_and_refuses")
def test_a_musl_or_static_program_is_refused_and_a_glibc_one_runs(deployed: Deployed, tmp_path: Path) -> None:
    for image, compile_command in ((MUSL_IMAGE, ["musl-gcc"]), (STATIC_IMAGE, ["gcc", "-static"])):
        deployed.node.containerd.ctr("images", "import", str(program_image_archive(tmp_path, image, compile_command)))
    create(deployed, slice_pod("lc-musl", image=MUSL_IMAGE))
    create(deployed, slice_pod("lc-static", image=STATIC_IMAGE))
    create(deployed, slice_pod("lc-glibc"))
    try:
        for name, cause in (("lc-musl", "/app's loader /lib/ld-musl-x86_64.so.1 is not glibc's but musl's"),
                            ("lc-static", "/app is a static executable (no program interpreter, so no loader runs "
                                          "the hook)")):
            message = wait_for(f"the {name} slice pod's start refused by the load check",
                               lambda name=name: start_failure(status_of(deployed, name)), timeout_s=120,
                               explain=lambda name=name: describe(deployed.cluster, f"pod -n {WORKLOADS} {name}"))
            assert f"refusing to start /app: {cause}" in message, message
            assert status_of(deployed, name)["status"].get("phase") != "Running"
        pod = wait_for("the glibc slice pod Running", lambda: running(deployed, "lc-glibc"), timeout_s=120,
                       explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} lc-glibc"))
        witness = Path(DEFAULT_LOAD_CHECK_DIR) / WITNESS_DIR / f"{pod['metadata']['uid']}_main"
        assert witness.exists()  # the check ran for it, and let it start
    finally:
        delete(deployed, "lc-musl", "lc-static", "lc-glibc")


def agent_restarted(deployed: Deployed) -> None:
    old = {p["metadata"]["uid"] for p in deployed.json("get", "pods", "-n", NAMESPACE, "-l", AGENT_LABEL)["items"]}
    deployed.kubectl("delete", "pods", "-n", NAMESPACE, "-l", AGENT_LABEL, "--wait=true", "--timeout=60s")

    def ready() -> bool:
        pods = deployed.json("get", "pods", "-n", NAMESPACE, "-l", AGENT_LABEL)["items"]
        return any(p["metadata"]["uid"] not in old and p["status"].get("phase") == "Running"
                   and all(s.get("ready") for s in p["status"].get("containerStatuses", [])) for p in pods)
    wait_for("a new agent pod ready", ready, timeout_s=180)


def agent_log(deployed: Deployed) -> str:
    return deployed.kubectl("logs", "-n", NAMESPACE, "-l", AGENT_LABEL, "--tail=60", check=False).stdout


def warning(deployed: Deployed, pod: str, reason: str) -> str | None:
    events = deployed.json("get", "events", "-n", WORKLOADS, "--field-selector",
                           f"involvedObject.name={pod},reason={reason}")["items"]
    return events[0]["message"] if events else None


@pytest.mark.skipif(CDI, reason="the runtime has CDI: the check runs (test_a_musl_or_static_program_is_refused...)")
def test_without_cdi_the_agent_says_so_and_refuses(deployed: Deployed) -> None:
    create(deployed, slice_pod("lc-first"))
    try:
        wait_for("the first slice pod Running (no check: the runtime ignores CDI)",
                 lambda: running(deployed, "lc-first"), timeout_s=120)
        said = wait_for("LoadCheckNotRun on the first pod", lambda: warning(deployed, "lc-first", "LoadCheckNotRun"),
                        timeout_s=90, interval_s=3, explain=lambda: agent_log(deployed) + json.dumps(
                            status_of(deployed, "lc-first")["status"].get("containerStatuses"), indent=1))
        assert "ignored its CDI device rocshare.io/loadcheck=slice" in said and "refused" in said
        create(deployed, slice_pod("lc-second"))
        refused = wait_for("the second slice pod refused at Allocate", lambda: (lambda p: p["status"].get("message")
                           if p["status"].get("phase") == "Failed" else None)(status_of(deployed, "lc-second")),
                           timeout_s=120, explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} lc-second"))
        assert "container runtime ignores CDI devices" in refused
    finally:
        delete(deployed, "lc-first", "lc-second")
        agent_restarted(deployed)
