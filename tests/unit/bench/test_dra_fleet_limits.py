"""A DRA fleet's start-up check: each node's plugin watcher holds one inotify instance, so a fleet
larger than this user's free instances must be refused before it starts (at 500 nodes on the default
limit of 128, 376 nodes once came up without a watcher: their DRA plugins never registered)."""

from __future__ import annotations

import os

import pytest

from rocshare_dev.devcluster.simfleet import FleetError, check_inotify_instances, inotify_instances_held


def fake_proc(root, instances_per_process: list[int]):
    for pid, count in enumerate(instances_per_process, start=100):
        fds = root / str(pid) / "fd"
        fds.mkdir(parents=True)
        for fd in range(count):
            os.symlink("anon_inode:inotify", fds / str(fd))
        os.symlink("/dev/null", fds / "99")  # other descriptors do not count
    return root


def test_the_instances_held_are_counted_from_each_processes_descriptors(tmp_path):
    assert inotify_instances_held(fake_proc(tmp_path, [2, 0, 1])) == 3


def test_a_fleet_larger_than_the_free_instances_is_refused_and_told_what_to_raise(tmp_path):
    proc = fake_proc(tmp_path / "proc", [3])
    limit = tmp_path / "max_user_instances"
    limit.write_text("10\n")
    check_inotify_instances(7, limit_file=limit, proc=proc)  # 10 - 3 free: fits
    with pytest.raises(FleetError, match=r"8 nodes needs 8 inotify instances .* 7 of fs.inotify.max_user_instances=10"):
        check_inotify_instances(8, limit_file=limit, proc=proc)
