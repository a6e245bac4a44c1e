"""cluster/metrics.py: names, scrape-time sources, helper methods, event-loop lag."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cluster.metrics import (
    LOOP_LAG_INTERVAL_S,
    GroupCoordinatorSample,
    GroupSample,
    NodeMetrics,
    NodeSample,
    PartitionSample,
    TransactionSample,
    TxnOutcome,
    exported_series_names,
)
from tests.support.prometheus import promtool
from tests.support.virtual_time import VirtualTimeLoop, run_on_virtual_time


def node_sample() -> NodeSample:
    parts = [
        PartitionSample("orders", 0, True, 3, 40, 100, 90, 0, 4096, True, 7),
        PartitionSample("orders", 1, False, 3, 40, 50, 50, 10, 2048, False, 0),
    ]
    return NodeSample(True, 2, 12, 2, 1, {"orders": 0}, parts)


def full_metrics() -> NodeMetrics:
    m = NodeMetrics()
    m.add_collector(node_sample)
    m.set_transaction_source(lambda: TransactionSample(2, int(time.time() * 1000) - 90_000, 900_000, 4))
    m.set_group_source(
        lambda: GroupCoordinatorSample(
            3, [GroupSample.from_offsets("g", 2, {("orders", 0): 60, ("orders", 1): 50}, lambda t, p: 100)]
        )
    )
    return m


def values(m: NodeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_exposition_follows_the_naming_rules_and_passes_promtool() -> None:
    m = full_metrics()
    m.txn_started()
    m.txn_completed(TxnOutcome.COMMITTED, 0.5)
    m.records_produced.labels("orders").inc(3)
    text = generate_latest(m.registry).decode()
    assert "_created" not in text
    for fam in text_string_to_metric_families(text):
        assert fam.name.startswith(("txbroker_", "process_", "python_")), fam.name
        if fam.type == "counter":
            assert all(s.name.endswith("_total") for s in fam.samples), fam.name
    res = promtool("check", "metrics", stdin=text.encode())
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()


def test_every_series_the_registry_can_produce_is_in_exported_series_names() -> None:
    m = full_metrics()
    exported = exported_series_names(m)
    assert {name for name, _ in values(m)} <= exported
    assert exported == exported_series_names()  # what can be exported does not depend on wiring


def test_partition_and_raft_gauges_from_the_node_sample() -> None:
    v = values(full_metrics())
    tp0 = (("partition", "0"), ("topic", "orders"))
    assert v[("txbroker_partition_unstable_records", tp0)] == 10
    assert v[("txbroker_raft_follower_lag_entries", tp0)] == 7
    assert ("txbroker_raft_follower_lag_entries", (("partition", "1"), ("topic", "orders"))) not in v  # follower
    assert v[("txbroker_partitions_under_replicated", (("topic", "orders"),))] == 1
    assert v[("txbroker_partitions", (("role", "leader"),))] == 1
    assert v[("txbroker_cluster_nodes", (("state", "down"),))] == 1
    assert v[("txbroker_raft_term", (("partition", "0"), ("topic", "__controller")))] == 2


def test_coordinator_gauges_only_once_a_source_is_registered() -> None:
    bare = values(NodeMetrics())
    assert not any(name.startswith(("txbroker_transactions_open", "txbroker_consumer_group_m")) for name, _ in bare)
    v = values(full_metrics())
    assert v[("txbroker_transactions_open", ())] == 2
    assert 89 <= v[("txbroker_transaction_oldest_open_age_seconds", ())] <= 120
    assert v[("txbroker_transaction_max_timeout_seconds", ())] == 900
    assert v[("txbroker_coordinator_partitions", (("kind", "transaction"),))] == 4
    assert v[("txbroker_coordinator_partitions", (("kind", "group"),))] == 3
    assert v[("txbroker_consumer_group_lag_records", (("group", "g"), ("topic", "orders")))] == 40 + 50
    assert v[("txbroker_consumer_group_members", (("group", "g"),))] == 2


def test_group_lag_skips_partitions_without_a_known_high_watermark() -> None:
    s = GroupSample.from_offsets("g", 1, {("a", 0): 5, ("a", 1): 5, ("b", 0): 9}, lambda t, p: None if p else 8)
    assert s.lag == {"a": 3, "b": 0}


def test_helpers_count_what_they_say() -> None:
    m = NodeMetrics()
    m.produce_failed("orders", "OUT_OF_ORDER_SEQUENCE_NUMBER")
    m.produce_failed("orders", "NOT_LEADER_OR_FOLLOWER")
    m.txn_completed(TxnOutcome.TIMED_OUT, 61.0)
    m.txn_marker_written("orders", commit=False)
    m.coordinator_loaded("group", 0.2)  # type: ignore[arg-type]  # plain strings of the enum are accepted
    m.group_rebalanced("g")
    v = values(m)
    assert v[("txbroker_out_of_order_rejections_total", (("topic", "orders"),))] == 1
    assert v[("txbroker_produce_errors_total", (("error_code", "NOT_LEADER_OR_FOLLOWER"),))] == 1
    assert v[("txbroker_transactions_completed_total", (("outcome", "timed_out"),))] == 1
    assert v[("txbroker_transactions_completed_total", (("outcome", "committed"),))] == 0  # pre-created, true 0
    assert v[("txbroker_transaction_duration_seconds_sum", (("outcome", "timed_out"),))] == 61.0
    assert v[("txbroker_transaction_markers_written_total", (("marker", "abort"), ("topic", "orders")))] == 1
    assert v[("txbroker_coordinator_loads_total", (("kind", "group"),))] == 1
    assert v[("txbroker_consumer_group_rebalances_total", (("group", "g"),))] == 1
    with pytest.raises(ValueError, match="'lost'"):
        m.txn_completed("lost", 1.0)  # type: ignore[arg-type]


def test_event_loop_lag_is_observed_when_the_loop_is_blocked() -> None:
    # On virtual time: the monitor wakes every LOOP_LAG_INTERVAL_S (0.25 s), at 0.25 and 0.5 on time; at 0.6 the
    # loop is blocked for 0.5 s, so the wake-up due at 0.75 comes at 1.1 (0.35 s late); the next one is on time.
    m = NodeMetrics()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        m.start_loop_monitor()
        await asyncio.sleep(0.6)
        loop.clock.now += 0.5  # a synchronous call holds the loop this long
        await asyncio.sleep(0.3)
        await m.stop_loop_monitor()

    run_on_virtual_time(run)()
    assert LOOP_LAG_INTERVAL_S == 0.25
    v = values(m)
    assert v[("txbroker_event_loop_lag_seconds_count", ())] == 4
    assert v[("txbroker_event_loop_lag_seconds_sum", ())] == pytest.approx(0.35)


def test_docs_describe_every_metric() -> None:
    from tests.support.prometheus import REPO

    doc = (REPO / "docs" / "metrics.md").read_text()
    m = NodeMetrics()
    families = {f.name + ("_total" if f.type == "counter" else "") for f in m.registry.collect()}
    families |= {f.name + ("_total" if f.type == "counter" else "") for f in m._collector.describe()}
    undocumented = sorted(n for n in families if f"`{n}`" not in doc)
    assert not undocumented, f"docs/metrics.md does not describe {undocumented}"
