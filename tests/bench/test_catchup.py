"""``txbroker bench catchup`` runs end to end on tiny numbers (results in BENCHMARKS.md)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from bench.catchup import log_events, main


def test_log_events_are_the_matching_lines_of_one_group_as_unix_times() -> None:
    text = "\n".join(
        [
            "2026-01-02 03:04:05,250 node-1 INFO raft: group 't1p0': snapshot at index 9 built for a follower",
            "2026-01-02 03:04:06,000 node-1 INFO raft: group 't1p1': snapshot at index 9 built for a follower",
            "  a continuation line: built for a follower 't1p0'",
            "2026-01-02 03:04:07,500 node-1 INFO raft.group: group 't1p0': restored state machine from snapshot",
        ]
    )
    start = datetime(2026, 1, 2, 3, 4, 5, 250_000).timestamp()
    assert log_events(text, "'t1p0'", "built for a follower") == [start]
    assert log_events(text, "'t1p0'", "restored state machine") == [start + 2.25]
    assert log_events(text, "'t2p0'", "restored state machine") == []


@pytest.mark.integration
def test_bench_catchup_times_the_write_and_a_replaced_followers_catch_up(capsys: pytest.CaptureFixture[str]) -> None:
    # A low compaction threshold: the leader's log starts past entry 1, so the follower gets a full snapshot.
    # The leader balancer settles the partition's leader before the write at once.
    argv = ["--mib", "3", "--node-setting", "raft_log_compaction_min_entries=8", "--timeout", "60", "--json"]
    argv += ["--node-setting", "leader_balance_hold_s=0", "--node-setting", "leader_balance_interval_s=0.2"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["write"]["payload_mib"] >= 3 and res["write"]["errors"] == {}, res["write"]
    assert res["replaced"] != res["leader"] and res["high_watermark"] == 3 * 1024
    phases = res["catchup"]["phases_s"]
    assert 0 < phases["leader_snapshot_build_started"] <= phases["leader_snapshot_built"], phases
    assert phases["leader_snapshot_built"] <= phases["follower_state_restored"], phases
    assert 0 < phases["follower_state_restored"] <= phases["high_watermark_reached"] == res["catchup"]["seconds"]
    assert res["catchup_vs_write"] > 0 and res["meets_target"] == (res["catchup_vs_write"] <= res["target_ratio"])
