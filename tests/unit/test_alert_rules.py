"""Alert rules and scrape config: promtool checks, rule unit tests, exported metric names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from cluster.metrics import exported_series_names
from cluster.prometheus_config import render_prometheus_config, write_prometheus_files
from tests.support.prometheus import (
    ALERTS,
    ALERTS_TEST,
    OPS,
    PROMETHEUS_SYNTHETIC,
    REPO,
    alert_queries,
    metric_names,
    promtool,
)

REQUIRED = {
    "TxbrokerNodeDown",
    "TxbrokerNoController",
    "TxbrokerUnavailablePartitions",
    "TxbrokerUnderReplicatedPartitions",
    "TxbrokerHangingTransaction",
    "TxbrokerConsumerLagGrowing",
}


def _output(res: object) -> str:
    return res.stdout.decode() + res.stderr.decode()  # type: ignore[attr-defined]


def test_rules_pass_promtool_check() -> None:
    res = promtool("check", "rules", str(ALERTS))
    assert res.returncode == 0, _output(res)
    assert f"SUCCESS: {len(alert_queries())} rules found" in _output(res)


def test_rule_unit_tests_pass() -> None:
    res = promtool("test", "rules", ALERTS_TEST.name, cwd=ALERTS_TEST.parent)
    assert res.returncode == 0, _output(res)
    assert "SUCCESS" in _output(res)


def test_rule_unit_tests_fail_when_an_alert_misbehaves(tmp_path: Path) -> None:
    """The unit tests can fail: weaken the under-replicated rule and they must notice."""
    broken = ALERTS.read_text().replace(
        "sum by (job, topic) (txbroker_partitions_under_replicated) > 0",
        "sum by (job, topic) (txbroker_partitions_under_replicated) > 5",
    )
    assert broken != ALERTS.read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    (tmp_path / "alerts_test.yml").write_text(ALERTS_TEST.read_text())
    res = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert res.returncode != 0
    assert "TxbrokerUnderReplicatedPartitions" in _output(res)


def test_every_required_alert_exists_and_is_shown_firing_in_a_unit_test() -> None:
    names = {q.source.removeprefix("alert ") for q in alert_queries()}
    assert names >= REQUIRED
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t.get("alert_rule_test", []) if c.get("exp_alerts")}
    quiet = {c["alertname"] for t in tests for c in t.get("alert_rule_test", []) if not c.get("exp_alerts")}
    assert fired >= names, f"alerts never shown firing: {names - fired}"
    assert quiet, "no test shows an alert staying quiet"


def test_alerts_name_only_exported_metrics() -> None:
    exported = exported_series_names() | PROMETHEUS_SYNTHETIC
    for q in alert_queries():
        names = metric_names(q.expr)
        assert names and not names - exported, f"{q.source}: {sorted(names - exported)} not exported"


def test_scrape_config_written_by_cluster_init_is_valid(tmp_path: Path) -> None:
    urls = ["http://127.0.0.1:9091", "http://127.0.0.1:9092", "http://127.0.0.1:9093"]
    path = write_prometheus_files(tmp_path, urls)
    assert (tmp_path / "alerts.yml").read_text() == ALERTS.read_text()
    res = promtool("check", "config", str(path))
    assert res.returncode == 0, _output(res)
    cfg = yaml.safe_load(path.read_text())
    [job] = cfg["scrape_configs"]
    assert job["job_name"] == "txbroker" and job["static_configs"][0]["targets"] == [u[7:] for u in urls]
    assert cfg["rule_files"] == ["alerts.yml"]
    # `txbroker cluster init` itself writes a config promtool accepts, with the rules beside it
    init_dir = tmp_path / "init"
    run = subprocess.run(
        [sys.executable, "-m", "cluster", "cluster", "init", "--nodes", "3", "--dir", str(init_dir)],
        capture_output=True, cwd=str(REPO), timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()
    res = promtool("check", "config", str(init_dir / "prometheus.yml"))
    assert res.returncode == 0 and f"SUCCESS: {len(alert_queries())} rules found" in _output(res), _output(res)
    # the committed example is exactly what `txbroker cluster init` writes for the default ports
    assert (OPS / "prometheus" / "prometheus.yml").read_text() == render_prometheus_config(
        urls, rule_files=["alerts.yml"]
    )
