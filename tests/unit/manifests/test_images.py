"""The Dockerfiles, read (tests/realnode builds and runs them with buildah): multi-stage on a
base that is a build argument, python:3.13-slim-trixie (Debian 13) by default,
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
    # The base is an argument (make images passes a trixie base built here); users get the slim one.
    assert re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.M) == ["python:3.13-slim-trixie"]
    stages = 3 if name == "agent" else 2  # the agent's third builds the memory hook
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE_IMAGE}"] * stages
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


def test_agent_image_builds_and_carries_the_hook_it_installs() -> None:
    """The hook stage builds hook/ with its own Makefile; the run stage holds the library where
    the agent's install step reads it (hook_install.SHIPPED_HOOK); the build context has the
    hook's sources but not a local build folder."""
    from rocshare_agent.hook_install import SHIPPED_HOOK

    text = dockerfile("agent")
    assert re.search(r"^FROM \$\{BASE_IMAGE\} AS hook$", text, re.M)
    assert re.search(r"make -C hook\b", text)
    assert f"install -D -m 0644 hook/build/librocshare-hook.so {SHIPPED_HOOK}" in text
    assert f"COPY --from=hook {SHIPPED_HOOK.parent} {SHIPPED_HOOK.parent}" in text
    ignore = (IMAGES / "agent.Dockerfile.dockerignore").read_text().splitlines()
    assert "!hook/" in ignore and "hook/build/" in ignore
    assert "!hook/" not in (IMAGES / "operator.Dockerfile.dockerignore").read_text().splitlines()
