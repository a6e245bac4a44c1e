"""``txbroker cluster health`` and ``cluster status`` against a live 3-node cluster, through a node failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.support.cluster import REPO, LocalCluster, wait_for
from tests.support.writer import IdempotentWriter

pytestmark = pytest.mark.integration


def txbroker(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster", *args],
        capture_output=True, text=True, timeout=timeout, cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip


def test_health_and_status_follow_a_node_failure(make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = make_cluster(3)
    cluster.create_topic("orders", partitions=2, rf=3)
    IdempotentWriter(cluster, "orders").send(0, [b"a", b"b", b"c"])
    boot = ["--bootstrap", cluster.url(1)]

    def healthy_report() -> subprocess.CompletedProcess[str] | None:
        res = txbroker("cluster", "health", *boot)
        return res if res.returncode == 0 else None

    ok = wait_for(healthy_report, 30, "cluster health exit 0", interval=0.5)
    assert "Healthy:" in ok.stdout and "true" in ok.stdout and "Nodes down:" in ok.stdout, ok.stdout

    status = txbroker("cluster", "status", *boot)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].split() == ["NODE", "URL", "STATE", "CONTROLLER", "LEADERS", "REPLICAS", "RSS"]
    assert sum(1 for ln in lines if ln.startswith("orders ")) == 2
    row0 = next(ln.split() for ln in lines if ln.startswith("orders ") and ln.split()[1] == "0")
    assert row0[4] == "3", row0  # high watermark after 3 records
    followers = row0[7:]
    assert len(followers) == 2 and all(f.endswith(":0") for f in followers), row0

    cluster.kill(3)

    def unhealthy() -> dict[str, object] | None:
        res = txbroker("cluster", "health", "--format", "json", *boot)
        report = json.loads(res.stdout)
        # both partitions, once the one node 3 led has a new leader; the other nodes are ready again once the
        # internal groups node 3 led have ready leaders
        settled = report["under_replicated"] == {"orders": 2} and report["nodes_down"] == [3]
        return report if res.returncode == 10 and settled else None

    report = wait_for(unhealthy, 30, "health exit 10 with 2 under-replicated partitions", interval=0.5)
    assert report["nodes_down"] == [3] and report["healthy"] is False
    assert "nodes down or not ready: [3]" in report["reasons"]
    down_status = txbroker("cluster", "status", *boot).stdout
    assert "DOWN" in down_status and "3:down" in down_status, down_status

    cluster.start_node(3)
    waited = txbroker("cluster", "health", "--watch", "--exit-when-healthy", "--interval", "0.5", "--timeout", "60",
                      *boot)  # fmt: skip
    assert waited.returncode == 0, waited.stdout + waited.stderr
    final = dict(ln.rsplit(":", 1) for ln in waited.stdout.rsplit("=======================", 1)[1].strip().splitlines())
    assert final["Healthy"].strip() == "true" and final["Nodes down"].strip() == "[]", waited.stdout
