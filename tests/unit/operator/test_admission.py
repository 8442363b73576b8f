"""Admission rules for pods (pure): defaults added, refusals with precise messages."""

from __future__ import annotations

import pytest

from rocshare.api.models import AmdGpuPoolSpec
from rocshare_operator.admission.pods import (
    Refused,
    apply_mutation,
    asks_for_gpus,
    plan_mutation,
    runtime_class_for,
    validate_create,
    validate_update,
)


def pod(*limits: dict, annotations: dict | None = None, **spec) -> dict:
    containers = [{"name": f"c{i}", "image": "x", "resources": {"limits": lim}} for i, lim in enumerate(limits)]
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}},
            "spec": {"containers": containers, **spec}}


def test_pod_without_amd_resources_is_untouched() -> None:
    plain = pod({"cpu": "1"})
    assert not asks_for_gpus(plain)
    assert plan_mutation(plain, scheduler_name="rocshare-scheduler", runtime_class_name="rocm").empty
    validate_create(plain, trusted=False)


def test_gpu_pod_goes_to_rocshare_scheduler_with_pool_runtime_class() -> None:
    gpu_pod = pod({"amd.com/gpu": "1", "amd.com/gpumem": "4096"})
    plan = plan_mutation(gpu_pod, scheduler_name="rocshare-scheduler", runtime_class_name="rocm")
    mutated = apply_mutation(gpu_pod, plan)
    assert mutated["spec"]["schedulerName"] == "rocshare-scheduler"
    assert mutated["spec"]["runtimeClassName"] == "rocm"


def test_own_runtime_class_is_kept() -> None:
    gpu_pod = pod({"amd.com/gpu": "1"}, runtimeClassName="mine")
    assert plan_mutation(gpu_pod, scheduler_name="s", runtime_class_name="rocm").runtime_class_name is None


def test_percentage_only_gets_one_gpu() -> None:
    gpu_pod = pod({"amd.com/gpumem-percentage": "50"}, {"cpu": "1"})
    mutated = apply_mutation(gpu_pod, plan_mutation(gpu_pod, scheduler_name="s", runtime_class_name=None))
    assert mutated["spec"]["containers"][0]["resources"]["limits"] == {"amd.com/gpumem-percentage": "50",
                                                                        "amd.com/gpu": "1"}
    assert mutated["spec"]["containers"][1]["resources"]["limits"] == {"cpu": "1"}
    validate_create(mutated, trusted=False)


@pytest.mark.parametrize(("limits", "message"), [
    ({"amd.com/gpu": "1", "amd.com/gpucores": "0"}, "amd.com/gpucores"),
    ({"amd.com/gpu": "1", "amd.com/gpucores": "101"}, "amd.com/gpucores"),
    ({"amd.com/gpu": "1", "amd.com/gpucores": "12.5"}, "amd.com/gpucores"),
    ({"amd.com/gpu": "1", "amd.com/gpucores": "abc"}, "amd.com/gpucores"),
    ({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "0"}, "amd.com/gpumem-percentage"),
    ({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "150"}, "amd.com/gpumem-percentage"),
    ({"amd.com/gpumem": "4096"}, "amd.com/gpumem needs amd.com/gpu"),
    ({"amd.com/gpucores": "25"}, "amd.com/gpucores needs amd.com/gpu"),
])
def test_bad_values_are_refused_with_the_resource_named(limits: dict, message: str) -> None:
    with pytest.raises(Refused) as refused:
        validate_create(pod(limits), trusted=False)
    assert message in str(refused.value)
    assert "c0" in str(refused.value)


def test_node_name_bypass_is_refused() -> None:
    with pytest.raises(Refused, match="spec.nodeName .* bypass"):
        validate_create(pod({"amd.com/gpu": "1"}, nodeName="worker-1"), trusted=False)


def test_privileged_slice_is_refused_but_privileged_whole_gpu_is_not() -> None:
    sliced = pod({"amd.com/gpu": "1", "amd.com/gpumem": "1024"})
    sliced["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(Refused, match="privileged"):
        validate_create(sliced, trusted=False)
    whole = pod({"amd.com/gpu": "1"})
    whole["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    validate_create(whole, trusted=False)


@pytest.mark.parametrize("key", ["rocshare.io/allocation", "rocshare.io/allocated", "hami.io/amd-devices-allocated"])
def test_forged_allocation_annotations_are_refused(key: str) -> None:
    forged = pod({"amd.com/gpu": "1"}, annotations={key: "{}"})
    with pytest.raises(Refused, match=key):
        validate_create(forged, trusted=False)
    plain = pod({"cpu": "1"}, annotations={key: "{}"})  # even on a pod that asks for no GPU
    with pytest.raises(Refused, match=key):
        validate_create(plain, trusted=False)
    validate_create(forged, trusted=True)


def test_update_of_allocation_annotation_needs_a_trusted_user() -> None:
    old = pod({"amd.com/gpu": "1"})
    new = pod({"amd.com/gpu": "1"}, annotations={"rocshare.io/allocation": '{"version":1}'})
    with pytest.raises(Refused):
        validate_update(old, new, trusted=False)
    validate_update(old, new, trusted=True)
    validate_update(old, pod({"amd.com/gpu": "1"}, annotations={"team": "a"}), trusted=False)


def test_runtime_class_comes_from_the_selected_or_only_pool() -> None:
    pools = {"a": AmdGpuPoolSpec(nodeSelector={}, runtimeClassName="rocm-a"),
             "b": AmdGpuPoolSpec(nodeSelector={}, runtimeClassName="rocm-b")}
    assert runtime_class_for(pod({}, nodeSelector={"rocshare.io/pool": "b"}), pools) == "rocm-b"
    assert runtime_class_for(pod({}), pools) is None
    assert runtime_class_for(pod({}), {"a": pools["a"]}) == "rocm-a"


def test_a_gpu_container_may_not_set_what_rocshare_hands_over() -> None:
    """The issue's pod: a 2048 MiB / 25 % slice whose own env gives it 64 GiB, every CU and no hook."""
    attack = pod({"amd.com/gpu": "1", "amd.com/gpumem": "2048", "amd.com/gpucores": "25"})
    attack["spec"]["containers"][0]["env"] = [{"name": "HIP_DEVICE_MEMORY_LIMIT_0", "value": "65536m"},
                                              {"name": "HSA_CU_MASK", "value": "0:0-103"},
                                              {"name": "LD_AUDIT", "value": "/nonexistent.so"}]
    with pytest.raises(Refused, match=r"^ProtectedEnvVar: containers\[0\] \(c0\): env HIP_DEVICE_MEMORY_LIMIT_0 "):
        validate_create(attack, trusted=False)
    # The same variables in a container without GPUs are the app's business.
    plain = pod({"cpu": "1"})
    plain["spec"]["containers"][0]["env"] = attack["spec"]["containers"][0]["env"]
    validate_create(plain, trusted=False)


def test_containers_naming_a_rocshare_claim_are_held_to_a_slice() -> None:
    """A container naming a gpu.rocshare.io claim itself (no amd.com/* limits): privileged, env and
    hostPath refused; a container naming another driver's claim is not judged."""
    def claimed(claim: str, **container) -> dict:
        return {"metadata": {"name": "p"}, "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "mine"}, {"name": "nic", "resourceClaimName": "n"}],
            "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": claim}]}, **container}]}}

    for attack, reason in ((claimed("gpu", securityContext={"privileged": True}), "PrivilegedSlice"),
                           (claimed("gpu", env=[{"name": "ROCR_VISIBLE_DEVICES", "value": "0,1"}]), "ProtectedEnvVar"),
                           (claimed("gpu", envFrom=[{"secretRef": {"name": "s"}}]), "ProtectedEnvFrom")):
        with pytest.raises(Refused, match=f"^{reason}: "):
            validate_create(attack, trusted=False, rocshare_claims=frozenset({"gpu"}))
        validate_create(attack, trusted=False, rocshare_claims=frozenset())  # not rocshare's: not judged
    validate_create(claimed("nic", securityContext={"privileged": True}), trusted=False,
                    rocshare_claims=frozenset({"gpu"}))


def test_claim_asks_rocshare_reads_exactly_and_first_available() -> None:
    from rocshare_operator.admission.pods import claim_asks_rocshare

    def exactly(device_class: str) -> dict:
        return {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": device_class}}]}}

    assert claim_asks_rocshare(exactly("gpu.rocshare.io"))
    assert claim_asks_rocshare({"devices": {"requests": [{"name": "g", "firstAvailable": [
        {"name": "a", "deviceClassName": "gpu.nvidia.com"}, {"name": "b", "deviceClassName": "gpu.rocshare.io"}]}]}})
    assert not claim_asks_rocshare(exactly("gpu.amd.com"))
    assert not claim_asks_rocshare({})
    # A class of one GPU shape is rocshare's too, written by admission or named by a tenant's own claim.
    assert claim_asks_rocshare(exactly("104cu-65520mi.gpu.rocshare.io"))
    assert claim_asks_rocshare({"devices": {"requests": [{"name": "g", "firstAvailable": [
        {"name": "a", "deviceClassName": "96cu-24560mi.gpu.rocshare.io"}]}]}})
    assert not claim_asks_rocshare(exactly("gpu.rocshare.io.example.com"))
