"""``txbroker bench reassign`` runs end to end on tiny numbers (results in BENCHMARKS.md)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from bench.reassign import TARGET, longest_stall, main, move_phases

_LEADER_LOG = """\
2026-01-02 03:04:05,000 node-1 INFO cluster.reassignment: move of t1p0: node 4 replicates as a learner
2026-01-02 03:04:05,500 node-1 INFO cluster.reassignment: move of t11p0: node 4 replicates as a learner
2026-01-02 03:04:06,000 node-1 INFO raft.full_snapshot: group 't1p0': building a full snapshot at state index 9 for a \
follower
2026-01-02 03:04:08,000 node-1 INFO raft.full_snapshot: group 't1p0': full snapshot at state index 9 built for a \
follower (3.2 MiB in 2.0 s)
2026-01-02 03:04:09,000 node-1 INFO cluster.reassignment: move of t1p0: node 4 added to the voters
2026-01-02 03:04:09,500 node-1 INFO cluster.reassignment: move of t1p0: leadership handed to node 4 before leaving
2026-01-02 03:04:09,600 node-1 WARNING raft.ticker: raft ticker: tick took 0.75 s; every group of this ticker waited
"""
_NEW_NODE_LOG = """\
2026-01-02 03:04:01,000 node-4 WARNING raft.ticker: raft ticker: tick took 3.00 s; every group of this ticker waited
2026-01-02 03:04:08,250 node-4 INFO raft.group: group 't1p0': restored state machine from snapshot at index 9
2026-01-02 03:04:08,300 node-4 WARNING raft.ticker: raft ticker: restore took 0.50 s; every group of this ticker waited
2026-01-02 03:04:10,000 node-4 INFO cluster.reassignment: move of t1p0: node 1 removed from the voters
2026-01-02 03:04:10,500 node-4 INFO cluster.reassignment: move of t1p0 complete: replicas [4, 2, 3]
"""


def test_the_moves_phases_are_the_first_matching_lines_of_its_group_on_any_node() -> None:
    started = datetime(2026, 1, 2, 3, 4, 4).timestamp()
    phases = move_phases({1: _LEADER_LOG, 4: _NEW_NODE_LOG}, "t1p0", 1, started)
    assert phases == {
        "learner_added": 1.0,
        "leader_snapshot_build_started": 2.0,
        "leader_snapshot_built": 4.0,
        "new_node_state_restored": 4.25,
        "new_node_voter": 5.0,
        "leadership_handed_over": 5.5,
        "leaving_node_removed": 6.0,
        "complete_recorded": 6.5,
    }
    assert move_phases({1: _LEADER_LOG}, "t2p0", 1, started) == dict.fromkeys(phases)


def test_the_longest_ticker_stall_counts_only_from_the_moves_start() -> None:
    started = datetime(2026, 1, 2, 3, 4, 4).timestamp()
    assert longest_stall(_NEW_NODE_LOG, started) == 0.5
    assert longest_stall(_NEW_NODE_LOG, started - 10) == 3.0
    assert longest_stall(_LEADER_LOG, started) == 0.75


@pytest.mark.integration
def test_bench_reassign_moves_a_partition_onto_a_fourth_node_under_load(capsys: pytest.CaptureFixture[str]) -> None:
    # A low compaction threshold: the leader's log starts past entry 1, so the new node gets a full snapshot.
    # The leader balancer settles the partitions' leaders before the write and the load at once.
    argv = ["--mib", "3", "--window", "2", "--warmup", "0.5", "--timeout", "90", "--json"]
    argv += ["--node-setting", "raft_log_compaction_min_entries=8"]
    argv += ["--node-setting", "leader_balance_hold_s=0", "--node-setting", "leader_balance_interval_s=0.2"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["write"]["payload_mib"] >= 3 and res["write"]["errors"] == {}, res["write"]
    assert res["big"]["replicas"] == [1, 2, 3] and res["big"]["high_watermark"] == 3 * 1024
    assert sorted(res["move"]["replicas"]) == sorted(TARGET), res["move"]
    load = res["load"]
    assert load["writers_failed"] == [], load
    assert load["before"]["records_per_s"] > 0 and load["during"]["records_per_s"] > 0, load
    assert load["before"]["seconds"] == pytest.approx(2, abs=0.2) == load["during"]["seconds"], load
    assert set(load["before"]["node_cpu_pct"]) == {"node1", "node2", "node3", "node4"}
    phases = res["move"]["phases_s"]
    assert 0 < phases["learner_added"] <= phases["leader_snapshot_built"] <= phases["new_node_state_restored"]
    assert phases["new_node_state_restored"] <= phases["new_node_at_high_watermark"] + 0.2, phases  # (polled)
    assert phases["new_node_voter"] <= phases["leaving_node_removed"] <= phases["move_over"], phases
    assert phases["move_over"] == res["move"]["seconds"] and len(res["move"]["snapshot_builds"]) >= 1
    ratio = res["throughput_during_vs_before"]
    assert ratio > 0 and res["meets_target"] == (ratio >= res["target_ratio"])
