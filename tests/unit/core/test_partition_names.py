"""Partitions named by kind (mixed resource naming): the names, the request rule (N whole
partitions of one kind, alone), fit only on GPUs offered under that kind, and the scheduler
configuration routing every kind to the extender."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rocshare.api.models import GpuInfo, OperatingMode, Partition, ResourceNaming, Sharing
from rocshare.api.resource_names import (GPU_RESOURCE, PARTITION_RESOURCES, is_gpu_resource, named, partition_modes,
                                         resource_for)
from rocshare.core.allocate import allocate
from rocshare.core.fit import FitFailure
from rocshare.core.inventory import NodeInventory
from rocshare.core.ledger import Ledger
from rocshare.core.policies import Policy
from rocshare.core.request import RequestError, parse_pod

SCHEDULER_CONFIG = Path(__file__).resolve().parents[3] / "manifests" / "base" / "scheduler" / "kube-scheduler-config.yaml"


def partition(index: int, compute: str = "cpx", memory: str | None = "nps4") -> GpuInfo:
    return GpuInfo(id=f"P-{index}", index=index, render_minor=128 + index, gfx_target_version=90402, vram_mib=24576,
                   cu_count=38, pci_bdf=f"0000:05:00.{index}", split_count=1, healthy=True,
                   partition=Partition(computeMode=compute, memoryMode=memory, index=index, parentBDF="0000:05:00.0"))


MIXED = Sharing(operatingMode="partition", resourceNaming="mixed")


@pytest.mark.parametrize(("gpu", "sharing", "name"), [
    (partition(0), MIXED, "amd.com/cpx_nps4"),
    (partition(0, "SPX", "NPS1"), MIXED, "amd.com/spx_nps1"),
    (partition(0, memory=None), MIXED, "amd.com/cpx"),
    (partition(0), Sharing(operatingMode="partition"), GPU_RESOURCE),  # single naming, the default
    (partition(0, "mig"), MIXED, GPU_RESOURCE),  # not a mode AMD names: the single name
])
def test_names(gpu: GpuInfo, sharing: Sharing, name: str) -> None:
    assert resource_for(gpu, naming=sharing.resource_naming, operating_mode=sharing.operating_mode) == name
    assert is_gpu_resource(name)


def _pod(**limits: str) -> dict:
    return {"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}


def test_a_container_asks_for_whole_partitions_of_one_kind() -> None:
    (container,) = parse_pod(_pod(**{"amd.com/cpx_nps4": "2"})).containers
    assert (container.gpus, container.resource, container.whole) == (2, "amd.com/cpx_nps4", True)
    assert parse_pod(_pod(**{"amd.com/cpx_nps4": "1k"})).containers[0].gpus == 1000  # read as Kubernetes writes it


@pytest.mark.parametrize("limits", [
    {"amd.com/cpx_nps4": "1", "amd.com/gpu": "1"},
    {"amd.com/cpx_nps4": "1", "amd.com/gpumem": "1024"},
    {"amd.com/cpx_nps4": "1", "amd.com/spx_nps1": "1"},
])
def test_a_kind_goes_alone(limits: dict) -> None:
    with pytest.raises(RequestError, match="whole partitions of one kind"):
        parse_pod(_pod(**limits))


def test_fit_takes_only_partitions_of_the_kind_asked() -> None:
    gpus = named([partition(0), partition(1), partition(2, "spx", "nps1")], MIXED)
    node = NodeInventory.from_gpu_infos("n1", gpus, MIXED)
    record = allocate(node, Ledger().usage(node), parse_pod(_pod(**{"amd.com/cpx_nps4": "2"})), Policy())
    assert not isinstance(record, FitFailure)
    assert sorted(device.gpu_id for device in record.containers[0].devices) == ["P-0", "P-1"]
    too_many = allocate(node, Ledger().usage(node), parse_pod(_pod(**{"amd.com/cpx_nps4": "3"})), Policy())
    assert isinstance(too_many, FitFailure) and "CardTypeMismatch" in " ".join(too_many.summary())
    single = allocate(node, Ledger().usage(node), parse_pod(_pod(**{"amd.com/gpu": "1"})), Policy())
    assert isinstance(single, FitFailure)  # nothing on this node is offered as amd.com/gpu


def test_the_scheduler_sends_every_kind_to_the_extender() -> None:
    # No managedResources: every pod of the profile goes to the extender (GPU-less ones too, so the
    # policy ranks them); kube-scheduler's fit ignores every amd.com name, partition kinds included.
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    assert not config["extenders"][0].get("managedResources")
    fit = next(entry["args"] for entry in config["profiles"][0]["pluginConfig"] if entry["name"] == "NodeResourcesFit")
    groups = set(fit["ignoredResourceGroups"])
    assert all(name.split("/")[0] in groups for name in (*PARTITION_RESOURCES, GPU_RESOURCE))


def test_partition_modes_read_back_every_name_mixed_naming_gives():
    for name in PARTITION_RESOURCES:
        compute, memory = partition_modes(name)
        assert resource_for(partition(0, compute, memory), naming=ResourceNaming.MIXED,
                            operating_mode=OperatingMode.PARTITION) == name
    with pytest.raises(ValueError, match="amd.com/gpu is not a partition kind"):
        partition_modes(GPU_RESOURCE)
