"""Every planned node's GPU loads and host usage as numpy columns: what the bulk planner (bulk.py) reads.

Nodes live in blocks, one block per GPU count, so no node is padded and no GPU is a placeholder.
Arrays are GPU-major -- (GPUs, nodes), a node is a column -- so the planner's elementwise work runs
along the long node axis and its sums over a node's GPUs add whole rows. A block also keeps one
column per node shape it has seen (`ShapeTable`: each GPU's memory, CUs, slices, health,
partition, product, and the node's host CPU and memory); a node's column names its shape by index,
so what depends only on the shape is stored once, not per node.

Kept in step, never rebuilt per decision: `locate` first reads the ledger's journal
(`Ledger.changed_since`) and reloads the nodes changed since its last look, then places afresh any
listed node whose inventory object is not the one its column was made from. The invariant after
`locate`: the column of every listed node holds exactly `ledger.usage(node)`'s loads, free shares,
CPU and memory, under the node's current inventory and shape. A dropped journal, another ledger or
too many stale columns reset everything (columns are then refilled on demand). Pure: no I/O; the
caller owns the object.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import is_not

import numpy as np

from rocshare.core.headroom import free_shares
from rocshare.core.inventory import NodeInventory, ShapeKey
from rocshare.core.ledger import Ledger

MAX_SHAPES = 4096
"""Shapes one block remembers; past it (inventories churning through shapes) the fleet starts over."""
SPARE_COLUMNS = 1024
"""Columns of vanished nodes tolerated beyond the live nodes before the fleet starts over."""


class ShapeTable:
    """The node shapes of one block: per shape, each GPU's numbers as (GPUs, shapes) arrays."""

    def __init__(self, width: int, products: dict[str, int]) -> None:
        self.width = width
        self.ids: dict[ShapeKey, int] = {}
        self.nodes: list[NodeInventory] = []
        """One node of each shape: what shape-wide facts (a request's needs) are worked out on."""
        self._products = products
        self._columns: list[tuple] = []
        self._built = 0
        empty = np.zeros((width, 0), np.int64)
        self.memory_mib = self.cu_count = self.cu_usable = self.max_slices = self.product = empty
        self.healthy = self.partition = empty.astype(bool)
        self.node_cpu_milli = self.node_memory_mib = np.zeros(0, np.int64)

    def id_of(self, node: NodeInventory) -> int:
        found = self.ids.get(node.shape)
        if found is None:
            found = self.ids[node.shape] = len(self.nodes)
            self.nodes.append(node)
            self._columns.append(self._column(node))
        return found

    def _column(self, node: NodeInventory) -> tuple:
        products, gpus = self._products, node.gpus
        codes = [products.setdefault(gpu.product_lower, len(products)) for gpu in gpus]
        return ([g.memory_mib for g in gpus], [g.cu_count for g in gpus], [g.cu_usable for g in gpus],
                [g.max_slices for g in gpus], codes, [g.healthy for g in gpus], [g.partition for g in gpus],
                node.cpu_milli, node.memory_mib)

    def build(self) -> ShapeTable:
        """The arrays, holding every shape added so far."""
        if self._built != len(self._columns):
            fields = list(zip(*self._columns))
            (self.memory_mib, self.cu_count, self.cu_usable, self.max_slices,
             self.product) = (np.array(f, np.int64).T.copy() for f in fields[:5])
            self.healthy, self.partition = (np.array(f, bool).T.copy() for f in fields[5:7])
            self.node_cpu_milli, self.node_memory_mib = (np.array(f, np.int64) for f in fields[7:])
            self._built = len(self._columns)
        return self


class Block:
    """The columns of the nodes with `width` GPUs: loads, free shares, host usage, shape ids."""

    def __init__(self, width: int, products: dict[str, int]) -> None:
        self.width = width
        self.loads = np.zeros((4, width, 0), np.int64)
        """(memory_mib, slices, cu_held, whole) of each GPU, as `NodeUsage.loads`: (4, GPUs, nodes)."""
        self.free = np.zeros((width, 0), np.int64)
        """Each GPU's free share under those loads, as `NodeUsage.free_milli` (at most 1000)."""
        self.host = np.zeros((2, 0), np.int64)
        """(cpu_milli, memory_mib) the node's pods hold."""
        self.shape = np.zeros(0, np.int64)
        self.shapes = ShapeTable(width, products)
        self._used = 0
        self._spare: list[int] = []

    @property
    def columns_in_use(self) -> int:
        return self._used - len(self._spare)

    def take_column(self) -> int:
        if self._spare:
            return self._spare.pop()
        if self._used == len(self.shape):
            capacity = max(64, self._used + self._used // 4)
            self.loads, self.free, self.host, self.shape = (
                _grown(array, capacity) for array in (self.loads, self.free, self.host, self.shape))
        self._used += 1
        return self._used - 1

    def give_back(self, column: int) -> None:
        self._spare.append(column)


@dataclass(frozen=True, slots=True)
class Batch:
    """Listed nodes of one block: their columns there and their positions in the caller's list."""

    block: Block
    columns: np.ndarray
    positions: np.ndarray


class FleetArrays:
    """The columns of every node planned in bulk so far, kept in step with the ledger and inventories."""

    def __init__(self) -> None:
        self._ledger: Ledger | None = None
        self._synced = 0
        self.products: dict[str, int] = {}
        """Lower-case product -> its code in the shape tables (codes only grow)."""
        self._blocks: dict[int, Block] = {}
        self._where: dict[str, tuple[Block, int]] = {}
        self._column: dict[str, int] = {}
        """Name -> its column in its block (`_where`'s second half, for look-ups in bulk)."""
        self._inventory: dict[str, NodeInventory] = {}

    def locate(self, names: Sequence[str], nodes: Sequence[NodeInventory], ledger: Ledger,
               inventories: Mapping[str, NodeInventory]) -> list[Batch]:
        """The columns of `names` (each with GPUs; `nodes[i]` is `names[i]`'s current inventory), up to date."""
        self.sync(ledger, inventories)
        if any(map(is_not, map(self._inventory.get, names), nodes)):
            known = self._inventory
            stale = [i for i, (name, node) in enumerate(zip(names, nodes)) if known.get(name) is not node]
            self._place([names[i] for i in stale], [nodes[i] for i in stale], ledger)
        if not names:
            return []
        columns = np.fromiter(map(self._column.__getitem__, names), np.int64, len(names))
        if len(self._blocks) == 1:
            return [Batch(next(iter(self._blocks.values())), columns, np.arange(len(names)))]
        widths = np.fromiter((len(node.gpus) for node in nodes), np.int64, len(nodes))
        batches = []
        for width in np.unique(widths).tolist():
            positions = np.flatnonzero(widths == width)
            batches.append(Batch(self._blocks[width], columns[positions], positions))
        return batches

    @property
    def empty(self) -> bool:
        return not self._inventory

    def sync(self, ledger: Ledger, inventories: Mapping[str, NodeInventory]) -> None:
        """Reload the nodes the ledger changed since the last look; forget vanished nodes (`locate`
        does this first; calling it between decisions takes that work out of them)."""
        changed = ledger.changed_since(self._synced) if ledger is self._ledger else None
        in_use = sum(block.columns_in_use for block in self._blocks.values())
        crowded = any(len(block.shapes.nodes) > MAX_SHAPES for block in self._blocks.values())
        if changed is None or crowded or in_use > len(inventories) + SPARE_COLUMNS:
            self._reset(ledger)
            return
        self._synced = ledger.journal_end
        reload_names, reload_nodes = [], []
        for name in set(changed).intersection(self._inventory):
            node = inventories.get(name)
            if node is self._inventory[name]:
                reload_names.append(name)
                reload_nodes.append(node)
            elif node is None or not node.gpus:
                self._drop(name)
            else:
                del self._inventory[name]  # placed afresh when next listed
        if reload_names:
            self._load(reload_names, reload_nodes, ledger)

    def _reset(self, ledger: Ledger) -> None:
        self._ledger, self._synced = ledger, ledger.journal_end
        for table in (self._blocks, self._where, self._column, self._inventory):
            table.clear()

    def _drop(self, name: str) -> None:
        block, column = self._where.pop(name)
        del self._column[name], self._inventory[name]
        block.give_back(column)

    def _place(self, names: list[str], nodes: list[NodeInventory], ledger: Ledger) -> None:
        for name, node in zip(names, nodes):
            width = len(node.gpus)
            block = self._blocks.get(width)
            if block is None:
                block = self._blocks[width] = Block(width, self.products)
            old = self._where.get(name)
            if old is not None and old[0] is block:
                column = old[1]
            else:
                if old is not None:
                    old[0].give_back(old[1])
                column = self._column[name] = block.take_column()
                self._where[name] = (block, column)
            block.shape[column] = block.shapes.id_of(node)
            self._inventory[name] = node
        self._load(names, nodes, ledger)

    def _load(self, names: list[str], nodes: list[NodeInventory], ledger: Ledger) -> None:
        """Write each node's usage into its column, one array assignment per block."""
        by_block: dict[int, tuple[Block, list[int], list]] = {}
        for name, node in zip(names, nodes):
            block, column = self._where[name]
            group = by_block.get(id(block))
            if group is None:
                group = by_block[id(block)] = (block, [], [])
            group[1].append(column)
            group[2].append(node)
        for block, columns, block_nodes in by_block.values():
            usages = [ledger.usage(node) for node in block_nodes]
            at, count, width = np.array(columns, np.int64), len(columns), block.width
            loads = np.fromiter(chain.from_iterable(chain.from_iterable(u.loads for u in usages)), np.int64,
                                count * width * 4)
            block.loads[:, :, at] = loads.reshape(count, width, 4).transpose(2, 1, 0)
            free = np.fromiter(chain.from_iterable(u.free_milli or free_shares(node, u.loads)
                                                   for u, node in zip(usages, block_nodes)), np.int64, count * width)
            block.free[:, at] = free.reshape(count, width).T
            hosts = np.fromiter(chain.from_iterable((u.cpu_milli, u.memory_mib) for u in usages), np.int64, 2 * count)
            block.host[:, at] = hosts.reshape(count, 2).T


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    """The array with its last (node) axis grown to `capacity`, zeros after the old columns."""
    grown = np.zeros((*array.shape[:-1], capacity), array.dtype)
    grown[..., :array.shape[-1]] = array
    return grown
