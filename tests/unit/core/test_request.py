"""parse_pod: resources, init containers, annotations, and every bad input named clearly."""

from __future__ import annotations

import pytest

from rocshare.api.models import GpuPolicy, NodePolicy
from rocshare.core.request import RequestError, parse_pod

from .helpers import pod


def test_slice_and_whole_requests():
    request = parse_pod(pod({"amd.com/gpu": 2, "amd.com/gpumem": 4096, "amd.com/gpucores": 30}, {"amd.com/gpu": 1}))
    first, second = request.containers
    assert (first.gpus, first.memory_mib, first.memory_pct, first.cores_pct, first.whole) == (2, 4096, None, 30, False)
    assert (second.gpus, second.whole) == (1, True)
    assert request.namespace == "ns" and request.wants_gpus


def test_memory_mib_wins_over_percentage_and_percentage_alone_means_one_gpu():
    both = parse_pod(pod({"amd.com/gpumem": "1024", "amd.com/gpumem-percentage": "50"})).containers[0]
    assert (both.gpus, both.memory_mib, both.memory_pct) == (1, 1024, None)
    alone = parse_pod(pod({"amd.com/gpumem-percentage": 25})).containers[0]
    assert (alone.gpus, alone.memory_pct) == (1, 25)


def test_init_containers_come_first_and_are_flagged():
    request = parse_pod(pod({"amd.com/gpu": 1}, init=({"amd.com/gpumem": 100},)))
    assert [c.init for c in request.containers] == [True, False]
    assert request.containers[0].name == "c100"


def test_requests_are_read_when_limits_are_absent():
    raw = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "resources": {"requests": {"amd.com/gpu": "1"}}}]}}
    assert parse_pod(raw).containers[0].gpus == 1


def test_container_without_gpu():
    request = parse_pod(pod({"cpu": "1"}))
    assert not request.wants_gpus and request.gpu_containers == ()


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [
        ({"amd.com/gpucores": 0}, "amd.com/gpucores is 0, must be 1-100"),
        ({"amd.com/gpucores": 101}, "amd.com/gpucores is 101, must be 1-100"),
        ({"amd.com/gpucores": "12.5"}, "amd.com/gpucores is in percent of each GPU's compute units: '12.5' is not a whole number"),
        ({"amd.com/gpucores": "abc"}, "amd.com/gpucores is in percent of each GPU's compute units: 'abc' is not a Kubernetes quantity"),
        ({"amd.com/gpumem-percentage": 0}, "amd.com/gpumem-percentage is 0, must be 1-100"),
        ({"amd.com/gpumem-percentage": 150}, "amd.com/gpumem-percentage is 150"),
        ({"amd.com/gpumem": "4Gi"}, "amd.com/gpumem is in MiB: '4Gi' has a binary (byte) suffix"),
        ({"amd.com/gpumem": 0}, "amd.com/gpumem is 0, must be >= 1"),
        ({"amd.com/gpu": "-1"}, "amd.com/gpu is in GPUs: '-1' is negative"),
        ({"amd.com/gpu": 0, "amd.com/gpucores": 10}, "amd.com/gpu is 0 but a GPU slice is asked"),
    ],
)
def test_bad_resources_name_container_resource_and_problem(limits, fragment):
    with pytest.raises(RequestError) as caught:
        parse_pod(pod(limits))
    assert "container 'c0'" in str(caught.value)
    assert fragment in str(caught.value)


def test_bad_init_container_is_named_as_init():
    with pytest.raises(RequestError, match="init container 'c100'"):
        parse_pod(pod({}, init=({"amd.com/gpucores": 0},)))


def test_annotations_parsed():
    request = parse_pod(pod({"amd.com/gpu": 1}, annotations={
        "amd.com/numa-bind": "true", "amd.com/link-bind": "false",
        "amd.com/use-gputype": "MI300X, mi210", "amd.com/nouse-gputype": "7900",
        "amd.com/use-gpu-uuid": "GPU-AB", "amd.com/nouse-gpu-uuid": "GPU-CD,GPU-EF",
        "hami.io/node-scheduler-policy": "spread", "hami.io/gpu-scheduler-policy": "topology-aware",
    }))
    sel = request.selection
    assert sel.numa_bind and not sel.link_bind
    assert sel.use_types == ("mi300x", "mi210") and sel.nouse_types == ("7900",)
    assert sel.use_uuids == {"gpu-ab"} and sel.nouse_uuids == {"gpu-cd", "gpu-ef"}
    assert request.node_policy == NodePolicy.SPREAD and request.gpu_policy == GpuPolicy.TOPOLOGY_AWARE


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({"amd.com/numa-bind": "yes"}, "amd.com/numa-bind is 'yes'"),
        ({"amd.com/use-gputype": "a,,b"}, "amd.com/use-gputype"),
        ({"hami.io/node-scheduler-policy": "pack"}, "binpack|spread"),
        ({"hami.io/gpu-scheduler-policy": "best"}, "topology-aware"),
    ],
)
def test_bad_annotations(annotations, fragment):
    with pytest.raises(RequestError, match=fragment):
        parse_pod(pod({"amd.com/gpu": 1}, annotations=annotations))
