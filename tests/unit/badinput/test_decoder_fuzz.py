"""Every decoder fuzzed with hypothesis: arbitrary text and arbitrary JSON-shaped values either
decode or raise the decoder's documented error type; nothing else escapes.

Decoders: the allocation record, the node's pool settings, both HAMi annotations, the pod
request parser, the KFD/DRM sysfs parsers, the exporter's health text, and the extender's
request JSON (filter, prioritize, bind handlers).
"""

from __future__ import annotations

import json

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocshare.api.allocation import AllocationError, decode_record
from rocshare.api.hami import HamiFormatError, decode_node_register, decode_pod_devices
from rocshare.api.node_settings import SettingsError, decode_settings
from rocshare.core.request import RequestError, parse_pod
from rocshare_agent.discovery.drm import RawDrmDevice, parse_drm_device
from rocshare_agent.discovery.kfd import KfdParseError, RawKfdNode, parse_link, parse_node, parse_properties
from rocshare_agent.health import ExporterError, parse_exporter_health
from rocshare_operator.extender.binder import Binder
from rocshare_operator.extender.metrics import ExtenderMetrics
from rocshare_operator.extender.server import BadRequest, ExtenderService
from rocshare_operator.extender.state import SchedulerState

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20)

# Values near the real shapes find deeper paths than noise alone.
device = st.fixed_dictionaries({"gpuId": st.text(max_size=8), "memoryMiB": json_values, "cuCount": json_values},
                               optional={"cuRanges": json_values, "whole": json_values, "reservesAllCores": json_values})
record_like = st.fixed_dictionaries({"version": st.sampled_from([1, 1, 1, 2, "1", None]), "node": json_values,
                                     "containers": st.lists(st.fixed_dictionaries(
                                         {"name": json_values, "devices": st.lists(device, max_size=3)}), max_size=3)})
texts = st.text(max_size=200) | json_values.map(json.dumps) | record_like.map(json.dumps)


@FUZZ
@given(texts)
def test_allocation_record(text: str) -> None:
    try:
        decode_record(text)
    except AllocationError:
        pass


@FUZZ
@given(st.text(max_size=200) | json_values.map(json.dumps))
def test_pool_settings(text: str) -> None:
    try:
        decode_settings(text)
    except SettingsError:
        pass


@FUZZ
@given(st.text(max_size=200) | json_values.map(json.dumps))
def test_hami_node_register(text: str) -> None:
    try:
        decode_node_register(text)
    except HamiFormatError:
        pass


@FUZZ
@given(st.text(alphabet=st.sampled_from("GPU-1,:;0123abc "), max_size=80) | st.text(max_size=80))
def test_hami_pod_devices(text: str) -> None:
    try:
        decode_pod_devices(text)
    except HamiFormatError:
        pass


resource_value = json_values | st.sampled_from(["1", "0", "100", "101", "-1", "1.5", "2Gi", "", " 7 "])
container = st.fixed_dictionaries({"name": json_values}, optional={"resources": st.fixed_dictionaries(
    {}, optional={"limits": st.dictionaries(st.sampled_from(["amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores",
                                                             "amd.com/gpumem-percentage"]), resource_value),
                  "requests": json_values})})
pod_like = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": st.text(max_size=8)}, optional={"annotations": st.dictionaries(
        st.sampled_from(["amd.com/numa-bind", "amd.com/link-bind", "amd.com/use-gputype", "amd.com/nouse-gpu-uuid",
                         "hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy"]), st.text(max_size=10))}),
    "spec": st.fixed_dictionaries({"containers": st.lists(container, max_size=3)},
                                  optional={"initContainers": st.lists(container, max_size=2)})})


@FUZZ
@given(pod_like)
def test_pod_requests(pod: dict) -> None:
    try:
        parse_pod(pod)
    except RequestError:
        pass


property_lines = st.lists(st.tuples(st.sampled_from(["simd_count", "simd_per_cu", "gfx_target_version", "location_id",
                                                     "domain", "drm_render_minor", "unique_id", "cpu_cores_count",
                                                     "node_to", "type", "size_in_bytes", "garbage"]),
                                    st.text(max_size=12) | st.integers(-2**65, 2**65).map(str)), max_size=12)


@FUZZ
@given(property_lines | st.text(max_size=200).map(lambda text: [("", text)]), st.lists(st.text(max_size=60), max_size=3))
def test_kfd_node(lines: list[tuple[str, str]], extra: list[str]) -> None:
    text = "\n".join(f"{key} {value}" for key, value in lines)
    parse_properties(text)
    parse_link(text)
    try:
        parse_node(RawKfdNode(1, "/sys/x", text, gpu_id_text=extra[0] if extra else None,
                              link_texts=tuple(extra), mem_bank_texts=tuple(extra)))
    except KfdParseError:
        pass


DRM_FILES = ("uevent", "mem_info_vram_total", "product_name", "numa_node", "unique_id", "current_compute_partition",
             "current_memory_partition", "device")


@FUZZ
@given(st.lists(st.text(max_size=40) | st.none() | st.sampled_from(["PCI_SLOT_NAME=0000:zz:00.0", "0x", "-1"]),
                min_size=len(DRM_FILES), max_size=len(DRM_FILES)), st.text(max_size=20) | st.none())
def test_drm_device(values: list[str | None], link_name: str | None) -> None:
    parse_drm_device(RawDrmDevice(0, "/sys/class/drm/card0/device", dict(zip(DRM_FILES, values)), link_name))


@FUZZ
@given(st.text(max_size=300) | st.lists(st.tuples(st.sampled_from(["gpu_health", "amd_gpu_health", "x"]),
                                                  st.text(max_size=6), st.text(max_size=6)), max_size=4)
       .map(lambda rows: "\n".join(f'{name}{{gpu_id="{label}"}} {value}' for name, label, value in rows)))
def test_exporter_text(text: str) -> None:
    try:
        parse_exporter_health(text)
    except ExporterError:
        pass


def service() -> ExtenderService:
    state = SchedulerState()
    return ExtenderService(state, Binder(kube=None, state=state), ExtenderMetrics(state), ready=lambda: True)


extender_args = st.dictionaries(st.sampled_from(["Pod", "Nodes", "NodeNames", "PodName", "PodNamespace", "PodUID",
                                                 "Node"]), json_values | pod_like, max_size=5)


@FUZZ
@given(extender_args)
async def test_extender_filter_and_prioritize(args: dict) -> None:
    extender = service()
    for verb in (extender.filter, extender.prioritize):
        try:
            reply = await verb(args)
        except BadRequest:
            continue
        orjson.loads(orjson.dumps(reply))  # what the server writes is JSON
