"""pool_logic: which pool owns a node (older wins), node marks and merge patches, membership and conflicts."""

from __future__ import annotations

import pytest

from rocshare.api.node_settings import (
    HAMI_OPERATING_MODE_ANNOTATION,
    PENDING_MODE_ANNOTATION,
    POOL_LABEL,
    POOL_SETTINGS_ANNOTATION,
    decode_settings,
)
from rocshare_operator.status.pool_logic import (
    NodeMarks,
    desired_marks,
    desired_node_patch,
    membership,
    node_patch,
    node_view,
    nodes_to_reconcile,
    owning_pool,
    pool_view,
    selector_matches,
)


def pool(name: str, selector: dict, created: str = "2026-01-01T00:00:00Z", *, deleting: bool = False,
         mode: str = "cu"):
    meta = {"name": name, "uid": f"uid-{name}", "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-02-01T00:00:00Z"
    return pool_view({"metadata": meta, "spec": {"nodeSelector": selector, "sharing": {"operatingMode": mode}}})


def node(name: str, labels: dict, annotations: dict | None = None):
    return node_view({"metadata": {"name": name, "labels": labels, "annotations": annotations or {}}})


@pytest.mark.parametrize(("selector", "labels", "matches"), [
    ({"gpu": "amd"}, {"gpu": "amd", "zone": "a"}, True),
    ({"gpu": "amd"}, {"gpu": "nvidia"}, False),
    ({"gpu": "amd", "zone": "a"}, {"gpu": "amd"}, False),
    ({}, {"anything": "x"}, True),  # matchLabels semantics: empty selects all
])
def test_selector_matches(selector, labels, matches) -> None:
    assert selector_matches(selector, labels) is matches


@pytest.mark.parametrize(("pools", "owner"), [
    ([pool("b", {"gpu": "amd"}, "2026-01-01T00:00:00Z"), pool("a", {"gpu": "amd"}, "2026-01-02T00:00:00Z")], "b"),
    ([pool("b", {"gpu": "amd"}), pool("a", {"gpu": "amd"})], "a"),  # same second: name breaks the tie
    ([pool("old", {"gpu": "amd"}, "2026-01-01T00:00:00Z", deleting=True), pool("new", {"gpu": "amd"},
                                                                             "2026-01-02T00:00:00Z")], "new"),
    ([pool("other", {"gpu": "nvidia"})], None),
    ([], None),
])
def test_owning_pool_is_the_oldest_live_match(pools, owner) -> None:
    found = owning_pool({"gpu": "amd"}, pools)
    assert (found.name if found else None) == owner


def test_a_pool_name_too_long_for_a_label_owns_nothing() -> None:
    long_pool = pool("p" * 64, {"gpu": "amd"})
    assert long_pool.problem and "63" in long_pool.problem
    assert owning_pool({"gpu": "amd"}, [long_pool]) is None


def test_marking_a_node_writes_label_settings_and_hami_mode() -> None:
    patch = desired_node_patch(node("n1", {"gpu": "amd"}), [pool("p", {"gpu": "amd"}, mode="partition")])
    assert patch["metadata"]["labels"] == {POOL_LABEL: "p"}
    annotations = patch["metadata"]["annotations"]
    assert annotations[HAMI_OPERATING_MODE_ANNOTATION] == "partition"
    settings = decode_settings(annotations[POOL_SETTINGS_ANNOTATION])
    assert (settings.pool, settings.sharing.operating_mode.value) == ("p", "partition")


def test_a_marked_node_in_line_needs_no_patch() -> None:
    pools = [pool("p", {"gpu": "amd"})]
    marked = pools[0]
    current = node("n1", {"gpu": "amd", POOL_LABEL: "p"}, {POOL_SETTINGS_ANNOTATION: marked.settings_json,
                                                           HAMI_OPERATING_MODE_ANNOTATION: "cu"})
    assert desired_node_patch(current, pools) is None


def test_a_node_that_left_is_unmarked_with_nulls() -> None:
    left = node("n1", {"gpu": "other", POOL_LABEL: "p"}, {POOL_SETTINGS_ANNOTATION: "{}",
                                                          HAMI_OPERATING_MODE_ANNOTATION: "cu"})
    patch = desired_node_patch(left, [pool("p", {"gpu": "amd"})])
    assert patch == {"metadata": {"labels": {POOL_LABEL: None}, "annotations": {
        POOL_SETTINGS_ANNOTATION: None, HAMI_OPERATING_MODE_ANNOTATION: None}}}


def test_a_hami_mode_someone_else_wrote_is_left_alone() -> None:
    assert node_patch(NodeMarks(operating_mode="cu"), NodeMarks()) is None


def test_settings_change_when_the_pool_is_edited() -> None:
    before = pool("p", {"gpu": "amd"})
    current = node("n1", {"gpu": "amd", POOL_LABEL: "p"}, {POOL_SETTINGS_ANNOTATION: before.settings_json,
                                                           HAMI_OPERATING_MODE_ANNOTATION: "cu"})
    patch = desired_node_patch(current, [pool("p", {"gpu": "amd"}, mode="partition")])
    assert patch is not None and patch["metadata"]["annotations"][HAMI_OPERATING_MODE_ANNOTATION] == "partition"


def test_membership_lists_members_and_conflicts_with_the_holder() -> None:
    old = pool("old", {"gpu": "amd"}, "2026-01-01T00:00:00Z")
    new = pool("new", {"zone": "a"}, "2026-01-02T00:00:00Z")
    nodes = [node("n1", {"gpu": "amd", "zone": "a"}), node("n2", {"zone": "a"}), node("n3", {"gpu": "amd"})]
    assert membership(old, [old, new], nodes).members == ("n1", "n3")
    new_view = membership(new, [old, new], nodes)
    assert new_view.members == ("n2",)
    assert new_view.conflicts == (("n1", "old"),)
    assert new_view.conflicting_nodes == ["n1"]


def test_a_deleting_pool_has_no_members() -> None:
    going = pool("p", {"gpu": "amd"}, deleting=True)
    assert membership(going, [going], [node("n1", {"gpu": "amd"})]).members == ()


def test_nodes_to_reconcile_include_those_still_carrying_the_label() -> None:
    p = pool("p", {"gpu": "amd"})
    nodes = [node("sel", {"gpu": "amd"}), node("left", {POOL_LABEL: "p"}), node("other", {"gpu": "x"})]
    assert [n.name for n in nodes_to_reconcile(p, nodes)] == ["sel", "left"]


def test_an_invalid_spec_gives_a_view_with_a_problem() -> None:
    view = pool_view({"metadata": {"name": "bad"}, "spec": {"nodeSelector": {}, "sharing": {"splitCount": 999}}})
    assert view.problem and view.problem.startswith("invalid spec")
    assert not view.eligible


# ---- an operating-mode change waits for the node to drain (AMD's guide) --------------------

def _marked_cu_node(settings_json: str, extra: dict | None = None):
    return node("n1", {"gpu": "amd", POOL_LABEL: "p"}, {POOL_SETTINGS_ANNOTATION: settings_json,
                                                        HAMI_OPERATING_MODE_ANNOTATION: "cu", **(extra or {})})


def test_a_busy_node_keeps_its_mode_and_records_the_pending_one() -> None:
    current = _marked_cu_node(pool("p", {"gpu": "amd"}).settings_json)
    patch = desired_node_patch(current, [pool("p", {"gpu": "amd"}, mode="partition")], busy=True)
    assert patch == {"metadata": {"labels": {POOL_LABEL: "p"}, "annotations": {
        POOL_SETTINGS_ANNOTATION: current.marks.settings_json, HAMI_OPERATING_MODE_ANNOTATION: "cu",
        PENDING_MODE_ANNOTATION: "partition"}}}
    held = node_view({"metadata": {"name": "n1", "labels": {"gpu": "amd", POOL_LABEL: "p"},
                                   "annotations": patch["metadata"]["annotations"]}})
    assert desired_node_patch(held, [pool("p", {"gpu": "amd"}, mode="partition")], busy=True) is None  # nothing more


def test_once_empty_the_node_switches_and_the_pending_mark_goes() -> None:
    current = _marked_cu_node(pool("p", {"gpu": "amd"}).settings_json, {PENDING_MODE_ANNOTATION: "partition"})
    target = pool("p", {"gpu": "amd"}, mode="partition")
    patch = desired_node_patch(current, [target], busy=False)
    annotations = patch["metadata"]["annotations"]
    assert annotations[HAMI_OPERATING_MODE_ANNOTATION] == "partition" and annotations[PENDING_MODE_ANNOTATION] is None
    assert annotations[POOL_SETTINGS_ANNOTATION] == target.settings_json


def test_other_setting_changes_and_releases_do_not_wait() -> None:
    current = _marked_cu_node(pool("p", {"gpu": "amd"}).settings_json)
    resized = pool_view({"metadata": {"name": "p", "uid": "uid-p", "creationTimestamp": "2026-01-01T00:00:00Z"},
                         "spec": {"nodeSelector": {"gpu": "amd"}, "sharing": {"splitCount": 4}}})
    assert desired_marks(current, [resized], busy=True) == NodeMarks(
        pool="p", settings_json=resized.settings_json, operating_mode="cu")
    assert desired_marks(current, [], busy=True) == NodeMarks()  # the pool is gone: released at once
