"""AmdGpuShare quota for ResourceClaims of rocshare's DRA driver: checked when a claim is created.

In a DRA pool no extender is on the path: kube-scheduler allocates claims itself. So a namespace's
share limits are held where Kubernetes holds its own quota for claims, at creation: a validating
webhook (``resourceclaims.validate.rocshare.io``, manifests/base/webhook) refuses a claim whose
worst case (rocshare.core.dra_claims.claim_cost) would take the namespace over a limit, naming what
is over, as the extender's ResourceQuotaNotFit does for pods. Template claims are made by
kube-controller-manager, which retries a refused one; the pod waits, Pending, with the reason in
its events.

What the namespace already holds is the one hold index's (`Accounts.used`: its pods and its
allocated claims, rocshare.core.holdings' rule), plus the worst case of its claims not yet
allocated, plus the claims this replica admitted that the claim watch has not shown yet (kept
`PENDING_S` at most: a claim refused after us by another admission step must not hold forever).
A namespace holding something whose use cannot be read takes no claim while it has a limit.

What a request leaves behind is bounded (issue 39: anyone who reaches port 9443 can post a review,
docs/security.md): a note lives `PENDING_S` (10 s: the claim watch shows a created claim within a
second or two; the note only bridges that gap), a namespace holds `MAX_PENDING_PER_NAMESPACE` notes
and the replica `MAX_PENDING` in all, expired ones are dropped on every call, and a review whose
namespace or name is not a Kubernetes name is refused before anything is kept. When a bound is
reached the claim is refused (ResourceQuotaNotFit, "retry"), never admitted uncounted: the quota
holds, and a flood of forged reviews can delay a namespace's claims by `PENDING_S` at most after it
stops. The NetworkPolicy and the optional client certificate (manifests/base/webhook) keep forged
reviews out where the install allows it.

Invariant: one replica never admits two claims that together pass a limit (the check and the
note of what it admitted run without a pause between them). Two replicas answering at once could,
within the claim watch's lag (docs/dra.md says so): the admission Service reaches every replica.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rocshare.api.models import AgentInterface, AmdGpuPoolSpec, OmittedCores, ShareLimits
from rocshare.core.dra_claims import claim_cost
from rocshare.core.holdings import Held
from rocshare.core.inventory import GpuSpec
from rocshare.core.fit import Reason
from rocshare.core.quota import limited, over_quota_refusal, unknown_use_refusal
from rocshare.core.request import RequestError
from rocshare.core.share_rules import omitted_cores_take_all
from rocshare_operator.admission.dra_pods import pool_shapes
from rocshare_operator.holds import Accounts
from rocshare_operator.feed.cluster_facts import ClaimFacts

PENDING_S = 10.0
MAX_PENDING_PER_NAMESPACE = 32
MAX_PENDING = 1024
_NAME_MAX = 253
CLAIM_VALIDATE_ID = "resourceclaims.validate.rocshare.io"


@dataclass
class ClaimQuota:
    limits: Callable[[str], ShareLimits]
    shapes: Callable[[], tuple[Sequence[GpuSpec], OmittedCores]]
    """The GPUs of pools serving DRA, and their omittedCores (Exclusive when any says so)."""
    clock: Callable[[], float] = time.monotonic
    _pending: dict[str, dict[str, tuple[Held, float]]] = field(default_factory=dict)

    def refusal(self, claim: Mapping, accounts: Accounts, claims_in: Callable[[str], list[ClaimFacts]], *,
                dry_run: bool = False) -> str | None:
        """None when the claim may be created in its namespace; else why not. Notes what it admits.
        `accounts`: the process's one hold index; `claims_in`: the claim watch's claims of a namespace."""
        meta = claim.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        if not 0 < len(namespace) <= _NAME_MAX or not 0 < len(name) <= _NAME_MAX:
            return f"ResourceQuotaNotFit: the claim's namespace {namespace[:64]!r} or name {name[:64]!r} is not a name"
        limits = self.limits(namespace)
        if not limited(limits):
            return None
        unknown = unknown_use_refusal(namespace, accounts.unaccountable_in(namespace))
        if unknown is not None:
            return f"{Reason.RESOURCE_QUOTA_NOT_FIT}: {unknown}"
        shapes, omitted = self.shapes()
        requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
        try:
            cost = claim_cost(requests, shapes, omitted)
            claims = claims_in(namespace)
            used = accounts.used(namespace) + _unallocated(claims, name, shapes, omitted) + \
                self._still_pending(namespace, name, {facts.name for facts in claims})
        except RequestError as error:
            return f"ResourceQuotaNotFit: the claim cannot be counted against namespace {namespace}'s quota: {error}"
        over = over_quota_refusal(namespace, cost, limits, used)
        if over is not None:
            return f"{Reason.RESOURCE_QUOTA_NOT_FIT}: {over}"
        return None if dry_run else self._note(namespace, name, cost)

    def pending_count(self) -> int:
        """How many admitted claims this replica keeps notes of (bounded by MAX_PENDING)."""
        return sum(len(notes) for notes in self._pending.values())

    def _note(self, namespace: str, name: str, cost: Held) -> str | None:
        """Keep what was admitted until the watch shows it; refuse (None: noted) when a bound is reached."""
        notes = self._pending.setdefault(namespace, {})
        if name not in notes and len(notes) >= MAX_PENDING_PER_NAMESPACE:
            return (f"ResourceQuotaNotFit: namespace {namespace} has {len(notes)} claims admitted in the last "
                    f"{PENDING_S:.0f} s that the API server has not shown yet; retry")
        if name not in notes and self.pending_count() >= MAX_PENDING:
            return (f"ResourceQuotaNotFit: {MAX_PENDING} claims admitted in the last {PENDING_S:.0f} s are not "
                    f"shown yet; retry")
        notes[name] = (cost, self.clock() + PENDING_S)
        return None

    def _still_pending(self, namespace: str, name: str, seen: set[str]) -> Held:
        """Admitted here and not yet seen by the claim watch (nor expired); drops the rest, and every
        namespace's expired notes."""
        now = self.clock()
        for other in list(self._pending):
            notes = self._pending[other]
            for claim in [claim for claim, (_cost, until) in notes.items()
                          if until < now or (other == namespace and claim in seen)]:
                del notes[claim]
            if not notes:
                del self._pending[other]
        pending = self._pending.get(namespace, {})
        return sum((cost for claim, (cost, _until) in pending.items() if claim != name), Held())


def _unallocated(claims: Sequence[ClaimFacts], name: str, shapes: Sequence[GpuSpec], omitted: OmittedCores) -> Held:
    """The worst case of the namespace's claims not yet allocated (they will consume when they are)."""
    total = Held()
    for facts in claims:
        if facts.name != name and not facts.allocated and facts.problem is None:
            total = total + claim_cost(json.loads(facts.requests_json), shapes, omitted)
    return total


def dra_shapes(pools: Mapping[str, AmdGpuPoolSpec], node_pools: Mapping[str, str],
               gpus_of: Callable[[str], Sequence[GpuSpec]]) -> tuple[list[GpuSpec], OmittedCores]:
    """The GPUs of the nodes of pools serving DRA and the strictest omittedCores among those pools."""
    dra = {name: pool for name, pool in pools.items() if pool.agent.interface == AgentInterface.DRA}
    exclusive = any(omitted_cores_take_all(pool.sharing.omitted_cores) for pool in dra.values())
    omitted = OmittedCores.EXCLUSIVE if exclusive or not dra else OmittedCores.SHARED
    return pool_shapes(dra, node_pools, gpus_of), omitted
