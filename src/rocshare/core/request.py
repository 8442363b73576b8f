"""A pod's GPU request, parsed from the pod as the API server returns it (a plain dict).

Resources (container limits, falling back to requests; DESIGN.md section 3):
``amd.com/gpu`` (GPU count), ``amd.com/gpumem`` (MiB per GPU, wins over the percentage),
``amd.com/gpumem-percentage`` (1-100), ``amd.com/gpucores`` (1-100, an integer).
A container that sets a slice resource without ``amd.com/gpu`` asks for one GPU (the rule
the admission webhook applies, repeated here so both agree). A pool with mixed resource naming
offers partitions as ``amd.com/<compute>_<memory>`` (rocshare.api.resource_names); a container
asks for N whole partitions of one kind by that name, alone.

Invariants of the result: every number is a validated int; ``memory_mib`` and
``memory_pct`` are never both set (the MiB value wins); init containers come first, in pod
order, then app containers in pod order. Anything that makes no sense raises
``RequestError`` naming the container, the resource and what is wrong; nothing is
silently defaulted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rocshare.api.models import GpuPolicy, NodePolicy
from rocshare.api.pod_lifecycle import is_sidecar
from rocshare.api.resource_names import GPU_RESOURCE, is_partition_resource
from rocshare.core.quantity import QuantityError, whole_quantity

RESOURCE_GPU = GPU_RESOURCE
RESOURCE_MEMORY = "amd.com/gpumem"
RESOURCE_MEMORY_PCT = "amd.com/gpumem-percentage"
RESOURCE_CORES = "amd.com/gpucores"
SLICE_RESOURCES = (RESOURCE_MEMORY, RESOURCE_MEMORY_PCT, RESOURCE_CORES)
RESOURCE_UNITS = {RESOURCE_GPU: "GPUs", RESOURCE_MEMORY: "MiB", RESOURCE_MEMORY_PCT: "percent of each GPU's VRAM",
                  RESOURCE_CORES: "percent of each GPU's compute units"}
"""The unit each amd.com resource counts in (quantities are read by rocshare.core.quantity)."""

ANNOTATION_NUMA_BIND = "amd.com/numa-bind"
ANNOTATION_LINK_BIND = "amd.com/link-bind"
ANNOTATION_USE_TYPE = "amd.com/use-gputype"
ANNOTATION_NOUSE_TYPE = "amd.com/nouse-gputype"
ANNOTATION_USE_UUID = "amd.com/use-gpu-uuid"
ANNOTATION_NOUSE_UUID = "amd.com/nouse-gpu-uuid"
ANNOTATION_NODE_POLICY = "hami.io/node-scheduler-policy"
ANNOTATION_GPU_POLICY = "hami.io/gpu-scheduler-policy"



class RequestError(ValueError):
    """The pod asks for something that makes no sense; the message says what and where."""


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """What one container asks of each of its GPUs."""

    name: str
    init: bool
    gpus: int
    memory_mib: int | None = None
    memory_pct: int | None = None
    cores_pct: int | None = None
    sidecar: bool = False
    """An init container with restartPolicy Always (a native sidecar): it runs beside the app
    containers, so Kubernetes counts its resources with theirs (see rocshare.core.holdings)."""
    resource: str = RESOURCE_GPU
    """The resource its devices are asked under: amd.com/gpu, or a partition kind (mixed naming)."""

    @property
    def whole(self) -> bool:
        """No memory and no cores asked: the whole GPU (seed semantics)."""
        return self.memory_mib is None and self.memory_pct is None and self.cores_pct is None


@dataclass(frozen=True, slots=True)
class Selection:
    """Which GPUs the pod accepts, from its annotations. Types are lower-case substrings."""

    numa_bind: bool = False
    link_bind: bool = False
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()

    def accepts_product(self, product_lower: str) -> bool:
        if self.use_types and not any(t in product_lower for t in self.use_types):
            return False
        return not any(t in product_lower for t in self.nouse_types)

    def accepts_uuid(self, gpu_id: str) -> bool:
        lowered = gpu_id.lower()
        if self.use_uuids and lowered not in self.use_uuids:
            return False
        return lowered not in self.nouse_uuids


@dataclass(frozen=True, slots=True)
class PodRequest:
    """The whole pod's request. ``cpu_milli``/``memory_mib`` are host resources; parse_pod
    leaves them 0, holdings.placement_request (the extender) and the placement benchmark fill them."""

    namespace: str
    name: str
    containers: tuple[ContainerRequest, ...]
    selection: Selection = field(default_factory=Selection)
    node_policy: NodePolicy | None = None
    gpu_policy: GpuPolicy | None = None
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def gpu_containers(self) -> tuple[ContainerRequest, ...]:
        return tuple(c for c in self.containers if c.gpus > 0)

    @property
    def wants_gpus(self) -> bool:
        return any(c.gpus > 0 for c in self.containers)

    @property
    def gpu_key(self) -> tuple:
        """Everything GPU fit and GPU scoring depend on: a memo key for callers' caches."""
        shapes = tuple((c.init, c.sidecar, c.gpus, c.memory_mib, c.memory_pct, c.cores_pct, c.resource)
                       for c in self.containers if c.gpus)
        return (shapes, self.selection)


def parse_pod(pod: Mapping) -> PodRequest:
    """Parse a pod dict (camelCase, as the API returns it). Raises RequestError."""
    metadata = _mapping(pod.get("metadata"), "metadata")
    spec = _mapping(pod.get("spec"), "spec")
    annotations = _mapping(metadata.get("annotations"), "metadata.annotations")
    containers = tuple(
        [_parse_container(_mapping(c, "an init container"), init=True) for c in _list(spec, "initContainers")]
        + [_parse_container(_mapping(c, "a container"), init=False) for c in _list(spec, "containers")]
    )
    return PodRequest(
        namespace=str(metadata.get("namespace") or "default"),
        name=str(metadata.get("name") or ""),
        containers=containers,
        selection=_parse_selection(annotations),
        node_policy=_parse_enum(annotations, ANNOTATION_NODE_POLICY, NodePolicy),
        gpu_policy=_parse_enum(annotations, ANNOTATION_GPU_POLICY, GpuPolicy),
    )


def _parse_container(container: Mapping, *, init: bool) -> ContainerRequest:
    name = str(container.get("name") or "?")
    where = f"{'init container' if init else 'container'} {name!r}"
    resources = _mapping(container.get("resources"), f"{where}: resources")
    # Extended resources must have requests == limits; limits are the usual place.
    values = {**_mapping(resources.get("requests"), f"{where}: requests"),
              **_mapping(resources.get("limits"), f"{where}: limits")}
    sidecar = is_sidecar(container, init=init)
    partitions = sorted(key for key in values if is_partition_resource(str(key)))
    if partitions:
        return _partition_container(name, init, sidecar, values, partitions, where)
    memory_mib = _optional_int(values, RESOURCE_MEMORY, where, low=1, high=None)
    memory_pct = _optional_int(values, RESOURCE_MEMORY_PCT, where, low=1, high=100)
    cores_pct = _optional_int(values, RESOURCE_CORES, where, low=1, high=100)
    # No upper bound: a count no node has is read by value and left Pending by the scheduler
    # (the extender says NodeInsufficientGPUs), as Kubernetes does for any extended resource.
    gpus = _optional_int(values, RESOURCE_GPU, where, low=0, high=None)
    slice_asked = memory_mib is not None or memory_pct is not None or cores_pct is not None
    if gpus is None:
        gpus = 1 if slice_asked else 0
    elif gpus == 0 and slice_asked:
        raise RequestError(f"{where}: {RESOURCE_GPU} is 0 but a GPU slice is asked ({_asked(values)})")
    if memory_mib is not None:
        memory_pct = None  # the MiB value wins (DESIGN.md section 3)
    return ContainerRequest(name, init, gpus, memory_mib, memory_pct, cores_pct, sidecar)


def _partition_container(name: str, init: bool, sidecar: bool, values: Mapping, partitions: list[str],
                         where: str) -> ContainerRequest:
    """N whole partitions of one kind: alone, since a partition is a whole, unshared device."""
    others = [key for key in (RESOURCE_GPU, *SLICE_RESOURCES) if key in values]
    if len(partitions) > 1 or others:
        raise RequestError(f"{where}: {partitions[0]} asks for whole partitions of one kind; it cannot be combined "
                           f"with {', '.join([*partitions[1:], *others])} in one container")
    resource = partitions[0]
    try:
        count = whole_quantity(values[resource], name=resource, unit="partitions")
    except QuantityError as error:
        raise RequestError(f"{where}: {error}") from None
    return ContainerRequest(name, init, count, sidecar=sidecar, resource=resource)


def _mapping(value: object, what: str) -> Mapping:
    """Pods from the API server always have these shapes; a hand-made one (a direct POST to the
    extender) may not, and must be refused with a reason rather than crash the parser."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RequestError(f"{what} must be an object, got {type(value).__name__}")
    return value


def _list(spec: Mapping, key: str) -> list:
    value = spec.get(key) or []
    if not isinstance(value, list):
        raise RequestError(f"spec.{key} must be a list, got {type(value).__name__}")
    return value


def _asked(values: Mapping) -> str:
    return ", ".join(f"{key}={values[key]}" for key in SLICE_RESOURCES if key in values)


def _optional_int(values: Mapping, key: str, where: str, *, low: int, high: int | None) -> int | None:
    if key not in values:
        return None
    number = _plain_int(values[key], where, key)
    if number < low or (high is not None and number > high):
        bounds = f"{low}-{high}" if high is not None else f">= {low}"
        raise RequestError(f"{where}: {key} is {number}, must be {bounds}")
    return number


def _plain_int(raw: object, what: str, key: str) -> int:
    """The quantity as the API server writes it (3000 arrives as "3k"): any whole number."""
    try:
        return whole_quantity(raw, name=key, unit=RESOURCE_UNITS[key])
    except QuantityError as error:
        raise RequestError(f"{what}: {error}") from None


def _parse_selection(annotations: Mapping) -> Selection:
    return Selection(
        numa_bind=_parse_bool(annotations, ANNOTATION_NUMA_BIND),
        link_bind=_parse_bool(annotations, ANNOTATION_LINK_BIND),
        use_types=_parse_list(annotations, ANNOTATION_USE_TYPE),
        nouse_types=_parse_list(annotations, ANNOTATION_NOUSE_TYPE),
        use_uuids=frozenset(_parse_list(annotations, ANNOTATION_USE_UUID)),
        nouse_uuids=frozenset(_parse_list(annotations, ANNOTATION_NOUSE_UUID)),
    )


def _parse_bool(annotations: Mapping, key: str) -> bool:
    raw = annotations.get(key)
    if raw is None:
        return False
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise RequestError(f"annotation {key} is {raw!r}, must be \"true\" or \"false\"")


def _parse_list(annotations: Mapping, key: str) -> tuple[str, ...]:
    raw = annotations.get(key)
    if raw is None:
        return ()
    items = tuple(part.strip().lower() for part in str(raw).split(","))
    if not items or any(not item for item in items):
        raise RequestError(f"annotation {key} is {raw!r}, must be a comma list of non-empty names")
    return items


def _parse_enum(annotations: Mapping, key: str, enum: type[NodePolicy] | type[GpuPolicy]):
    raw = annotations.get(key)
    if raw is None:
        return None
    try:
        return enum(str(raw).strip())
    except ValueError:
        allowed = "|".join(member.value for member in enum)
        raise RequestError(f"annotation {key} is {raw!r}, must be one of {allowed}") from None
