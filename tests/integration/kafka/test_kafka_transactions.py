"""Idempotent and transactional producers through the Kafka listener (the classic transaction protocol).

The protocol tests speak the transaction APIs frame by frame to the
coordinator and the partition leader, as librdkafka does (AddPartitionsToTxn
v0-3, EndTxn v1-3); the client tests run confluent-kafka, kafka-python and
aiokafka unmodified: idempotence, commit and abort read back by a
read_committed consumer of the same library and through the HTTP door, zombie
fencing, and a transaction left open by a Kafka client pinning the HTTP
read_committed last stable offset.
"""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import (
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from kafka.record.default_records import DefaultRecordBatchBuilder

from tests.integration.kafka.conftest import unique
from tests.support.cluster import LocalCluster, http, wait_for

pytestmark = pytest.mark.integration

PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE = 90, 47, 48
NOT_COORDINATOR, OPERATION_NOT_ATTEMPTED, UNKNOWN_TOPIC_OR_PARTITION = 16, 55, 3


# ---- helpers ---------------------------------------------------------------------------------------------


def _topic(cluster: LocalCluster, partitions: int = 1) -> str:
    name = unique("txn")
    cluster.create_topic(name, partitions=partitions)
    cluster.wait_leaders(name, partitions)
    return name


class Wire:
    """Requests to one node's Kafka listener, one connection per node, answered in order."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.socks: dict[int, socket.socket] = {}
        self.cid = 0

    def call(self, node: int, request: Any, response: Any, version: int) -> Any:
        s = self.socks.get(node)
        if s is None:
            host, port = str(self.cluster.configs[node - 1].self_address.kafka_address).rsplit(":", 1)
            s = self.socks[node] = socket.create_connection((host, int(port)), timeout=20)
        self.cid += 1
        request.with_header(correlation_id=self.cid, client_id="txn-wire")
        s.sendall(bytes(request.encode(header=True, framed=True)))
        (size,) = struct.unpack(">i", _recv(s, 4))
        answer = response.decode(_recv(s, size), version=version, header=True)
        assert answer.header.correlation_id == self.cid
        return answer

    def close(self) -> None:
        for s in self.socks.values():
            s.close()


def _recv(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


@pytest.fixture
def wire(kafka_cluster: LocalCluster) -> Any:
    w = Wire(kafka_cluster)
    yield w
    w.close()


def _coordinator(cluster: LocalCluster, tid: str) -> int:
    def ask() -> int | None:
        status, body = http("GET", f"{cluster.url(1)}/v1/coordinators/transaction/{tid}")
        return int(body["node_id"]) if status == 200 else None

    return int(wait_for(ask, 20, f"a coordinator for {tid}"))


def _init(wire: Wire, node: int, tid: str | None, version: int = 4, pid: int = -1, epoch: int = -1) -> Any:
    req = InitProducerIdRequest[version](transactional_id=tid, transaction_timeout_ms=30_000, producer_id=pid,
                                         producer_epoch=epoch)  # fmt: skip
    return wire.call(node, req, InitProducerIdResponse, version)


def _add(wire: Wire, node: int, tid: str, pid: int, epoch: int, topic: str, parts: list[int], version: int = 3) -> Any:
    req = AddPartitionsToTxnRequest[version](
        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=parts)],
    )  # fmt: skip
    resp = wire.call(node, req, AddPartitionsToTxnResponse, version)
    return {(t.name, p.partition_index): p.partition_error_code for t in resp.results_by_topic_v3_and_below
            for p in t.results_by_partition}  # fmt: skip


def _end(wire: Wire, node: int, tid: str, pid: int, epoch: int, commit: bool, version: int = 3) -> int:
    req = EndTxnRequest[version](transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit)
    return int(wire.call(node, req, EndTxnResponse, version).error_code)


def _batch(values: list[bytes], pid: int, epoch: int, seq: int, transactional: bool = True) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=2**20)  # fmt: skip
    for i, v in enumerate(values):
        b.append(i, timestamp=1_700_000_000_000 + i, key=None, value=v, headers=[])
    return bytes(b.build())


def _produce(wire: Wire, cluster: LocalCluster, topic: str, batch: bytes, tid: str | None, partition: int = 0) -> Any:
    leader = wait_for(lambda: cluster.leader(topic, partition), 20, "a leader")
    Data = ProduceRequest.TopicProduceData
    req = ProduceRequest[9](transactional_id=tid, acks=-1, timeout_ms=10_000, topic_data=[
        Data(name=topic, partition_data=[Data.PartitionProduceData(index=partition, records=batch)])])  # fmt: skip
    return wire.call(leader, req, ProduceResponse, 9).responses[0].partition_responses[0]


def _committed_values(cluster: LocalCluster, topic: str, partition: int = 0) -> list[bytes]:
    import base64

    leader = wait_for(lambda: cluster.leader(topic, partition), 20, "a leader")
    status, body = http("GET", f"{cluster.url(leader)}/v1/topics/{topic}/partitions/{partition}/records"
                        "?offset=0&max_bytes=10000000&isolation=read_committed")  # fmt: skip
    assert status == 200, body
    return [base64.b64decode(r["value"]) for r in body["records"]]


def _lso(cluster: LocalCluster, topic: str, partition: int = 0) -> int:
    leader = wait_for(lambda: cluster.leader(topic, partition), 20, "a leader")
    status, body = http("GET", f"{cluster.url(leader)}/v1/topics/{topic}/partitions/{partition}/records"
                        "?offset=0&max_bytes=1000000&isolation=read_committed")  # fmt: skip
    assert status == 200, body
    return int(body["last_stable_offset"])


# ---- the classic protocol, frame by frame -------------------------------------------------------------


def test_classic_client_keeps_its_epoch_across_transactions(kafka_cluster: LocalCluster, wire: Wire) -> None:
    topic, tid = _topic(kafka_cluster), unique("tid")
    coord = _coordinator(kafka_cluster, tid)
    init = _init(wire, coord, tid)
    assert init.error_code == 0
    pid, epoch = init.producer_id, init.producer_epoch
    seq = 0
    for round_, commit in enumerate((True, False, True)):
        assert _add(wire, coord, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}
        values = [f"r{round_}-{i}".encode() for i in range(3)]
        res = _produce(wire, kafka_cluster, topic, _batch(values, pid, epoch, seq), tid)
        assert res.error_code == 0, res
        seq += len(values)
        assert _end(wire, coord, tid, pid, epoch, commit) == 0
        # A retried EndTxn of the same identity (its answer lost) is answered NONE again.
        assert _end(wire, coord, tid, pid, epoch, commit) == 0
        assert _end(wire, coord, tid, pid, epoch, not commit) == INVALID_TXN_STATE
    want = [f"r{r}-{i}".encode() for r in (0, 2) for i in range(3)]
    assert wait_for(lambda: _committed_values(kafka_cluster, topic) == want or None, 20, "the committed records")
    # The producer state at the leader: the same epoch, no open transaction.
    leader = wait_for(lambda: kafka_cluster.leader(topic, 0), 20, "a leader")
    req = DescribeProducersRequest[0](topics=[DescribeProducersRequest.TopicRequest(name=topic, partition_indexes=[0])])
    part = wire.call(leader, req, DescribeProducersResponse, 0).topics[0].partitions[0]
    assert part.error_code == 0
    [state] = [p for p in part.active_producers if p.producer_id == pid]
    assert (state.producer_epoch, state.last_sequence, state.current_txn_start_offset) == (epoch, seq - 1, -1)
    follower = next(n for n in (1, 2, 3) if n != leader)
    other = wire.call(follower, req, DescribeProducersResponse, 0).topics[0].partitions[0]
    assert other.error_code == 6  # NOT_LEADER_OR_FOLLOWER


def test_a_second_init_fences_the_first_producer_and_aborts_its_transaction(
    kafka_cluster: LocalCluster, wire: Wire
) -> None:
    topic, tid = _topic(kafka_cluster), unique("tid")
    coord = _coordinator(kafka_cluster, tid)
    first = _init(wire, coord, tid)
    pid, epoch = first.producer_id, first.producer_epoch
    assert _add(wire, coord, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}
    assert _produce(wire, kafka_cluster, topic, _batch([b"zombie"], pid, epoch, 0), tid).error_code == 0
    assert _lso(kafka_cluster, topic) == 0  # the open transaction pins the last stable offset
    second = _init(wire, coord, tid)
    assert second.error_code == 0 and second.producer_id == pid and second.producer_epoch > epoch
    # The zombie is fenced with the code its request version expects, everywhere.
    assert _end(wire, coord, tid, pid, epoch, True, version=3) == PRODUCER_FENCED
    assert _end(wire, coord, tid, pid, epoch, True, version=1) == INVALID_PRODUCER_EPOCH
    assert _add(wire, coord, tid, pid, epoch, topic, [0], version=2) == {(topic, 0): PRODUCER_FENCED}
    assert _add(wire, coord, tid, pid, epoch, topic, [0], version=0) == {(topic, 0): INVALID_PRODUCER_EPOCH}
    late = _produce(wire, kafka_cluster, topic, _batch([b"late"], pid, epoch, 1), tid)
    assert late.error_code in (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH)
    # Its transaction was aborted: nothing of it is visible, and the LSO moved past its marker.
    assert wait_for(lambda: _lso(kafka_cluster, topic) >= 2 or None, 20, "the abort marker")
    assert _committed_values(kafka_cluster, topic) == []
    # The new producer works.
    pid2, epoch2 = second.producer_id, second.producer_epoch
    assert _add(wire, coord, tid, pid2, epoch2, topic, [0]) == {(topic, 0): 0}
    assert _produce(wire, kafka_cluster, topic, _batch([b"new"], pid2, epoch2, 0), tid).error_code == 0
    assert _end(wire, coord, tid, pid2, epoch2, True) == 0
    assert wait_for(lambda: _committed_values(kafka_cluster, topic) == [b"new"] or None, 20, "the new record")


def test_a_fenced_classic_producer_cannot_open_a_transaction_where_an_earlier_one_was_verified(
    kafka_cluster: LocalCluster, wire: Wire
) -> None:
    # The zombie's epoch spans its transactions: a verification cached for its first transaction on
    # partition 1 must not admit its batch there after it was fenced in a later transaction.
    topic, tid = _topic(kafka_cluster, 2), unique("tid")
    coord = _coordinator(kafka_cluster, tid)
    init = _init(wire, coord, tid)
    pid, epoch = init.producer_id, init.producer_epoch
    assert _add(wire, coord, tid, pid, epoch, topic, [1]) == {(topic, 1): 0}
    assert _produce(wire, kafka_cluster, topic, _batch([b"one"], pid, epoch, 0), tid, partition=1).error_code == 0
    assert _end(wire, coord, tid, pid, epoch, True) == 0
    assert _add(wire, coord, tid, pid, epoch, topic, [0]) == {(topic, 0): 0}
    assert _produce(wire, kafka_cluster, topic, _batch([b"two"], pid, epoch, 0), tid, partition=0).error_code == 0
    assert _init(wire, coord, tid).error_code == 0  # fences the producer, aborts its second transaction
    late = _produce(wire, kafka_cluster, topic, _batch([b"late"], pid, epoch, 1), tid, partition=1)
    assert late.error_code in (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH), late
    assert wait_for(lambda: _committed_values(kafka_cluster, topic, 1) == [b"one"] or None, 20, "partition 1")
    assert _lso(kafka_cluster, topic, 1) == 2  # no transaction open there: nothing pins its LSO


def test_kip360_init_with_the_current_identity_bumps_it(kafka_cluster: LocalCluster, wire: Wire) -> None:
    tid = unique("tid")
    coord = _coordinator(kafka_cluster, tid)
    first = _init(wire, coord, tid)
    pid, epoch = first.producer_id, first.producer_epoch
    bumped = _init(wire, coord, tid, pid=pid, epoch=epoch)
    assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (0, pid, epoch + 1)
    # Naming an identity that is neither current nor the one just bumped: fenced, as each version expects.
    assert _init(wire, coord, tid, version=4, pid=pid, epoch=epoch + 5).error_code == PRODUCER_FENCED
    assert _init(wire, coord, tid, version=3, pid=pid, epoch=epoch + 5).error_code == INVALID_PRODUCER_EPOCH


def test_add_partitions_answers_per_partition(kafka_cluster: LocalCluster, wire: Wire) -> None:
    topic, tid = _topic(kafka_cluster), unique("tid")
    coord = _coordinator(kafka_cluster, tid)
    init = _init(wire, coord, tid)
    pid, epoch = init.producer_id, init.producer_epoch
    # A partition that does not exist: UNKNOWN_TOPIC_OR_PARTITION, the others not attempted, nothing added.
    assert _add(wire, coord, tid, pid, epoch, topic, [0, 7]) == {(topic, 0): OPERATION_NOT_ATTEMPTED,
                                                                 (topic, 7): UNKNOWN_TOPIC_OR_PARTITION}  # fmt: skip
    assert _end(wire, coord, tid, pid, epoch, True) == INVALID_TXN_STATE  # no transaction is open
    other = next(n for n in (1, 2, 3) if n != coord)
    assert _add(wire, other, tid, pid, epoch, topic, [0]) == {(topic, 0): NOT_COORDINATOR}
    assert _init(wire, other, tid).error_code == NOT_COORDINATOR


def test_offsets_join_the_transaction_and_commit_with_it(kafka_cluster: LocalCluster, wire: Wire) -> None:
    topic, tid, group = _topic(kafka_cluster), unique("tid"), unique("group")
    coord = _coordinator(kafka_cluster, tid)
    init = _init(wire, coord, tid)
    pid, epoch = init.producer_id, init.producer_epoch
    status, body = http("GET", f"{kafka_cluster.url(1)}/v1/coordinators/group/{group}")
    assert status == 200, body
    Topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    commit = TxnOffsetCommitRequest[3](
        transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
        member_id="", group_instance_id=None,
        topics=[Topic(name=topic, partitions=[Topic.TxnOffsetCommitRequestPartition(
            partition_index=0, committed_offset=42, committed_leader_epoch=-1, committed_metadata="m")])],
    )  # fmt: skip

    def commit_codes() -> list[int]:
        resp = wire.call(int(body["node_id"]), commit, TxnOffsetCommitResponse, 3)
        return [p.error_code for t in resp.topics for p in t.partitions]

    # The classic protocol: AddOffsetsToTxn comes first; without it the offsets are refused, not added.
    assert commit_codes() == [INVALID_TXN_STATE]
    req = AddOffsetsToTxnRequest[3](transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group)
    assert wire.call(coord, req, AddOffsetsToTxnResponse, 3).error_code == 0
    assert commit_codes() == [0]
    # Describe and list show the open transaction with the offsets partition in it.
    desc = wire.call(coord, DescribeTransactionsRequest[0](transactional_ids=[tid]), DescribeTransactionsResponse, 0)
    [state] = desc.transaction_states
    assert (state.error_code, state.transaction_state, state.producer_id) == (0, "Ongoing", pid)
    assert [t.topic for t in state.topics] == ["__consumer_offsets"]
    listed = wire.call(coord, ListTransactionsRequest[1](state_filters=["Ongoing", "Bogus"], producer_id_filters=[],
                                                         duration_filter=-1), ListTransactionsResponse, 1)  # fmt: skip
    assert listed.unknown_state_filters == ["Bogus"]
    assert (tid, pid, "Ongoing") in [(t.transactional_id, t.producer_id, t.transaction_state)
                                     for t in listed.transaction_states]  # fmt: skip
    assert _end(wire, coord, tid, pid, epoch, True) == 0

    def committed() -> Any:
        s, b = http("GET", f"{kafka_cluster.url(1)}/v1/groups/{group}/offsets")
        return b["offsets"] if s == 200 and b["offsets"] else None

    offsets = wait_for(committed, 20, "the committed offsets")
    assert [(o["topic"], o["partition"], o["offset"]) for o in offsets] == [(topic, 0, 42)]


def test_idempotent_init_producer_id_and_its_kip360_bump(kafka_cluster: LocalCluster, wire: Wire) -> None:
    first = _init(wire, 1, None, version=4)
    assert first.error_code == 0 and first.producer_epoch == 0
    second = _init(wire, 2, None, version=4)
    assert second.producer_id != first.producer_id
    bumped = _init(wire, 1, None, version=4, pid=first.producer_id, epoch=0)
    assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (0, first.producer_id, 1)
    assert _init(wire, 1, None, version=4, pid=first.producer_id, epoch=-1).error_code == 42  # INVALID_REQUEST
    assert _init(wire, 1, "", version=4).error_code == 42


# ---- idempotent producers of the three libraries ----------------------------------------------------


def _batches(cluster: LocalCluster, topic: str) -> list[dict[str, Any]]:
    leader = wait_for(lambda: cluster.leader(topic, 0), 20, "a leader")
    status, body = http("GET", f"{cluster.url(leader)}/v1/topics/{topic}/partitions/0/records"
                        "?offset=0&max_bytes=10000000&format=batches")  # fmt: skip
    assert status == 200, body
    return list(body["batches"])


def _assert_idempotent_once(cluster: LocalCluster, topic: str, n: int) -> None:
    values = wait_for(lambda: (v := _committed_values(cluster, topic)) and len(v) >= n and v, 20, "the records")
    assert values == [f"v{i}".encode() for i in range(n)]
    batches = _batches(cluster, topic)
    assert {b["producer_id"] for b in batches} != {-1} and len({b["producer_id"] for b in batches}) == 1
    assert batches[0]["base_sequence"] == 0 and not any(b["is_transactional"] for b in batches)


def test_confluent_kafka_idempotent_producer(kafka_cluster: LocalCluster) -> None:
    from confluent_kafka import Producer

    topic = _topic(kafka_cluster)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "enable.idempotence": True,
                         "acks": "all", "retries": 5, "linger.ms": 2, "message.timeout.ms": 20_000})  # fmt: skip
    errors: list[Any] = []
    for i in range(100):
        producer.produce(topic, value=f"v{i}".encode(), partition=0,
                         on_delivery=lambda err, _m: errors.append(err) if err else None)  # fmt: skip
    assert producer.flush(20) == 0 and not errors
    _assert_idempotent_once(kafka_cluster, topic, 100)


def test_kafka_python_idempotent_producer(kafka_cluster: LocalCluster) -> None:
    from kafka import KafkaProducer

    topic = _topic(kafka_cluster)
    producer = KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap_servers, enable_idempotence=True, acks="all",
                             retries=5, linger_ms=2, request_timeout_ms=10_000)  # fmt: skip
    try:
        futures = [producer.send(topic, value=f"v{i}".encode(), partition=0) for i in range(100)]
        producer.flush(20)
        assert all(f.get(timeout=20).offset >= 0 for f in futures)
    finally:
        producer.close(5)
    _assert_idempotent_once(kafka_cluster, topic, 100)


def test_aiokafka_idempotent_producer(kafka_cluster: LocalCluster) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    topic = _topic(kafka_cluster)

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_cluster.bootstrap_servers, enable_idempotence=True,
                                    acks="all", linger_ms=2, request_timeout_ms=10_000)  # fmt: skip
        await producer.start()
        try:
            for i in range(100):
                await producer.send(topic, value=f"v{i}".encode(), partition=0)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(asyncio.wait_for(run(), 30))
    _assert_idempotent_once(kafka_cluster, topic, 100)


# ---- transactional producers of the three libraries ---------------------------------------------------

COMMITTED = [f"c{i}".encode() for i in range(10)]


def _confluent_read(cluster: LocalCluster, topic: str, n: int, settle: float = 1.0) -> list[bytes]:
    """Every record a read_committed confluent-kafka consumer sees: ``n`` of them, then nothing for ``settle`` s."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": unique("g"),
                         "enable.auto.commit": False, "isolation.level": "read_committed"})  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        return _drain(lambda: [m.value() for m in consumer.consume(100, 0.2) if m.error() is None], n, settle)
    finally:
        consumer.close()


def _drain(poll: Any, n: int, settle: float, timeout: float = 20) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got.extend(poll())
    quiet = time.monotonic() + settle
    while time.monotonic() < quiet:
        got.extend(poll())
    return got


def _kafka_python_read(cluster: LocalCluster, topic: str, n: int, settle: float = 1.0) -> list[bytes]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None, enable_auto_commit=False,
                             isolation_level="read_committed", auto_offset_reset="earliest")  # fmt: skip
    try:
        consumer.assign([KTopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        return _drain(lambda: [r.value for rs in consumer.poll(200).values() for r in rs], n, settle)
    finally:
        consumer.close()


async def _aiokafka_read(cluster: LocalCluster, topic: str, n: int, settle: float = 1.0) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as ATopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None, enable_auto_commit=False,
                                isolation_level="read_committed", auto_offset_reset="earliest")  # fmt: skip
    await consumer.start()
    try:
        consumer.assign([ATopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            got.extend(r.value for rs in batch.values() for r in rs)
        quiet = time.monotonic() + settle
        while time.monotonic() < quiet:
            batch = await consumer.getmany(timeout_ms=200)
            got.extend(r.value for rs in batch.values() for r in rs)
        return got
    finally:
        await consumer.stop()


def _confluent_producer(cluster: LocalCluster, tid: str) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": tid,
                     "transaction.timeout.ms": 30_000, "linger.ms": 2, "message.timeout.ms": 20_000})  # fmt: skip


def test_confluent_kafka_transactions_commit_and_abort(kafka_cluster: LocalCluster) -> None:
    topic, tid = _topic(kafka_cluster), unique("tid")
    p = _confluent_producer(kafka_cluster, tid)
    p.init_transactions(20)
    for values, commit in ((COMMITTED[:5], True), ([b"aborted"] * 5, False), (COMMITTED[5:], True)):
        p.begin_transaction()
        for v in values:
            p.produce(topic, value=v, partition=0)
        if commit:
            p.commit_transaction(20)
        else:
            assert p.flush(20) == 0  # the aborted records are in the log, then aborted
            p.abort_transaction(20)
    assert _confluent_read(kafka_cluster, topic, len(COMMITTED)) == COMMITTED
    assert _committed_values(kafka_cluster, topic) == COMMITTED


def test_kafka_python_transactions_commit_and_abort(kafka_cluster: LocalCluster) -> None:
    from kafka import KafkaProducer

    topic, tid = _topic(kafka_cluster), unique("tid")
    p = KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap_servers, transactional_id=tid, linger_ms=2,
                      request_timeout_ms=10_000, transaction_timeout_ms=30_000)  # fmt: skip
    try:
        p.init_transactions()
        for values, commit in ((COMMITTED[:5], True), ([b"aborted"] * 5, False), (COMMITTED[5:], True)):
            p.begin_transaction()
            for v in values:
                p.send(topic, value=v, partition=0)
            p.flush(20)
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()
    finally:
        p.close(5)
    assert _kafka_python_read(kafka_cluster, topic, len(COMMITTED)) == COMMITTED
    assert _committed_values(kafka_cluster, topic) == COMMITTED


def test_aiokafka_transactions_commit_and_abort(kafka_cluster: LocalCluster) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    topic, tid = _topic(kafka_cluster), unique("tid")

    async def run() -> list[bytes]:
        p = AIOKafkaProducer(bootstrap_servers=kafka_cluster.bootstrap_servers, transactional_id=tid, linger_ms=2,
                             request_timeout_ms=10_000, transaction_timeout_ms=30_000)  # fmt: skip
        await p.start()
        try:
            for values, commit in ((COMMITTED[:5], True), ([b"aborted"] * 5, False), (COMMITTED[5:], True)):
                await p.begin_transaction()
                for v in values:
                    await p.send_and_wait(topic, value=v, partition=0)
                if commit:
                    await p.commit_transaction()
                else:
                    await p.abort_transaction()
        finally:
            await p.stop()
        return await _aiokafka_read(kafka_cluster, topic, len(COMMITTED))

    assert asyncio.run(asyncio.wait_for(run(), 60)) == COMMITTED
    assert _committed_values(kafka_cluster, topic) == COMMITTED


# ---- zombie fencing ------------------------------------------------------------------------------------


def test_confluent_kafka_zombie_is_fenced(kafka_cluster: LocalCluster) -> None:
    from confluent_kafka import KafkaException

    topic, tid = _topic(kafka_cluster), unique("tid")
    zombie = _confluent_producer(kafka_cluster, tid)
    zombie.init_transactions(20)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie", partition=0)
    assert zombie.flush(20) == 0
    fresh = _confluent_producer(kafka_cluster, tid)
    fresh.init_transactions(20)  # fences the zombie and aborts its transaction
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(20)
    assert fenced.value.args[0].fatal(), fenced.value
    fresh.begin_transaction()
    fresh.produce(topic, value=b"fresh", partition=0)
    fresh.commit_transaction(20)
    assert _confluent_read(kafka_cluster, topic, 1) == [b"fresh"]


def test_kafka_python_zombie_is_fenced(kafka_cluster: LocalCluster) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError, ProducerFencedError

    topic, tid = _topic(kafka_cluster), unique("tid")

    def producer() -> Any:
        return KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap_servers, transactional_id=tid,
                             request_timeout_ms=10_000, transaction_timeout_ms=30_000)  # fmt: skip

    zombie, fresh = producer(), producer()
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(topic, value=b"zombie", partition=0).get(timeout=20)
        fresh.init_transactions()
        with pytest.raises(KafkaError) as fenced:
            zombie.commit_transaction()
        assert isinstance(fenced.value, ProducerFencedError) or "Fenced" in repr(fenced.value), fenced.value
        fresh.begin_transaction()
        fresh.send(topic, value=b"fresh", partition=0)
        fresh.commit_transaction()
    finally:
        zombie.close(2)
        fresh.close(5)
    assert _kafka_python_read(kafka_cluster, topic, 1) == [b"fresh"]


def test_aiokafka_zombie_is_fenced(kafka_cluster: LocalCluster) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    topic, tid = _topic(kafka_cluster), unique("tid")

    async def run() -> list[bytes]:
        def producer() -> Any:
            return AIOKafkaProducer(bootstrap_servers=kafka_cluster.bootstrap_servers, transactional_id=tid,
                                    request_timeout_ms=10_000, transaction_timeout_ms=30_000)  # fmt: skip

        zombie, fresh = producer(), producer()
        await zombie.start()
        try:
            await zombie.begin_transaction()
            await zombie.send_and_wait(topic, value=b"zombie", partition=0)
            await fresh.start()  # InitProducerId: fences the zombie
            with pytest.raises(KafkaError) as fenced:
                await zombie.commit_transaction()
            assert "Fenced" in type(fenced.value).__name__, fenced.value
            await fresh.begin_transaction()
            await fresh.send_and_wait(topic, value=b"fresh", partition=0)
            await fresh.commit_transaction()
        finally:
            await zombie.stop()
            await fresh.stop()
        return await _aiokafka_read(kafka_cluster, topic, 1)

    assert asyncio.run(asyncio.wait_for(run(), 60)) == [b"fresh"]


# ---- across the doors ------------------------------------------------------------------------------------


def test_an_open_kafka_transaction_pins_the_http_read_committed_lso(kafka_cluster: LocalCluster) -> None:
    topic, tid = _topic(kafka_cluster), unique("tid")
    p = _confluent_producer(kafka_cluster, tid)
    p.init_transactions(20)
    p.begin_transaction()
    for v in COMMITTED[:3]:
        p.produce(topic, value=v, partition=0)
    assert p.flush(20) == 0
    # An HTTP write behind the open transaction: in the log, not yet stable.
    leader = wait_for(lambda: kafka_cluster.leader(topic, 0), 20, "a leader")
    status, body = http("POST", f"{kafka_cluster.url(leader)}/v1/topics/{topic}/records",
                        {"records": [{"value": "aHR0cA==", "partition": 0}]})  # fmt: skip
    assert status == 200, body
    status, view = http("GET", f"{kafka_cluster.url(leader)}/v1/topics/{topic}/partitions/0/records"
                        "?offset=0&isolation=read_committed")  # fmt: skip
    assert status == 200, view
    assert (view["last_stable_offset"], view["high_watermark"], view["records"]) == (0, 4, [])
    p.commit_transaction(20)
    want = [*COMMITTED[:3], b"http"]
    assert wait_for(lambda: _committed_values(kafka_cluster, topic) == want or None, 20, "the records, stable")


# ---- the exactly-once copier, killed midway ------------------------------------------------------------

COPIER = Path(__file__).with_name("kafka_copier.py")


def _copier(cluster: LocalCluster, library: str, src: str, dst: str, group: str, tid: str, log: Path) -> Any:
    args = [sys.executable, str(COPIER), library, cluster.bootstrap_servers, cluster.url(1), src, dst, "2", group, tid]
    out = log.open("a")
    try:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=str(Path(__file__).parents[3]))
    finally:
        out.close()


def _progress(log: Path) -> int:
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("committed ")]
    return int(lines[-1].split()[1]) if lines else 0


@pytest.mark.parametrize("library", ["confluent", "kafka-python", "aiokafka"])
def test_copier_killed_midway_and_restarted_copies_exactly_once(
    kafka_cluster: LocalCluster, library: str, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    src, dst, group, tid = _topic(kafka_cluster, 2), _topic(kafka_cluster, 2), unique("copy"), unique("copier")
    n = 1000
    inputs = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "linger.ms": 5})
    for i in range(n):
        inputs.produce(src, value=f"r{i}".encode(), partition=i % 2)
    assert inputs.flush(20) == 0
    want = sorted(f"R{i}".encode() for i in range(n))

    def copied() -> list[bytes]:
        return sorted(v for p in (0, 1) for v in _committed_values(kafka_cluster, dst, p))

    log = tmp_path / "copier.log"
    proc = _copier(kafka_cluster, library, src, dst, group, tid, log)
    try:
        wait_for(lambda: _progress(log) >= 100 or proc.poll() is not None, 60, "the copier's first commits")
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        at_kill = len(copied())
        assert 100 <= at_kill < n, at_kill  # killed midway; whatever it had open is not visible
        proc = _copier(kafka_cluster, library, src, dst, group, tid, log)
        got = wait_for(lambda: (c := copied()) and len(c) >= n and c, 90, f"{n} copied records")
        assert proc.poll() is None, log.read_text()
        assert got == want  # every input record exactly once: no loss, no duplicate
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
