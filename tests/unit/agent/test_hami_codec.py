"""The HAMi compatibility codec (src/rocshare/api/hami.py): golden strings and round trips."""

from __future__ import annotations

import json

import pytest

from rocshare.api.allocation import AllocationRecord, ContainerAllocation, DeviceSlice
from rocshare.api.hami import (HamiContainerDevice, HamiFormatError, decode_node_register, decode_pod_devices,
                               encode_node_register, encode_pod_devices)
from rocshare.api.models import GpuInfo, OperatingMode


def gpu(**overrides) -> GpuInfo:
    values = dict(id="GPU-1901ead3a2ecd4a6", index=0, gfx_target_version=90010, cu_count=104, pci_bdf="0000:63:00.0",
                  split_count=10, healthy=True, product="AMD Instinct MI210", vram_mib=65520, numa=0,
                  xgmi_peers=["0000:03:00.0"])
    return GpuInfo(**{**values, **overrides})


def test_node_register_golden():
    text = encode_node_register([gpu(), gpu(id="GPU-2", index=1, numa=1, healthy=False, xgmi_peers=[], vram_mib=None)],
                                operating_mode=OperatingMode.CU, memory_scaling=1.5, compute_queues={"GPU-1901ead3a2ecd4a6": 24})
    assert text == (
        '[{"id":"GPU-1901ead3a2ecd4a6","count":10,"devmem":98280,"devcore":104,"type":"AMD Instinct MI210",'
        '"mode":"cu","health":true,"devicevendor":"AMD","custominfo":{"pciBDF":"0000:63:00.0","cuPerWGP":1,'
        '"xgmiPeers":["0000:03:00.0"],"computeQueues":24}},'
        '{"id":"GPU-2","index":1,"count":10,"devcore":104,"type":"AMD Instinct MI210","numa":1,"mode":"cu",'
        '"devicevendor":"AMD","custominfo":{"pciBDF":"0000:63:00.0","cuPerWGP":1}}]'
    )
    decoded = decode_node_register(text)
    assert decoded[1]["health"] is False and decoded[1]["devmem"] == 0 and decoded[0]["index"] == 0


@pytest.mark.parametrize("text", ["{", "{}", "[1]"])
def test_node_register_rejects_non_arrays(text):
    with pytest.raises(HamiFormatError):
        decode_node_register(text)


def record() -> AllocationRecord:
    return AllocationRecord(node="n", containers=[
        ContainerAllocation(name="main", devices=[
            DeviceSlice(gpu_id="GPU-a", memory_mib=4096, cu_count=26, cu_ranges=[(0, 25)]),
            DeviceSlice(gpu_id="GPU-b", memory_mib=65520, cu_count=104, whole=True),
        ]),
        ContainerAllocation(name="setup", init=True, devices=[DeviceSlice(gpu_id="GPU-a", memory_mib=1024, cu_count=2)]),
    ])


def test_pod_devices_golden_init_first():
    types = {"GPU-a": "AMD Instinct MI210", "GPU-b": "Radeon RX 7900 XT/XTX, rev:c8"}
    text = encode_pod_devices(record(), device_types=types)
    assert text == "GPU-a,AMD Instinct MI210,1024,2:;GPU-a,AMD Instinct MI210,4096,26:GPU-b,Radeon RX 7900 XT/XTX- rev-c8,65520,104:;"
    assert decode_pod_devices(text)[0] == [HamiContainerDevice("GPU-a", "AMD Instinct MI210", 1024, 2)]
    assert len(decode_pod_devices(text)[1]) == 2


def test_pod_devices_with_gpu_less_containers():
    text = encode_pod_devices(record(), device_types={}, container_names=["setup", "sidecar", "main"])
    assert text == "GPU-a,,1024,2:;;GPU-a,,4096,26:GPU-b,,65520,104:;"
    assert [len(container) for container in decode_pod_devices(text)] == [1, 0, 2]


@pytest.mark.parametrize("text", ["GPU-a,t,1,2:", "GPU-a,t,1:;", "GPU-a,t,x,2:;", "GPU-a,t,1,2;"])
def test_pod_devices_rejects_malformed(text):
    with pytest.raises(HamiFormatError):
        decode_pod_devices(text)


def test_register_is_plain_json():
    assert json.loads(encode_node_register([], operating_mode=OperatingMode.PARTITION)) == []
