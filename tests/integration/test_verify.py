"""``txbroker verify`` as a user runs it: the workload against a real cluster, then the checker offline."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import REPO, LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("verify"), 3) as c:
        yield c.start()


def txbroker(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "cluster", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )


def count(text: str, name: str) -> int:
    m = re.search(rf"^\s+{re.escape(name)}\s+(\d+)$", text, re.MULTILINE)
    assert m, f"{name} not in the summary:\n{text}"
    return int(m.group(1))


@pytest.fixture(scope="module")
def recorded(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One 8 s run against the cluster: its history file and its summary (on a 2-core machine, about 250
    committed and 50 aborted transactions and 800 acknowledged sends: well above what the tests ask)."""
    path = tmp_path_factory.mktemp("verify-history") / "history.jsonl"
    bootstrap = ",".join(cluster.urls)
    res = txbroker("verify", "--bootstrap", bootstrap, "--duration", "8", "--record", str(path), "--seed", "7")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"history: {path}" in res.stderr
    return path, res.stdout


def test_verify_against_a_healthy_cluster_finds_no_anomaly(recorded: tuple[Path, str]) -> None:
    _path, out = recorded
    assert "VALID: no anomalies" in out
    for kind in ("lost-write", "duplicate", "aborted-read", "partial-transaction", "inconsistent-offsets",
                 "non-monotonic-poll", "producer-order", "phantom-read", "copy-lost", "copy-duplicate"):  # fmt: skip
        assert count(out, kind) == 0, kind
    assert count(out, "txns-committed") > 20
    assert count(out, "txns-aborted") > 0
    assert count(out, "acked-sends") > 100
    assert count(out, "records-read") > count(out, "acked-sends")
    assert count(out, "copy-records") == count(out, "copy-source-records") > 0


def test_the_recorded_history_checks_offline(recorded: tuple[Path, str]) -> None:
    path, _out = recorded
    res = txbroker("verify", "--history", str(path), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads(res.stdout)
    assert summary["valid"] is True
    assert summary["counts"]["txns-committed"] > 20
    assert summary["counts"].get("unverified-writes", 0) == 0  # the final drain covered every acknowledged write
    assert summary["availability"]["commits"] == summary["counts"]["txn-commit:ok"]
    assert summary["availability"]["windows"] == []


def test_a_planted_lost_write_fails_the_offline_check(recorded: tuple[Path, str], tmp_path: Path) -> None:
    path, _out = recorded
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    copied = next(op["copy"]["from"] for op in lines if op["type"] == "meta")
    victim = next(
        op for op in lines if op["type"] == "send" and op["outcome"] == "ok" and op["topic"] != copied
    )  # an acknowledged send outside the copied topic: erasing its reads leaves only the lost write
    for op in lines:
        if op["type"] == "poll":
            op["records"] = [r for r in op["records"] if not (r[0] == victim["topic"] and r[3] == victim["value"])]
    planted = tmp_path / "planted.jsonl"
    planted.write_text("".join(json.dumps(op) + "\n" for op in lines))
    res = txbroker("verify", "--history", str(planted))
    assert res.returncode == 1, res.stdout + res.stderr
    assert count(res.stdout, "lost-write") == 1
    assert f"lost-write: '{victim['value']}'" in res.stdout
    assert "INVALID: 1 anomalies" in res.stdout
