"""The small rules of a share that the device-plugin and DRA paths both apply, each written once
(issue 45: copies had drifted twice, 9903aab and fea6fe5). Pure.

* `cores_percent`: the percent of a GPU's compute that CUs are, rounded up (never under), in the
  quota units of rocshare.core.holdings and HAMi's AMD normalisation;
* `omitted_cores_take_all` / `omitted_cores_pct`: what a container or claim that asks memory but
  no cores takes and is charged under the pool's omittedCores (every CU and 100 % under
  Exclusive, no CU and 0 % under Shared);
* `memory_need_mib` and `cus_for_percent`: what one GPU of a given spec gives a request in MiB
  and in CUs (a percentage of its registered memory, rounded down; of its CUs, rounded up to
  whole WGPs and never above the CUs whole WGPs cover).

Invariant: a pod's request and the DRA claim written for it (rocshare.core.dra_claims) ask, are
charged and hold the same figures on the same GPU.
"""

from __future__ import annotations

import math

from rocshare.api.models import OmittedCores
from rocshare.core.cumask import cu_count_for
from rocshare.core.inventory import GpuSpec
from rocshare.core.request import ContainerRequest

WHOLE_PCT = 100
"""A whole GPU's compute, in percent."""


def cores_percent(cus: int, gpu_cus: int) -> int:
    """The percent of a GPU of `gpu_cus` CUs that `cus` of them are: ceil(cus x 100 / gpu_cus)."""
    return math.ceil(cus * 100 / gpu_cus)


def omitted_cores_take_all(omitted: OmittedCores) -> bool:
    """Whether a slice that asks no cores holds every CU (Exclusive) or shares them all (Shared)."""
    return omitted == OmittedCores.EXCLUSIVE


def omitted_cores_pct(omitted: OmittedCores) -> int:
    """The cores percent charged for a slice that asks memory but no cores."""
    return WHOLE_PCT if omitted_cores_take_all(omitted) else 0


def memory_need_mib(container: ContainerRequest, gpu_memory_mib: int, *, whole: bool) -> int:
    """What one GPU whose registered memory is `gpu_memory_mib` gives the container: all of it
    when taken whole (or more, when the container asks more: it must still fit); else the MiB it
    asks, its percentage rounded down, or all of it when it asks cores only (HAMi's default of
    100 % memory)."""
    if whole:
        return max(container.memory_mib if container.memory_mib is not None else gpu_memory_mib, gpu_memory_mib)
    if container.memory_mib is not None:
        return container.memory_mib
    if container.memory_pct is not None:
        return gpu_memory_mib * container.memory_pct // 100
    return gpu_memory_mib


def cus_for_percent(cores_pct: int, spec: GpuSpec) -> int:
    """The CUs a percentage of the GPU's compute takes: rounded up to whole WGPs (cumask.cu_count_for),
    never above the CUs whole WGPs cover."""
    return min(cu_count_for(cores_pct, spec.cu_count, spec.cu_align), spec.cu_usable)
