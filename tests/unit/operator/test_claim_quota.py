"""AmdGpuShare quota for DRA claims (admission/claim_quota.py) and what an allocated claim holds in
the process's one hold index (holds.Accounts.claim_changed -> Accounts.on_claim).
Figures are worked out here: a Vega10 has 64 CUs, so 16 CUs are 25 % of it."""

from __future__ import annotations

import json

from rocshare.api.models import OmittedCores, ShareLimits, Sharing
from rocshare.core.dra_shares import AllocatedDevice, claim_record
from rocshare.core.holdings import Held
from rocshare.core.ids import GpuId, claim_key
from rocshare.core.inventory import GpuSpec, NodeInventory
from rocshare.core.request import ContainerRequest, PodRequest
from rocshare_operator.admission.claim_quota import MAX_PENDING, PENDING_S, ClaimQuota
from rocshare_operator.extender.quota import quota_verdict
from rocshare_operator.holds import Accounts
from rocshare_operator.feed.cluster_facts import ClaimFacts, claim_facts

MIB = 2**20
VEGA = GpuSpec(gpu_id=GpuId("GPU-v"), index=0, memory_mib=16368, cu_count=64)
SPECS = {"gpu-v": VEGA}


def claim(name: str, *, mib: int, cus: int, namespace: str = "team") -> dict:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.rocshare.io", "count": 1,
                "capacity": {"requests": {"memory": f"{mib}Mi", "compute": str(cus)}}}}]}}}


def allocated(body: dict, *, node: str = "n1", mib: int, cus: int) -> dict:
    result = {"request": "gpu", "driver": "gpu.rocshare.io", "pool": node, "device": "gpu-v", "shareID": "s1",
              "consumedCapacity": {"memory": str(mib * MIB), "compute": str(cus), "shares": "1"}}
    return {**body, "status": {"allocation": {"devices": {"results": [result]}}}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def quota(limit_mib: int, clock: Clock | None = None) -> ClaimQuota:
    return ClaimQuota(limits=lambda ns: ShareLimits(memory_mib=limit_mib) if ns == "team" else ShareLimits(),
                      shapes=lambda: ([VEGA], OmittedCores.SHARED), clock=clock or Clock())


def account(accounts: Accounts, body: dict) -> None:
    facts = claim_facts(body)
    held = claim_record(facts.name, facts.node, facts.devices, facts.prepared, SPECS)
    accounts.on_claim(claim_key(facts.namespace, facts.name), facts.namespace, facts.node, held)


def test_an_allocated_claim_is_held_by_its_namespace_and_freed_when_it_goes():
    accounts = Accounts()
    account(accounts, allocated(claim("a", mib=4096, cus=16), mib=4096, cus=16))
    assert accounts.used("team") == Held(memory_mib=4096, cores_pct=25, gpus=1)
    assert claim_key("team", "a") in accounts.ledger.records()
    accounts.on_claim(claim_key("team", "a"), "team", "n1", None)
    assert accounts.used("team") == Held()


def test_a_claim_over_the_share_is_refused_with_the_figures_and_one_under_is_noted():
    accounts, check = Accounts(), quota(6000)
    account(accounts, allocated(claim("a", mib=4096, cus=16), mib=4096, cus=16))
    why = check.refusal(claim("b", mib=4096, cus=16), accounts, lambda _ns: [])
    assert why == "ResourceQuotaNotFit: namespace team: memory MiB: 4096 used + 4096 asked > 6000 limit"
    assert check.refusal(claim("b", mib=1024, cus=16), accounts, lambda _ns: []) is None
    assert check.refusal(claim("other", mib=9999, cus=64, namespace="free"), accounts, lambda _ns: []) is None


def test_a_claim_naming_a_shape_class_is_held_to_the_share_as_one_of_gpu_rocshare_io():
    """A tenant may name the class admission writes for a GPU shape (64cu-16368mi.gpu.rocshare.io: a
    Vega10) in a claim of their own: it takes rocshare's devices, so it counts as one of gpu.rocshare.io."""
    accounts, check = Accounts(), quota(6000)
    account(accounts, allocated(claim("a", mib=4096, cus=16), mib=4096, cus=16))
    shaped = claim("b", mib=4096, cus=16)
    shaped["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "64cu-16368mi.gpu.rocshare.io"
    why = check.refusal(shaped, accounts, lambda _ns: [])
    assert why == "ResourceQuotaNotFit: namespace team: memory MiB: 4096 used + 4096 asked > 6000 limit"
    # Seen by the watch before it is allocated, its worst case counts as the namespace's.
    assert claim_facts(shaped).ours


def test_admitted_claims_count_until_the_watch_shows_them_or_they_expire():
    clock = Clock()
    check, accounts = quota(6000, clock), Accounts()
    assert check.refusal(claim("a", mib=4000, cus=16), accounts, lambda _ns: []) is None
    assert "4000 used + 4000 asked" in check.refusal(claim("b", mib=4000, cus=16), accounts, lambda _ns: [])
    assert check.refusal(claim("b", mib=4000, cus=16), accounts, lambda _ns: [], dry_run=True) is not None
    # The watch shows "a", not yet allocated: its worst case counts instead of the note.
    seen = [claim_facts(claim("a", mib=4000, cus=16))]
    assert "4000 used + 4000 asked" in check.refusal(claim("b", mib=4000, cus=16), accounts, lambda _ns: seen)
    # A claim admitted but never created (refused after us) stops counting after PENDING_S.
    assert check.refusal(claim("c", mib=1000, cus=16), accounts, lambda _ns: []) is None
    clock.now = PENDING_S + 1
    assert check.refusal(claim("d", mib=5000, cus=16), accounts, lambda _ns: []) is None


def test_a_namespace_holding_what_cannot_be_read_takes_no_claim():
    accounts, check = Accounts(), quota(6000)
    accounts.on_claim(claim_key("team", "bad"), "team", "n1", "its prepared record cannot be read: x")
    why = check.refusal(claim("b", mib=1, cus=1), accounts, lambda _ns: [])
    assert why.startswith("ResourceQuotaNotFit: namespace team holds 1 pod(s) or claim(s) whose use cannot be read")


def test_a_pod_and_a_claim_are_refused_in_one_text():
    """Issue 45: the extender (pods) and the claim webhook wrote the quota refusal apart, and the
    extender's had drifted: it called a claim whose use cannot be read a pod and named no namespace.
    One rule (rocshare.core.quota) now gives both the same words after the reason."""
    accounts, check = Accounts(), quota(6000)
    pod = PodRequest("team", "p", (ContainerRequest("main", False, 1, memory_mib=4096),))
    node = NodeInventory.from_gpu_infos("n1", (), Sharing())
    limits = ShareLimits(memory_mib=6000)
    account(accounts, allocated(claim("a", mib=4096, cus=16), mib=4096, cus=16))
    over_claim = check.refusal(claim("b", mib=4096, cus=16), accounts, lambda _ns: [])
    over_pod = quota_verdict(pod, node, limits, accounts.used("team"), accounts.unaccountable_in("team"))
    assert over_claim == f"ResourceQuotaNotFit: {over_pod}"
    assert over_pod == "namespace team: memory MiB: 4096 used + 4096 asked > 6000 limit"
    accounts.on_claim(claim_key("team", "bad"), "team", "n1", "its prepared record cannot be read: x")
    unknown_claim = check.refusal(claim("c", mib=1, cus=1), accounts, lambda _ns: [])
    unknown_pod = quota_verdict(pod, node, limits, accounts.used("team"), accounts.unaccountable_in("team"))
    assert unknown_claim == f"ResourceQuotaNotFit: {unknown_pod}"
    assert unknown_pod.startswith("namespace team holds 1 pod(s) or claim(s) whose use cannot be read")


def test_claim_facts_keep_only_what_readers_use_and_never_raise():
    body = allocated(claim("a", mib=4096, cus=16), mib=4096, cus=16)
    facts = claim_facts(body)
    assert (facts.ours, facts.node, facts.allocated, facts.prepared) == (True, "n1", True, None)
    assert facts.devices == (AllocatedDevice(request="gpu", device="gpu-v", share_id="s1", consumed={
        "memory": str(4096 * MIB), "compute": "16", "shares": "1"}),)
    assert json.loads(facts.requests_json) == body["spec"]["devices"]["requests"]
    assert claim_facts({**body, "status": {"allocation": {"devices": {"results": [{"driver": "other"}]}}}}).node == ""
    nic = {"metadata": {"name": "n", "namespace": "team"}, "spec": {"devices": {"requests": [
        {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}]}}}
    assert claim_facts(nic) == ClaimFacts(namespace="team", name="n")
    broken = claim_facts({"metadata": {"name": "x", "namespace": "team"}, "spec": {"devices": {"requests": 7}}})
    assert broken.ours and broken.problem and "cannot be read" in broken.problem


def test_forged_reviews_keep_bounded_state_and_move_quota_for_a_short_window_only():
    """Anyone who reaches the webhook port can post reviews (issue 39): what they leave is bounded,
    and a namespace's quota is back once the notes expire (nothing is kept past PENDING_S)."""
    clock = Clock()
    check, accounts = quota(6000, clock), Accounts()
    refused = [check.refusal(claim(f"forged-{i}", mib=1, cus=1), accounts, lambda _ns: []) for i in range(5000)]
    kept = sum(len(notes) for notes in check._pending.values())
    assert kept <= 32 and refused.count(None) == kept
    assert "not shown yet; retry" in refused[-1]
    assert check.refusal(claim("x" * 300, mib=1, cus=1), accounts, lambda _ns: []).endswith("is not a name")
    clock.now = PENDING_S + 1
    assert check.refusal(claim("real", mib=5999, cus=16), accounts, lambda _ns: []) is None
    assert sum(len(notes) for notes in check._pending.values()) == 1


def test_notes_of_every_namespace_expire_and_the_total_is_bounded():
    clock = Clock()
    check = ClaimQuota(limits=lambda _ns: ShareLimits(memory_mib=10**9), shapes=lambda: ([VEGA], OmittedCores.SHARED),
                       clock=clock)
    accounts = Accounts()
    answers = [check.refusal(claim("c", mib=1, cus=1, namespace=f"ns-{i}"), accounts, lambda _ns: [])
               for i in range(3000)]
    assert check.pending_count() == MAX_PENDING and answers.count(None) == MAX_PENDING
    clock.now = PENDING_S + 1
    assert check.refusal(claim("c", mib=1, cus=1, namespace="late"), accounts, lambda _ns: []) is None
    assert check.pending_count() == 1 and set(check._pending) == {"late"}
