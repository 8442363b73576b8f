"""A non-root container on the real node opens its GPU's device files (docs/non-root.md).

The node's /dev/kfd and render nodes are root:render 0660, as on a GPU node, so a container
running as uid 1000 without supplementalGroups could not open them. rocshare's Allocate hands it
per-pod copies owned by its user; the test opens each one from inside the real container as that
user. The node's video and render ids are published in its AmdGpuNode status."""

from __future__ import annotations

import os
import stat

import pytest
import yaml

from rocshare_dev.realnode import deploy
from tests.realnode.conftest import WORKLOADS, Deployed, describe, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
NAME = "non-root-slice"


def test_the_node_publishes_its_video_and_render_ids(deployed: Deployed) -> None:
    def groups():
        return deployed.json("get", "amdgpunode", deployed.node.node_name).get("status", {}).get("deviceGroups")

    assert wait_for("deviceGroups in AmdGpuNode status", groups, timeout_s=60) == [
        {"name": "video", "gid": deploy.VIDEO_GID}, {"name": "render", "gid": deploy.RENDER_GID}]


def test_a_non_root_container_opens_its_device_files(deployed: Deployed) -> None:
    host_render = os.stat(next((deployed.host.dev_root / "dri").glob("renderD*")))
    assert (host_render.st_uid, host_render.st_gid, stat.S_IMODE(host_render.st_mode)) == (0, deploy.RENDER_GID, 0o660)
    pod = deploy.slice_pod(NAME, WORKLOADS, memory_mib=2048, cores_pct=10)
    pod["spec"]["securityContext"] = {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True}
    deployed.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(pod))
    try:
        wait_for("the non-root slice Running", lambda: deployed.json("get", "pod", "-n", WORKLOADS, NAME)[
            "status"].get("phase") == "Running", timeout_s=180,
            explain=lambda: describe(deployed.cluster, f"pod -n {WORKLOADS} {NAME}"))
        opened = deployed.kubectl("exec", "-n", WORKLOADS, NAME, "--", "sh", "-c",
                                  "id -u; for f in /dev/kfd /dev/dri/renderD*; do cat \"$f\" > /dev/null && echo \"opened $f\"; done; "
                                  "ls -ln /dev/kfd /dev/dri", check=False)
        lines = opened.stdout.splitlines()
        assert lines[0] == "1000", opened.stdout + opened.stderr
        assert "opened /dev/kfd" in lines and any(line.startswith("opened /dev/dri/renderD") for line in lines), (
            opened.stdout + opened.stderr)
        owners = [line.split()[2] for line in lines if line.startswith("c")]
        assert owners and set(owners) == {"1000"}, opened.stdout
    finally:
        deployed.kubectl("delete", "pod", "-n", WORKLOADS, NAME, "--wait=true", "--timeout=120s", check=False)

