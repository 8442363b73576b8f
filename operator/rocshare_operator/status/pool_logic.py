"""Which pool owns which node, and what the operator writes on a node because of it.

Pure: takes views of pools and nodes (built from API objects by `pool_view` and
`node_view`) and returns decisions and merge patches; no I/O, no clock.

Invariants:
* A node belongs to at most one pool. When several live pools select it, the older
  pool keeps it: oldest ``creationTimestamp`` first, then name (timestamps have a
  one-second resolution, so ties happen and the name makes the order total).
* A pool being deleted owns nothing, so its nodes are released (or handed to the
  next pool that selects them) before its finalizer goes.
* A node that no pool owns is only touched when it still carries our marks: a
  ``hami.io/amd-operating-mode`` that someone else wrote (say, during a migration
  from HAMi) is left alone.
* A node's operating mode never changes under GPU pods (AMD's guide: drain a node before
  switching its mode). A node that holds any keeps its current marks and gets
  ``rocshare.io/pending-operating-mode``; it switches on the first pass after it is empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from rocshare.api.models import AmdGpuPoolSpec
from rocshare.api.node_settings import (
    HAMI_OPERATING_MODE_ANNOTATION,
    PENDING_MODE_ANNOTATION,
    POOL_LABEL,
    POOL_SETTINGS_ANNOTATION,
    NodeSettings,
    encode_settings,
)
from rocshare_operator.feed.node_view import NodeMarks, NodeView, marks_of

__all__ = ["NodeMarks", "NodeView", "marks_of"]  # re-exported: membership decisions read them

LABEL_VALUE_MAX_CHARS = 63
"""A pool's name becomes a label value, which Kubernetes caps at 63 characters."""


@dataclass(frozen=True)
class PoolView:
    """What membership decisions need of an AmdGpuPool (hashable and frozen: every pool loop compares them)."""

    name: str
    uid: str
    created: str  # RFC 3339 UTC with a Z: string order is time order
    selector: tuple[tuple[str, str], ...]
    settings_json: str  # the rocshare.io/pool-settings annotation value
    operating_mode: str
    deleting: bool = False
    problem: str | None = None  # set when the pool cannot own nodes, with why

    @property
    def eligible(self) -> bool:
        return not self.deleting and self.problem is None

    def selects(self, labels: Mapping[str, str]) -> bool:
        return selector_matches(dict(self.selector), labels)


@dataclass(frozen=True)
class Membership:
    """One pool's view of the nodes its selector matches."""

    members: tuple[str, ...]
    conflicts: tuple[tuple[str, str], ...]  # (node, older pool that holds it)

    @property
    def conflicting_nodes(self) -> list[str]:
        return [node for node, _ in self.conflicts]


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """matchLabels semantics: every pair present; an empty selector matches every node."""
    return all(labels.get(key) == value for key, value in selector.items())


def pool_view(body: Mapping) -> PoolView:
    """Build the view from an AmdGpuPool object; an invalid spec gives a view with `problem` set."""
    meta = body.get("metadata", {})
    name = meta.get("name", "")
    common = {"name": name, "uid": meta.get("uid", ""), "created": meta.get("creationTimestamp", ""),
              "deleting": bool(meta.get("deletionTimestamp"))}
    try:
        spec = AmdGpuPoolSpec.model_validate(dict(body.get("spec") or {}))
    except ValidationError as error:
        return PoolView(**common, selector=(), settings_json="", operating_mode="", problem=f"invalid spec: {error}")
    problem = None
    if len(name) > LABEL_VALUE_MAX_CHARS:
        problem = f"name is {len(name)} characters; node label values allow {LABEL_VALUE_MAX_CHARS}"
    settings = NodeSettings(pool=name, sharing=spec.sharing, health=spec.health)
    return PoolView(**common, selector=tuple(sorted(spec.node_selector.items())),
                    settings_json=encode_settings(settings), operating_mode=spec.sharing.operating_mode.value,
                    problem=problem)


def node_view(body: Mapping) -> NodeView:
    meta = body.get("metadata", {})
    labels = meta.get("labels") or {}
    marks = marks_of(labels, meta.get("annotations") or {})
    return NodeView(name=meta.get("name", ""), labels=tuple(sorted(labels.items())), marks=marks)


def seniority(pool: PoolView) -> tuple[str, str]:
    return (pool.created, pool.name)


def owning_pool(labels: Mapping[str, str], pools: Iterable[PoolView]) -> PoolView | None:
    """The oldest eligible pool whose selector matches `labels`, or None."""
    candidates = [pool for pool in pools if pool.eligible and pool.selects(labels)]
    return min(candidates, key=seniority, default=None)


def marks_for(pool: PoolView | None) -> NodeMarks:
    if pool is None:
        return NodeMarks()
    return NodeMarks(pool=pool.name, settings_json=pool.settings_json, operating_mode=pool.operating_mode)


def node_patch(current: NodeMarks, desired: NodeMarks) -> dict | None:
    """The merge patch taking a node from `current` to `desired` marks, or None when nothing is to do."""
    if current == desired or (desired == NodeMarks() and not current.any):
        return None
    # In a merge patch a null deletes the key, so one shape both marks and unmarks.
    annotations = {POOL_SETTINGS_ANNOTATION: desired.settings_json,
                   HAMI_OPERATING_MODE_ANNOTATION: desired.operating_mode}
    if current.pending_mode is not None or desired.pending_mode is not None:
        annotations[PENDING_MODE_ANNOTATION] = desired.pending_mode
    return {"metadata": {"labels": {POOL_LABEL: desired.pool}, "annotations": annotations}}


def desired_marks(node: NodeView, pools: Iterable[PoolView], *, busy: bool) -> NodeMarks:
    """The marks `node` should carry. `busy`: it holds GPU pods, so a change of its operating
    mode waits: it keeps what it has and records the mode it will switch to."""
    desired = marks_for(owning_pool(node.label_map, pools))
    current = node.marks
    if busy and mode_changes(current, desired):
        return NodeMarks(pool=current.pool, settings_json=current.settings_json,
                         operating_mode=current.operating_mode, pending_mode=desired.operating_mode)
    return desired


def mode_changes(current: NodeMarks, desired: NodeMarks) -> bool:
    """A node that stays managed would switch its operating mode (releasing a node is no switch)."""
    return (current.operating_mode is not None and desired.operating_mode is not None
            and current.operating_mode != desired.operating_mode)


def desired_node_patch(node: NodeView, pools: Iterable[PoolView], *, busy: bool = False) -> dict | None:
    """Bring one node in line with every pool: the whole membership rule in one call."""
    return node_patch(node.marks, desired_marks(node, pools, busy=busy))


def drain_message(node: str, marks: NodeMarks) -> str:
    return (f"node {node} holds GPU pods: it keeps operating mode {marks.operating_mode} and switches to "
            f"{marks.pending_mode} once they are gone; drain it (kubectl drain {node}) to switch now")


def membership(pool: PoolView, pools: Iterable[PoolView], nodes: Iterable[NodeView]) -> Membership:
    """The nodes `pool` owns, and those it selects that an older pool holds."""
    pools = list(pools)
    members: list[str] = []
    conflicts: list[tuple[str, str]] = []
    if not pool.eligible:
        return Membership((), ())
    for node in nodes:
        labels = node.label_map
        if not pool.selects(labels):
            continue
        owner = owning_pool(labels, pools)
        if owner is None or owner.name == pool.name:
            members.append(node.name)
        else:
            conflicts.append((node.name, owner.name))
    return Membership(tuple(sorted(members)), tuple(sorted(conflicts)))


def nodes_to_reconcile(pool: PoolView, nodes: Iterable[NodeView]) -> list[NodeView]:
    """The nodes a pool's reconcile looks at: those it selects and those carrying its label."""
    return [node for node in nodes if node.marks.pool == pool.name or pool.selects(node.label_map)]


def orphaned_nodes(nodes: Iterable[NodeView], pools: Iterable[PoolView]) -> list[NodeView]:
    """Nodes carrying our marks for no existing pool (say, one deleted without its finalizer)."""
    names = {pool.name for pool in pools}
    return [node for node in nodes if node.marks.any and node.marks.pool not in names]


def conflict_message(node: str, *, holder: str, loser: str) -> str:
    return f"node {node} is selected by pools {holder} and {loser}; {holder} is older and keeps it"
