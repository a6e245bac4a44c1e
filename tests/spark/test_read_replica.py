"""The Spark reader's replica choice: partition leaders by default (followed when they move), or
``readReplica=any`` follower reads from a replica among the bootstrap URLs."""

from __future__ import annotations

from typing import Any

import pytest

from spark_io.planning import OffsetRange
from spark_io.reader import ReadSettings, arrow_schema, read_range
from spark_io.source import kafka_schema
from tests.spark.support import produce_plain
from tests.support.cluster import LocalCluster, samples, wait_for

pytestmark = pytest.mark.spark


def fetched_records(c: LocalCluster, node: int, topic: str) -> float:
    return sum(v for labels, v in samples(c.url(node), "txbroker_records_fetched_total") if labels["topic"] == topic)


def test_read_range_follows_the_leader_when_it_moves(make_cluster: Any) -> None:
    # Given 3,000 records on a partition, read in small fetches through every node's URL
    c = make_cluster(3, leader_balance_interval_s=3600.0)
    c.create_topic("mv", partitions=1, rf=3)
    values = [f"m{i}".encode() for i in range(3000)]
    for k in range(0, len(values), 500):
        produce_plain(c, "mv", 0, values[k : k + 500])
    settings = ReadSettings(",".join(c.urls), "read_uncommitted", True, 1024, 60_000, 10_000)
    batches = read_range(OffsetRange("mv", 0, 0, 3000), settings, arrow_schema(kafka_schema()))
    rows: list[tuple[int, bytes]] = []
    first = next(batches)
    rows += zip(first.column("offset").to_pylist(), first.column("value").to_pylist(), strict=True)
    # When the leader stops in the middle of the read (it hands leadership to a follower)
    leader = c.leader("mv", 0)
    assert leader is not None
    assert c.stop_node(leader) == 0
    for rb in batches:
        rows += zip(rb.column("offset").to_pylist(), rb.column("value").to_pylist(), strict=True)
    # Then the range is read exactly, from the new leader
    assert rows == list(enumerate(values))


def test_batch_read_from_a_follower_replica(spark: Any, shared_cluster: LocalCluster) -> None:
    c = shared_cluster
    c.create_topic("rr", partitions=1, rf=3)
    values = [f"f{i}".encode() for i in range(400)]
    produce_plain(c, "rr", 0, values)
    leader = c.wait_leaders("rr", 1)[0]
    follower = next(n for n in (1, 2, 3) if n != leader)
    wait_for(lambda: c.partition_meta("rr", 0, follower)["high_watermark"] == 400, 10, "the follower caught up")
    before = fetched_records(c, follower, "rr")
    df = (spark.read.format("txbroker").option("bootstrap", c.url(follower)).option("topic", "rr")
          .option("readReplica", "any").load())  # fmt: skip
    rows = sorted((r.offset, bytes(r.value)) for r in df.collect())
    assert rows == list(enumerate(values))
    assert fetched_records(c, follower, "rr") - before >= 400  # served by the follower's replica
