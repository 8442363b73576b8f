"""The agent's side of a resize (rocshare_agent.slice_limits): a resized record becomes the
container's slice/limits in the account contract's version-1 form, written whole, once per
generation, only into a folder Allocate made, never through a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, DeviceSlice, \
    encode_record
from rocshare.api.container_account import encode_limits, file_generation, limits_for
from rocshare_agent.accounts import AccountStore
from rocshare_agent.slice_limits import LimitsFollower, write_limits

UID = "0b9c3c4e-0000-4000-8000-000000000001"


def record(memory_mib: int, ranges, generation: int | None) -> AllocationRecord:
    app = ContainerAllocation(name="main", devices=[
        DeviceSlice(gpu_id="G0", memory_mib=memory_mib, cu_ranges=list(ranges),
                    cu_count=sum(h - lo + 1 for lo, h in ranges), cores_pct=30),
        DeviceSlice(gpu_id="G1", memory_mib=65536, cu_count=104, whole=True)])
    setup = ContainerAllocation(name="setup", init=True, devices=[
        DeviceSlice(gpu_id="G0", memory_mib=1, cu_ranges=[(0, 0)], cu_count=1, cores_pct=1)])
    return AllocationRecord(node="n1", containers=[setup, app], resize_generation=generation)


def account(root: Path, container: str = "main") -> Path:
    slice_dir = root / "pods" / UID / container / "slice"
    slice_dir.mkdir(parents=True)
    return slice_dir


def pod(rec: AllocationRecord) -> dict:
    return {"metadata": {"uid": UID, "annotations": {ALLOCATION_ANNOTATION: encode_record(rec)}}}


def test_the_contracts_example_is_what_is_rendered():
    rec = record(4096, [(0, 15), (32, 47)], 7)
    assert encode_limits(limits_for(rec.containers[1].devices, rec.generation)) == (
        "rocshare-limits 1\ngeneration 7\nmemory 0 4294967296\ncu-mask 0 0-15,32-47\n")  # the whole GPU 1: no line


def test_written_whole_into_the_folder_allocate_made(tmp_path: Path):
    slice_dir = account(tmp_path)
    main = record(4096, [(0, 15)], 2).containers[1]
    assert write_limits(AccountStore(tmp_path), UID, main, 2)
    assert (slice_dir / "limits").read_text() == (  # resize 2: the file's third generation (Allocate's was 1)
        "rocshare-limits 1\ngeneration 3\nmemory 0 4294967296\ncu-mask 0 0-15\n")
    assert sorted(os.listdir(slice_dir)) == ["limits"]  # no temporary file left
    assert not write_limits(AccountStore(tmp_path), "another-uid", main, 2)  # no folder: nothing made
    assert not (tmp_path / "pods" / "another-uid").exists()


def test_a_link_in_the_path_is_not_followed(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "pods" / UID / "main").mkdir(parents=True)
    (tmp_path / "pods" / UID / "main" / "slice").symlink_to(elsewhere)
    with pytest.raises(OSError, match="not a folder"):  # refused, not followed
        write_limits(AccountStore(tmp_path), UID, record(4096, [(0, 15)], 2).containers[1], 2)
    assert os.listdir(elsewhere) == []


def test_follower_writes_each_generation_once(tmp_path: Path):
    slice_dir = account(tmp_path)
    follower = LimitsFollower(tmp_path)
    assert follower.follow([pod(record(4096, [(0, 9)], None))]) == []  # as bound: Allocate's own write
    assert not (slice_dir / "limits").exists()
    assert follower.follow([pod(record(8192, [(0, 31)], 1))]) == [(UID, "main", 1)]
    # Larger than the generation Allocate wrote (the contract: larger on every write).
    assert (slice_dir / "limits").read_text() == (
        "rocshare-limits 1\ngeneration 2\nmemory 0 8589934592\ncu-mask 0 0-31\n")
    assert file_generation(1) > file_generation(0) == 1
    assert follower.follow([pod(record(8192, [(0, 31)], 1))]) == []  # the same record: not again
    assert follower.follow([pod(record(2048, [(0, 5)], 3))]) == [(UID, "main", 3)]
    assert (slice_dir / "limits").read_text().startswith("rocshare-limits 1\ngeneration 4\nmemory 0 2147483648\n")
    assert not (tmp_path / "pods" / UID / "setup").exists()  # the finished init container: no account touched


def test_a_folder_made_later_is_written_on_the_next_event(tmp_path: Path):
    follower = LimitsFollower(tmp_path)
    resized = pod(record(8192, [(0, 31)], 1))
    assert follower.follow([resized]) == []
    account(tmp_path)
    assert follower.follow([resized]) == [(UID, "main", 1)]
