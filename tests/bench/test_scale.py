"""``txbroker bench create``, ``failover --partitions N`` and ``idle`` at two sizes run end to end on tiny
numbers (the measured ones are in BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest

from bench.produce import main

pytestmark = pytest.mark.integration


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    scenario = report["scenarios"][argv[0]]
    assert isinstance(scenario, dict)
    return scenario


def test_create_reports_the_leaders_and_every_nodes_longest_loop_stall(capsys: pytest.CaptureFixture[str]) -> None:
    res = _run(["create", "--create-partitions", "12"], capsys)
    assert res["partitions"] == 12 and 0 < float(res["all_leaders_after_s"]) < 60  # type: ignore[arg-type]
    stalls = res["event_loop_max_stall"]
    assert isinstance(stalls, dict) and set(stalls) == {"node1", "node2", "node3"}
    assert all(s["probes"] > 0 and s["max_ms"] > 0 for s in stalls.values())
    per_node = res["leaders_per_node"]
    assert isinstance(per_node, dict) and sum(per_node.values()) == 12
    assert res["on_preferred_replica"] == 12  # the preferred replica campaigns first
    assert int(res["raft_campaigns_total"]) >= 12  # type: ignore[call-overload]


def test_failover_with_partitions_times_each_partition_the_dead_node_led(capsys: pytest.CaptureFixture[str]) -> None:
    res = _run(["failover", "--partitions", "9", "--settle-seconds", "0.5"], capsys)
    assert int(res["partitions_it_led"]) >= 3 and res["led_again"] == res["partitions_it_led"]  # type: ignore[call-overload]
    assert res["not_led_again"] == 0
    assert 0 < float(res["p50_s"]) <= float(res["p99_s"]) <= float(res["max_s"]) < 30  # type: ignore[arg-type]
    campaigns = res["survivors_campaigns"]
    assert isinstance(campaigns, dict) and campaigns["raft_campaigns_total"] >= 3


def test_idle_measures_each_size_on_a_fresh_cluster_and_the_slope(capsys: pytest.CaptureFixture[str]) -> None:
    res = _run(["idle", "--idle-partitions", "3,9", "--idle-seconds", "1", "--idle-settle-s", "2"], capsys)
    sizes = res["sizes"]
    assert isinstance(sizes, list) and [s["partitions"] for s in sizes] == [3, 9]
    for s in sizes:
        assert set(s["nodes"]) == {"node1", "node2", "node3"} and s["mb_per_replica"] > 0
    slopes = res["slopes"]
    assert isinstance(slopes, list) and slopes[0]["from"] == 3 and slopes[0]["to"] == 9
