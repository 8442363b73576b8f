"""A resized record in the extender's accounts (accounts.py, resize): the covering record takes the
old one's place while the new one is written, the watch's echo replaces it, an event older than
the resize changes nothing, and the namespace's figures and the on_hold readers (share and pool
status) count the pod once throughout."""

from __future__ import annotations

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, encode_record
from rocshare.api.models import ShareLimits
from rocshare.api.resize import ResizeRequest
from rocshare.core.holdings import Held
from rocshare.core.resize import Neighbours, Resized, covering, decide_resize
from rocshare_operator.holds import Accounts
from rocshare_operator.extender.resizer import others_on
from rocshare_operator.feed.cluster_facts import pod_facts

from ..core.helpers import gpu, node

GPU0 = "GPU-n1-0000"


def record(memory_mib: int, ranges: list[list[int]], pct: int, generation: int | None = None) -> AllocationRecord:
    return AllocationRecord.model_validate({"version": 1, "node": "n1", "resizeGeneration": generation, "containers": [
        {"name": "c", "devices": [{"gpuId": GPU0, "memoryMiB": memory_mib,
                                   "cuCount": sum(h - lo + 1 for lo, h in ranges),
                                   "cuRanges": ranges, "coresPct": pct}]}]})


def facts(name: str, rec: AllocationRecord):
    return pod_facts({"metadata": {"name": name, "namespace": "ns", "uid": "u-" + name,
                                   "annotations": {ALLOCATION_ANNOTATION: encode_record(rec)}},
                      "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "startTime": "t"}})


def test_covering_then_echo_then_stale_event_count_once() -> None:
    accounts = Accounts(lambda _node: {GPU0: 104})
    heard: list[Held] = []
    accounts.on_hold.append(lambda key, ns, holding: heard.append(holding.held({GPU0: 104})) if holding else None)
    old = record(4096, [[0, 9]], 10)
    accounts.on_pod("MODIFIED", facts("a", old))
    accounts.on_pod("MODIFIED", facts("b", record(1000, [[50, 59]], 10)))
    assert accounts.used("ns") == Held(5096, 20, 2)

    inventory = node(gpu(0, memory_mib=65536, cu_count=104))
    others = others_on(accounts.ledger.holders(inventory), "ns/a", [GPU0])
    assert others[GPU0].memory_mib == 1000 and others[GPU0].cu_held == 10
    decided = decide_resize(old, ResizeRequest(generation=1, memory_mib=2048, cores_pct=20), inventory,
                            Neighbours(others, ShareLimits(), accounts.used("ns")))
    assert isinstance(decided, Resized)
    new = decided.record
    assert new.containers[0].devices[0].cu_ranges == [(0, 20)]  # beside its own, not into b's 50-59

    accounts.replace("ns/a", "ns", covering(old, new), interim=True)  # the resizer, before its patch
    assert accounts.used("ns") == Held(4096 + 1000, 20 + 10, 2)  # the larger of both, once: no double count
    assert accounts.ledger.gpu_usage("n1", GPU0).cu_held == 21 + 10

    accounts.on_pod("MODIFIED", facts("a", old))  # an event from before the patch: changes nothing
    assert accounts.used("ns") == Held(5096, 30, 2) and "ns/a" in accounts.interim

    accounts.on_pod("MODIFIED", facts("a", new))  # the watch's echo of the new record
    assert accounts.used("ns") == Held(2048 + 1000, 20 + 10, 2) and "ns/a" not in accounts.interim
    assert accounts.ledger.record("ns/a") == new
    assert heard[-1] == Held(2048, 20, 1)  # share and pool status heard the new hold

    accounts.on_pod("MODIFIED", facts("a", old))  # a stale event after the echo: still nothing
    assert accounts.used("ns") == Held(3048, 30, 2)

    accounts.on_pod("DELETED", facts("a", new))
    assert accounts.used("ns") == Held(1000, 10, 1) and "ns/a" not in accounts.record_texts


def test_a_resize_written_by_another_replica_is_taken_from_the_watch() -> None:
    accounts = Accounts(lambda _node: {GPU0: 104})
    accounts.on_pod("MODIFIED", facts("a", record(4096, [[0, 9]], 10)))
    accounts.on_pod("MODIFIED", facts("a", record(8192, [[0, 20]], 20, generation=3)))
    assert accounts.used("ns") == Held(8192, 20, 1)
    accounts.on_pod("MODIFIED", facts("a", record(100, [[0, 0]], 1, generation=2)))  # older generation
    assert accounts.used("ns") == Held(8192, 20, 1)
