"""``txbroker verify --nemesis``: the workload over a namespaced cluster while nodes are killed and isolated.

Needs root, iproute2 and nftables (``verify.netns``); elsewhere it skips with the harness's reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import REPO
from tests.support.prometheus import artifacts_dir

netns = pytest.importorskip("verify.netns")
REASON = netns.unavailable_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.fault,
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=f"namespaced cluster unavailable: {REASON}"),
]


FAULTS = ["leader-isolation", "majority-split", "coordinator-isolation", "bridge", "kill", "pause"]
SINGLE_NODE = {"leader-isolation", "majority-split", "coordinator-isolation", "kill", "pause"}


def test_a_fault_campaign_finds_no_anomaly_and_the_majority_keeps_committing(tmp_path: Path) -> None:
    """One round of every fault class: zero anomalies, and while a single-node fault holds, commits on the
    majority side never stop for more than 5 s. A failure leaves the history in the test artifacts."""
    history = tmp_path / "nemesis.jsonl"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run(
        [sys.executable, "-m", "cluster", "verify", "--nemesis", "--duration", "44",
         "--faults", ",".join(FAULTS), "--fault-seconds", "4", "--quiet-seconds", "3", "--seed", "11",
         "--record", str(history), "--json", "--max-commit-gap", "5"],
        capture_output=True, text=True, timeout=900, env=env, cwd=REPO,
    )  # fmt: skip
    try:
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
        summary = json.loads(res.stdout)
        assert summary["valid"] is True, summary["anomalies"][:5]
        assert summary["counts"]["txns-committed"] > 0
        windows = summary["availability"]["windows"]
        assert [w["fault"] for w in windows] == FAULTS
        for w in windows:
            assert w["heal"] is not None and w["heal"] > w["start"]
            assert w["commit_recovery"] is not None, w  # commits came back after every heal
            if w["fault"] in SINGLE_NODE:
                assert len(w["nodes"]) == 1
                assert w["longest_commit_gap"] <= 5.0, w
        assert summary["commit_gap_exceeded"] is False
        faults = [json.loads(line) for line in history.read_text().splitlines() if '"type":"fault"' in line]
        assert [(f["kind"], f["fault"]) for f in faults][:4] == [
            ("start", "leader-isolation"), ("heal", "leader-isolation"),
            ("start", "majority-split"), ("heal", "majority-split"),
        ]  # fmt: skip
        m = re.search(r"namespaced cluster in (\S+)", res.stderr)
        assert m, res.stderr
        assert not Path(m.group(1)).exists()  # the run's cluster directory is gone with its nodes
    except AssertionError:
        if history.exists():
            shutil.copy(history, artifacts_dir("verify-nemesis") / history.name)
        raise


def test_verify_refuses_the_nemesis_against_a_given_cluster() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run(
        [sys.executable, "-m", "cluster", "verify", "--nemesis", "--bootstrap", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 2
    assert "never runs against --bootstrap" in res.stderr
