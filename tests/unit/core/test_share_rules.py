"""One rule per fact (issue 45): the small rules the device-plugin and DRA paths share are written
once (rocshare.core.share_rules, quota, dra_shares.share_kind, inventory.node_inventory) and both
paths give the same figures. Expected numbers are worked out here by hand; the last test reads the
sources and fails if a rule is written a second time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rocshare.api.models import GpuInfo, OmittedCores, ShareLimits, Sharing
from rocshare.core.dra_claims import claim_cost, claim_spec
from rocshare.core.dra_shares import AllocatedDevice, Holdings, ShareKind, counted_slices, plan_claim, share_kind
from rocshare.core.fit import need_for
from rocshare.core.holdings import GpuHold, Held, request_cost
from rocshare.core.ids import GpuId
from rocshare.core.inventory import GpuSpec, node_inventory
from rocshare.core.quota import limited, over_quota_refusal, unknown_use_refusal
from rocshare.core.request import ContainerRequest, PodRequest
from rocshare.core.share_rules import (cores_percent, cus_for_percent, memory_need_mib, omitted_cores_pct,
                                       omitted_cores_take_all)

MIB = 2**20
MI210 = GpuSpec(gpu_id=GpuId("GPU-a"), index=0, memory_mib=65520, cu_count=104, gfx_target_version=90010)
RX7900 = GpuSpec(gpu_id=GpuId("GPU-b"), index=1, memory_mib=24560, cu_count=96, gfx_target_version=110000,
                 cu_per_wgp=2)
SPECS = {"gpu-a": MI210, "gpu-b": RX7900}
ROOT = Path(__file__).resolve().parents[3]


def ask(**asked) -> ContainerRequest:
    return ContainerRequest("main", False, 1, **asked)


def test_cores_percent_rounds_up_and_every_reader_uses_it():
    # 26 of 104 CUs is 25 %; 1 of 104 is 0.96 %, charged 1; 24 of 96 is 25 %.
    assert [cores_percent(26, 104), cores_percent(1, 104), cores_percent(24, 96), cores_percent(104, 104)] == \
        [25, 1, 25, 100]
    # A record without coresPct (holdings), a DRA share before prepare (dra_shares) and a claim's
    # worst case (dra_claims) count the same CUs as the same percent.
    hold = GpuHold(GpuId("GPU-a"), 1, 1, (1 << 27) - 1, 0, None)
    assert hold.cores_of(104) == 26 == cores_percent(27, 104)
    [counted] = counted_slices([AllocatedDevice("gpu", "gpu-a", "s", {"compute": "27", "memory": f"{MIB}"})], SPECS)
    assert counted.cores_pct == 26
    requests = [{"name": "gpu", "exactly": {"deviceClassName": "gpu.rocshare.io",
                                            "capacity": {"requests": {"compute": "27"}}}}]
    assert claim_cost(requests, [MI210], OmittedCores.SHARED).cores_pct == 26


@pytest.mark.parametrize("omitted, pct, all_cus",
                         [(OmittedCores.EXCLUSIVE, 100, True), (OmittedCores.SHARED, 0, False)])
def test_omitted_cores_cost_the_same_to_a_pod_and_a_claim(omitted: OmittedCores, pct: int, all_cus: bool):
    assert omitted_cores_pct(omitted) == pct and omitted_cores_take_all(omitted) is all_cus
    pod = PodRequest("ns", "p", (ask(memory_mib=4096),))
    assert request_cost(pod, gpu_memory_mib=MI210.memory_mib, omitted=omitted, whole_devices=False) == \
        Held(4096, pct, 1)
    claim = claim_spec(ask(memory_mib=4096), [MI210])["devices"]["requests"]
    assert claim_cost(claim, [MI210], omitted) == Held(4096, pct, 1)
    assert need_for(MI210, ask(memory_mib=4096), omitted).reserves_all is all_cus


@pytest.mark.parametrize("asked", [dict(memory_pct=50, cores_pct=25), dict(memory_mib=3000, cores_pct=1),
                                   dict(cores_pct=33), dict(memory_pct=10), dict(memory_pct=100, cores_pct=100)])
def test_a_claim_subrequest_asks_what_the_device_plugin_gives_on_that_shape(asked: dict):
    container = ask(**asked)
    subrequests = claim_spec(container, [MI210, RX7900])["devices"]["requests"][0]["firstAvailable"]
    for spec, sub in zip(sorted([MI210, RX7900], key=lambda s: s.cu_count), subrequests):
        need = need_for(spec, container, OmittedCores.SHARED)
        requests = sub["capacity"]["requests"]
        if "memory_mib" in asked or "memory_pct" in asked:
            assert requests["memory"] == f"{need.memory_mib}Mi"
        if "cores_pct" in asked:
            assert requests["compute"] == str(need.pin_cus)


def test_a_request_needs_memory_and_cus_by_one_rule():
    # 50 % of 24560 MiB, floored; 33 % of 96 CUs is 31.68 -> 32 (whole WGPs of 2); of 104, 34.32 -> 35.
    assert memory_need_mib(ask(memory_pct=50), 24560, whole=False) == 12280
    assert memory_need_mib(ask(cores_pct=5), 24560, whole=False) == 24560
    assert memory_need_mib(ask(memory_mib=30000), 24560, whole=True) == 30000
    assert memory_need_mib(ask(memory_mib=100), 24560, whole=True) == 24560
    assert (cus_for_percent(33, RX7900), cus_for_percent(33, MI210)) == (32, 35)
    need = need_for(RX7900, ask(memory_pct=50, cores_pct=33), OmittedCores.EXCLUSIVE)
    assert (need.memory_mib, need.pin_cus) == (12280, 32)


@pytest.mark.parametrize("cus, mib, kind", [
    (104, 65520, ShareKind.WHOLE),      # every CU and all the memory: the whole GPU
    (104, 4096, ShareKind.ALL_CORES),   # every CU, a memory limit
    (26, 65520, ShareKind.SHARED),
    (0, 4096, ShareKind.SHARED),        # omittedCores Shared: no CU pinned, none held
])
def test_prepare_and_accounting_classify_a_share_alike(cus: int, mib: int, kind: ShareKind):
    device = AllocatedDevice("gpu", "gpu-a", "s", {"compute": str(cus), "memory": str(mib * MIB)})
    assert share_kind(device, MI210)[0] is kind
    [planned] = plan_claim([device], SPECS, Holdings(masks={}))
    [counted] = counted_slices([device], SPECS)
    for slice_ in (planned, counted):
        assert (slice_.whole, slice_.reserves_all_cores) == (kind is ShareKind.WHOLE, kind is ShareKind.ALL_CORES)
        assert slice_.memory_mib == mib
    assert planned.cores_pct == counted.cores_pct
    assert share_kind(AllocatedDevice("gpu", "gpu-a"), MI210)[0] is ShareKind.WHOLE  # no shareID


def test_a_namespace_is_limited_by_any_one_limit_and_refusals_read_alike():
    assert not limited(ShareLimits())
    assert all(limited(ShareLimits(**{key: 0})) for key in ("memoryMiB", "coresPercent", "gpus"))
    assert unknown_use_refusal("team", []) is None
    assert unknown_use_refusal("team", ["team/b (x)", "team/a (y)"]) == (
        "namespace team holds 2 pod(s) or claim(s) whose use cannot be read, so its quota use is unknown: "
        "team/a (y); team/b (x)")
    assert over_quota_refusal("team", Held(4096, 0, 1), ShareLimits(memoryMiB=6000), Held(4096, 0, 1)) == \
        "namespace team: memory MiB: 4096 used + 4096 asked > 6000 limit"
    assert over_quota_refusal("team", Held(1, 0, 1), ShareLimits(memoryMiB=6000), Held(4096, 0, 1)) is None


def test_a_nodes_gpu_specs_are_its_listed_gpus_with_the_sharing_marked_on_it():
    info = GpuInfo(id="GPU-1", index=0, render_minor=128, card=1, gfx_target_version=90010, vram_mib=65536,
                   cu_count=104, pci_bdf="0000:63:00.0", split_count=10, healthy=True)
    assert node_inventory("n1", None, Sharing()) == "its AmdGpuNode lists no GPUs"
    assert node_inventory("n1", [info], "bad json") == "its pool settings cannot be read: bad json"
    # gfx90a can oversubscribe: the registered memory is the VRAM times the marked deviceMemoryScaling.
    [spec] = node_inventory("n1", [info], Sharing(deviceMemoryScaling=1.5)).gpus
    assert (spec.memory_mib, spec.cu_count) == (98304, 104)


# Each rule's shape in source: its one home (None: no product file may hold it) and a pattern that
# finds a copy.
RULES = {
    "CUs -> percent": ("src/rocshare/core/share_rules.py", r"ceil\(.*\*\s*100\s*/"),
    "memory percent of a GPU": ("src/rocshare/core/share_rules.py", r"memory_pct\s*//\s*100"),
    "CUs for a percent": ("src/rocshare/core/share_rules.py", r"(?<!def )cu_count_for\("),
    "omitted cores take all": ("src/rocshare/core/share_rules.py", r"==\s*OmittedCores\.EXCLUSIVE"),
    "namespace is limited": ("src/rocshare/core/quota.py", r"limits\.memory_mib is (not )?None (and|or) "),
    "quota use unknown": ("src/rocshare/core/quota.py", r"holds \{len\(\w+\)\} pod"),
    "whole or all-cores": ("src/rocshare/core/dra_shares.py", r">=\s*spec\.cu_usable"),
    "a node's GPU specs, in the operator": (None, r"from_gpu_infos\("),
}
PRODUCT = ("src/rocshare", "operator/rocshare_operator", "nodeagent/rocshare_agent")


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_is_written_once(rule: str):
    home, pattern = RULES[rule]
    folders = PRODUCT if home is not None else ("operator/rocshare_operator",)
    found = [str(path.relative_to(ROOT)) for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))
             for _match in re.finditer(pattern, path.read_text())]
    assert found == ([home] if home else []), f"{rule}: written at {found}, its one home is {home}"
