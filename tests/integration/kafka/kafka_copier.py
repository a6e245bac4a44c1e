"""An exactly-once consume-transform-produce copier of unmodified Kafka clients, run as a process by the tests.

``python kafka_copier.py LIBRARY BOOTSTRAP HTTP_URL IN OUT PARTITIONS GROUP TRANSACTIONAL_ID`` copies
every record of topic IN to OUT (same partition, value upper-cased) in transactions of at most 20
records, each committing the consumed offsets with ``send_offsets_to_transaction``. LIBRARY is
``confluent`` (confluent-kafka), ``kafka-python`` or ``aiokafka``.

On start it first takes over the transactional id (``init_transactions``: a previous instance is
fenced and its open transaction aborted), then resumes from the group's committed offsets, asked of
the HTTP door with ``require_stable`` (the copier assigns its partitions itself and is no group
member, so it needs no group membership). It prints ``committed N`` after each commit and runs until
it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

BATCH = 20


def committed_offsets(http_url: str, group: str) -> dict[int, int]:
    """The group's stable committed offsets per partition (retried while a transaction's are pending)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{http_url}/v1/groups/{group}/offsets?require_stable=true", timeout=10) as r:
                body = json.load(r)
            return {int(o["partition"]): int(o["offset"]) for o in body["offsets"]}
        except (urllib.error.URLError, OSError, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_confluent(bootstrap: str, http_url: str, src: str, dst: str, partitions: int, group: str, tid: str) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "transaction.timeout.ms": 30_000,
                         "linger.ms": 2, "message.timeout.ms": 30_000})  # fmt: skip
    producer.init_transactions(30)
    start = committed_offsets(http_url, group)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.assign([TopicPartition(src, p, start.get(p, OFFSET_BEGINNING)) for p in range(partitions)])
    total = 0
    while True:
        batch = [m for m in consumer.consume(BATCH, 0.5) if m.error() is None]
        if not batch:
            continue
        producer.begin_transaction()
        for m in batch:
            producer.produce(dst, key=m.key(), value=m.value().upper(), partition=m.partition())
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)  # fmt: skip
        producer.commit_transaction(30)
        total += len(batch)
        print(f"committed {total}", flush=True)


def run_kafka_python(bootstrap: str, http_url: str, src: str, dst: str, partitions: int, group: str,
                     tid: str) -> None:  # fmt: skip
    from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition

    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, linger_ms=2,
                             transaction_timeout_ms=30_000, request_timeout_ms=10_000)  # fmt: skip
    producer.init_transactions()
    start = committed_offsets(http_url, group)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             isolation_level="read_committed", auto_offset_reset="earliest")  # fmt: skip
    tps = [TopicPartition(src, p) for p in range(partitions)]
    consumer.assign(tps)
    for tp in tps:
        if tp.partition in start:
            consumer.seek(tp, start[tp.partition])
        else:
            consumer.seek_to_beginning(tp)
    total = 0
    while True:
        records: list[Any] = [r for rs in consumer.poll(500, max_records=BATCH).values() for r in rs]
        if not records:
            continue
        producer.begin_transaction()
        for r in records:
            producer.send(dst, key=r.key, value=r.value.upper(), partition=r.partition)
        offsets = {tp: OffsetAndMetadata(consumer.position(tp), "", -1) for tp in tps}
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        producer.commit_transaction()
        total += len(records)
        print(f"committed {total}", flush=True)


async def copy_aiokafka(bootstrap: str, http_url: str, src: str, dst: str, partitions: int, group: str,
                        tid: str) -> None:  # fmt: skip
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, linger_ms=2,
                                transaction_timeout_ms=30_000, request_timeout_ms=10_000)  # fmt: skip
    await producer.start()  # InitProducerId: fences the previous instance
    start = committed_offsets(http_url, group)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                isolation_level="read_committed", auto_offset_reset="earliest")  # fmt: skip
    await consumer.start()
    tps = [TopicPartition(src, p) for p in range(partitions)]
    consumer.assign(tps)
    for tp in tps:
        if tp.partition in start:
            consumer.seek(tp, start[tp.partition])
        else:
            await consumer.seek_to_beginning(tp)
    total = 0
    while True:
        got = await consumer.getmany(timeout_ms=500, max_records=BATCH)
        records: list[Any] = [r for rs in got.values() for r in rs]
        if not records:
            continue
        async with producer.transaction():
            for r in records:
                await producer.send(dst, key=r.key, value=r.value.upper(), partition=r.partition)
            offsets = {tp: await consumer.position(tp) for tp in tps}
            await producer.send_offsets_to_transaction(offsets, group)
        total += len(records)
        print(f"committed {total}", flush=True)


def run_aiokafka(bootstrap: str, http_url: str, src: str, dst: str, partitions: int, group: str, tid: str) -> None:
    asyncio.run(copy_aiokafka(bootstrap, http_url, src, dst, partitions, group, tid))


def main(argv: list[str]) -> None:
    library, bootstrap, http_url, src, dst, partitions, group, tid = argv
    run = {"confluent": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}[library]
    run(bootstrap, http_url, src, dst, int(partitions), group, tid)


if __name__ == "__main__":
    main(sys.argv[1:])
