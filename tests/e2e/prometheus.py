"""A real Prometheus server for e2e tests: the Debian package's binary (`make observability-deps`)
on a free loopback port, its own storage in a temp folder, scraping loopback targets only;
queries through its HTTP API. Stopped by the test that started it.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

SCRAPE_S = 5

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    """A real Prometheus server on a loopback port, scraping loopback targets every SCRAPE_S seconds
    (generous: on a loaded 2-core machine a monitor's scrape of the 63-partition MI300X can take
    over a second, and a failed scrape marks every series of its target stale)."""

    def __init__(self, work: Path, *, operator: str, agents: dict[str, str], rule_files: tuple[Path, ...] = ()) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is not installed: run `make observability-deps` (Debian package prometheus)"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                             "evaluation_interval": f"{SCRAPE_S}s"},
                  "scrape_configs": [
                      {"job_name": "rocshare-operator", "static_configs": [{"targets": [operator]}]},
                      # As manifests/observability's ServiceMonitor: the monitor's own labels win,
                      # the target's node label fills in where a series has none.
                      {"job_name": "rocshare-node-agent", "honor_labels": True,
                       "static_configs": [{"targets": [address], "labels": {"node": node}}
                                          for node, address in agents.items()]}]}
        if rule_files:  # Prometheus rule files (a PrometheusRule's spec, as its operator writes them)
            config["rule_files"] = [str(path) for path in rule_files]
        (work / "prometheus.yml").write_text(json.dumps(config))
        self.log = work / "prometheus.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.started = time.time()

    def get(self, path: str, **params: str) -> dict:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params, doseq=True)}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"prometheus exited: {self.log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout_s} s; see {self.log}")

    def query(self, expr: str, at: float) -> dict[frozenset, float]:
        data = self.get("/api/v1/query", query=expr, time=f"{at:.3f}")
        assert data["resultType"] == "vector", data
        return {frozenset(item["metric"].items()): float(item["value"][1]) for item in data["result"]}

    def label_values(self, metric: str, label: str) -> set[str]:
        return set(self.get(f"/api/v1/label/{label}/values", **{"match[]": metric}))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
