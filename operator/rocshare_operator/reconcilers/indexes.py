"""Kopf indexes: in-memory views of the objects the reconcilers read, rebuilt from
list+watch on every start (Kopf holds handlers back until they are filled).

Each index maps a key to a store of small frozen values (never whole objects):
  pool_views          pool name -> PoolView
An indexer returns {} (not None) to drop an object, which Kopf reads as "no keys".

Nodes, AmdGpuNodes and pods are not indexed here: the whole process reads them from one
watch per kind, the cluster feed (cluster_feed.py), and the reconcilers from its views
(context.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import kopf

from rocshare.api.models import GROUP, VERSION
from rocshare_operator.status.pool_logic import PoolView, pool_view

V = TypeVar("V")


@kopf.index(GROUP, VERSION, "amdgpupools")
def pool_views(body: kopf.Body, name: str, **_: Any) -> dict[str, PoolView]:
    return {name: pool_view(body)}


def all_values(index: Mapping[Any, Iterable[V]]) -> list[V]:
    return [value for store in index.values() for value in store]


def one_value(index: Mapping[Any, Iterable[V]], key: Any) -> V | None:
    return next(iter(index.get(key, ())), None)
