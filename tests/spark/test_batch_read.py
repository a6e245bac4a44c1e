"""Batch reads into Spark from a real 3-node cluster."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest

import tests.integration.test_transactions_http as txh
from tests.spark.support import committed_records, produce_plain
from tests.support.cluster import LocalCluster, http

pytestmark = pytest.mark.spark


def _json_produce(c: LocalCluster, topic: str, partition: int, records: list[dict[str, Any]]) -> None:
    body = {"partitions": [{"topic": topic, "partition": partition, "producer_id": -1, "producer_epoch": -1,
                            "base_sequence": -1, "records": records}]}  # fmt: skip
    leader = c.wait_leaders(topic, partition + 1)[partition]
    status, res = http("POST", c.url(leader) + "/v1/produce", body)
    assert status == 200, res


@pytest.fixture(scope="module")
def mixed_topic(shared_cluster: LocalCluster) -> dict[str, Any]:
    """Topic ``mix``: plain, committed, aborted and still-open transactional records on 3 partitions."""
    c = shared_cluster
    c.create_topic("mix", partitions=3)
    expected: set[tuple[int, bytes]] = set()
    for p in range(3):
        vals = [f"plain-{p}-{i}".encode() for i in range(5)]
        produce_plain(c, "mix", p, vals)
        expected |= {(p, v) for v in vals}
    committed = txh.TxnWriter(c, "mix-committed")
    aborted = txh.TxnWriter(c, "mix-aborted")
    for p in range(3):
        assert committed.send("mix", p, [f"committed-{p}-{i}".encode() for i in range(4)])[0] == 200
        assert aborted.send("mix", p, [f"aborted-{p}-{i}".encode() for i in range(3)])[0] == 200
        expected |= {(p, f"committed-{p}-{i}".encode()) for i in range(4)}
    committed.end(commit=True)
    aborted.end(commit=False)
    hdr = [{"key": "trace", "value": base64.b64encode(b"abc").decode()}]
    _json_produce(c, "mix", 0, [{"value": base64.b64encode(b"with-headers").decode(), "key": None, "headers": hdr}])
    expected.add((0, b"with-headers"))
    # An open transaction on partition 1 pins its last stable offset: the plain record after it is not
    # visible to read_committed until the transaction ends.
    pending = txh.TxnWriter(c, "mix-open")
    assert pending.send("mix", 1, [b"open-1"])[0] == 200
    produce_plain(c, "mix", 1, [b"after-open"])
    return {"expected": expected, "open": pending}


def _read(spark: Any, c: LocalCluster, **options: str) -> list[Any]:
    reader = spark.read.format("txbroker").option("bootstrap", ",".join(c.urls))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load().collect()


def test_read_committed_returns_committed_and_plain_records_with_kafka_columns(spark, shared_cluster, mixed_topic):
    c = shared_cluster
    rows = _read(spark, c, subscribe="mix")
    assert {(r.partition, r.value) for r in rows} == mixed_topic["expected"]
    assert len(rows) == len(mixed_topic["expected"])  # nothing twice
    # Offsets and values agree with the broker's own read_committed fetch, partition by partition.
    broker = {(p, o): v for p, o, v in committed_records(c, "mix", 3)}
    assert {(r.partition, r.offset): r.value for r in rows} == broker
    r = next(r for r in rows if r.value == b"with-headers")
    assert r.topic == "mix" and r.timestampType == 0 and r.key is None
    assert [(h.key, h.value) for h in r.headers] == [("trace", b"abc")]
    plain = next(r for r in rows if r.value == b"plain-2-0")
    assert plain.headers == [] and isinstance(plain.timestamp, dt.datetime)
    assert abs(plain.timestamp.timestamp() - dt.datetime.now().timestamp()) < 600
    assert [f.name for f in spark.read.format("txbroker").option("bootstrap", c.url(1)).option("subscribe", "mix")
            .load().schema.fields] == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                                       "headers"]  # fmt: skip


def test_read_uncommitted_sees_aborted_and_open_records(spark, shared_cluster, mixed_topic):
    rows = _read(spark, shared_cluster, subscribe="mix", **{"isolation.level": "read_uncommitted"})
    values = {r.value for r in rows}
    assert {b"aborted-0-0", b"open-1", b"after-open"} <= values
    assert mixed_topic["expected"] <= {(r.partition, r.value) for r in rows}


def test_offset_bounds_min_partitions_assign_and_pattern(spark, shared_cluster, mixed_topic):
    c = shared_cluster
    everything = {(r.partition, r.offset): r.value for r in _read(spark, c, subscribe="mix")}
    start = {"mix": {"0": 2, "1": -2, "2": 6}}
    end = {"mix": {"0": 7, "1": -1, "2": 9}}
    rows = _read(spark, c, subscribe="mix", startingOffsets=json.dumps(start), endingOffsets=json.dumps(end))
    want = {k: v for k, v in everything.items()
            if (k[0] == 0 and 2 <= k[1] < 7) or k[0] == 1 or (k[0] == 2 and 6 <= k[1] < 9)}  # fmt: skip
    assert {(r.partition, r.offset): r.value for r in rows} == want
    df = (spark.read.format("txbroker").option("bootstrap", c.url(2)).option("subscribe", "mix")
          .option("minPartitions", "7").load())  # fmt: skip
    assert df.rdd.getNumPartitions() == 7
    assert sorted((r.partition, r.offset) for r in df.collect()) == sorted(everything)
    assigned = _read(spark, c, assign=json.dumps({"mix": [2]}))
    assert {(r.partition, r.offset) for r in assigned} == {k for k in everything if k[0] == 2}
    assert len(_read(spark, c, subscribePattern="m.x")) == len(everything)
    assert _read(spark, c, subscribePattern="nothing-.*") == []


def test_open_transaction_bounds_read_committed_until_it_commits(spark, shared_cluster, mixed_topic):
    c = shared_cluster
    before = {r.value for r in _read(spark, c, assign=json.dumps({"mix": [1]}))}
    assert b"after-open" not in before and b"open-1" not in before
    mixed_topic["open"].end(commit=True)
    after = {r.value for r in _read(spark, c, assign=json.dumps({"mix": [1]}))}
    assert after == before | {b"open-1", b"after-open"}
    mixed_topic["expected"] |= {(1, b"open-1"), (1, b"after-open")}


def test_starting_offsets_by_timestamp(spark, shared_cluster):
    c = shared_cluster
    c.create_topic("ts", partitions=2)
    for p in range(2):
        _json_produce(c, "ts", p, [{"value": base64.b64encode(f"t{p}-{t}".encode()).decode(), "timestamp": t}
                                   for t in (1000, 2000, 3000, 4000)])  # fmt: skip
    rows = _read(spark, c, subscribe="ts", startingTimestamp="2500")
    assert sorted(r.value for r in rows) == sorted(f"t{p}-{t}".encode() for p in range(2) for t in (3000, 4000))
    by_ts = json.dumps({"ts": {"0": 1000, "1": 4000}})
    rows = _read(spark, c, subscribe="ts", startingOffsetsByTimestamp=by_ts, endingTimestamp="4000")
    assert sorted(r.value for r in rows) == [b"t0-1000", b"t0-2000", b"t0-3000"]
    rows = _read(spark, c, subscribe="ts", startingTimestamp="3500", endingTimestamp="99999")  # no record: latest
    assert sorted(r.value for r in rows) == [b"t0-4000", b"t1-4000"]
    with pytest.raises(Exception, match="no record at or after timestamp"):
        _read(spark, c, subscribe="ts", startingTimestamp="9000")
    assert _read(spark, c, subscribe="ts", startingTimestamp="9000", startingOffsetsByTimestampStrategy="latest") == []


def test_explicit_register_and_bad_option_fails_before_any_task(spark, shared_cluster):
    import spark_io

    spark_io.register(spark)  # auto-registration already made the format known; registering again is allowed
    with pytest.raises(Exception, match="exactly one of subscribe"):
        spark.read.format("txbroker").option("bootstrap", shared_cluster.url(1)).load().collect()
