"""A container's amd.com/* request written as a DRA claim, for pools in DRA mode. Pure.

Users keep their habits: ``amd.com/gpu``, ``amd.com/gpumem``, ``amd.com/gpumem-percentage`` and
``amd.com/gpucores`` mean in a DRA pool what they mean under the device plugin. Memory in MiB is
a capacity request as it stands, but percentages depend on the GPU: 25 % of the cores is 26 CUs of
an MI210 (104) and 16 of a Vega10 (64), rounded up to whole WGPs on RDNA. So a request with a
percentage becomes a ``firstAvailable`` list with one subrequest per GPU shape of the pool (CU
count, WGP size, registered memory), each naming the DeviceClass of that shape (shape_device_class:
rocshare's driver and the shape, in one CEL selector, so the claim carries none of its own and
kube-scheduler evaluates one selector per device, not two) and asking the capacities worked out for
it with the device plugin's own rule (rocshare.core.fit.need_for, whose memory and CU figures are
rocshare.core.share_rules'); kube-scheduler takes the first that fits. Admission writes the classes
a claim names (shape_classes_of) before the claim's template.

Invariants: a request that asks neither memory nor cores asks no capacity (every default: the
whole GPU); omitted cores ask no compute (the pool's omittedCores default decides, as it does for
pods); ``amd.com/gpu: N`` > 1 is N devices with a ``distinctAttribute`` on the uuid (never two
shares of one GPU); numa-bind and link-bind become ``matchAttribute`` constraints on the NUMA node
and the XGMI hive; product filters become CEL selectors. A partition kind as mixed naming writes it
(``amd.com/cpx_nps4: N``) is N whole partitions of class gpu.rocshare.io selected by their
``computePartition`` and ``memoryPartition`` attributes (partition_selector, on the device plugin's
naming rule), refused when the pool has no partition of that kind. More shapes than the API allows
subrequests (8) is an error that names them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rocshare.api import dra
from rocshare.api.models import OmittedCores
from rocshare.api.resource_names import GPU_RESOURCE, partition_modes
from rocshare.core.fit import need_for
from rocshare.core.holdings import Held
from rocshare.core.inventory import GpuSpec
from rocshare.core.quantity import QuantityError, memory_mib_quantity, whole_quantity
from rocshare.core.request import ContainerRequest, RequestError, Selection
from rocshare.core.share_rules import WHOLE_PCT, cores_percent, omitted_cores_pct

REQUEST_NAME = "gpu"
SUBREQUESTS_MAX = 8
_CAPACITY = f"device.capacity['{dra.DRIVER_NAME}']"
_ATTRIBUTES = f"device.attributes['{dra.DRIVER_NAME}']"


def claim_spec(container: ContainerRequest, shapes: Sequence[GpuSpec], *, selection: Selection = Selection()) -> dict:
    """The ResourceClaim spec equivalent to `container`'s request in a pool whose GPUs have `shapes`."""
    if container.resource != GPU_RESOURCE:
        request = {"name": REQUEST_NAME, "exactly": _partition_exactly(container, shapes, selection)}
        return _with_constraints({"devices": {"requests": [request]}}, container, selection)
    per_shape = container.memory_pct is not None or container.cores_pct is not None
    if per_shape:
        request = {"name": REQUEST_NAME, "firstAvailable": _subrequests(container, shapes, selection)}
    else:
        request = {"name": REQUEST_NAME, "exactly": _exactly(container, selection)}
    return _with_constraints({"devices": {"requests": [request]}}, container, selection)


def _with_constraints(spec: dict, container: ContainerRequest, selection: Selection) -> dict:
    constraints = _constraints(container, selection)
    if constraints:
        spec["devices"]["constraints"] = constraints
    return spec


def _partition_exactly(container: ContainerRequest, shapes: Sequence[GpuSpec], selection: Selection) -> dict:
    """N whole partitions of one kind (amd.com/cpx_nps4: N): count N, no capacity (a partition is whole),
    the kind's selector (partition_selector). A kind none of the pool's GPUs is in is refused, naming it."""
    kinds = sorted({spec.partition_kind for spec in shapes if spec.partition_kind})
    if container.resource not in kinds:
        held = f"its partitions are {', '.join(kinds)}" if kinds else "it has no partitions"
        raise RequestError(f"container {container.name!r}: the pool has no {container.resource} partition ({held})")
    selectors = [{"cel": {"expression": partition_selector(container.resource)}}, *_selection_selectors(selection)]
    return {"deviceClassName": dra.DEVICE_CLASS_NAME, "allocationMode": "ExactCount", "count": container.gpus,
            "selectors": selectors}


def partition_selector(kind: str) -> str:
    """The CEL selector of the partitions of one kind (amd.com/cpx_nps4): the devices whose
    computePartition and memoryPartition attributes are the modes the name says, as mixed naming
    names a partition (rocshare.api.resource_names.partition_resource; a kind without a memory mode,
    amd.com/cpx, is a partition whose memory mode is unknown)."""
    compute, memory = partition_modes(kind)
    compute_attr, memory_attr = (f"{_ATTRIBUTES}.{dra.ATTRIBUTE_PARTITION}",
                                 f"{_ATTRIBUTES}.{dra.ATTRIBUTE_MEMORY_PARTITION}")
    term = f"has({compute_attr}) && {compute_attr}.lowerAscii() == {_cel_string(compute)}"
    if memory is None:
        return f"{term} && !has({memory_attr})"
    return f"{term} && has({memory_attr}) && {memory_attr}.lowerAscii() == {_cel_string(memory)}"


def _exactly(container: ContainerRequest, selection: Selection) -> dict:
    exactly: dict = {"deviceClassName": dra.DEVICE_CLASS_NAME, "allocationMode": "ExactCount",
                     "count": container.gpus}
    if container.memory_mib is not None:
        exactly["capacity"] = {"requests": {dra.CAPACITY_MEMORY: f"{container.memory_mib}Mi"}}
    selectors = _selection_selectors(selection)
    if selectors:
        exactly["selectors"] = selectors
    return exactly


def _subrequests(container: ContainerRequest, shapes: Sequence[GpuSpec], selection: Selection) -> list[dict]:
    distinct = sorted({_shape_key(spec): spec for spec in shapes if not spec.partition}.items())
    if not distinct:
        raise RequestError(f"container {container.name!r}: the pool has no shared GPU to take a percentage of")
    if len(distinct) > SUBREQUESTS_MAX:
        raise RequestError(f"container {container.name!r}: the pool has {len(distinct)} GPU shapes; a claim can "
                           f"list {SUBREQUESTS_MAX}; ask amd.com/gpumem in MiB and no percentages, or write the claim")
    return [_subrequest(index, container, spec, selection) for index, (_key, spec) in enumerate(distinct)]


def _shape_key(spec: GpuSpec) -> tuple[int, int, int]:
    return (spec.cu_count, spec.cu_align, spec.memory_mib)


def _subrequest(index: int, container: ContainerRequest, spec: GpuSpec, selection: Selection) -> dict:
    # What one GPU of this shape gives the container is the device plugin's rule (fit.need_for);
    # omitted cores ask no compute here (the pool's omittedCores decides at allocation).
    need = need_for(spec, container, OmittedCores.SHARED)
    requests: dict[str, str] = {}
    if container.memory_mib is not None or container.memory_pct is not None:
        requests[dra.CAPACITY_MEMORY] = f"{need.memory_mib}Mi"
    if container.cores_pct is not None:
        requests[dra.CAPACITY_COMPUTE] = str(need.pin_cus)
    subrequest: dict = {"name": f"shape{index}", "deviceClassName": shape_class_name(spec),
                        "allocationMode": "ExactCount", "count": container.gpus}
    selectors = _selection_selectors(selection)
    if selectors:
        subrequest["selectors"] = selectors
    subrequest["capacity"] = {"requests": requests}
    return subrequest


def shape_selector(spec: GpuSpec) -> str:
    """The CEL selector of one GPU shape (its CU count and registered memory)."""
    return (f"{_CAPACITY}.{dra.CAPACITY_COMPUTE}.compareTo(quantity('{spec.cu_count}')) == 0 && "
            f"{_CAPACITY}.{dra.CAPACITY_MEMORY}.compareTo(quantity('{spec.memory_mib}Mi')) == 0")


def shape_class_name(spec: GpuSpec) -> str:
    """The DeviceClass of one GPU shape: <CUs>cu-<MiB>mi.gpu.rocshare.io (a DNS subdomain)."""
    return f"{spec.cu_count}cu-{spec.memory_mib}mi{dra.SHAPE_CLASS_SUFFIX}"


def shape_device_class(spec: GpuSpec) -> dict:
    """The DeviceClass of one GPU shape: gpu.rocshare.io's driver selector and shape_selector in one
    expression (the devices a subrequest of gpu.rocshare.io with the shape's selector could get)."""
    base = dra.device_class()
    driver = base["spec"]["selectors"][0]["cel"]["expression"]
    return {**base, "metadata": {"name": shape_class_name(spec), "labels": {"app.kubernetes.io/part-of": "rocshare"}},
            "spec": {"selectors": [{"cel": {"expression": f"{driver} && {shape_selector(spec)}"}}]}}


def shape_classes_of(claim: Mapping, shapes: Sequence[GpuSpec]) -> list[dict]:
    """The shape classes (shape_device_class) a claim spec written by claim_spec names, once each."""
    by_name = {shape_class_name(spec): spec for spec in shapes}
    named = {choice.get("deviceClassName") for request in (claim.get("devices") or {}).get("requests") or ()
             for choice in request.get("firstAvailable") or ()}
    return [shape_device_class(by_name[name]) for name in sorted(named) if name in by_name]


def _selection_selectors(selection: Selection) -> list[dict]:
    product = f"{_ATTRIBUTES}.{dra.ATTRIBUTE_PRODUCT}"
    terms = []
    if selection.use_types:
        terms.append(" || ".join(f"{product}.lowerAscii().contains({_cel_string(t)})" for t in selection.use_types))
    terms += [f"!{product}.lowerAscii().contains({_cel_string(t)})" for t in selection.nouse_types]
    if selection.use_uuids:
        terms.append(" || ".join(f"{_ATTRIBUTES}.{dra.ATTRIBUTE_UUID}.lowerAscii() == {_cel_string(u)}"
                                 for u in sorted(selection.use_uuids)))
    terms += [f"{_ATTRIBUTES}.{dra.ATTRIBUTE_UUID}.lowerAscii() != {_cel_string(u)}"
              for u in sorted(selection.nouse_uuids)]
    return [{"cel": {"expression": term}} for term in terms]


def _constraints(container: ContainerRequest, selection: Selection) -> list[dict]:
    constraints = []
    if container.gpus > 1:
        constraints.append({"requests": [REQUEST_NAME], "distinctAttribute": f"{dra.DRIVER_NAME}/{dra.ATTRIBUTE_UUID}"})
        if selection.numa_bind:
            constraints.append({"requests": [REQUEST_NAME], "matchAttribute": dra.ATTRIBUTE_NUMA_NODE})
        if selection.link_bind:
            constraints.append({"requests": [REQUEST_NAME],
                                "matchAttribute": f"{dra.DRIVER_NAME}/{dra.ATTRIBUTE_XGMI_HIVE}"})
    return constraints


def _cel_string(text: str) -> str:
    """A CEL string literal: the value is a lower-case name from an annotation, quoted safely."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


ALL_MODE_DEVICES = 32
"""What an ``allocationMode: All`` request may take, as Kubernetes' own quota counts it
(AllocationResultsMaxSize)."""


def claim_cost(requests: Sequence[Mapping], shapes: Sequence[GpuSpec], omitted: OmittedCores) -> Held:
    """The most a claim with these device requests (of rocshare's class) can hold once allocated, in
    quota units (rocshare.core.holdings.Held): per request, the largest of its choices (a
    ``firstAvailable`` list, as Kubernetes' quota counts devices); per choice, its count times what
    one device costs on the GPUs it can get (`shapes`; a subrequest written by `claim_spec` names
    its shape, others may land on any). Memory: what it asks, else the GPU's whole registered memory;
    cores: the percent of the GPU its compute is (rounded up), a whole GPU's 100 when it asks no
    capacity, and when it asks memory but no compute, 100 under omittedCores Exclusive, 0 under Shared
    (what the allocation will then consume). Raises RequestError on a request it cannot read."""
    total = Held()
    for request in requests:
        choices = [request["exactly"]] if request.get("exactly") else list(request.get("firstAvailable") or ())
        costs = [_choice_cost(choice, shapes, omitted) for choice in choices
                 if dra.is_rocshare_class(choice.get("deviceClassName"))]
        if costs:
            total = total + Held(max(c.memory_mib for c in costs), max(c.cores_pct for c in costs),
                                 max(c.gpus for c in costs))
    return total


def _choice_cost(choice: Mapping, shapes: Sequence[GpuSpec], omitted: OmittedCores) -> Held:
    mode = choice.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise RequestError(f"allocationMode {mode!r} cannot be counted against a quota")
    count = int(choice.get("count") or 1) if mode == "ExactCount" else ALL_MODE_DEVICES
    expressions = {(selector.get("cel") or {}).get("expression") for selector in choice.get("selectors") or ()}
    kinds = {kind for kind in {spec.partition_kind for spec in shapes}
             if kind and partition_selector(kind) in expressions}
    candidates = [spec for spec in shapes if shape_selector(spec) in expressions
                  or shape_class_name(spec) == choice.get("deviceClassName") or spec.partition_kind in kinds] \
        or list(shapes)
    if not candidates:
        raise RequestError("no GPU of a pool serving DRA is known yet, so what the claim may take cannot be counted")
    asked = (choice.get("capacity") or {}).get("requests") or {}
    try:
        memory_mib = (memory_mib_quantity(str(asked[dra.CAPACITY_MEMORY]), name=f"capacity {dra.CAPACITY_MEMORY}")
                      if dra.CAPACITY_MEMORY in asked else max(spec.memory_mib for spec in candidates))
        compute = (whole_quantity(str(asked[dra.CAPACITY_COMPUTE]), name=f"capacity {dra.CAPACITY_COMPUTE}",
                                  unit="CUs") if dra.CAPACITY_COMPUTE in asked else None)
    except QuantityError as error:
        raise RequestError(str(error)) from None
    if compute is not None:
        cores = max(cores_percent(min(compute, spec.cu_count), spec.cu_count) for spec in candidates)
    elif not asked:
        cores = WHOLE_PCT
    else:
        cores = omitted_cores_pct(omitted)
    return Held(memory_mib * count, cores * count, count)
