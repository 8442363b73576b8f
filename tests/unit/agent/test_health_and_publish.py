"""Health (device files, exporter text, matching) and the pure parts of publishing
(label values, transitions, Ready condition)."""

from __future__ import annotations

import pytest

from rocshare.api.models import GpuInfo, Partition
from rocshare_agent.health import (ExporterError, ExporterVerdict, apply_device_file_health, apply_exporter_health,
                                   parse_exporter_health)
from rocshare.api.node_settings import SettingsError
from rocshare_agent.inventory_loop import ready_condition, settings_from_node
from rocshare_agent.publish import health_transitions, node_labels, sanitize_label_value


def gpu(index: int, **overrides) -> GpuInfo:
    values = dict(id=f"GPU-{index}", index=index, gfx_target_version=90010, cu_count=104, pci_bdf=f"0000:0{index}:00.0",
                  split_count=10, healthy=True, render_minor=128 + index, product="AMD Instinct MI210",
                  device_id="0x740f", vram_mib=65520)
    return GpuInfo(**{**values, **overrides})


def test_device_files_missing_dangling_and_recovered(tmp_path):
    (tmp_path / "dri").mkdir()
    (tmp_path / "kfd").write_text("")
    (tmp_path / "dri" / "renderD128").write_text("")
    (tmp_path / "dri" / "renderD129").symlink_to(tmp_path / "gone")
    result = apply_device_file_health([gpu(0), gpu(1), gpu(2)], tmp_path)
    assert [g.healthy for g in result] == [True, False, False]
    assert "renderD129 cannot be opened" in result[1].health_reason
    (tmp_path / "dri" / "renderD129").unlink()
    (tmp_path / "dri" / "renderD129").write_text("")
    assert [g.healthy for g in apply_device_file_health(result, tmp_path)][:2] == [True, True]
    (tmp_path / "kfd").unlink()
    assert {g.health_reason.split(" ")[0] for g in apply_device_file_health(result, tmp_path)} == {str(tmp_path / "kfd")}


def test_exporter_text_with_prefix_and_partitions():
    text = ('# HELP amd_gpu_health health\n# TYPE amd_gpu_health gauge\n'
            'amd_gpu_health{gpu_id="0",serial_number="x"} 1\namd_gpu_health{gpu_id="1",gpu_partition_id="2"} 0\n'
            'gpu_temperature{gpu_id="0"} 40\n')
    assert parse_exporter_health(text) == [ExporterVerdict("0", None, True), ExporterVerdict("1", "2", False)]


@pytest.mark.parametrize("text", ["<html>nope</html>", "gpu_health{gpu_id=0 1", "other_metric 1\n", ""])
def test_exporter_garbage_raises_exporter_error(text):
    with pytest.raises(ExporterError):
        parse_exporter_health(text)


def test_exporter_verdicts_match_physical_gpus_and_partitions():
    def part(index, parent, k):
        return gpu(index, partition=Partition(compute_mode="cpx", index=k, parent_bdf=parent))
    gpus = [part(0, "0000:05:00.0", 0), part(1, "0000:05:00.0", 1), part(2, "0000:06:00.0", 0), part(3, "0000:06:00.0", 1)]
    result = apply_exporter_health(gpus, [ExporterVerdict("1", "1", False), ExporterVerdict("0", None, True)])
    assert [g.healthy for g in result] == [True, True, True, False]
    result = apply_exporter_health(gpus, [ExporterVerdict("0", None, False)])
    assert [g.healthy for g in result] == [False, False, True, True]


def test_label_values_are_sanitized():
    assert sanitize_label_value("Radeon RX 7900 XT/XTX") == "Radeon_RX_7900_XT_XTX"
    assert sanitize_label_value("  -weird!! name-- ") == "weird_name"
    assert len(sanitize_label_value("x" * 100)) == 63


def test_node_labels_and_mixed_nodes():
    labels = node_labels([gpu(0), gpu(1)])
    assert labels == {"amd.com/gpu.product-name": "AMD_Instinct_MI210", "amd.com/gpu.cu-count": "104",
                      "amd.com/gpu.vram": "64G", "amd.com/gpu.family": "AI", "amd.com/gpu.device-id": "740f"}
    mixed = node_labels([gpu(0), gpu(1, cu_count=96, gfx_target_version=110000, vram_mib=None)])
    assert mixed["amd.com/gpu.cu-count"] == "104_96" and mixed["amd.com/gpu.family"] == "AI_GC_11_0_0"
    assert node_labels([]) == {}


def test_transitions():
    healthy, sick = [gpu(0), gpu(1)], [gpu(0), gpu(1, healthy=False, health_reason="gone")]
    assert health_transitions(None, healthy) == []
    assert [t.reason for t in health_transitions(None, sick)] == ["AMDGPUUnhealthy"]
    assert [(t.reason, t.gpu_id, t.event_type) for t in health_transitions(healthy, sick)] == [("AMDGPUUnhealthy", "GPU-1", "Warning")]
    assert [(t.reason, t.event_type) for t in health_transitions(sick, healthy)] == [("AMDGPURecovered", "Normal")]
    assert [t.reason for t in health_transitions(healthy, [gpu(0)])] == ["AMDGPUMissing"]
    assert [t.reason for t in health_transitions([gpu(0)], healthy)] == ["AMDGPURecovered"]


def test_ready_condition_and_settings_defaults():
    assert ready_condition([]).reason == "NoGpus"
    assert ready_condition([gpu(0, healthy=False)]).status == "False"
    assert ready_condition([gpu(0)]).message == "1/1 GPUs healthy"
    with pytest.raises(SettingsError):  # never a guess: the agent then offers nothing (test_fail_closed.py)
        settings_from_node({"metadata": {"annotations": {"rocshare.io/pool-settings": "{bad"}}})
    assert settings_from_node({"metadata": {}}).pool == ""
