"""Shared helpers for the agent's unit tests: the real sysfs captures, read in place."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

SYSFS_FIXTURES = (Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "sysfs").resolve()


@pytest.fixture
def sysfs() -> Path:
    assert SYSFS_FIXTURES.is_dir(), f"missing {SYSFS_FIXTURES}: tests read ../shared in place"
    return SYSFS_FIXTURES


@pytest.fixture
def copy_capture(tmp_path: Path, sysfs: Path):
    """A writable copy of one capture in tmp_path, for synthetic variants (never in the project)."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(sysfs / name, target)
        for path in [target, *target.rglob("*")]:  # captures are read-only; the copy must not be
            path.chmod(0o755 if path.is_dir() else 0o644)
        return target

    return copy
