"""The DRA ResourceSlice codec (rocshare.core.resource_slices) on the real sysfs captures.

Every expected number is worked out here from the capture's facts (VRAM MiB x 2^20 bytes,
CU counts, WGP sizes), not read back from the codec.
"""

from __future__ import annotations

from rocshare.api import dra
from rocshare.api.models import GpuInfo, OmittedCores, OperatingMode, Partition, Sharing
from rocshare.core.resource_slices import (device_name, gpus_by_device, pool_slices, resource_slice, slice_devices,
                                          specs_by_device)
from rocshare_agent.discovery import discover

MIB = 1024 * 1024


def _capacity(device: dict, name: str) -> dict:
    return device["capacity"][name]


def test_vega10_one_shared_device_with_every_capacity_under_a_policy(sysfs):
    gpus = discover(sysfs / "vega10-1gpu").gpus
    [device] = slice_devices("node-a", gpus, Sharing())
    memory_bytes = 16368 * MIB  # mem_info_vram_total of the capture: 16 GiB less 16 MiB
    assert device["name"] == "gpu-c34ec50444dd0a6c"
    assert device["allowMultipleAllocations"] is True
    assert _capacity(device, "memory") == {"value": str(memory_bytes), "requestPolicy": {
        "default": str(memory_bytes), "validRange": {"min": str(MIB), "max": str(memory_bytes), "step": str(MIB)}}}
    # GCN: single CUs; an omitted request under Exclusive takes all 64.
    assert _capacity(device, "compute") == {"value": "64", "requestPolicy": {
        "default": "64", "validRange": {"min": "1", "max": "64", "step": "1"}}}
    assert _capacity(device, "shares") == {"value": "10", "requestPolicy": {"default": "1", "validValues": ["1"]}}
    assert all("requestPolicy" in capacity for capacity in device["capacity"].values())
    assert device["attributes"] == {
        "uuid": {"string": "GPU-c34ec50444dd0a6c"}, "productName": {"string": "AMD Radeon Instinct MI25"},
        "gfxTarget": {"string": "gfx900"}, "gfxTargetVersion": {"int": 90000}, "cuPerWGP": {"int": 1},
        "xgmiPeerCount": {"int": 0}, "resource.kubernetes.io/pciBusID": {"string": "0000:19:00.0"},
        "resource.kubernetes.io/numaNode": {"int": 0},
    }


def test_memory_scaling_registers_more_on_gcn_and_shared_cores_default_to_none(sysfs):
    gpus = discover(sysfs / "vega10-1gpu", split_count=4).gpus  # the agent discovers with the pool's splitCount
    sharing = Sharing(device_memory_scaling=2.0, omitted_cores=OmittedCores.SHARED, split_count=4)
    [device] = slice_devices("node-a", gpus, sharing)
    assert _capacity(device, "memory")["value"] == str(2 * 16368 * MIB)  # gfx900 has XNACK: scaled
    assert _capacity(device, "compute")["requestPolicy"] == {
        "default": "0", "validRange": {"min": "0", "max": "64", "step": "1"}}
    assert _capacity(device, "shares")["value"] == "4"


def test_rdna_compute_steps_in_whole_wgps_and_memory_is_never_scaled(sysfs):
    gpus = discover(sysfs / "strixpoint-apu").gpus
    [device] = slice_devices("apu", gpus, Sharing(device_memory_scaling=2.0))
    assert device["name"] == "gpu-pci-0000-c1-00-0"  # no unique_id: the id from the PCI address, as a DNS label
    assert _capacity(device, "memory")["value"] == str(15679 * MIB)  # RDNA has no XNACK: real VRAM
    assert _capacity(device, "compute") == {"value": "12", "requestPolicy": {
        "default": "12", "validRange": {"min": "2", "max": "12", "step": "2"}}}
    assert device["attributes"]["gfxTarget"] == {"string": "gfx1150"}
    assert device["attributes"]["cuPerWGP"] == {"int": 2}
    assert "resource.kubernetes.io/numaNode" not in device["attributes"]  # numa_node -1: unknown, left out


def test_rdna_odd_cu_count_offers_only_what_whole_wgps_cover():
    gpu = GpuInfo(id="GPU-0000000000000007", index=0, gfx_target_version=110000, vram_mib=1024, cu_count=13,
                  cu_per_wgp=2, pci_bdf="0000:03:00.0", split_count=10, healthy=True)
    [device] = slice_devices("n", [gpu], Sharing())
    assert _capacity(device, "compute") == {"value": "13", "requestPolicy": {
        "default": "12", "validRange": {"min": "2", "max": "12", "step": "2"}}}


def test_mi210_xgmi_hives_numa_and_unknown_vram(sysfs):
    gpus = discover(sysfs / "mi210-8gpu-xgmi").gpus
    devices = slice_devices("mi210", gpus, Sharing())
    assert [d["attributes"]["resource.kubernetes.io/pciBusID"]["string"] for d in devices] == [
        "0000:63:00.0", "0000:43:00.0", "0000:03:00.0", "0000:26:00.0",
        "0000:e3:00.0", "0000:c3:00.0", "0000:83:00.0", "0000:a3:00.0"]
    assert [d["attributes"]["resource.kubernetes.io/numaNode"]["int"] for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    hives = [d["attributes"]["xgmiHive"]["string"] for d in devices]
    assert {hive: hives.count(hive) for hive in hives} == {"0xaefdf8293fefa6b7": 4, "0xfb11632c00f4d272": 4}
    assert [d["attributes"]["xgmiHive"] for d in devices] == [{"string": g.hive_id} for g in gpus]
    assert {d["attributes"]["xgmiPeerCount"]["int"] for d in devices} == {3}
    # No VRAM source in this capture: 0 bytes, and only a claim asking no memory fits.
    assert {str(_capacity(d, "memory")) for d in devices} == {
        str({"value": "0", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "0"}}})}
    assert {_capacity(d, "compute")["value"] for d in devices} == {"104"}


def test_partitions_are_whole_unshared_devices_without_policies(sysfs):
    gpus = discover(sysfs / "mi300x-8gpu-cpx", operating_mode=OperatingMode.PARTITION).gpus
    devices = slice_devices("mi300x", gpus, Sharing(operating_mode=OperatingMode.PARTITION))
    assert len(devices) == 63 <= dra.SLICE_DEVICES_MAX
    assert len({d["name"] for d in devices}) == 63
    assert devices[0]["name"] == "gpu-e3aa140f9a5f9e31-p0"
    for device in devices:
        assert "allowMultipleAllocations" not in device
        assert device["capacity"] == {"memory": {"value": "0"}, "compute": {"value": "38"}}
        assert device["attributes"]["computePartition"] == {"string": "cpx"}
        assert "memoryPartition" not in device["attributes"]  # the capture has no memory partition mode
        assert device["attributes"]["gfxTarget"] == {"string": "gfx942"}


def test_unhealthy_devices_are_left_out_and_names_map_back(sysfs):
    gpus = discover(sysfs / "mi210-8gpu-xgmi").gpus
    sick = [gpu.model_copy(update={"healthy": False}) if gpu.index == 2 else gpu for gpu in gpus]
    devices = slice_devices("mi210", sick, Sharing())
    assert len(devices) == 7
    assert device_name(gpus[2].id) not in {d["name"] for d in devices}
    by_device = gpus_by_device(gpus)
    assert [by_device[d["name"]].pci_bdf for d in devices] == [g.pci_bdf for g in gpus if g.index != 2]


def test_the_slice_is_the_nodes_pool_owned_by_the_node(sysfs):
    gpus = discover(sysfs / "vega10-1gpu").gpus
    body = resource_slice(node_name="gpu-node-1", node_uid="u-1", gpus=gpus, sharing=Sharing(), generation=3)
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceSlice"
    assert body["metadata"]["name"] == "gpu-node-1-gpu.rocshare.io"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1", "uid": "u-1", "controller": True}]
    assert body["spec"]["driver"] == "gpu.rocshare.io" != "gpu.amd.com"
    assert body["spec"]["nodeName"] == "gpu-node-1"
    assert body["spec"]["pool"] == {"name": "gpu-node-1", "generation": 3, "resourceSliceCount": 1}
    assert len(body["spec"]["devices"]) == 1


def test_gfx_names_and_device_class():
    assert [dra.gfx_target(v) for v in (90402, 90010, 110000, 120001, 90008)] == [
        "gfx942", "gfx90a", "gfx1100", "gfx1201", "gfx908"]
    assert dra.device_class()["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "gpu.rocshare.io"'}}]


def test_the_shipped_device_class_is_the_codes():
    import yaml
    from pathlib import Path

    shipped = yaml.safe_load((Path(__file__).resolve().parents[3] / "manifests/base/dra/deviceclass.yaml").read_text())
    expected = dra.device_class()
    assert shipped["apiVersion"] == expected["apiVersion"] and shipped["kind"] == expected["kind"]
    assert shipped["metadata"]["name"] == expected["metadata"]["name"] == "gpu.rocshare.io"
    assert shipped["spec"] == expected["spec"]


def test_with_shared_counters_each_shared_gpu_has_a_whole_twin_consuming_its_one_counter(sysfs):
    """MI210 x 8 (cu mode): 16 devices, each GPU's whole twin listed before its shared device, both
    consuming the GPU's one counter, whose set is in the pool's second slice."""
    gpus = discover(sysfs / "mi210-8gpu-xgmi").gpus
    shared = slice_devices("mi210", gpus, Sharing())
    main, counters = pool_slices(node_name="mi210", node_uid="uid", gpus=gpus, sharing=Sharing(), generation=4,
                                 counters=True)
    assert main["metadata"]["name"] == "mi210-gpu.rocshare.io"
    assert counters["metadata"]["name"] == "mi210-gpu.rocshare.io-counters"
    for body in (main, counters):
        assert body["spec"]["pool"] == {"name": "mi210", "generation": 4, "resourceSliceCount": 2}
        assert body["metadata"]["ownerReferences"][0]["uid"] == "uid"
    assert "devices" not in counters["spec"] and "sharedCounters" not in main["spec"]  # the API's rule: one or other
    assert counters["spec"]["sharedCounters"] == [{"name": device["name"], "counters": {"gpu": {"value": "1"}}}
                                                  for device in shared]
    devices = main["spec"]["devices"]
    assert len(devices) == 16 <= dra.SLICE_DEVICES_WITH_COUNTERS_MAX
    for gpu, device, (twin, share) in zip(gpus, shared, zip(devices[::2], devices[1::2])):
        consumes = [{"counterSet": device["name"], "counters": {"gpu": {"value": "1"}}}]
        assert twin == {"name": f"{device_name(gpu.id)}-whole", "attributes": device["attributes"],
                        "capacity": {"memory": {"value": "0"}, "compute": {"value": "0"}}, "consumesCounters": consumes}
        assert share == {**device, "consumesCounters": consumes}
    # Both names map back to the GPU, for prepare and for accounting.
    specs = specs_by_device("mi210", gpus, Sharing())
    for gpu in gpus:
        assert gpus_by_device(gpus)[f"{device_name(gpu.id)}-whole"] == gpu
        assert specs[f"{device_name(gpu.id)}-whole"] is specs[device_name(gpu.id)]


def test_one_slice_without_counters_without_shared_gpus_or_past_the_apis_limits(sysfs):
    mi210 = discover(sysfs / "mi210-8gpu-xgmi").gpus
    cpx = discover(sysfs / "mi300x-8gpu-cpx").gpus  # 63 partitions: whole already, nothing to twin
    nine = [*mi210, mi210[0].model_copy(update={"id": "GPU-ninth", "index": 8})]  # 9 counter sets > 8
    single = resource_slice(node_name="n", node_uid="u", gpus=mi210, sharing=Sharing(), generation=1)
    assert pool_slices(node_name="n", node_uid="u", gpus=mi210, sharing=Sharing(), generation=1,
                       counters=False) == [single]
    for gpus in (cpx, nine):
        [body] = pool_slices(node_name="n", node_uid="u", gpus=gpus, sharing=Sharing(), generation=1, counters=True)
        assert body == resource_slice(node_name="n", node_uid="u", gpus=gpus, sharing=Sharing(), generation=1)
        assert not any("consumesCounters" in device for device in body["spec"]["devices"])


def test_a_partition_publishes_its_memory_partition_mode_when_known():
    info = GpuInfo(id="P-0", index=0, render_minor=128, gfx_target_version=90402, vram_mib=24576, cu_count=38,
                   pci_bdf="0000:05:00.1", split_count=1, healthy=True,
                   partition=Partition(computeMode="cpx", memoryMode="nps4", index=0, parentBDF="0000:05:00.0"))
    [device] = slice_devices("mi300x", [info], Sharing())
    assert (device["attributes"]["computePartition"], device["attributes"]["memoryPartition"]) == (
        {"string": "cpx"}, {"string": "nps4"})
