"""The Dockerfiles, read (tests/realnode builds and runs them with buildah): multi-stage on a
base that is a build argument, python:3.11-slim by default,
dependencies pinned through constraints.txt, the operator unprivileged with a numeric user,
the agent's root documented, entry points matching what the manifests run, and build
contexts limited to the sources."""

from __future__ import annotations

import re

import pytest

from tests.unit.manifests.rendering import ROOT, find, render

IMAGES = ROOT / "images"


def dockerfile(name: str) -> str:
    return (IMAGES / f"{name}.Dockerfile").read_text()


@pytest.mark.parametrize("name", ["operator", "agent"])
def test_multi_stage_slim_and_pinned(name: str) -> None:
    text = dockerfile(name)
    # The base is an argument (make images passes a bookworm base built here); users get the slim one.
    assert re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.M) == ["python:3.11-slim"]
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
    # Debian's python3 has no `python` command; both bases have `python3`.
    assert not re.search(r"^RUN python ", text, re.M)
    assert "-c constraints.txt" in text
    assert "COPY --from=build /opt/rocshare /opt/rocshare" in text
    for path in ("pyproject.toml", "constraints.txt", "src", "operator", "nodeagent"):
        assert (ROOT / path).exists()
    ignore = (IMAGES / f"{name}.Dockerfile.dockerignore").read_text().splitlines()
    assert ignore[1] == "*" and "!src/" in ignore


def test_operator_runs_unprivileged_as_the_deployment_expects() -> None:
    text = dockerfile("operator")
    assert re.search(r"^USER 65532:65532$", text, re.M)
    deployment = find(render("manifests/base"), "Deployment", "rocshare-operator")
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 65532
    assert 'ENTRYPOINT ["rocshare"]' in text
    assert 'CMD ["operator", "--namespace", "rocshare-system"]' in text


def test_agent_documents_why_it_runs_as_root() -> None:
    text = dockerfile("agent")
    assert re.search(r"^USER 0:0$", text, re.M)
    for reason in ("device-plugins", "/dev/kfd", "dmem.max", "hostPID"):
        assert reason in text
    assert 'CMD ["agent"]' in text
