"""What users install is what we test: the wheel, installed with its runtime dependencies only
(pinned by constraints.txt, as the images install it), in a fresh virtualenv that has none of
the dev extras and none of the harness (rocshare_dev).

From that virtualenv: every product command answers `--help`, `rocshare discover` reads a real
capture, importing the three product packages loads nothing of the harness, and the operator
starts against the real control plane until its extender is ready.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocshare_dev.devcluster.controlplane import PROJECT_ROOT, ControlPlane
from rocshare_dev.devcluster.operator_proc import OperatorProcess

PRODUCT_PACKAGES = ("rocshare", "rocshare_operator", "rocshare_agent")
# (cryptography is a runtime dependency: the operator makes its own webhook certificate, overlays/dev.)
DEV_ONLY = ("rocshare_dev", "pytest", "hypothesis", "matplotlib", "grpc_tools", "importlinter")


def _run(*command: str | Path, timeout_s: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--disable-pip-version-check",
         "-w", out, PROJECT_ROOT)
    (built,) = out.glob("rocshare-*.whl")
    return built


@pytest.fixture(scope="module")
def runtime_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("runtime") / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check",
         "-c", PROJECT_ROOT / "constraints.txt", wheel)
    yield venv


def test_the_wheel_holds_the_product_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.startswith("rocshare-")}
    assert top_level == set(PRODUCT_PACKAGES), top_level
    assert "rocshare_operator/reconcilers/templates/agent-daemonset.yaml.j2" in names
    assert not [name for name in names if "bench" in name or "devcluster" in name]


def test_runtime_venv_has_no_dev_extras(runtime_venv: Path) -> None:
    probe = ("import importlib.util, json; "
             f"print(json.dumps([m for m in {list(DEV_ONLY)!r} if importlib.util.find_spec(m)]))")
    assert json.loads(_run(runtime_venv / "bin" / "python", "-c", probe).stdout) == []


def test_importing_the_product_loads_nothing_of_the_harness(runtime_venv: Path) -> None:
    probe = ("import json, sys; import rocshare, rocshare_operator, rocshare_agent, rocshare.cli; "
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             f"{list(DEV_ONLY)!r})))")
    assert json.loads(_run(runtime_venv / "bin" / "python", "-c", probe).stdout) == []


@pytest.mark.parametrize("command", ["operator", "agent", "discover", "crds"])
def test_every_product_command_answers_help(runtime_venv: Path, command: str) -> None:
    output = _run(runtime_venv / "bin" / "rocshare", command, "--help", timeout_s=60).stdout
    assert f"usage: rocshare {command}" in output


def test_discover_reads_a_real_capture(runtime_venv: Path, sysfs_fixtures: Path) -> None:
    output = _run(runtime_venv / "bin" / "rocshare", "discover", "--sysfs-root",
                  sysfs_fixtures / "mi210-8gpu-xgmi", "--json", timeout_s=60).stdout
    gpus = json.loads(output)["gpus"]
    assert len(gpus) == 8
    assert {gpu["cuCount"] for gpu in gpus} == {104}


def test_the_installed_operator_starts_against_the_real_control_plane(runtime_venv: Path,
                                                                        cluster: ControlPlane) -> None:
    operator = OperatorProcess(cluster, command=(str(runtime_venv / "bin" / "rocshare"),))
    try:
        operator.start(wait_s=90)  # returns once the extender's /readyz answers 200
    finally:
        operator.stop()
