"""Pure logic of the connector (no JVM, no broker): options, planning, Arrow decoding."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from clients.protocol import (
    BrokerError,
    ControlType,
    Record,
    StoredBatch,
    encode_batch,
    encode_control_batch,
    parse_batch,
)
from clients.txn_filter import visible_batches
from spark_io.arrow_records import RecordBatchBuilder
from spark_io.broker import PartitionState
from spark_io.options import OffsetSpec, ReaderOptions, WriterOptions
from spark_io.planning import OffsetRange, checked_ranges, rate_limit, resolve, split

pytestmark = pytest.mark.spark


def arrow_schema(headers: bool = True) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    from spark_io.source import kafka_schema

    return to_arrow_schema(kafka_schema(headers), timezone="UTC")


def test_reader_options_parse_like_kafka():
    o = ReaderOptions.parse(
        {
            "BOOTSTRAP": "http://a:1",
            "subscribe": "x, y,x",
            "startingOffsets": '{"x": {"0": 5, "1": -2}}',
            "endingOffsets": "latest",
            "minPartitions": "4",
            "includeHeaders": "false",
        },
        streaming=False,
    )
    assert o.subscribe == ("x", "y")
    assert o.starting == OffsetSpec("offsets", offsets={("x", 0): 5, ("x", 1): -2})
    assert o.ending.kind == "latest"
    assert (o.min_partitions, o.include_headers, o.isolation, o.fail_on_data_loss) == (4, False, "read_committed", True)
    s = ReaderOptions.parse(
        {
            "kafka.bootstrap.servers": "http://a:1",
            "assign": '{"t": [1, 0]}',
            "startingTimestamp": "7",
            "maxTriggerDelay": "2s",
            "kafka.isolation.level": "read_uncommitted",
        },
        streaming=True,
    )
    assert s.assign == (("t", 0), ("t", 1))
    assert s.starting == OffsetSpec("timestamp", timestamp=7)
    assert (s.max_trigger_delay_ms, s.isolation) == (2000, "read_uncommitted")
    assert (o.read_replica, s.read_replica) == ("leader", "leader")
    r = ReaderOptions.parse({"bootstrap": "http://a:1", "topic": "t", "readReplica": "Any"}, streaming=False)
    assert r.read_replica == "any"
    assert ReaderOptions.parse({"bootstrap": "http://a:1", "topic": "t"}, streaming=True).starting.kind == "latest"


@pytest.mark.parametrize(
    ("opts", "needle"),
    [
        ({"subscribe": "t"}, "bootstrap"),
        ({"bootstrap": "http://a:1"}, "exactly one"),
        ({"bootstrap": "http://a:1", "subscribe": "t", "assign": '{"t":[0]}'}, "exactly one"),
        ({"bootstrap": "http://a:1", "subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}, "latest"),
        ({"bootstrap": "http://a:1", "subscribe": "t", "endingOffsets": "earliest"}, "earliest"),
        ({"bootstrap": "http://a:1", "subscribe": "t", "isolation.level": "dirty"}, "read_committed"),
        ({"bootstrap": "http://a:1", "subscribe": "t", "minPartitions": "zero"}, "integer"),
        ({"bootstrap": "http://a:1", "subscribe": "t", "readReplica": "follower"}, "readReplica"),
        (
            {"bootstrap": "http://a:1", "subscribe": "t", "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "9"},
            "more",
        ),
        (
            {
                "bootstrap": "http://a:1",
                "subscribePattern": "(",
            },
            "regular",
        ),
    ],
)
def test_bad_reader_options_name_the_option(opts, needle):
    with pytest.raises(BrokerError, match=needle) as info:
        ReaderOptions.parse(opts, streaming=False)
    assert info.value.error_code.name == "INVALID_CONFIG"


def test_writer_ids_cannot_break_transactional_ids():
    assert (
        WriterOptions.parse({"bootstrap": "http://a:1", "writeId": "job-7.a_b"}, streaming=False).write_id
        == "job-7.a_b"
    )
    with pytest.raises(BrokerError, match="writeId"):
        WriterOptions.parse({"bootstrap": "http://a:1", "writeId": "a:b"}, streaming=False)
    assert WriterOptions.parse({"bootstrap": "http://a:1", "sinkId": "s1"}, streaming=True).write_id == "s1"


def test_rate_limit_is_proportional_and_moves_small_partitions():
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 10}
    end = {("t", 0): 1000, ("t", 1): 10, ("t", 2): 10}
    got = rate_limit(100, start, end)
    assert got[("t", 0)] == 99 and got[("t", 1)] == 1 and got[("t", 2)] == 10  # 100*1000/1010 -> 99; 0.99 -> 1
    assert rate_limit(5000, start, end) == end


def test_split_for_min_partitions_covers_each_range_exactly():
    ranges = [OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 5, 105), OffsetRange("t", 2, 7, 7)]
    pieces = split(ranges, 10)
    assert len(pieces) == 10
    for r in ranges[:2]:
        mine = sorted((p.start, p.end) for p in pieces if p.partition == r.partition)
        assert mine[0][0] == r.start and mine[-1][1] == r.end
        assert all(a[1] == b[0] for a, b in itertools.pairwise(mine))
    assert split(ranges, None) == ranges[:2]


def test_resolve_and_data_loss_checks():
    states = {("t", 0): PartitionState("u", 10, 50, 40), ("t", 1): PartitionState("u", 0, 5, 5)}
    committed = resolve(OffsetSpec("latest"), states, "read_committed", None, "x")  # type: ignore[arg-type]
    assert committed == {("t", 0): 40, ("t", 1): 5}
    spec = OffsetSpec("offsets", offsets={("t", 0): -2, ("t", 1): 3})
    assert resolve(spec, states, "read_uncommitted", None, "x") == {("t", 0): 10, ("t", 1): 3}  # type: ignore[arg-type]
    with pytest.raises(BrokerError, match="every partition"):
        resolve(OffsetSpec("offsets", offsets={("t", 0): 1}), states, "read_committed", None, "x")  # type: ignore[arg-type]
    with pytest.raises(BrokerError, match="deleted"):
        checked_ranges({("t", 0): 3}, {("t", 0): 40}, states, fail_on_data_loss=True)
    assert checked_ranges({("t", 0): 3}, {("t", 0): 40}, states, False) == [OffsetRange("t", 0, 10, 40)]


def _stored(base: int, data: bytes) -> StoredBatch:
    return StoredBatch(base, 0, data, parse_batch(data))


def test_arrow_builder_keeps_only_visible_records_in_range_with_nulls_and_headers():
    plain = encode_batch(
        [
            Record(value=b"p0", key=b"k0", timestamp=1_000),
            Record(value=None, key=None, timestamp=2_000),
            Record(value=b"p2", headers=(("h", b"v"), ("n", None)), timestamp=3_000),
        ]
    )
    aborted = encode_batch(
        [Record(value=b"gone")], producer_id=7, producer_epoch=0, base_sequence=0, transactional=True
    )
    marker = encode_control_batch(ControlType.ABORT, producer_id=7, producer_epoch=0, coordinator_epoch=0, timestamp=1)
    committed = encode_batch(
        [Record(value=b"c5"), Record(value=b"c6")], producer_id=8, producer_epoch=0, base_sequence=0, transactional=True
    )
    batches = [_stored(0, plain), _stored(3, aborted), _stored(4, marker), _stored(5, committed)]
    schema = arrow_schema()
    b = RecordBatchBuilder(schema, "t", 2, 1, 6)  # offsets [1, 6)
    for sb in visible_batches(batches, [(7, 3)]):
        b.add(sb)
    rb = b.build()
    assert rb is not None and rb.schema.equals(schema)
    rows = rb.to_pylist()
    assert [r["offset"] for r in rows] == [1, 2, 5]
    assert [r["value"] for r in rows] == [None, b"p2", b"c5"]
    assert [r["key"] for r in rows] == [None, None, None]
    assert rows[1]["headers"] == [{"key": "h", "value": b"v"}, {"key": "n", "value": None}]
    assert rows[0]["headers"] == [] and rows[2]["headers"] == []
    assert {r["topic"] for r in rows} == {"t"} and {r["partition"] for r in rows} == {2}
    assert rows[1]["timestamp"].timestamp() == 3.0 and rows[0]["timestampType"] == 0
    assert b.rows == 3 and b.payload_bytes == len(b"p2c5")
    no_headers = RecordBatchBuilder(arrow_schema(False), "t", 0, 0, 10)
    no_headers.add(batches[0])
    rb2 = no_headers.build()
    assert rb2 is not None and rb2.column("key").to_pylist() == [b"k0", None, None]
    assert RecordBatchBuilder(schema, "t", 0, 100, 200).build() is None


def test_credentials_options_are_checked_and_kept_out_of_reprs():
    from spark_io.options import Credentials
    from spark_io.reader import ReadSettings

    raw = {"bootstrap": "https://a:1", "subscribe": "t", "username": "alice", "PASSWORD": "hunter2",
           "ssl.cafile": "/nonexistent/ca.pem"}  # fmt: skip
    with pytest.raises(BrokerError, match=r"ssl\.cafile") as info:
        ReaderOptions.parse(raw, streaming=False)
    assert info.value.error_code.name == "INVALID_CONFIG"
    del raw["ssl.cafile"]
    o = ReaderOptions.parse(raw, streaming=False)
    assert o.credentials == Credentials("alice", "hunter2")
    w = WriterOptions.parse({**raw, "topic": "t"}, streaming=False)
    for value in (o, w, ReadSettings.of(o), o.credentials):
        assert "hunter2" not in repr(value)
    with pytest.raises(BrokerError, match="together"):
        WriterOptions.parse({"bootstrap": "http://a:1", "username": "alice"}, streaming=False)
    with pytest.raises(BrokerError, match="https://"):
        ReaderOptions.parse({"bootstrap": "http://a:1", "subscribe": "t", "ssl.cafile": "ca.pem"}, streaming=False)
    assert ReaderOptions.parse({"bootstrap": "http://a:1", "subscribe": "t"}, streaming=False).credentials == (
        Credentials()
    )
