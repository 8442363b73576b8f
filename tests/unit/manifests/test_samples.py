"""samples/: the pools, the share and the seed documents' pods, read by the pydantic models
(the source of the CRDs) as well as by the CRD schemas (test_schemas.py)."""

from __future__ import annotations

import pytest

from rocshare.api.models import AmdGpuPoolSpec, AmdGpuShareSpec, OperatingMode
from tests.unit.manifests.rendering import find, render

SAMPLES = render("samples")


def limits(pod: dict) -> dict[str, str]:
    return pod["spec"]["containers"][0]["resources"]["limits"]


def test_pools_parse_and_cover_the_three_kinds_of_node() -> None:
    pools = {obj["metadata"]["name"]: AmdGpuPoolSpec.model_validate(obj["spec"])
             for obj in SAMPLES if obj["kind"] == "AmdGpuPool"}
    assert pools["mi300x-cu"].sharing.operating_mode is OperatingMode.CU
    assert pools["mi300x-partition"].sharing.operating_mode is OperatingMode.PARTITION
    assert pools["radeon"].sharing.operating_mode is OperatingMode.CU
    assert pools["mi210"].sharing.device_memory_scaling == 2.0
    selectors = [tuple(pool.node_selector.items()) for pool in pools.values()]
    assert len(set(selectors)) == len(selectors), "pools must not select the same nodes"


def test_shares_parse_and_live_in_the_samples_namespaces() -> None:
    """A share is its namespace's quota over every pool (docs/accounting.md): it names no pool."""
    team = AmdGpuShareSpec.model_validate(find(SAMPLES, "AmdGpuShare", "team-demo")["spec"])
    small = AmdGpuShareSpec.model_validate(find(SAMPLES, "AmdGpuShare", "small")["spec"])
    assert team.limits.memory_mib == 131072 and small.limits.memory_mib == 8192
    assert find(SAMPLES, "AmdGpuShare", "team-demo")["metadata"]["namespace"] == "gpu-demo"


@pytest.mark.parametrize(("name", "expected_limits", "annotation"), [
    ("slice-4g-25pct", {"amd.com/gpu": "1", "amd.com/gpumem": "4096", "amd.com/gpucores": "25"}, None),
    ("slice-25pct-vram", {"amd.com/gpumem-percentage": "25"}, None),
    ("numa-pair", {"amd.com/gpu": "2", "amd.com/gpumem": "8192", "amd.com/gpucores": "25"}, "amd.com/numa-bind"),
    ("xgmi-pair", {"amd.com/gpu": "2", "amd.com/gpumem": "8192", "amd.com/gpucores": "25"}, "amd.com/link-bind"),
])
def test_seed_pods(name: str, expected_limits: dict, annotation: str | None) -> None:
    pod = find(SAMPLES, "Pod", name)
    assert pod["metadata"]["namespace"] == "gpu-demo"
    assert limits(pod) == expected_limits
    if annotation:
        assert pod["metadata"]["annotations"][annotation] == "true"


def test_pods_fit_the_share_quota_on_mi300x() -> None:
    """The sample share must not hold the sample pods back (MI300X: 192 GiB per GPU)."""
    share = find(SAMPLES, "AmdGpuShare", "team-demo")["spec"]["limits"]
    memory_mib = cores_pct = gpus = 0
    for pod in (obj for obj in SAMPLES if obj["kind"] == "Pod" and obj["metadata"]["namespace"] == "gpu-demo"):
        asked = limits(pod)
        count = int(asked.get("amd.com/gpu", "1"))
        per_gpu = int(asked.get("amd.com/gpumem", 0)) or 192 * 1024 * int(asked.get("amd.com/gpumem-percentage", 100)) // 100
        memory_mib += count * per_gpu
        cores_pct += count * int(asked.get("amd.com/gpucores", 100))
        gpus += count
    assert memory_mib <= share["memoryMiB"] and cores_pct <= share["coresPercent"] and gpus <= share["gpus"]
