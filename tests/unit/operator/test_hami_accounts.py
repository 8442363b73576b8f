"""The extender's accounts with pods HAMi placed (holds.py, feed/cluster_facts.py): such a pod is
held as HAMi says, on the node HAMi chose until it is bound; an undecodable HAMi record or one
naming a GPU its node does not list blocks the node; a record HAMi rewrites is read again; a pod
with rocshare's record is held by that one."""

from __future__ import annotations

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, encode_record
from rocshare.core.holdings import Held
from rocshare_operator.holds import Accounts
from rocshare_operator.feed.cluster_facts import pod_facts
from rocshare_operator.status.usage import slices_of

COUNTS = {"n1": {"g1": 104, "g2": 104}, "n2": {"g1": 104}}


def hami_pod(name: str, devices: str, *, vgpu_node: str = "n1", bound: str = "", extra: dict | None = None) -> dict:
    annotations = {"hami.io/amd-devices-allocated": devices, "hami.io/vgpu-node": vgpu_node, **(extra or {})}
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations},
            "spec": {"nodeName": bound, "containers": [{"name": "c0"}]},
            "status": {"phase": "Running" if bound else "Pending", "startTime": "t" if bound else None}}


def accounts() -> Accounts:
    return Accounts(lambda node: COUNTS.get(node, {}))


def test_a_hami_pod_is_held_on_hamis_node_before_and_after_binding() -> None:
    books = accounts()
    books.on_pod("ADDED", pod_facts(hami_pod("h", "g1,MI210,8000,26:;")))
    assert books.ledger.gpu_usage("n1", "g1").memory_mib == 8000 and books.used("ns") == Held(8000, 100, 1)
    books.on_pod("MODIFIED", pod_facts(hami_pod("h", "g1,MI210,8000,26:;", bound="n1",
                                                extra={"hami.io/amd-cu-allocated": '{"g1":"0-25"}'})))
    assert books.ledger.gpu_usage("n1", "g1").cu_held == 26 and books.used("ns") == Held(8000, 25, 1)
    assert not books.blocked_nodes()
    books.on_pod("DELETED", pod_facts(hami_pod("h", "g1,MI210,8000,26:;", bound="n1")))
    assert books.ledger.gpu_usage("n1", "g1").memory_mib == 0 and books.used("ns") == Held()


def test_a_record_hami_rewrites_is_read_again() -> None:
    books = accounts()
    books.on_pod("ADDED", pod_facts(hami_pod("h", "g1,MI210,8000,26:;")))
    books.on_pod("MODIFIED", pod_facts(hami_pod("h", "g1,MI210,3000,26:;", vgpu_node="n2")))
    assert books.ledger.gpu_usage("n1", "g1").memory_mib == 0
    assert books.ledger.gpu_usage("n2", "g1").memory_mib == 3000 and books.used("ns").memory_mib == 3000


def test_undecodable_or_unlisted_hami_records_block_their_node() -> None:
    books = accounts()
    books.on_pod("ADDED", pod_facts(hami_pod("bad", "g1,MI210,lots,26:;", bound="n1")))
    books.on_pod("ADDED", pod_facts(hami_pod("ghost", "g9,MI210,1000,26:;", vgpu_node="n2", bound="n2")))
    assert books.blocked_nodes() == {"n1", "n2"}
    assert "does not list" in books.unaccountable["ns/ghost"][2]
    books.on_pod("DELETED", pod_facts(hami_pod("bad", "g1,MI210,lots,26:;", bound="n1")))
    assert books.blocked_nodes() == {"n2"}


def test_rocshares_record_wins_over_the_hami_companion() -> None:
    record = AllocationRecord.model_validate({"version": 1, "node": "n1", "containers": [
        {"name": "c0", "devices": [{"gpuId": "g2", "memoryMiB": 1000, "cuCount": 10, "cuRanges": [[0, 9]],
                                    "coresPct": 10}]}]})
    pod = hami_pod("r", "g1,MI210,99999,104:;", bound="n1", extra={ALLOCATION_ANNOTATION: encode_record(record)})
    facts = pod_facts(pod)
    assert facts.hami is None
    books = accounts()
    books.on_pod("ADDED", facts)
    assert books.ledger.gpu_usage("n1", "g1").memory_mib == 0 and books.ledger.gpu_usage("n1", "g2").memory_mib == 1000


def test_share_status_counts_hami_pods_by_the_same_rule() -> None:
    held = slices_of(pod_facts(hami_pod("h", "g1,MI210,8000,26:;g2,MI210,2000,26:;", bound="n1")))
    assert held is not None and held.held(COUNTS["n1"]) == Held(10000, 200, 2)
    broken = slices_of(pod_facts(hami_pod("b", "nonsense", bound="n1")))
    assert broken is not None and not broken.holding.accountable
