"""Bad pods through the admission decisions (pure): every refusal names the container, the
resource and the rule. The same pods go through the real webhook in tests/e2e/test_bad_input.py."""

from __future__ import annotations

import pytest

from rocshare_operator.admission.pods import Refused, validate_create, validate_update


def pod(limits: dict | None = None, *, annotations: dict | None = None, init: bool = False, **spec) -> dict:
    container = {"name": "main", "image": "x", "resources": {"limits": limits or {}}}
    containers = {"initContainers": [container], "containers": [{"name": "app", "image": "x"}]} if init else \
        {"containers": [container]}
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}},
            "spec": {**containers, **spec}}


BAD = [
    ("cores over 100", pod({"amd.com/gpu": "1", "amd.com/gpucores": "101"}), "amd.com/gpucores is 101, must be 1-100"),
    ("cores zero", pod({"amd.com/gpu": "1", "amd.com/gpucores": "0"}), "amd.com/gpucores is 0, must be 1-100"),
    ("memory zero", pod({"amd.com/gpu": "1", "amd.com/gpumem": "0"}), "amd.com/gpumem is 0, must be >= 1"),
    ("memory with a unit", pod({"amd.com/gpu": "1", "amd.com/gpumem": "4Gi"}), "amd.com/gpumem is in MiB: '4Gi' has a binary (byte) suffix"),
    ("fractional GPUs", pod({"amd.com/gpu": "1.5"}), "amd.com/gpu is in GPUs: '1.5' is not a whole number"),
    ("percentage over 100", pod({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "150"}),
     "amd.com/gpumem-percentage is 150"),
    ("slice without gpu", pod({"amd.com/gpucores": "10"}), "amd.com/gpucores needs amd.com/gpu"),
    ("zero GPUs with a slice", pod({"amd.com/gpu": "0", "amd.com/gpumem": "10"}), "amd.com/gpu is 0 but a GPU slice"),
    ("numa-bind not a boolean", pod({"amd.com/gpu": "1"}, annotations={"amd.com/numa-bind": "yes"}),
     'amd.com/numa-bind is \'yes\', must be "true" or "false"'),
    ("unknown policy", pod({"amd.com/gpu": "1"}, annotations={"hami.io/gpu-scheduler-policy": "random"}),
     "hami.io/gpu-scheduler-policy is 'random', must be one of"),
    ("empty type list item", pod({"amd.com/gpu": "1"}, annotations={"amd.com/use-gputype": "MI210,,"}),
     "must be a comma list of non-empty names"),
    ("nodeName bypass", pod({"amd.com/gpu": "1"}, nodeName="n1"), "spec.nodeName (n1) would bypass"),
    ("privileged slice", {**pod({"amd.com/gpu": "1", "amd.com/gpumem": "1024"}), "spec": {"containers": [
        {"name": "main", "securityContext": {"privileged": True},
         "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "1024"}}}]}}, "privileged container"),
    ("forged record", pod({"amd.com/gpu": "1"}, annotations={"rocshare.io/allocation": "{}"}),
     "annotation rocshare.io/allocation is written only by"),
    ("forged allocated mark", pod({}, annotations={"rocshare.io/allocated": "now"}),
     "annotation rocshare.io/allocated is written only by"),
    ("forged HAMi devices", pod({"amd.com/gpu": "1"}, annotations={"hami.io/amd-devices-allocated": "GPU-1,x,1,1:;"}),
     "annotation hami.io/amd-devices-allocated"),
    ("bad init container", pod({"amd.com/gpu": "1", "amd.com/gpucores": "-5"}, init=True), "init container 'main': amd.com/gpucores is in percent of each GPU's compute units: '-5' is negative"),
]


@pytest.mark.parametrize(("body", "message"), [(body, message) for _, body, message in BAD], ids=[c for c, _, _ in BAD])
def test_bad_pods_are_refused_with_why(body: dict, message: str) -> None:
    with pytest.raises(Refused) as refused:
        validate_create(body, trusted=False)
    assert message in str(refused.value)


@pytest.mark.parametrize("limits", [{"amd.com/gpu": "1", "amd.com/gpumem": "3k"}, {"amd.com/gpu": "1", "amd.com/gpumem": "8k"},
                                    {"amd.com/gpu": "1", "amd.com/gpumem": "40k"}, {"amd.com/gpu": "1", "amd.com/gpumem": "3e3"},
                                    {"amd.com/gpu": "1", "amd.com/gpumem": "24000"}, {"amd.com/gpu": "2", "amd.com/gpumem": "1k"},
                                    {"amd.com/gpu": "1k"}])
def test_round_numbers_as_the_api_server_writes_them_are_accepted(limits: dict) -> None:
    """The API server stores `amd.com/gpumem: 3000` as "3k": the webhook reads it as 3000 MiB. A count
    no node has (`amd.com/gpu: 1000`) is the scheduler's to refuse (Pending, NodeInsufficientGPUs)."""
    validate_create({"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}},
                    trusted=False)


def test_privileged_whole_gpu_is_allowed() -> None:
    validate_create({"metadata": {}, "spec": {"containers": [
        {"name": "c", "securityContext": {"privileged": True}, "resources": {"limits": {"amd.com/gpu": "2"}}}]}},
        trusted=False)


@pytest.mark.parametrize("key", ["rocshare.io/allocation", "rocshare.io/allocated", "rocshare.io/allocation-error",
                                 "hami.io/amd-devices-allocated"])
def test_users_cannot_add_change_or_remove_system_annotations(key: str) -> None:
    plain = pod({"amd.com/gpu": "1"})
    marked = pod({"amd.com/gpu": "1"}, annotations={key: "x"})
    for old, new in ((plain, marked), (marked, plain), (marked, pod({"amd.com/gpu": "1"}, annotations={key: "y"}))):
        with pytest.raises(Refused, match=key):
            validate_update(old, new, trusted=False)
        validate_update(old, new, trusted=True)  # the scheduler and agent may
