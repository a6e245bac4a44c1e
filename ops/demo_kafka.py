"""The quickstart's Kafka stage: unmodified Kafka clients against the same cluster, through the Kafka listener.

confluent-kafka's idempotent producer writes lz4-compressed records through
the Kafka port; the Python client reads them over HTTP (one log, two doors).
Then confluent-kafka runs a transactional consume-transform-produce loop
(read_committed input, ``send_offsets_to_transaction``, a commit every
100 ms), one transaction is aborted on purpose, and kafka-python's
read_committed consumer finds every input record transformed exactly once and
nothing of the aborted transaction.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from clients import Consumer as HttpConsumer

TOPIC = "kafka-orders"
OUT = "kafka-orders-upper"
RECORDS = 3000


def _bootstrap(demo: Any) -> str:
    return ",".join(str(c.self_address.kafka_address) for c in demo.configs[:3])


def stage_kafka(demo: Any, say: Callable[[str], None]) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = _bootstrap(demo)
    say(f"== Kafka clients on the Kafka listener ({bootstrap})")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(t, 3, 3) for t in (TOPIC, OUT)]).values():
        fut.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "compression.type": "lz4"})  # fmt: skip
    failed: list[Any] = []
    t0 = time.monotonic()
    for i in range(RECORDS):
        producer.produce(TOPIC, key=str(i % 10).encode(), value=f"order-{i}".encode(),
                         on_delivery=lambda err, _m: failed.append(err) if err else None)  # fmt: skip
        producer.poll(0)
    if producer.flush(60) or failed:
        raise SystemExit(f"confluent-kafka producer: {failed[:3]}")
    say(f"   confluent-kafka (librdkafka) wrote {RECORDS} lz4-compressed records, idempotent, acks=all, "
        f"in {time.monotonic() - t0:.2f}s")  # fmt: skip

    urls = [demo.url(n) for n in demo.live()]
    http_consumer = HttpConsumer(urls, isolation_level="read_committed", auto_offset_reset="earliest")
    try:
        http_consumer.assign([(TOPIC, p) for p in range(3)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(seen) < RECORDS and time.monotonic() < deadline:
            seen += [r.value or b"" for r in http_consumer.poll(timeout_ms=500)]
    finally:
        http_consumer.close()
    if sorted(seen) != sorted(f"order-{i}".encode() for i in range(RECORDS)):
        raise SystemExit(f"the HTTP consumer read {len(seen)} records, not the {RECORDS} written")
    say(f"   the Python client read all {RECORDS} over HTTP: one log, two doors")

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "upper", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "upper-1", "linger.ms": 5})
    txn.init_transactions(30)
    consumer.subscribe([TOPIC])
    copied = commits = 0
    aborted_one = False
    deadline = time.monotonic() + 120
    try:
        while copied < RECORDS and time.monotonic() < deadline:
            batch = [m for m in consumer.consume(500, 0.2) if m.error() is None]
            if not batch:
                continue
            txn.begin_transaction()
            if not aborted_one:  # one transaction aborted on purpose: none of it may be seen
                txn.produce(OUT, value=b"ABORTED")
                txn.abort_transaction(30)
                aborted_one = True
                txn.begin_transaction()
            for m in batch:
                txn.produce(OUT, key=m.key(), value=(m.value() or b"").upper())
            txn.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                            consumer.consumer_group_metadata(), 30)  # fmt: skip
            txn.commit_transaction(30)
            copied += len(batch)
            commits += 1
    finally:
        consumer.close()
    say(f"   confluent-kafka copied {copied} records in {commits} transactions (one more aborted on purpose)")

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition

    reader = KafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", auto_offset_reset="earliest",
        enable_auto_commit=False, consumer_timeout_ms=3000,
    )  # fmt: skip
    try:
        reader.assign([KafkaTopicPartition(OUT, p) for p in range(3)])
        counts = Counter(r.value for r in reader)
    finally:
        reader.close()
    expected = {f"ORDER-{i}".encode() for i in range(RECORDS)}
    if set(counts) != expected or any(n != 1 for n in counts.values()):
        raise SystemExit(f"{OUT}: {len(counts)} distinct values, expected {RECORDS} exactly once")
    say(f"   kafka-python (read_committed) read {OUT}: all {RECORDS} exactly once, nothing of the aborted transaction")
