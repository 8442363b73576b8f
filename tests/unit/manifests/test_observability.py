"""The Grafana dashboard and ServiceMonitors: valid JSON, every metric it charts is one the
code exports (so a rename breaks this test, not the dashboard), scrape ports match Services."""

from __future__ import annotations

import json
import re

from tests.unit.manifests.rendering import ROOT, find, render

DASHBOARD = ROOT / "manifests" / "observability" / "grafana-dashboard.json"
SOURCES = [ROOT / "operator/rocshare_operator/extender/metrics.py", ROOT / "nodeagent/rocshare_agent/monitor.py"]
REQUIRED = {"rocshare_extender_request_duration_seconds", "rocshare_extender_decisions_total",
            "hami_gpu_memory_limit_bytes", "hami_gpu_memory_allocated_bytes", "hami_gpu_core_allocated_ratio",
            "hami_gpu_shared_count", "hami_vgpu_memory_allocated_bytes", "hami_vgpu_core_allocated_ratio",
            "hami_resource_quota_used", "hami_resource_quota_limit", "hami_vgpu_memory_used_bytes",
            "hami_vgpu_memory_limit_bytes", "hami_container_device_utilization_ratio", "hami_host_gpu_utilization_ratio",
            "hami_host_gpu_memory_used_bytes"}


def charted_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    names = set(re.findall(r"\b((?:rocshare|hami)_[a-z_]+)", " ".join(exprs)))
    # A histogram's series (_bucket, _count, _sum) chart the histogram; hami_gpu_shared_count is a gauge.
    return {re.sub(r"(_seconds)_(bucket|count|sum)$", r"\1", name) for name in names}


def test_dashboard_charts_the_required_metrics() -> None:
    assert REQUIRED <= charted_metrics()


def test_every_charted_metric_is_exported_by_the_code() -> None:
    code = "".join(path.read_text() for path in SOURCES)
    missing = {name for name in charted_metrics() if f'"{name}"' not in code}
    assert not missing


def test_dashboard_panels_do_not_overlap_and_have_unique_ids() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells = set()
    for panel in panels:
        box = panel["gridPos"]
        for x in range(box["x"], box["x"] + box["w"]):
            for y in range(box["y"], box["y"] + box["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))


def test_service_monitors_scrape_the_metrics_services() -> None:
    base = render("manifests/base")
    for monitor in (obj for obj in render("manifests/observability") if obj["kind"] == "ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        services = [obj for obj in base if obj["kind"] == "Service"
                    and selector.items() <= obj["metadata"].get("labels", {}).items()]
        assert len(services) == 1, monitor["metadata"]["name"]
        assert monitor["spec"]["endpoints"][0]["port"] in {port["name"] for port in services[0]["spec"]["ports"]}


def test_dashboard_config_map_carries_the_json() -> None:
    config_map = find(render("manifests/observability"), "ConfigMap", "rocshare-grafana-dashboard")
    assert json.loads(config_map["data"]["rocshare.json"]) == json.loads(DASHBOARD.read_text())
