"""rocshare_dev/devcluster/evidence.py, the container-side invariant checks the chaos and failover tests share:
they must catch a double booking, and read every form of what a container receives."""

from __future__ import annotations

from rocshare_dev.devcluster.evidence import Gpu, Share, conflicts, parse_cu_mask, shares_of

GPU0 = Gpu("n1", "GPU-00000000000000aa", 0, 128, 65536, 104)
GPU1 = Gpu("n1", "GPU-00000000000000bb", 1, 136, 65536, 104)
APU = Gpu("n2", "0000:c4:00.0", 0, 128, 4096, 12)


def received(envs: dict[str, str], *minors: int) -> dict:
    return {"envs": envs, "devices": [{"containerPath": "/dev/kfd"},
                                      *({"containerPath": f"/dev/dri/renderD{minor}"} for minor in minors)]}


def test_cu_masks_parse_every_gpu_and_range() -> None:
    assert parse_cu_mask("0:0-75;1:3-5,9") == {0: ((0, 75),), 1: ((3, 5), (9, 9))}
    assert parse_cu_mask("") == {}


def test_shares_map_uuids_and_indexes_to_the_devices_handed() -> None:
    two = shares_of("ns/a", "n1", {"c0": received({"ROCR_VISIBLE_DEVICES": "GPU-00000000000000bb,GPU-00000000000000aa",
                                                   "HSA_CU_MASK": "0:0-9;1:10-19",
                                                   "HIP_DEVICE_MEMORY_LIMIT_0": "1024m",
                                                   "HIP_DEVICE_MEMORY_LIMIT_1": "2048m"}, 128, 136)}, [GPU0, GPU1])
    assert [(s.gpu, s.memory_mib, s.cu_ranges) for s in two] == [(GPU1, 1024, ((0, 9),)), (GPU0, 2048, ((10, 19),))]
    (apu,) = shares_of("ns/b", "n2", {"c0": received({"ROCR_VISIBLE_DEVICES": "0"}, 128)}, [APU])
    assert apu.gpu == APU and apu.memory_mib is None and apu.cu_ranges is None


def test_overlapping_ranges_whole_gpus_and_too_much_memory_are_caught() -> None:
    first = Share("ns/a", "c0", GPU0, 40000, ((0, 49),))
    assert conflicts(Share("ns/b", "c0", GPU0, 1024, ((50, 103),)), [first]) == []
    assert "overlap" in conflicts(Share("ns/b", "c0", GPU0, 1024, ((49, 60),)), [first])[0]
    assert "whole" in conflicts(Share("ns/b", "c0", GPU0, None, None), [first])[0]
    assert "overlap" in conflicts(Share("ns/b", "c0", GPU0, 1024, None), [first])[0]  # no mask: every CU
    assert "memory" in conflicts(Share("ns/b", "c0", GPU0, 30000, ((60, 70),)), [first])[0]
    assert conflicts(Share("ns/b", "c0", GPU1, None, None), [first]) == []  # another GPU


def test_a_device_the_environment_does_not_match_is_an_error() -> None:
    try:
        shares_of("ns/a", "n1", {"c0": received({"ROCR_VISIBLE_DEVICES": "GPU-00000000000000bb"}, 128)}, [GPU0, GPU1])
    except AssertionError as error:
        assert "not a device it was handed" in str(error)
    else:
        raise AssertionError("a container told of a GPU it was not handed passed")


def test_a_container_handed_a_gpu_without_saying_which_is_refused_by_name() -> None:
    """Planted: render nodes (or a GPU's variables) but no ROCR_VISIBLE_DEVICES. The checker used to
    skip such a container, so a pod holding a GPU nobody could place was never checked; now it
    raises, naming the container (fails on fea6fe5's evidence.py: no error)."""
    unreadable = {"render node only": received({}, 128),
                  "a mask, no device list": received({"HSA_CU_MASK": "0:0-9"}, 128),
                  "a memory limit, no device list": received({"HIP_DEVICE_MEMORY_LIMIT_0": "1024m"})}
    for case, container in unreadable.items():
        try:
            shares_of("ns/a", "n1", {"sidecar": received({}), "worker": container}, [GPU0, GPU1])
        except AssertionError as error:
            assert "ns/a:worker" in str(error) and "ROCR_VISIBLE_DEVICES" in str(error), (case, error)
        else:
            raise AssertionError(f"{case}: a container handed a GPU it cannot be placed on was skipped")
    # A container with no GPU at all (no render node, no GPU variable) is no share and no error.
    assert shares_of("ns/a", "n1", {"sidecar": received({"PATH": "/bin"})}, [GPU0]) == []
