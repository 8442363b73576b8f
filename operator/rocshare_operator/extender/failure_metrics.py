"""Failures the operator must show, as metrics on the extender's port (rocshare_* series):
pods it cannot account for (their nodes take no new pod) and watch events a handler has not
taken yet (retried until it does). Read at scrape time from the accounts and the informers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from rocshare.kube.informer import Informer
from rocshare_operator.holds import Accounts


class FailureCollector(Collector):
    def __init__(self, accounts: Accounts, watches: Callable[[], Iterable[Informer]]) -> None:
        self._accounts = accounts
        self._watches = watches

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        unaccountable = GaugeMetricFamily(
            "rocshare_unaccountable_pods", "Pods whose hold cannot be read; their node takes no new pod.",
            labels=["namespace", "node"])
        counts: dict[tuple[str, str], int] = {}
        for namespace, node, _why in self._accounts.unaccountable.values():
            counts[(namespace, node)] = counts.get((namespace, node), 0) + 1
        for labels, count in sorted(counts.items()):
            unaccountable.add_metric(list(labels), count)
        failures = CounterMetricFamily("rocshare_watch_event_failures",
                                       "Watch events a handler raised on, or objects that could not be decoded.",
                                       labels=["watch"])
        failing = GaugeMetricFamily("rocshare_watch_events_failing",
                                    "Objects whose latest event is not taken yet (being retried).", labels=["watch"])
        for informer in self._watches():
            failures.add_metric([informer.name], informer.failures_total)
            failing.add_metric([informer.name], len(informer.failing))
        yield from (unaccountable, failures, failing)
