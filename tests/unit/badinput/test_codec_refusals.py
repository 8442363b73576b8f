"""Bad input to the codecs, case by case: every refusal is the codec's documented error type
and its message says what is wrong (the allocation record, the node's pool settings, and the
HAMi compatibility annotations)."""

from __future__ import annotations

import json

import pytest

from rocshare.api.allocation import AllocationError, decode_record
from rocshare.api.hami import HamiFormatError, decode_node_register, decode_pod_devices
from rocshare.api.node_settings import SettingsError, decode_settings

GOOD_DEVICE = {"gpuId": "GPU-1", "memoryMiB": 1024, "cuCount": 4, "cuRanges": [[0, 3]]}


def record(**changes) -> str:
    data = {"version": 1, "node": "n1", "containers": [{"name": "c0", "devices": [dict(GOOD_DEVICE)]}]}
    data.update(changes)
    return json.dumps(data)


def device(**changes) -> str:
    return record(containers=[{"name": "c0", "devices": [{**GOOD_DEVICE, **changes}]}])


RECORDS = [
    ("truncated JSON", record()[:-7], "is not JSON"),
    ("a JSON array", "[]", "must be a JSON object, got list"),
    ("a JSON string", '"forged"', "must be a JSON object, got str"),
    ("no version", json.dumps({"node": "n1", "containers": []}), "unsupported version None"),
    ("a future version", record(version=2), "unsupported version 2"),
    ("version as text", record(version="1"), "unsupported version '1'"),
    ("empty node name", record(node=""), "node"),
    ("no containers", record(containers=[]), "containers"),
    ("a container without devices", record(containers=[{"name": "c0", "devices": []}]), "devices"),
    ("negative memory", device(memoryMiB=-1), "memoryMiB"),
    ("memory as text", device(memoryMiB="lots"), "memoryMiB"),
    ("a reversed CU range", device(cuRanges=[[9, 3]]), "CU range 9-3 is not a valid inclusive range"),
    ("a negative CU index", device(cuRanges=[[-4, 3]]), "CU range -4-3"),
    ("a CU range of three numbers", device(cuRanges=[[0, 1, 2]]), "cuRanges"),
    ("an empty GPU id", device(gpuId=""), "gpuId"),
    ("an unknown field", device(stolen=True), "stolen"),
]


@pytest.mark.parametrize(("text", "message"), [(text, message) for _, text, message in RECORDS],
                         ids=[case for case, _, _ in RECORDS])
def test_bad_allocation_records_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(AllocationError) as refused:
        decode_record(text)
    assert message in str(refused.value)
    assert "rocshare.io/allocation" in str(refused.value)


SETTINGS = [
    ("truncated JSON", '{"version":1,"pool":"p"', "is invalid at (root)"),
    ("wrong type of pool", '{"version":1,"pool":7}', "is invalid at pool"),
    ("no pool", '{"version":1}', "is invalid at pool"),
    ("a future version", '{"version":2,"pool":"p"}', "is invalid at version"),
    ("split count as text", '{"version":1,"pool":"p","sharing":{"splitCount":"many"}}', "sharing.splitCount"),
    ("unknown operating mode", '{"version":1,"pool":"p","sharing":{"operatingMode":"mig"}}', "sharing.operatingMode"),
    ("a JSON array", "[]", "is invalid at (root)"),
]


@pytest.mark.parametrize(("text", "message"), [(text, message) for _, text, message in SETTINGS],
                         ids=[case for case, _, _ in SETTINGS])
def test_bad_pool_settings_are_refused_with_where(text: str, message: str) -> None:
    with pytest.raises(SettingsError) as refused:
        decode_settings(text)
    assert message in str(refused.value) and "rocshare.io/pool-settings" in str(refused.value)


@pytest.mark.parametrize(("text", "message"), [
    ('[{"id":"GPU-1"', "not JSON"),
    ('{"id":"GPU-1"}', "JSON array of objects"),
    ('[1, 2]', "JSON array of objects"),
])
def test_bad_hami_node_register(text: str, message: str) -> None:
    with pytest.raises(HamiFormatError) as refused:
        decode_node_register(text)
    assert message in str(refused.value)


def test_hami_node_register_fills_omitted_fields_with_zero_values() -> None:
    assert decode_node_register('[{"id":"GPU-1"}]')[0]["devmem"] == 0


@pytest.mark.parametrize(("text", "message"), [
    ("GPU-1,MI210,1024,26:", "must end each container with ';'"),
    ("GPU-1,MI210,1024,26;", "must end each device with ':'"),
    ("GPU-1,MI210,1024:;", "must be UUID,Type,MemMiB,CUcount"),
    ("GPU-1,MI210,lots,26:;", "non-integer memory or CU count"),
])
def test_bad_hami_pod_devices(text: str, message: str) -> None:
    with pytest.raises(HamiFormatError) as refused:
        decode_pod_devices(text)
    assert message in str(refused.value)
