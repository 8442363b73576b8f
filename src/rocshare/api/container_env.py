"""What rocshare hands a GPU container (DESIGN.md section 4): the one list of the environment
variables it sets and the paths it mounts there.

The node agent renders a container's spec from these names (rocshare_agent.deviceplugin.container_spec,
and through it the DRA driver's CDI spec); admission refuses a pod that would set or cover any of
them (rocshare.core.tenant_spec), because the kubelet applies the pod's own env after the device
plugin's and the last value wins. One list for both, so they cannot drift. Pure data.
"""

from __future__ import annotations

HOOK_CONTAINER_DIR = "/usr/local/vgpu"
HOOK_LIBRARY = "libamvgpu.so"
HOOK_CONTAINER_PATH = f"{HOOK_CONTAINER_DIR}/{HOOK_LIBRARY}"

ROCR_VISIBLE_DEVICES = "ROCR_VISIBLE_DEVICES"
HIP_VISIBLE_DEVICES = "HIP_VISIBLE_DEVICES"
HSA_CU_MASK = "HSA_CU_MASK"
LD_AUDIT = "LD_AUDIT"
HIP_OVERSUBSCRIBE = "HIP_OVERSUBSCRIBE"
HSA_XNACK = "HSA_XNACK"
MEMORY_LIMIT_PREFIX = "HIP_DEVICE_MEMORY_LIMIT_"
"""HIP_DEVICE_MEMORY_LIMIT_<i>: the slice's VRAM on the container's i-th GPU, read by the hook."""
ROCSHARE_PREFIX = "ROCSHARE_"
"""Read by the hook (ROCSHARE_HOOK_DIR: where the container's shared account lives; another
directory per process would split the account and multiply the limit)."""

HANDED_OVER_NAMES = (ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, HSA_CU_MASK, LD_AUDIT, HIP_OVERSUBSCRIBE, HSA_XNACK)
HANDED_OVER_PREFIXES = (MEMORY_LIMIT_PREFIX, ROCSHARE_PREFIX)
HSA_CU_MASK_SKIP_INIT = "HSA_CU_MASK_SKIP_INIT"
"""Never set by rocshare: at 1, ROCr creates queues without HSA_CU_MASK (its own internal queues too,
which the hook never sees), so it would undo the CU mask rocshare hands over."""
UNDOING_NAMES = (HSA_CU_MASK_SKIP_INIT,)
PROTECTED_NAMES = (*HANDED_OVER_NAMES, *UNDOING_NAMES)
"""What a GPU container's pod may not set: the names rocshare hands over and those that undo them."""


def memory_limit_name(position: int) -> str:
    """The variable of the memory limit of the container's GPU at `position` (HIP device order)."""
    return f"{MEMORY_LIMIT_PREFIX}{position}"


def is_handed_over(name: str) -> bool:
    """True when rocshare may set `name` in a GPU container."""
    return name in HANDED_OVER_NAMES or name.startswith(HANDED_OVER_PREFIXES)


def is_protected(name: str) -> bool:
    """True when a pod may not set `name` in a GPU container (PROTECTED_NAMES and the prefixes)."""
    return name in PROTECTED_NAMES or name.startswith(HANDED_OVER_PREFIXES)


def prefix_can_reach_protected(prefix: str) -> bool:
    """True when an envFrom with `prefix` can produce a protected variable, whatever the ConfigMap or
    Secret holds: some name or name family starts with `prefix`, or `prefix` lies inside a name family."""
    return (any(name.startswith(prefix) for name in PROTECTED_NAMES)
            or any(family.startswith(prefix) or prefix.startswith(family) for family in HANDED_OVER_PREFIXES))
