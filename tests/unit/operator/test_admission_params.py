"""The pod-defaults MutatingAdmissionPolicy's parameters (admission/policy_params.py): the same
RuntimeClass rule as the webhook's `runtime_class_for`, as ConfigMap data."""

from __future__ import annotations

from rocshare.api.models import AmdGpuPoolSpec
from rocshare_operator.admission.pods import runtime_class_for
from rocshare_operator.admission.policy_params import admission_params


def pool(runtime_class: str | None = None) -> AmdGpuPoolSpec:
    spec = {"nodeSelector": {"x": "y"}}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return AmdGpuPoolSpec.model_validate(spec)


def test_no_pools_only_the_scheduler_name() -> None:
    assert admission_params({}, scheduler_name="rocshare-scheduler") == {"schedulerName": "rocshare-scheduler"}


def test_each_pool_with_a_runtime_class_and_the_only_pool() -> None:
    assert admission_params({"a": pool("rc-a")}, scheduler_name="s") == {
        "schedulerName": "s", "pool.a": "rc-a", "onlyPool": "rc-a"}
    assert admission_params({"a": pool("rc-a"), "b": pool(), "c": pool("rc-c")}, scheduler_name="s") == {
        "schedulerName": "s", "pool.a": "rc-a", "pool.c": "rc-c"}


def test_agrees_with_the_webhooks_rule() -> None:
    """What the policy's CEL reads from the data is what the webhook would set."""
    for pools in ({"a": pool("rc-a")}, {"a": pool("rc-a"), "b": pool()}, {"b": pool()}):
        data = admission_params(pools, scheduler_name="s")
        for selector in (None, "a", "b", "missing"):
            pod = {"spec": {"nodeSelector": {"rocshare.io/pool": selector}} if selector else {}}
            policy = data.get(f"pool.{selector}", "") if selector else data.get("onlyPool", "")
            assert (runtime_class_for(pod, pools) or "") == policy, (pools, selector)
