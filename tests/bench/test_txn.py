"""``txbroker bench txn``'s produce and cycle parts run end to end on one short round (numbers in BENCHMARKS.md).

One run of the bench (one cluster) serves both tests: each checks the report of its own part.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from typing import Any

import pytest

from bench.txn import main

pytestmark = pytest.mark.integration

# Every topic's partitions are led by their preferred replicas before the bench measures anything: the leader
# balancer hands them back at once instead of after its default 10 s hold.
BALANCED_AT_ONCE = ["--node-setting", "leader_balance_hold_s=0", "--node-setting", "leader_balance_interval_s=0.2"]


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    # The produce part covers every mode: the A/A control left out (its flag), a pipelined producer added.
    argv = ["--only", "produce", "cycle", "--produce-windows", "1", "--window", "1.6", "--window-warmup", "0.3",
            "--no-aa-control", "--pipelined", "--duration", "2", "--warmup", "0.5", *BALANCED_AT_ONCE]  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    printed: dict[str, Any] = json.loads(out.getvalue())
    assert rc == 0, printed
    assert all(printed["leaders_balanced"].values()), printed["leaders_balanced"]
    return printed


def test_produce_part_compares_every_mode_and_the_floor_control_commits(report: dict[str, Any]) -> None:
    res = report["produce"]
    assert res["leader_changes_seen_by_nodes"] == 0
    assert "aa_control" not in res and "control" not in res["nodes_cpu_us_per_record"]
    # Every mode acknowledged records in its window, and the transactional one committed every ~100 ms.
    for mode in ("idempotent", "transactional", "flushing", "one_write", "pipelined"):
        assert res["nodes_cpu_us_per_record"][mode] > 0, mode
        # The broker's own CPU leaves out RocksDB's background threads: less than the whole, but most of it.
        assert 0 < res["nodes_python_cpu_us_per_record"][mode] <= res["nodes_cpu_us_per_record"][mode], mode
        # The nodes' CPU by thread: the Raft tickers and the event loop both worked, and
        # the kinds add up to no more than the whole (threads that ended meanwhile are not counted).
        by_thread = res["nodes_cpu_us_per_record_by_thread"][mode]
        assert by_thread["raft-ticker"] > 0 and by_thread["event-loop"] > 0, (mode, by_thread)
        whole = sum(v for k, v in by_thread.items() if not k.endswith(":sys"))
        # (Read a moment apart, and each thread's CPU in 10 ms ticks: a one-window run on a busy host can differ
        # by several %; counting the ``:sys`` parts twice would add a fifth or more.)
        assert whole <= res["nodes_cpu_us_per_record"][mode] * 1.1 + 0.05, (mode, by_thread)
        assert 0 <= by_thread["raft-ticker:sys"] <= by_thread["raft-ticker"], (mode, by_thread)
        # 1 KB records in batches of at most 64 KB: at least ~15 batches and requests per 1,000 records (a
        # request may carry batches of several partitions), each replicated with Raft messages.
        assert res["batches_per_1k_records"][mode] > 10 and res["requests_per_1k_records"][mode] > 5, mode
        assert res["raft_messages_per_1k_records"][mode] > res["requests_per_1k_records"][mode], mode
    assert 0 < res["python_cpu_ratio"] < 10
    assert res["commits"] >= 5 and res["transactional_records_per_s"] > 0
    # The floor control's commit is a flush plus one offset commit: it blocked the loop, and its ratio exists.
    floor = res["one_write_floor"]
    assert floor["commit_ms_p50"] > 0
    assert 0 < floor["ratio_of_totals"] < 10 and 0 < floor["cpu_ratio"] < 10
    # commit_and_begin: its commits ran while the loop sent on; each one's duration is measured, not its wait.
    piped = res["pipelined"]
    assert piped["commit_ms_p50"] > 0 and 0 < piped["ratio_of_totals"] < 10


def test_commit_cycle_reports_each_phase_and_the_host_cores_it_kept_busy(report: dict[str, Any]) -> None:
    res = report["cycle"]
    assert res["commits"] >= 5
    for step in ("flush", "end_txn", "next_first_ack"):
        assert res[step]["p50_ms"] > 0, step
    # Each phase kept some of the host busy (the nodes at least), and never more cores than the host has.
    cores = os.cpu_count() or 1
    for name, busy in res["host_busy_cores"].items():
        assert busy is not None and 0 < busy <= cores, (name, busy)
