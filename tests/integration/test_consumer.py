"""Consumer against three real node processes: exact reads, positions, resets, long polls, deserializers."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest

from clients.aio import AsyncConsumer
from clients.consumer import Consumer
from clients.protocol import BrokerError, ErrorCode
from clients.records import ConsumerRecord
from tests.support.cluster import LocalCluster, http, wait_for
from tests.support.writer import IdempotentWriter

pytestmark = pytest.mark.integration

BIG_PARTITIONS = 6
BIG_RECORDS = 100_000
BIG_BATCH = 1000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Retention runs every 0.2 s so the out-of-range tests can move a log start offset quickly.
    c = LocalCluster(tmp_path_factory.mktemp("consumer"), 3, retention_check_interval_s=0.2)
    try:
        yield c.start()
    finally:
        c.close()


def value_of(p: int, i: int) -> bytes:
    return f"p{p}-r{i:06d}-".encode() + b"x" * 80


@pytest.fixture(scope="module")
def big_topic(cluster: LocalCluster) -> dict[int, list[bytes]]:
    """100,000 distinct records over 6 partitions (uneven: batches go round-robin), written once."""
    cluster.create_topic("big", partitions=BIG_PARTITIONS, rf=3)
    w = IdempotentWriter(cluster, "big")
    expected: dict[int, list[bytes]] = {p: [] for p in range(BIG_PARTITIONS)}
    for b in range(BIG_RECORDS // BIG_BATCH):
        p = b % BIG_PARTITIONS
        n = len(expected[p])
        values = [value_of(p, n + j) for j in range(BIG_BATCH)]
        assert w.send(p, values) == n
        expected[p].extend(values)
    return expected


def by_partition(records: list[ConsumerRecord]) -> dict[int, list[ConsumerRecord]]:
    out: dict[int, list[ConsumerRecord]] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r)
    return out


def assert_exact(records: list[ConsumerRecord], expected: dict[int, list[bytes]], topic: str) -> None:
    got = by_partition(records)
    assert sorted(got) == sorted(expected)
    for p, values in expected.items():
        assert all(r.topic == topic for r in got[p])
        assert [r.offset for r in got[p]] == list(range(len(values))), f"partition {p}: gap, duplicate or reorder"
        assert [r.value for r in got[p]] == values, f"partition {p}: contents differ"


def plain_produce(c: LocalCluster, topic: str, partition: int, records: list[dict[str, Any]]) -> int:
    """One plain (non-idempotent) JSON produce to the partition leader; returns the base offset.

    A node that is no longer the leader (the leader balancer moved it) refuses the
    write before it reaches the log, so only that answer is retried: a plain write
    has no sequence to make a retry of a maybe-written batch safe.
    """
    body = {"partitions": [{"topic": topic, "partition": partition, "records": records}]}

    def attempt() -> Any:
        leader = c.leader(topic, partition)
        if leader is None:
            return None
        status, res = http("POST", c.url(leader) + "/v1/produce", body)
        if status == 421 and "is not the leader" in str(res.get("message", "")):
            return None
        return status, res

    status, res = wait_for(attempt, 30.0, f"a produce to the leader of {topic}-{partition}")
    assert status == 200, res
    assert res["partitions"][0]["error_code"] == "NONE", res
    return int(res["partitions"][0]["base_offset"])


def b64(v: bytes) -> str:
    return base64.b64encode(v).decode()


def poll_until(consumer: Consumer, count: int, timeout: float = 60.0) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        assert time.monotonic() < deadline, f"only {len(out)} of {count} records within {timeout}s"
        out.extend(consumer.poll(timeout_ms=500))
    return out


def poll_error(consumer: Consumer, timeout: float = 20.0) -> BrokerError:
    """Poll until ``poll`` raises; return the error (records returned before it are discarded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            consumer.poll(timeout_ms=200)
        except BrokerError as exc:
            return exc
    raise AssertionError(f"poll did not raise within {timeout}s")


# ---- exact reads -------------------------------------------------------------------------------


def test_consumer_reads_100k_records_across_6_partitions_exactly(cluster, big_topic):
    with Consumer(cluster.urls, auto_offset_reset="earliest", max_partition_fetch_bytes=256 * 1024) as consumer:
        consumer.assign([("big", p) for p in range(BIG_PARTITIONS)])
        records = poll_until(consumer, BIG_RECORDS)
        # Nothing more arrives: the log holds exactly those records
        assert consumer.poll(timeout_ms=300) == []
        for p in range(BIG_PARTITIONS):
            assert consumer.position(("big", p)) == len(big_topic[p])
    assert len(records) == BIG_RECORDS
    assert_exact(records, big_topic, "big")


def test_async_consumer_reads_100k_records_across_6_partitions_exactly(cluster, big_topic):
    async def run() -> list[ConsumerRecord]:
        async with AsyncConsumer(cluster.urls[::-1], auto_offset_reset="earliest", max_poll_records=777) as c:
            c.assign([("big", p) for p in range(BIG_PARTITIONS)])
            out: list[ConsumerRecord] = []
            async with asyncio.timeout(60):
                while len(out) < BIG_RECORDS:
                    batch = await c.poll(timeout_ms=500)
                    assert len(batch) <= 777
                    out.extend(batch)
            assert await c.poll(timeout_ms=300) == []
            return out

    records = asyncio.run(run())
    assert len(records) == BIG_RECORDS
    assert_exact(records, big_topic, "big")


def test_sync_iterator_stops_after_consumer_timeout(cluster, big_topic):
    with Consumer(cluster.urls, auto_offset_reset="earliest", consumer_timeout_ms=1000) as consumer:
        consumer.assign([("big", 0)])
        values = [r.value for r in consumer]
    assert values == big_topic[0]


# ---- positions ------------------------------------------------------------------------------------


def test_seek_position_seek_to_beginning_and_end(cluster, big_topic):
    tp = ("big", 1)
    n = len(big_topic[1])
    with Consumer(cluster.urls, auto_offset_reset="latest") as consumer:
        consumer.assign([tp])
        # latest: a fresh position is the high watermark
        assert consumer.position(tp) == n
        assert consumer.poll(timeout_ms=200) == []
        # seek into the middle of a stored batch: records below the offset are dropped
        consumer.seek(tp, 1500)
        assert consumer.position(tp) == 1500
        first = consumer.poll(timeout_ms=5000, max_records=10)
        assert [r.offset for r in first] == list(range(1500, 1510))
        assert [r.value for r in first] == big_topic[1][1500:1510]
        assert consumer.position(tp) == 1510
        consumer.seek_to_beginning(tp)
        assert consumer.position(tp) == 0
        assert consumer.poll(timeout_ms=5000, max_records=1)[0].offset == 0
        grouped = consumer.poll_by_partition(timeout_ms=5000, max_records=3)
        assert {k: [r.offset for r in v] for k, v in grouped.items()} == {tp: [1, 2, 3]}
        consumer.seek_to_end()
        assert consumer.position(tp) == n
        assert consumer.end_offsets([tp]) == {tp: n}
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        # a seek to the high watermark is valid and waits for new records
        consumer.seek(tp, n)
        assert consumer.poll(timeout_ms=300) == []
        assert consumer.position(tp) == n


def test_assignment_and_bad_arguments_raise_broker_errors(cluster, big_topic):
    with Consumer(cluster.urls) as consumer:
        consumer.assign([("big", 0), ("big", 1), ("big", 0)])
        assert consumer.assignment() == {("big", 0), ("big", 1)}
        with pytest.raises(BrokerError) as e:
            consumer.seek(("big", 5), 0)
        assert e.value.error_code is ErrorCode.INVALID_REQUEST
        with pytest.raises(BrokerError) as e:
            consumer.seek(("big", 0), -1)
        assert e.value.error_code is ErrorCode.INVALID_REQUEST
        with pytest.raises(BrokerError):
            consumer.assign(["big"])
        assert consumer.partitions_for_topic("big") == set(range(BIG_PARTITIONS))
        with pytest.raises(BrokerError) as e:
            consumer.partitions_for_topic("no-such-topic")
        assert e.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        consumer.unsubscribe()
        assert consumer.assignment() == set()
    with pytest.raises(BrokerError) as e:
        Consumer(cluster.urls, auto_offset_reset="sometimes")
    assert e.value.error_code is ErrorCode.INVALID_CONFIG
    with pytest.raises(BrokerError) as e:
        Consumer(cluster.urls, isolation_level="read_dirty")
    assert e.value.error_code is ErrorCode.INVALID_CONFIG
    with pytest.raises(BrokerError) as e:
        Consumer("127.0.0.1:9")
    assert e.value.error_code is ErrorCode.INVALID_REQUEST


def test_group_operations_need_a_group_id(cluster):
    # Consumer groups themselves are tested in test_consumer_groups.py.
    with Consumer(cluster.urls) as consumer:
        for call in (lambda: consumer.subscribe(["big"]), consumer.commit, lambda: consumer.committed(("big", 0))):
            with pytest.raises(BrokerError) as e:
                call()
            assert e.value.error_code is ErrorCode.INVALID_REQUEST
            assert "group_id" in e.value.message


def test_closed_consumer_refuses_calls(cluster):
    consumer = Consumer(cluster.urls)
    consumer.close()
    consumer.close()  # idempotent
    with pytest.raises(BrokerError):
        consumer.poll()


# ---- long polls ---------------------------------------------------------------------------------------


def test_long_poll_returns_as_soon_as_a_record_is_written(cluster):
    cluster.create_topic("live", partitions=2, rf=3)

    async def run() -> tuple[list[ConsumerRecord], float]:
        async with AsyncConsumer(cluster.urls, auto_offset_reset="latest", fetch_max_wait_ms=5000) as c:
            c.assign([("live", 0), ("live", 1)])
            assert await c.position(("live", 1)) == 0
            task = asyncio.create_task(c.poll(timeout_ms=20_000))
            await asyncio.sleep(0.5)  # the fetches are parked in the broker's long poll
            assert not task.done()
            t0 = time.monotonic()
            await asyncio.to_thread(plain_produce, cluster, "live", 1, [{"value": b64(b"hello")}])
            records = await task
            return records, time.monotonic() - t0

    records, waited = asyncio.run(run())
    assert [(r.partition, r.offset, r.value) for r in records] == [(1, 0, b"hello")]
    assert waited < 5.0, f"the long poll did not wake up on the write ({waited:.2f}s)"


# ---- record fields and deserializers ----------------------------------------------------------------------


def test_keys_headers_nulls_timestamps_and_deserializers(cluster):
    # Retention is off: this module checks retention every 0.2 s, and records stamped in 1970 are
    # past the default retention.ms, so the second read below would find them deleted.
    cluster.create_topic("fields", partitions=1, rf=3, **{"retention.ms": -1})
    plain_produce(
        cluster,
        "fields",
        0,
        [
            {"key": b64(b"k1"), "value": b64(b"v1"), "headers": [{"key": "h", "value": b64(b"hv")}], "timestamp": 1234},
            {"key": None, "value": None, "headers": [{"key": "n", "value": None}], "timestamp": 5678},
            {"key": b64(b""), "value": b64("é".encode()), "timestamp": 9},
        ],
    )
    with Consumer(cluster.urls, auto_offset_reset="earliest") as consumer:
        consumer.assign([("fields", 0)])
        raw = poll_until(consumer, 3)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in raw] == [
        (b"k1", b"v1", (("h", b"hv"),), 1234),
        (None, None, (("n", None),), 5678),
        (b"", "é".encode(), (), 9),
    ]

    def text(b: bytes | None) -> str | None:
        return None if b is None else b.decode()

    with Consumer(cluster.urls, auto_offset_reset="earliest", key_deserializer=text, value_deserializer=text) as c:
        c.assign([("fields", 0)])
        decoded = poll_until(c, 3)
    assert [(r.key, r.value) for r in decoded] == [("k1", "v1"), (None, None), ("", "é")]


def test_failing_deserializer_raises_after_the_records_before_it(cluster):
    cluster.create_topic("poison", partitions=1, rf=3)
    plain_produce(cluster, "poison", 0, [{"value": b64(f"{i}".encode())} for i in range(5)] + [{"value": b64(b"x")}])

    def to_int(b: bytes | None) -> int:
        return int(b or b"")

    with Consumer(cluster.urls, auto_offset_reset="earliest", value_deserializer=to_int) as consumer:
        consumer.assign([("poison", 0)])
        assert [r.value for r in poll_until(consumer, 5)] == [0, 1, 2, 3, 4]
        for _ in range(2):  # it fails again until the application seeks past the record
            err = poll_error(consumer)
            assert err.error_code is ErrorCode.CORRUPT_MESSAGE
            assert err.extra["offset"] == 5
            assert consumer.position(("poison", 0)) == 5
        consumer.seek(("poison", 0), 6)
        assert consumer.poll(timeout_ms=300) == []


# ---- OFFSET_OUT_OF_RANGE -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def truncated_topic(cluster: LocalCluster) -> tuple[str, int, int]:
    """A partition whose first 100 records were removed by retention: log start 100, HW 200."""
    cluster.create_topic("trunc", partitions=1, rf=3, **{"retention.ms": 3_600_000})
    # Given 100 records stamped in 1970 (older than retention.ms) and then 100 current ones
    plain_produce(cluster, "trunc", 0, [{"value": b64(b"old"), "timestamp": 1000 + i} for i in range(100)])
    plain_produce(cluster, "trunc", 0, [{"value": b64(f"new{i}".encode())} for i in range(100)])
    # When retention runs on the leader
    leader = cluster.leader("trunc", 0)
    wait_for(lambda: cluster.partition_meta("trunc", 0, leader)["log_start_offset"] == 100, 30, "retention")
    return "trunc", 100, 200


@pytest.mark.parametrize(("policy", "expected_position"), [("earliest", 100), ("latest", 200)])
def test_offset_below_log_start_resets_per_auto_offset_reset(cluster, truncated_topic, policy, expected_position):
    topic, start, hw = truncated_topic
    tp = (topic, 0)
    with Consumer(cluster.urls, auto_offset_reset=policy) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        if policy == "earliest":
            records = poll_until(consumer, hw - start)
            assert [r.offset for r in records] == list(range(start, hw))
            assert records[0].value == b"new0"
        else:
            wait_for(lambda: consumer.poll(timeout_ms=200) == [] and consumer.position(tp) == hw, 20, "reset")
        assert consumer.position(tp) == hw
        # beyond the high watermark (never seen by this consumer) resets the same way
        consumer.seek(tp, hw + 1000)
        wait_for(lambda: consumer.poll(timeout_ms=200) == [] and consumer.position(tp) == hw, 20, "reset")


def test_offset_out_of_range_with_reset_none_raises_until_the_application_seeks(cluster, truncated_topic):
    topic, start, hw = truncated_topic
    tp = (topic, 0)
    with Consumer(cluster.urls, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        # no position and no reset policy: a clear error, not a guess
        with pytest.raises(BrokerError) as e:
            consumer.position(tp)
        assert e.value.error_code is ErrorCode.OFFSET_OUT_OF_RANGE
        assert poll_error(consumer).error_code is ErrorCode.OFFSET_OUT_OF_RANGE
        for bad in (0, hw + 5):
            consumer.seek(tp, bad)
            err = poll_error(consumer)
            assert err.error_code is ErrorCode.OFFSET_OUT_OF_RANGE
            assert err.retriable is False
            assert consumer.position(tp) == bad  # the position is left for the application to fix
        consumer.seek(tp, start)
        assert [r.offset for r in poll_until(consumer, hw - start)] == list(range(start, hw))


def test_read_committed_without_transactions_reads_up_to_the_high_watermark(cluster, truncated_topic):
    topic, start, hw = truncated_topic
    with Consumer(cluster.urls, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, 0)])
        assert consumer.position((topic, 0)) == start
        assert [r.offset for r in poll_until(consumer, hw - start)] == list(range(start, hw))
        consumer.seek_to_end()
        assert consumer.position((topic, 0)) == hw


def test_position_gives_up_after_its_timeout_when_no_broker_answers(cluster):
    from cluster.config import free_ports

    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    with Consumer(dead, auto_offset_reset="earliest", retry_backoff_ms=50) as consumer:
        consumer.assign([("big", 0)])
        assert consumer.poll(timeout_ms=300) == []  # the fetch task keeps retrying in the background
        t0 = time.monotonic()
        with pytest.raises(BrokerError) as e:
            consumer.position(("big", 0), timeout_ms=700)
        assert e.value.error_code is ErrorCode.REQUEST_TIMED_OUT
        assert 0.6 < time.monotonic() - t0 < 10
    with Consumer(cluster.urls) as consumer:
        consumer.assign([("no-such-topic", 0)])
        with pytest.raises(BrokerError) as e:
            consumer.position(("no-such-topic", 0))
        assert e.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
