"""The alerts of manifests/observability/alerts.yaml on a real Prometheus (the Debian package's, as the
dashboards test; `make observability-deps`) scraping a real operator and a real node agent.

The PrometheusRule's groups are loaded as a rule file, as the Prometheus Operator does. Checked:
every rule evaluates without error; every series a rule names is one rocshare really exports (at
least one sample scraped); with one replica running and leading, the standby alert is pending and
the alerts of a stopped or leaderless operator are not; when the node's agent stops, its alert
becomes pending, and when the operator is killed, RocshareOperatorDown does.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rocshare.api.models import API_VERSION
from rocshare_dev.devcluster.controlplane import PROJECT_ROOT
from rocshare_dev.devcluster.operator_proc import OperatorProcess
from rocshare_dev.devcluster.simnode import SimulatedNode
from tests.e2e.fleet import mi210_with_synthetic_vram
from tests.e2e.prometheus import SCRAPE_S, Prometheus, free_port

pytestmark = pytest.mark.e2e

ALERTS = PROJECT_ROOT / "manifests" / "observability" / "alerts.yaml"
SERIES = re.compile(r"\b((?:rocshare|hami)_[a-z_]+)\b")


@dataclass
class Setting:
    prometheus: Prometheus
    operator: OperatorProcess
    node: SimulatedNode


def rule_groups() -> dict:
    return {"groups": yaml.safe_load(ALERTS.read_text())["spec"]["groups"]}


def rules() -> list[dict]:
    return [rule for group in rule_groups()["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def setting(cluster, tmp_path_factory, sysfs_fixtures) -> Iterator[Setting]:
    work = tmp_path_factory.mktemp("alerts")
    (work / "rules.yaml").write_text(yaml.safe_dump(rule_groups()))
    operator = OperatorProcess(cluster)
    monitor_port = free_port()
    node = SimulatedNode(name="alerts-0", kubeconfig=cluster.kubeconfig, work_dir=work,
                         sysfs_root=mi210_with_synthetic_vram(sysfs_fixtures, work),
                         labels={"rocshare.io/sim": "alerts"},
                         agent_args=(f"--monitor-port={monitor_port}", "--monitor-addr=127.0.0.1"))
    prometheus = Prometheus(work, operator=f"127.0.0.1:{operator.metrics_port}",
                            agents={node.name: f"127.0.0.1:{monitor_port}"}, rule_files=(work / "rules.yaml",))
    try:
        operator.start()
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps({
            "apiVersion": API_VERSION, "kind": "AmdGpuPool", "metadata": {"name": "alerts"},
            "spec": {"nodeSelector": {"rocshare.io/sim": "alerts"}}}))
        node.start()
        prometheus.wait_ready()
        _wait(lambda: len(prometheus.query("up == 1", time.time())) == 2, "both targets scraped")
        yield Setting(prometheus, operator, node)
    finally:
        prometheus.stop()
        cluster.kubectl("delete", "amdgpupool", "alerts", "--ignore-not-found", "--timeout=30s", check=False)
        node.stop()
        operator.stop()


def _wait(check, what: str, timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def evaluated_rules(prometheus: Prometheus) -> dict[str, dict]:
    groups = prometheus.get("/api/v1/rules", type="alert")["groups"]
    return {rule["name"]: rule for group in groups for rule in group["rules"]}


def active(prometheus: Prometheus) -> dict[str, str]:
    """alert name -> state (pending or firing) of the active alerts."""
    return {alert["labels"]["alertname"]: alert["state"] for alert in prometheus.get("/api/v1/alerts")["alerts"]}


def test_every_rule_evaluates_without_error(setting: Setting) -> None:
    names = {rule["alert"] for rule in rules()}

    def evaluated_twice() -> dict[str, dict] | None:
        found = evaluated_rules(setting.prometheus)
        done = set(found) == names and all(rule.get("lastEvaluation", "").startswith("20") for rule in found.values())
        return found if done else None

    time.sleep(2 * SCRAPE_S)
    found = _wait(evaluated_twice, "every rule evaluated")
    broken = {name: rule.get("lastError") for name, rule in found.items() if rule["health"] != "ok"}
    assert not broken, broken


def test_every_series_a_rule_names_is_exported(setting: Setting) -> None:
    named = {name for rule in rules() for name in SERIES.findall(rule["expr"])}
    assert {"rocshare_extender_leading", "rocshare_extender_decisions_total"} <= named
    missing = sorted(name for name in named if not exported(setting.prometheus, name))
    assert not missing, f"rules name series nobody exports: {missing}"


def exported(prometheus: Prometheus, name: str) -> bool:
    """Scraped with samples, or declared by a target (HELP/TYPE: a family with no series yet, such as
    rocshare_unaccountable_pods while every pod is accountable)."""
    if prometheus.query(f'count({{__name__="{name}"}})', time.time()):
        return True
    family = re.sub(r"_(bucket|count|sum)$", "", name)
    return bool(prometheus.get("/api/v1/metadata", metric=family))


def test_one_leading_replica_raises_only_the_standby_alert(setting: Setting) -> None:
    states = _wait(lambda: (found := active(setting.prometheus)) and "RocshareNoStandby" in found and found,
                   "RocshareNoStandby active")
    assert states["RocshareNoStandby"] in ("pending", "firing")
    quiet = {"RocshareOperatorDown", "RocshareNoDecider", "RocshareTwoDeciders", "RocshareNodeAgentDown"}
    assert not quiet & set(states)
    leading = setting.prometheus.query("sum(rocshare_extender_leading)", time.time())
    assert list(leading.values()) == [1.0]


def test_a_stopped_agent_and_a_killed_operator_raise_their_alerts(setting: Setting) -> None:
    setting.node.stop()
    _wait(lambda: "RocshareNodeAgentDown" in active(setting.prometheus), "RocshareNodeAgentDown active")
    setting.operator.kill()
    _wait(lambda: "RocshareOperatorDown" in active(setting.prometheus), "RocshareOperatorDown active")
