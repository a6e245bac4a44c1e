"""``txbroker bench load`` runs end to end on a short sweep (numbers in BENCHMARKS.md)."""

from __future__ import annotations

import json
import os

import pytest

from bench.load import main

pytestmark = pytest.mark.integration


def test_load_bench_holds_the_offered_rate_and_counts_requests_and_messages(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--rounds", "1", "--rates", "0,4000", "--window", "1.7", "--warmup", "0.2", "--json"]
    # The leader balancer hands each partition to its preferred replica at once (not after its 10 s hold).
    argv += ["--node-setting", "leader_balance_hold_s=0", "--node-setting", "leader_balance_interval_s=0.2"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    full, slow = res["rates"]["unthrottled"], res["rates"]["4000/s"]
    # The throttle holds the offered rate (within 30 %: a 1.5 s measurement catches the schedule's catch-up
    # bursts and the acks of records sent before it began); unthrottled goes well past it.
    assert 2800 <= slow["records_per_s"] <= 5200
    assert full["records_per_s"] > 2 * slow["records_per_s"]
    for s in (full, slow):
        assert s["produce_requests_per_1k_records"] > 0
        assert s["raft_messages_per_1k_records"] > 0
        assert s["nodes_cpu_us_per_record"] > 0 and 0 < s["nodes_busy_cores"] <= (os.cpu_count() or 1) + 0.2
    # A 64 KiB batch holds ~60 records of 1 KiB: unthrottled, requests are near that, not one per record.
    assert full["produce_requests_per_1k_records"] < 100


def test_load_bench_refuses_a_bad_rate_list() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--rates", "fast"])
    assert exc.value.code == 2
