"""A GPU's headroom as one number: the share of it a new slice could still take, in milli.

The smaller of its free memory and free CU fractions; 0 when it is unhealthy, held whole or out
of slices; a partition is all free or all taken. Fragmentation (its measure), the scorers
(BestFit's packing, stranded share) and the ledger (which keeps every node's per-GPU headroom
with its usage, recomputed only when the node's records change) read this one rule.
"""

from __future__ import annotations

from rocshare.core.fit import Load
from rocshare.core.inventory import GpuSpec, NodeInventory

MILLI = 1000


def free_share_milli(spec: GpuSpec, load: Load) -> int:
    memory_held, slices, cu_held, whole = load
    if not spec.healthy or whole or slices >= spec.max_slices or not spec.memory_mib:
        return 0
    if spec.partition:
        return MILLI if not slices else 0
    memory_share = (spec.memory_mib - memory_held) * MILLI // spec.memory_mib
    if not spec.cu_count:
        return memory_share
    return min(memory_share, (spec.cu_count - cu_held) * MILLI // spec.cu_count)


def free_shares(node: NodeInventory, loads: tuple[Load, ...]) -> tuple[int, ...]:
    """Each GPU's free share, in the node's GPU order."""
    return tuple(free_share_milli(spec, load) for spec, load in zip(node.gpus, loads))
