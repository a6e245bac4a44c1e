"""Producer and AsyncProducer against three real node processes: what lands where, callbacks, errors, limits."""

from __future__ import annotations

import asyncio
import base64
import http.client as http_client
import itertools
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from clients import DeliveryTimeoutError, Producer
from clients.aio import AsyncProducer
from clients.partitioner import partition_for_key
from clients.protocol import (
    PRODUCE_CONTENT_TYPE,
    BrokerError,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    Record,
    encode_batch,
    encode_produce_request,
)
from clients.records import RecordMetadata
from tests.support.cluster import LocalCluster, http, samples
from tests.support.exactly_once import assert_exactly_once_in_order, read_log

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("producer"), 3)
    try:
        yield c.start()
    finally:
        c.close()


_topics = iter(range(1_000_000))


@pytest.fixture
def topic(cluster: LocalCluster) -> str:
    name = f"p{next(_topics)}"
    cluster.create_topic(name, partitions=3)
    return name


def batches(c: LocalCluster, topic: str, partition: int) -> list[dict[str, Any]]:
    """The partition's stored batches (``format=batches``) from its leader."""
    leader = c.leader(topic, partition)
    url = f"{c.url(leader)}/v1/topics/{topic}/partitions/{partition}/records?offset=0&format=batches"
    status, body = http("GET", url)
    assert status == 200, body
    return list(body["batches"])


# ---- sync ----------------------------------------------------------------------------------------------


def test_keyed_records_land_on_murmur2_partitions_with_key_headers_and_timestamp(cluster, topic):
    with Producer(cluster.urls) as p:
        futs = [
            p.send(topic, value=f"v{i}".encode(), key=f"k{i % 10}".encode(),
                   headers=[("h", b"1"), ("n", None)], timestamp_ms=1_700_000_000_000 + i)
            for i in range(300)
        ]  # fmt: skip
        p.flush(30)
        mds = [f.result() for f in futs]
    for i, md in enumerate(mds):
        assert isinstance(md, RecordMetadata)
        assert md.topic == topic and md.partition == partition_for_key(f"k{i % 10}".encode(), 3)
        assert md.timestamp == 1_700_000_000_000 + i
        assert md.serialized_key_size == len(f"k{i % 10}") and md.serialized_value_size == len(f"v{i}")
    # the JSON fetch shows the same key, headers and timestamp at the reported offset
    md = mds[7]
    leader = cluster.leader(topic, md.partition)
    status, body = http(
        "GET", f"{cluster.url(leader)}/v1/topics/{topic}/partitions/{md.partition}/records?offset={md.offset}"
    )
    assert status == 200
    rec = body["records"][0]
    assert rec["offset"] == md.offset
    assert base64.b64decode(rec["key"]) == b"k7" and base64.b64decode(rec["value"]) == b"v7"
    assert rec["timestamp"] == 1_700_000_000_007
    assert [h["key"] for h in rec["headers"]] == ["h", "n"]
    # every record exactly once, in send order
    for part in range(3):
        sent = [f"v{i}".encode() for i, m in enumerate(mds) if m.partition == part]
        acked = {f"v{i}".encode(): m for i, m in enumerate(mds) if m.partition == part}
        assert_exactly_once_in_order(sent, acked, read_log(cluster, topic, part, len(sent)), f"{topic}-{part}")


def test_batches_carry_producer_id_epoch_and_consecutive_sequences(cluster, topic):
    with Producer(cluster.urls, batch_size=1024, linger_ms=1) as p:
        futs = [p.send(topic, value=b"x" * 100, partition=1) for _ in range(50)]
        p.flush(30)
        pid = p.producer_id
        assert all(f.result().partition == 1 for f in futs)
    stored = batches(cluster, topic, 1)
    assert len(stored) > 1, "batch_size did not split the records"
    assert {b["producer_id"] for b in stored} == {pid} and {b["producer_epoch"] for b in stored} == {0}
    seq = 0
    for b in stored:
        assert b["base_sequence"] == seq
        seq += len(b["records"])
    assert seq == 50


def test_null_keys_stick_to_a_partition_until_its_batch_is_full(cluster, topic):
    with Producer(cluster.urls, batch_size=2048, linger_ms=1000) as p:
        futs = [p.send(topic, value=f"n{i:04d}".encode() + b"." * 200) for i in range(100)]
        p.flush(30)
        parts = [f.result().partition for f in futs]
    # 221-byte records: 9 fill a 2048-byte batch (40-byte header), then the next partition takes over
    runs = [len(list(g)) for _, g in itertools.groupby(parts)]
    assert len(runs) > 1, "null keys never left the first partition"
    assert runs[:-1] == [9] * (len(runs) - 1), f"records hop between partitions instead of filling batches: {parts}"


def test_non_idempotent_producer_writes_plain_batches(cluster, topic):
    with Producer(cluster.urls, enable_idempotence=False, acks=1) as p:
        md = p.send(topic, value=b"plain", partition=0).result(timeout=30)
    assert md.offset == 0
    [b] = batches(cluster, topic, 0)
    assert (b["producer_id"], b["producer_epoch"], b["base_sequence"]) == (-1, -1, -1)


def test_callbacks_serializers_and_buffer_backpressure(cluster, topic):
    got: list[tuple[RecordMetadata | None, BaseException | None, str]] = []
    done = threading.Event()

    def cb(md: RecordMetadata | None, exc: BaseException | None) -> None:
        got.append((md, exc, threading.current_thread().name))
        if len(got) == 200:
            done.set()

    # a buffer far smaller than the data: send() blocks until batches are acknowledged
    with Producer(cluster.urls, key_serializer=str.encode, value_serializer=lambda v: repr(v).encode(),
                  buffer_memory=8 * 1024, batch_size=2048) as p:  # fmt: skip
        for i in range(200):
            p.send(topic, value={"i": i, "pad": "z" * 100}, key=str(i), callback=cb)
        assert done.wait(30)
        assert p.metrics()["buffered_bytes"] == 0
    assert all(exc is None and md is not None for md, exc, _ in got)
    assert {name for *_, name in got} == {"txbroker-producer"}  # callbacks run on the I/O thread


def test_errors_are_broker_errors_with_codes(cluster, topic):
    with Producer(cluster.urls, max_block_ms=500, max_request_size=10_000) as p:
        # unknown topic: the future fails after max_block_ms of metadata refreshes
        with pytest.raises(BrokerError) as ei:
            p.send("no-such-topic", value=b"x").result(timeout=30)
        assert ei.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        # a partition the topic does not have
        with pytest.raises(BrokerError) as ei:
            p.send(topic, value=b"x", partition=7).result(timeout=30)
        assert ei.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        # a record larger than max_request_size fails at once, in the caller
        with pytest.raises(BrokerError) as ei:
            p.send(topic, value=b"x" * 20_000)
        assert ei.value.error_code is ErrorCode.RECORD_TOO_LARGE
        with pytest.raises(BrokerError) as ei:
            p.send(topic, value="not bytes")
        assert ei.value.error_code is ErrorCode.INVALID_REQUEST
        assert p.send(topic, value=b"still fine").result(timeout=30).offset >= 0
    with pytest.raises(BrokerError):
        p.send(topic, value=b"after close")
    txn = Producer(cluster.urls, transactional_id="t1")
    try:
        with pytest.raises(BrokerError) as ei:
            txn.send(topic, value=b"x")
        assert ei.value.error_code is ErrorCode.INVALID_TXN_STATE
    finally:
        txn.close()
    with pytest.raises(BrokerError) as ei:
        Producer(cluster.urls, acks=0)
    assert ei.value.error_code is ErrorCode.INVALID_CONFIG


def test_close_with_timeout_fails_what_cannot_be_delivered():
    # Nothing listens on the bootstrap URL: the record can never be delivered
    p = Producer("http://127.0.0.1:9", max_block_ms=60_000, request_timeout_ms=500, delivery_timeout_ms=60_000)
    fut = p.send("t", value=b"x")
    started = time.monotonic()
    p.close(timeout=1.0)
    assert time.monotonic() - started < 10
    exc = fut.exception(timeout=5)
    assert isinstance(exc, DeliveryTimeoutError) and exc.error_code is ErrorCode.REQUEST_TIMED_OUT
    assert not exc.maybe_written


# ---- async twin ----------------------------------------------------------------------------------------


def test_async_producer_round_trip_callbacks_and_flush(cluster, topic):
    seen: list[RecordMetadata | None] = []

    async def run() -> tuple[list[RecordMetadata], RecordMetadata, int]:
        async with AsyncProducer(cluster.urls, linger_ms=2) as p:
            futs = [
                await p.send(topic, value=f"a{i:04d}".encode(), key=f"k{i % 4}".encode(),
                             callback=lambda md, exc: seen.append(md))
                for i in range(1000)
            ]  # fmt: skip
            await p.flush(30)
            assert all(f.done() for f in futs)
            single = await p.send_and_wait(topic, b"last", b"k0")
            assert await p.partitions_for(topic) == {0, 1, 2}
            return [f.result() for f in futs], single, p.producer_id

    mds, single, pid = asyncio.run(run())
    assert pid >= 0 and len(seen) == 1000
    assert single.partition == partition_for_key(b"k0", 3)
    values = [f"a{i:04d}".encode() for i in range(1000)] + [b"last"]
    mds.append(single)
    for part in range(3):
        sent = [v for v, m in zip(values, mds, strict=True) if m.partition == part]
        acked = {v: m for v, m in zip(values, mds, strict=True) if m.partition == part}
        assert_exactly_once_in_order(sent, acked, read_log(cluster, topic, part, len(sent)), f"{topic}-{part}")


def test_async_send_to_an_unreachable_cluster_fails_after_max_block_ms():
    async def run() -> float:
        p = AsyncProducer("http://127.0.0.1:9", max_block_ms=300)
        started = time.monotonic()
        try:
            with pytest.raises(BrokerError) as ei:
                await p.send("t", b"x")
            assert ei.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            return time.monotonic() - started
        finally:
            await p.close(1)

    assert 0.2 < asyncio.run(run()) < 10


# ---- the leader's submit order ---------------------------------------------------------------------------


def _reordered(url: str, outcome: str = "in_order") -> float:
    return sum(v for labels, v in samples(url, "txbroker_reordered_batches_total") if labels.get("outcome") == outcome)


def _start_post(url: str, body: bytes, *, hold_last_byte: bool) -> socket.socket:
    host, port = urllib.parse.urlsplit(url).netloc.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = (
        f"POST /v1/produce HTTP/1.1\r\nHost: {host}\r\nContent-Type: {PRODUCE_CONTENT_TYPE}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + (body[:-1] if hold_last_byte else body))
    return sock


def _answer(sock: socket.socket) -> dict[str, Any]:
    resp = http_client.HTTPResponse(sock)
    resp.begin()
    part = json.loads(resp.read())["partitions"][0]
    sock.close()
    return dict(part)


def test_batches_that_overtake_their_predecessor_wait_for_it_on_the_leader(cluster, topic):
    """Two in-flight batches of one producer on separate connections, the later one arriving first.

    The leader holds the overtaking batch until its predecessor is submitted, so both land in sequence order
    instead of the later one failing with OUT_OF_ORDER_SEQUENCE_NUMBER (cluster/sequencer.py). The first
    batch's request is held one byte short of complete, so the second is certainly read first; a round whose
    first batch still went first (the leader had not read the second in time) is simply repeated.
    """
    status, init = http("POST", cluster.urls[0] + "/v1/producers/init", {"transactional_id": None})
    assert status == 200, init
    pid, epoch = int(init["producer_id"]), int(init["producer_epoch"])
    url = cluster.url(cluster.leader(topic, 0))
    records = [Record(value=f"r{i}".encode()) for i in range(10)]

    def request(seq: int) -> bytes:
        batch = encode_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
        return encode_produce_request(ProduceRequest((ProducePartition(topic, 0, batch),)))

    before, offsets = _reordered(url), []
    deadline = time.monotonic() + 60
    seq = 0
    while _reordered(url) == before:
        assert time.monotonic() < deadline, "the second batch never overtook the first in 60 s"
        timed_out = _reordered(url, "timed_out")
        first = _start_post(url, request(seq), hold_last_byte=True)
        second = _start_post(url, request(seq + 10), hold_last_byte=False)
        time.sleep(0.03)  # pacing only: if the leader has not read `second` yet, this round proves nothing
        first.sendall(request(seq)[-1:])
        a, b = _answer(first), _answer(second)
        assert a.get("error_code", "NONE") == "NONE", a
        offsets.append(a["base_offset"])
        seq += 10
        if b.get("error_code") == "OUT_OF_ORDER_SEQUENCE_NUMBER" and _reordered(url, "timed_out") > timed_out:
            continue  # a loaded host read `first` only after the 200 ms wait: the log judged `second`; again
        assert b.get("error_code", "NONE") == "NONE", (a, b)
        assert b["base_offset"] == a["base_offset"] + 10
        offsets.append(b["base_offset"])
        seq += 10
    assert offsets == list(range(0, 10 * len(offsets), 10))
    stored = batches(cluster, topic, 0)
    assert [b["base_sequence"] for b in stored] == list(range(0, seq, 10))


# ---- batches built by the caller (create_batch / send_batch) ---------------------------------------------


def test_send_batch_lands_as_one_batch_in_order_with_send_and_answers_its_base_offset(cluster, topic):
    """send() records, a caller-built batch, then send() again: one partition, that order, each record once."""

    async def run() -> tuple[list[RecordMetadata], list[RecordMetadata], int]:
        async with AsyncProducer(cluster.urls, batch_size=4096, linger_ms=50) as p:
            before = [await p.send(topic, value=f"s{i}".encode(), partition=2) for i in range(3)]
            batch = p.create_batch()
            offsets = []
            while (i := batch.record_count()) < 1000:
                at = batch.append(value=f"b{i:03d}".encode() + b"." * 100, key=b"k" if i % 2 else None,
                                  headers=[("h", str(i).encode())], timestamp=1_700_000_000_000 + i)  # fmt: skip
                if at is None:
                    break
                offsets.append(at)
            assert offsets == list(range(len(offsets))) and 10 < len(offsets) < 1000, "batch_size bounds the batch"
            assert batch.size() <= 4096
            fut = await p.send_batch(batch, topic, partition=2)
            after = [await p.send(topic, value=f"t{i}".encode(), partition=2) for i in range(3)]
            await p.flush(30)
            with pytest.raises(BrokerError) as again:
                await p.send_batch(batch, topic, partition=2)
            assert again.value.error_code is ErrorCode.INVALID_REQUEST
            with pytest.raises(BrokerError) as sent:
                batch.append(value=b"late")
            assert sent.value.error_code is ErrorCode.INVALID_REQUEST
            return [f.result() for f in before] + [fut.result()], [f.result() for f in after], len(offsets)

    first, after, n = asyncio.run(run())
    *before, whole = first
    assert [m.offset for m in before] == [0, 1, 2]
    assert (whole.topic, whole.partition, whole.offset, whole.timestamp) == (topic, 2, 3, 1_700_000_000_000)
    assert [m.offset for m in after] == [3 + n, 4 + n, 5 + n]
    stored = batches(cluster, topic, 2)
    mine = [b for b in stored if b["base_offset"] == 3]
    assert len(mine) == 1 and len(mine[0]["records"]) == n, "the caller's batch was split or merged"
    got = [v for _, v in read_log(cluster, topic, 2, n + 6)]
    assert got == [b"s0", b"s1", b"s2"] + [f"b{i:03d}".encode() + b"." * 100 for i in range(n)] + [b"t0", b"t1", b"t2"]
    keys = [r.get("key") and base64.b64decode(r["key"]) for r in mine[0]["records"][:4]]
    assert keys == [None, b"k", None, b"k"]


def test_send_batch_rejects_bad_requests_and_changes_nothing(cluster, topic):
    async def run() -> None:
        async with AsyncProducer(cluster.urls, max_block_ms=1000, max_request_size=10_000) as p:
            empty = p.create_batch()
            with pytest.raises(BrokerError) as e:
                await p.send_batch(empty, topic, partition=0)
            assert e.value.error_code is ErrorCode.INVALID_REQUEST
            full = p.create_batch()
            with pytest.raises(BrokerError) as e:
                full.append(value=b"x" * 20_000)
            assert e.value.error_code is ErrorCode.RECORD_TOO_LARGE
            with pytest.raises(BrokerError) as e:
                full.append(value={"not": "bytes"})
            assert e.value.error_code is ErrorCode.INVALID_REQUEST
            full.append(value=b"ok")
            with pytest.raises(BrokerError) as e:
                await p.send_batch(full, topic, partition=7)
            assert e.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            with pytest.raises(BrokerError) as e:
                await p.send_batch(full, "no-such-topic", partition=0)
            assert e.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert full.record_count() == 1, "a refused send_batch leaves the batch usable"
            md = await (await p.send_batch(full, topic, partition=0))
            assert md.offset == 0

    asyncio.run(run())
    assert read_log(cluster, topic, 0, 1) == [(0, b"ok")]


def test_sync_send_batch_keeps_send_order_and_memory_accounting(cluster, topic):
    expected: list[bytes] = []
    with Producer(cluster.urls, linger_ms=20, buffer_memory=64 * 1024, batch_size=16 * 1024) as p:
        futs = []
        for round_ in range(20):  # 20 x ~16 KiB batches through a 64 KiB buffer: send_batch must wait for room
            expected.append(f"r{round_}".encode())
            futs.append(p.send(topic, value=expected[-1], partition=1))
            batch = p.create_batch()
            while batch.append(value=(v := f"r{round_}b{batch.record_count()}".encode().ljust(500, b"."))) is not None:
                expected.append(v)
            futs.append(p.send_batch(batch, topic, partition=1))
        mds = [f.result(timeout=30) for f in futs]
        assert p.metrics()["buffered_bytes"] == 0
    assert all(b.offset > a.offset for a, b in itertools.pairwise(mds)), "send and send_batch overtook each other"
    assert [v for _, v in read_log(cluster, topic, 1, len(expected))] == expected
