"""The monitor served over HTTP on a free port and scraped like Prometheus would."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from rocshare_agent.monitor import start_monitor

SYSFS = (Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "sysfs").resolve()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_scrape_over_http(tmp_path):
    port = free_port()
    server, thread = start_monitor(sysfs_root=SYSFS / "strixpoint-apu", proc_root=tmp_path, port=port, addr="127.0.0.1",
                                  node_name="apu")
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
        thread.join(timeout=5)
    samples = {sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples}
    assert samples["rocshare_host_gpu_temperature_celsius"] == 38.0
    assert samples["hami_host_gpu_utilization_ratio"] == 3.0
    assert "hami_vgpu_memory_used_bytes" not in samples  # no GPU processes in the empty proc root
