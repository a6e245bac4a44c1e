"""Kafka listener benchmark: librdkafka (confluent-kafka) against the Python client's HTTP binary path, one run.

Against one 3-node cluster (``txbroker bench kafka`` starts it), 1 KiB records:

* **produce**: the Python producer (``AsyncProducer``: binary HTTP produce,
  acks=all, idempotent, linger 5 ms) writes ``records`` records to one topic;
  confluent-kafka's producer with the same settings (acks=all, idempotent,
  linger.ms 5) writes as many to another, through the Kafka listener. Each
  rate counts from the first send to the last acknowledgement; the ratio is
  Kafka door / HTTP door.
* **consume**: each topic is read from the start with read_committed, by the
  Python consumer (binary HTTP fetch) and by a confluent-kafka consumer
  (assigned every partition), each door reading the records its own producer
  wrote (what a user of that door sees) and, for the record, the other's.
* **copy**: a transactional consume-transform-produce loop with
  confluent-kafka (read_committed input, ``send_offsets_to_transaction``,
  a commit every 100 ms) copies the Kafka topic; ``txbroker copy``
  (``cluster.copier``, a transaction every 100 ms) copies the HTTP topic.
  Both outputs are read back: every input value exactly once.

Same process, same cluster, one after the other: each round (``--rounds``)
produces through both doors (the order alternating between rounds) and reads
both topics back, and a ratio pairs the two doors of one round; the report
gives the median ratio and every round's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from clients.aio import AsyncConsumer, AsyncProducer
from clients.protocol import BrokerError, ErrorCode

from .consume import ensure_topic, read_range
from .copier import _throughput as txbroker_copy_throughput
from .copier import value_of
from .harness import BenchCluster, fresh_cluster
from .measure import machine_info

HTTP_TOPIC = "kb-http"
KAFKA_TOPIC = "kb-kafka"


def _rate(records: int, size: int, seconds: float) -> dict[str, Any]:
    return {
        "records": records,
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds),
        "mb_per_s": round(records * size / seconds / 1e6, 2),
    }


async def produce_http(urls: list[str], topic: str, records: int, size: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    async with AsyncProducer(urls, acks="all", enable_idempotence=True, linger_ms=5) as producer:
        futures = [await producer.send(topic, value=value_of(i, size)) for i in range(records)]
        await producer.flush()
    results = await asyncio.gather(*futures, return_exceptions=True)
    wall = time.perf_counter() - t0
    failed = sum(1 for r in results if isinstance(r, BaseException))
    if failed:
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{failed} of {records} records were not written")
    return _rate(records, size, wall)


def produce_kafka(bootstrap: str, topic: str, records: int, size: int) -> dict[str, Any]:
    from confluent_kafka import Producer

    failed: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "compression.type": "none"})  # fmt: skip
    t0 = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value_of(i, size), on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    left = producer.flush(120)
    wall = time.perf_counter() - t0
    if failed or left:
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{len(failed)} failed, {left} unsent: {failed[:3]}")
    return _rate(records, size, wall)


async def consume_http(urls: list[str], topic: str, records: int) -> dict[str, Any]:
    async with AsyncConsumer(urls, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        parts = sorted(await consumer.partitions_for_topic(topic))
        tps = [(topic, p) for p in parts]
        consumer.assign(tps)
        start = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)
        if sum(end[tp] - start[tp] for tp in tps) < records:
            raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{topic} holds fewer than {records} records")
        return await read_range(consumer, start, end, timeout=max(120.0, records / 1000))


def consume_kafka(bootstrap: str, topic: str, partitions: int, records: int, group: str) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        for tp in tps:  # connects to every leader first, as the HTTP consumer's offset lookups do before its clock
            consumer.get_watermark_offsets(tp, timeout=10)
        consumer.assign(tps)
        got = payload = 0
        c0, t0 = os.times(), time.perf_counter()
        deadline = t0 + max(120.0, records / 1000)
        while got < records and time.perf_counter() < deadline:
            for m in consumer.consume(10_000, 1.0):
                if m.error() is not None:
                    raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, str(m.error()))
                got += 1
                payload += len(m.value() or b"")
        wall, c1 = time.perf_counter() - t0, os.times()
    finally:
        consumer.close()
    if got < records:
        raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"read {got} of {records} records")
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return {"records": got, "seconds": round(wall, 3), "records_per_s": round(got / wall),
            "mb_per_s": round(payload / wall / 1e6, 2), "client_cpu_pct": round(100 * cpu / wall, 1)}  # fmt: skip


def copy_kafka(bootstrap: str, src: str, dst: str, records: int, commit_every_ms: int = 100) -> dict[str, Any]:
    """confluent-kafka's consume-transform-produce loop: a transaction every ``commit_every_ms``; then verified."""
    from confluent_kafka import Consumer, Producer

    group = f"kb-copy-{os.getpid()}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": group, "linger.ms": 5})
    producer.init_transactions(30)
    consumer.subscribe([src])
    copied = transactions = 0
    first = last = None
    in_txn = False
    txn_started = 0.0
    deadline = time.perf_counter() + max(120.0, records / 500)
    try:
        while copied < records and time.perf_counter() < deadline:
            for m in consumer.consume(1000, 0.05):
                if m.error() is not None:
                    raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, str(m.error()))
                if not in_txn:
                    producer.begin_transaction()
                    in_txn, txn_started = True, time.perf_counter()
                    first = first or txn_started
                producer.produce(dst, value=m.value(), key=m.key())
                copied += 1
            if in_txn and (time.perf_counter() - txn_started >= commit_every_ms / 1000 or copied >= records):
                producer.send_offsets_to_transaction(
                    consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
                )
                producer.commit_transaction(30)
                transactions += 1
                in_txn = False
                last = time.perf_counter()
    finally:
        consumer.close()
    if copied < records or first is None or last is None:
        raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"copied {copied} of {records} records")
    seconds = last - first
    return {"records": copied, "transactions": transactions, "seconds": round(seconds, 3),
            "records_per_s": round(copied / seconds), "txn_per_s": round(transactions / seconds, 1)}  # fmt: skip


def verify_kafka(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    """Every input value exactly once in ``topic`` (read_committed), or raise."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kb-verify-{topic}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})  # fmt: skip
    seen: Counter[bytes] = Counter()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        eof: set[int] = set()
        deadline = time.perf_counter() + 120
        while len(eof) < partitions and time.perf_counter() < deadline:
            for m in consumer.consume(10_000, 1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(int(m.partition() or 0))
                        continue
                    raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, str(err))
                seen[(m.value() or b"")[:10]] += 1
    finally:
        consumer.close()
    dups = sum(1 for k in seen.values() if k > 1)
    if len(seen) != records or dups:
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{topic}: {len(seen)} values ({dups} twice), not {records}")


def _paired(rounds: list[dict[str, Any]], http: str, kafka: str) -> dict[str, Any]:
    """Per-round Kafka / HTTP ratios of records/s, their median, and each door's median rate."""
    ratios = [r[kafka]["records_per_s"] / r[http]["records_per_s"] for r in rounds]
    return {
        "ratio_kafka_over_http": round(statistics.median(ratios), 2),
        "ratios_by_round": [round(x, 2) for x in ratios],
        f"{http}_records_per_s": round(statistics.median(r[http]["records_per_s"] for r in rounds)),
        f"{kafka}_records_per_s": round(statistics.median(r[kafka]["records_per_s"] for r in rounds)),
        "rounds": rounds,
    }


def _in_loop(fn: Callable[..., Coroutine[Any, Any, dict[str, Any]]], *args: Any) -> dict[str, Any]:
    return asyncio.run(fn(*args))


def _one_round(http: tuple[str, Callable[[], dict[str, Any]]], kafka: tuple[str, Callable[[], dict[str, Any]]],
               kafka_first: bool) -> dict[str, Any]:  # fmt: skip
    """Both doors' measurements of one round, in the round's order, by name."""
    return {name: measure() for name, measure in ((kafka, http) if kafka_first else (http, kafka))}


def run(cluster: BenchCluster, *, records: int, size: int, partitions: int, copy_records: int,
        rounds: int = 3) -> dict[str, Any]:  # fmt: skip
    """Each round writes ``records`` through each door (alternating which goes first) and reads each topic
    back whole through each door; ratios are paired within a round."""
    urls = [c.url for c in cluster.configs]
    bootstrap = ",".join(c.self_address.kafka_address or "" for c in cluster.configs)
    produce_rounds: list[dict[str, Any]] = []
    consume_rounds: list[dict[str, Any]] = []
    asyncio.run(ensure_topic(urls, f"{KAFKA_TOPIC}-out", partitions, 3))
    for r in range(rounds):
        http_topic, kafka_topic = f"{HTTP_TOPIC}-{r}", f"{KAFKA_TOPIC}-{r}"
        for topic in (http_topic, kafka_topic):
            asyncio.run(ensure_topic(urls, topic, partitions, 3))
        kafka_first = r % 2 == 1
        produce_rounds.append(
            _one_round(
                ("http_python_producer", partial(_in_loop, produce_http, urls, http_topic, records, size)),
                ("kafka_confluent_producer", partial(produce_kafka, bootstrap, kafka_topic, records, size)),
                kafka_first,
            )
        )
        consume_rounds.append(_one_round(
            ("http_python_consumer", partial(_in_loop, consume_http, urls, http_topic, records)),
            ("kafka_confluent_consumer",
             partial(consume_kafka, bootstrap, kafka_topic, partitions, records, f"kb-consume-{r}")),
            kafka_first,
        ))  # fmt: skip
    produce = _paired(produce_rounds, "http_python_producer", "kafka_confluent_producer")
    consume = _paired(consume_rounds, "http_python_consumer", "kafka_confluent_consumer")
    first_http, first_kafka = f"{HTTP_TOPIC}-0", f"{KAFKA_TOPIC}-0"
    consume["cross_door_http_reads_kafka_topic"] = asyncio.run(consume_http(urls, first_kafka, records))
    consume["cross_door_kafka_reads_http_topic"] = consume_kafka(bootstrap, first_http, partitions, records, "kb-cross")
    n = min(copy_records, records)
    copy: dict[str, Any] = {}
    try:
        copy["kafka_confluent_copier"] = copy_kafka(bootstrap, first_kafka, f"{KAFKA_TOPIC}-out", n)
        verify_kafka(bootstrap, f"{KAFKA_TOPIC}-out", partitions, n)
    except BrokerError as exc:  # reported in the result; the other figures of the run stand
        copy["kafka_confluent_copier"] = {"error": str(exc)}
    copy["txbroker_copy"] = asyncio.run(txbroker_copy_throughput(urls, first_http, "kb", n, partitions, 0, 100))
    return {
        "machine": machine_info(),
        "record_size": size,
        "partitions": partitions,
        "produce": produce,
        "consume": consume,
        "copy_every_100ms": copy,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="txbroker bench kafka", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=100_000, help="records per producer (default 100000)")
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--copy-records", type=int, default=50_000, help="records each copier copies")
    p.add_argument("--rounds", type=int, default=3, help="rounds of produce and consume through both doors")
    p.add_argument("--json", action="store_true", help="print JSON only")
    args = p.parse_args(argv)
    with fresh_cluster("txbroker-bench-kafka-") as cluster:
        result = run(cluster, records=args.records, size=args.record_size, partitions=args.partitions,
                     copy_records=args.copy_records, rounds=args.rounds)  # fmt: skip
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
