"""Kopf indexes: in-memory views of the objects the reconcilers read, rebuilt from
list+watch on every start (Kopf holds handlers back until they are filled).

Each index maps a key to a store of small frozen values (never whole objects):
  pool_views          pool name -> PoolView
  node_views          node name -> NodeView
  inventories         node name -> Inventory (from its AmdGpuNode)
  pods_by_node        node name -> PodSlices of each pod holding a slice there
  pods_by_namespace   namespace -> PodSlices
  shares_by_pool      pool name -> (namespace, share name)
An indexer returns {} (not None) to drop an object, which Kopf reads as "no keys".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import kopf

from rocshare.api.models import GROUP, VERSION
from rocshare_operator.pool_logic import NodeView, PoolView, node_view, pool_view
from rocshare_operator.pool_status import Inventory
from rocshare_operator.usage import gpu_summaries, pod_slices

V = TypeVar("V")


@kopf.index(GROUP, VERSION, "amdgpupools")
def pool_views(body: kopf.Body, name: str, **_: Any) -> dict[str, PoolView]:
    return {name: pool_view(body)}


@kopf.index("v1", "nodes")
def node_views(body: kopf.Body, name: str, **_: Any) -> dict[str, NodeView]:
    return {name: node_view(body)}


@kopf.index(GROUP, VERSION, "amdgpunodes")
def inventories(name: str, status: kopf.Status, **_: Any) -> dict[str, Inventory]:
    return {name: Inventory(node=name, gpus=gpu_summaries(status.get("gpus") or []))}


@kopf.index("v1", "pods")
def pods_by_node(body: kopf.Body, **_: Any) -> dict:
    held = pod_slices(body)
    return {held.node: held} if held and held.node else {}


@kopf.index("v1", "pods")
def pods_by_namespace(body: kopf.Body, **_: Any) -> dict:
    held = pod_slices(body)
    return {held.namespace: held} if held else {}


@kopf.index(GROUP, VERSION, "amdgpushares")
def shares_by_pool(namespace: str, name: str, spec: kopf.Spec, **_: Any) -> dict:
    pool = spec.get("pool")
    return {pool: (namespace, name)} if pool else {}


def all_values(index: Mapping[Any, Iterable[V]]) -> list[V]:
    return [value for store in index.values() for value in store]


def one_value(index: Mapping[Any, Iterable[V]], key: Any) -> V | None:
    return next(iter(index.get(key, ())), None)
