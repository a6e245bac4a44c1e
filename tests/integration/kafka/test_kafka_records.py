"""Records through the Kafka listener: every compression, both doors, ListOffsets, refused batches, and
compressed batches served as written.

Real Kafka clients (confluent-kafka, kafka-python, aiokafka) against a real
3-node cluster; the HTTP side through the HTTP API and ``clients.Consumer``.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from clients import Consumer as HttpConsumer
from tests.integration.kafka.conftest import unique
from tests.support.cluster import LocalCluster, http, wait_for

pytestmark = pytest.mark.integration

BASE_TS = 1_700_000_000_000


def _topic(cluster: LocalCluster, partitions: int = 1) -> str:
    name = unique("rec")
    cluster.create_topic(name, partitions=partitions)
    cluster.wait_leaders(name, partitions)
    return name


def _kafka_read(bootstrap: str, topic: str, n: int, partitions: int = 1, timeout: float = 20) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "enable.auto.commit": False,
                         "isolation.level": "read_committed"})  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got.append(m)
        return got
    finally:
        consumer.close()


def _http_records(cluster: LocalCluster, topic: str, partition: int = 0) -> list[dict[str, Any]]:
    leader = wait_for(lambda: cluster.leader(topic, partition), 10, "a leader")
    status, body = http("GET", f"{cluster.url(leader)}/v1/topics/{topic}/partitions/{partition}/records"
                        "?offset=0&max_bytes=10000000&isolation=read_committed")  # fmt: skip
    assert status == 200, body
    return list(body["records"])


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_kafka_produce_is_read_exactly_by_both_doors(kafka_cluster: LocalCluster, compression: str) -> None:
    topic = _topic(kafka_cluster)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "acks": "all", "linger.ms": 5,
                         "compression.type": compression, "enable.idempotence": False})  # fmt: skip
    sent = [(f"k{i}".encode(), f"value-{i}".encode() * 20, BASE_TS + i) for i in range(200)]
    errors: list[Any] = []
    for key, value, ts in sent:
        producer.produce(topic, key=key, value=value, timestamp=ts, headers=[("h", key), ("empty", None)],
                         partition=0, on_delivery=lambda err, _m: errors.append(err) if err else None)  # fmt: skip
    assert producer.flush(20) == 0 and not errors
    got = _kafka_read(kafka_cluster.bootstrap_servers, topic, len(sent))
    assert [(m.key(), m.value(), m.timestamp()[1]) for m in got] == sent
    assert [m.offset() for m in got] == list(range(len(sent)))
    assert got[5].headers() == [("h", b"k5"), ("empty", None)]
    # The HTTP door reads the same records, keys, headers and timestamps.
    records = _http_records(kafka_cluster, topic)
    assert [(base64.b64decode(r["key"]), base64.b64decode(r["value"]), r["timestamp"]) for r in records] == sent


def test_http_produce_is_read_by_kafka_clients(kafka_cluster: LocalCluster) -> None:
    topic = _topic(kafka_cluster)
    leader = wait_for(lambda: kafka_cluster.leader(topic, 0), 10, "a leader")
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    records = [{"key": b64(f"k{i}".encode()), "value": b64(f"v{i}".encode()), "timestamp": BASE_TS + i,
                "headers": [{"key": "trace", "value": b64(f"t{i}".encode())}]} for i in range(50)]  # fmt: skip
    body = {"acks": "all", "timeout_ms": 10000, "transactional_id": None, "partitions": [
        {"topic": topic, "partition": 0, "producer_id": -1, "producer_epoch": -1, "base_sequence": -1,
         "records": records}]}  # fmt: skip
    status, answer = http("POST", f"{kafka_cluster.url(leader)}/v1/produce", body)
    assert status == 200 and answer["partitions"][0]["error_code"] == "NONE", answer
    got = _kafka_read(kafka_cluster.bootstrap_servers, topic, 50)
    assert [(m.key(), m.value(), m.timestamp()[1], m.headers()) for m in got] == [
        (f"k{i}".encode(), f"v{i}".encode(), BASE_TS + i, [("trace", f"t{i}".encode())]) for i in range(50)
    ]
    # kafka-python reads them too.
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    kc = KafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap_servers, auto_offset_reset="earliest",
                       enable_auto_commit=False, consumer_timeout_ms=2000)  # fmt: skip
    try:
        kc.assign([KTP(topic, 0)])
        values = [r.value for r in kc]
    finally:
        kc.close()
    assert values == [f"v{i}".encode() for i in range(50)]


def test_kafka_produce_is_read_by_the_python_client_and_aiokafka(kafka_cluster: LocalCluster) -> None:
    topic = _topic(kafka_cluster, partitions=3)

    async def produce() -> None:
        from aiokafka import AIOKafkaProducer

        p = AIOKafkaProducer(bootstrap_servers=kafka_cluster.bootstrap_servers, compression_type="gzip", acks="all")
        await p.start()
        try:
            for i in range(90):
                await p.send(topic, value=f"a{i}".encode(), key=f"{i}".encode(), partition=i % 3)
            await p.flush()
        finally:
            await p.stop()

    asyncio.run(produce())
    consumer = HttpConsumer(kafka_cluster.urls, isolation_level="read_committed", auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, p) for p in range(3)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(seen) < 90 and time.monotonic() < deadline:
            seen += [r.value or b"" for r in consumer.poll(timeout_ms=500)]
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"a{i}".encode() for i in range(90))


def test_list_offsets_earliest_latest_and_by_timestamp(kafka_cluster: LocalCluster) -> None:
    topic = _topic(kafka_cluster)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "enable.idempotence": False})
    for i in range(10):
        producer.produce(topic, value=b"x", timestamp=BASE_TS + 1000 * i, partition=0)
    assert producer.flush(20) == 0
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": unique("lo")})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 10)
        found = consumer.offsets_for_times([TopicPartition(topic, 0, BASE_TS + 4500)], timeout=10)
        assert found[0].offset == 5
        beyond = consumer.offsets_for_times([TopicPartition(topic, 0, BASE_TS + 10**9)], timeout=10)
        assert beyond[0].offset == -1  # no record that new: Kafka's "end" (-1)
    finally:
        consumer.close()


def _raw_produce(cluster: LocalCluster, node: int, topic: str, batch: bytes, version: int = 9) -> Any:
    import socket

    host, port = cluster.configs[node - 1].self_address.kafka_address.rsplit(":", 1)  # type: ignore[union-attr]
    req = ProduceRequest[version](
        transactional_id=None, acks=-1, timeout_ms=5000,
        topic_data=[ProduceRequest.TopicProduceData(
            name=topic, partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)]
        )],
    )  # fmt: skip
    req.with_header(correlation_id=1, client_id="raw")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(bytes(req.encode(header=True, framed=True)))
        (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
        data = s.recv(size, socket.MSG_WAITALL)
    return ProduceResponse.decode(data, version=version, header=True).responses[0].partition_responses[0]


def _batch(values: list[bytes]) -> bytearray:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=2**20)  # fmt: skip
    for i, v in enumerate(values):
        b.append(i, BASE_TS, None, v, [])
    return b.build()


def test_malformed_batches_are_refused_per_partition_and_write_nothing(kafka_cluster: LocalCluster) -> None:
    topic = _topic(kafka_cluster)
    leader = wait_for(lambda: kafka_cluster.leader(topic, 0), 10, "a leader")
    good = _batch([b"a", b"b"])
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    short_count = bytearray(good)
    struct.pack_into(">i", short_count, 57, 5)  # recordCount 5 for 2 records (the CRC no longer matches either)
    cases = {
        "crc": (bytes(bad_crc), 2),
        "truncated": (bytes(good[:40]), 2),
        "count": (bytes(short_count), 2),
    }
    for what, (raw, code) in cases.items():
        answer = _raw_produce(kafka_cluster, leader, topic, raw)
        assert answer.error_code == code, what
    assert _raw_produce(kafka_cluster, leader, topic, bytes(good), version=2).error_code == 43  # message sets
    assert _http_records(kafka_cluster, topic) == []  # nothing was written
    follower = next(n for n in (1, 2, 3) if n != leader)
    assert _raw_produce(kafka_cluster, follower, topic, bytes(good)).error_code == 6  # NOT_LEADER_OR_FOLLOWER
    assert _raw_produce(kafka_cluster, leader, unique("missing"), bytes(good)).error_code == 3
    ok = _raw_produce(kafka_cluster, leader, topic, bytes(good))
    assert (ok.error_code, ok.base_offset) == (0, 0)


def _raw_fetch(cluster: LocalCluster, node: int, topic: str, offset: int) -> bytes:
    import socket

    host, port = cluster.configs[node - 1].self_address.kafka_address.rsplit(":", 1)  # type: ignore[union-attr]
    req = FetchRequest[4](
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)
        ])],
    )  # fmt: skip
    req.with_header(correlation_id=2, client_id="raw")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(bytes(req.encode(header=True, framed=True)))
        (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
        data = s.recv(size, socket.MSG_WAITALL)
    part = FetchResponse.decode(data, version=4, header=True).responses[0].partitions[0]
    assert part.error_code == 0, part
    return bytes(part.records)


def test_a_compressed_batch_is_stored_and_served_as_the_producer_wrote_it(kafka_cluster: LocalCluster) -> None:
    # Native storage (docs/kafka-listener.md "Record batches"): a Kafka fetch gets the producer's bytes,
    # compressed as written, with only baseOffset (and the leader epoch, outside the CRC) patched.
    topic = _topic(kafka_cluster)
    leader = wait_for(lambda: kafka_cluster.leader(topic, 0), 10, "a leader")
    assert _raw_produce(kafka_cluster, leader, topic, bytes(_batch([b"first"]))).error_code == 0
    b = DefaultRecordBatchBuilder(magic=2, compression_type=4, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=2**20)  # fmt: skip
    for i in range(20):
        b.append(i, BASE_TS + i, None, f"zstd-{i}".encode() * 50, [])
    zstd = bytes(b.build())
    answer = _raw_produce(kafka_cluster, leader, topic, zstd)
    assert (answer.error_code, answer.base_offset) == (0, 1)
    served = _raw_fetch(kafka_cluster, leader, topic, 1)
    assert len(served) == len(zstd) and served[16:] == zstd[16:]
    assert struct.unpack_from(">q", served, 0) == (1,)
    # The HTTP door decodes the same batch.
    assert [base64.b64decode(r["value"]) for r in _http_records(kafka_cluster, topic)][1:] == [
        f"zstd-{i}".encode() * 50 for i in range(20)
    ]
