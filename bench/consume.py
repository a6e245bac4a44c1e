"""Consume benchmark: throughput of the Python consumer and end-to-end latency, producer to consumer.

Two phases against a running cluster, both through the real clients
(``AsyncProducer`` writes, ``AsyncConsumer`` reads, binary fetches):

* **throughput**: fill the topic with ``records`` records of ``record_size``
  bytes, then read exactly that range from the start with one consumer over
  all partitions (prefetching fetch per partition) and time it. Every record
  is checked to arrive once, in offset order.
* **latency**: the same consumer tails the end of the log while a producer
  sends ``latency_rate`` records/s for ``latency_seconds``; each value starts
  with the send time (``perf_counter_ns``; producer and consumer share the
  process, so the clocks agree), and a record's latency is the time from
  ``send()`` to the ``poll()`` that returned it: batching (``linger_ms``),
  replication, the broker's long poll and the client's decoding. The
  producer's acknowledgement latency is reported next to it, to tell the
  replication share from the consumer's.

``python -m bench.consume`` starts its own 3-node cluster (like
``txbroker bench``) and prints the result as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import time
from typing import Any

from clients.aio import AsyncAdmin, AsyncConsumer
from clients.aio.producer import AsyncProducer
from clients.protocol import BrokerError, ErrorCode
from clients.records import ConsumerRecord, TopicPartition

from .harness import add_node_setting_argument, fresh_cluster, node_settings_or_exit
from .measure import STAMP, machine_info, quantile


async def ensure_topic(urls: list[str], topic: str, partitions: int, replication_factor: int) -> int:
    """``topic``'s partition count once every partition has a leader; created first if it does not exist."""
    async with AsyncAdmin(urls) as admin:
        try:
            desc = await admin.describe_topic(topic)
        except BrokerError as exc:
            if exc.error_code is not ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise
            await admin.create_topic(topic, partitions=partitions, replication_factor=replication_factor)
        desc = await admin.wait_for_leaders(topic, timeout_s=60)
    return len(desc["partitions"])


async def fill_topic(urls: list[str], topic: str, records: int, record_size: int) -> dict[str, Any]:
    """``records`` records of ``record_size`` bytes through ``AsyncProducer``, every one acknowledged; the rate."""
    value = os.urandom(record_size)
    t0 = time.perf_counter()
    async with AsyncProducer(urls, linger_ms=20, batch_size=256 * 1024) as producer:
        futures = [await producer.send(topic, value=value) for _ in range(records)]
        await producer.flush()
    results = await asyncio.gather(*futures, return_exceptions=True)
    failed = sum(1 for r in results if isinstance(r, BaseException))
    if failed:
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{failed} of {records} records were not written")
    wall = time.perf_counter() - t0
    return {"records": records, "seconds": round(wall, 2), "mb_per_s": round(records * record_size / wall / 1e6, 2)}


async def read_range(
    consumer: AsyncConsumer, start: dict[TopicPartition, int], end: dict[TopicPartition, int], timeout: float
) -> dict[str, Any]:
    """Read ``[start, end)`` of every partition; check each offset arrives once, in order."""
    for tp, offset in start.items():
        consumer.seek(tp, offset)
    expected = dict(start)
    total = sum(end[tp] - start[tp] for tp in start)
    got = payload = 0
    c0, t0 = os.times(), time.perf_counter()
    deadline = t0 + timeout
    while got < total and time.perf_counter() < deadline:
        for r in await consumer.poll(timeout_ms=1000, max_records=10_000):
            tp = (r.topic, r.partition)
            if r.offset != expected[tp]:
                raise BrokerError(ErrorCode.CORRUPT_MESSAGE, f"{tp}: offset {r.offset}, expected {expected[tp]}")
            expected[tp] += 1
            got += 1
            payload += len(r.value or b"") + len(r.key or b"")
    wall, c1 = time.perf_counter() - t0, os.times()
    if got < total:
        raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"read {got} of {total} records within {timeout}s")
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return {
        "records": got,
        "seconds": round(wall, 3),
        "mb_per_s": round(payload / wall / 1e6, 2),
        "records_per_s": round(got / wall),
        "client_cpu_pct": round(100 * cpu / wall, 1),
    }


async def fill_and_read(
    consumer: AsyncConsumer, urls: list[str], tps: list[TopicPartition], records: int, record_size: int
) -> dict[str, Any]:
    """Append ``records`` records to ``tps`` (partitions of one topic) and time ``consumer`` reading exactly them.

    Returns the range read (``start`` and ``end`` offsets), the fill's rate (``fill``) and the read's (``read``).
    """
    consumer.assign(tps)
    start = await consumer.end_offsets(tps)
    fill = await fill_topic(urls, tps[0][0], records, record_size)
    end = await consumer.end_offsets(tps)
    read = await read_range(consumer, start, end, timeout=max(120.0, records / 1000))
    return {"start": start, "end": end, "fill": fill, "read": read}


async def _latency(
    urls: list[str], topic: str, consumer: AsyncConsumer, record_size: int, rate: int, seconds: float, linger_ms: int
) -> dict[str, Any]:
    pad = os.urandom(max(0, record_size - STAMP.size))
    latencies: list[float] = []
    acks: list[float] = []
    sent = 0
    producing = True

    async def receive() -> None:
        while producing or len(latencies) < sent:
            records: list[ConsumerRecord] = await consumer.poll(timeout_ms=200)
            now = time.perf_counter_ns()
            for r in records:
                latencies.append((now - STAMP.unpack_from(r.value or b"")[0]) / 1e6)

    def on_ack(t_send: int, _fut: object) -> None:
        acks.append((time.perf_counter_ns() - t_send) / 1e6)

    tick = 0.01
    per_tick = max(1, round(rate * tick))
    receiver = asyncio.create_task(receive())
    try:
        async with AsyncProducer(urls, linger_ms=linger_ms) as producer:
            t0 = time.perf_counter()
            next_tick = t0
            while time.perf_counter() - t0 < seconds:
                for _ in range(per_tick):
                    t_send = time.perf_counter_ns()
                    fut = await producer.send(topic, value=STAMP.pack(t_send) + pad)
                    fut.add_done_callback(functools.partial(on_ack, t_send))
                    sent += 1
                next_tick += tick
                await asyncio.sleep(max(0.0, next_tick - time.perf_counter()))
            await producer.flush()
        producing = False
        await asyncio.wait({receiver}, timeout=30)
    finally:
        producing = False
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
    lat, ack = sorted(latencies), sorted(acks)
    return {
        "records": len(lat),
        "sent": sent,
        "not_received": sent - len(lat),
        "rate_per_s": rate,
        "p50_ms": round(quantile(lat, 0.50) or 0.0, 2),
        "p99_ms": round(quantile(lat, 0.99) or 0.0, 2),
        "max_ms": round(lat[-1], 2) if lat else None,
        # send() -> producer acknowledgement (acks=all): the replication share of the end-to-end latency
        "ack_p50_ms": round(quantile(ack, 0.50) or 0.0, 2),
        "ack_p99_ms": round(quantile(ack, 0.99) or 0.0, 2),
        "linger_ms": linger_ms,
    }


async def run_consume_bench(
    urls: list[str],
    topic: str,
    *,
    records: int = 100_000,
    record_size: int = 1024,
    partitions: int = 3,
    replication_factor: int = 3,
    latency_seconds: float = 10.0,
    latency_rate: int = 1000,
    linger_ms: int = 1,
    isolation_level: str = "read_uncommitted",
    max_partition_fetch_bytes: int = 1 << 20,
    fetch_max_wait_ms: int = 500,
) -> dict[str, Any]:
    """Fill ``topic`` (created if missing), time reading it back, then measure tail latency.

    Returns ``{"fill": ..., "throughput": ..., "latency": ...}`` (see the module docstring).
    """
    count = await ensure_topic(urls, topic, partitions, replication_factor)
    tps = [(topic, p) for p in range(count)]
    async with AsyncConsumer(
        urls,
        isolation_level=isolation_level,
        max_partition_fetch_bytes=max_partition_fetch_bytes,
        fetch_max_wait_ms=fetch_max_wait_ms,
    ) as consumer:
        filled = await fill_and_read(consumer, urls, tps, records, record_size)
        consumer.seek_to_end()
        for tp in tps:
            await consumer.position(tp)
        latency = await _latency(urls, topic, consumer, record_size, latency_rate, latency_seconds, linger_ms)
    return {
        "topic": topic,
        "partitions": count,
        "record_size": record_size,
        "isolation_level": isolation_level,
        "fill": filled["fill"],
        "throughput": filled["read"],
        "latency": latency,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.consume", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--latency-seconds", type=float, default=10.0)
    p.add_argument("--latency-rate", type=int, default=1000)
    p.add_argument("--linger-ms", type=int, default=1)
    p.add_argument("--isolation", default="read_uncommitted", choices=["read_uncommitted", "read_committed"])
    add_node_setting_argument(p)
    args = p.parse_args(argv)
    settings = node_settings_or_exit(p, args)
    with fresh_cluster("txbroker-bench-consume-", settings) as cluster:
        res = asyncio.run(
            run_consume_bench(
                cluster.live_urls(),
                "consume-bench",
                records=args.records,
                record_size=args.record_size,
                partitions=args.partitions,
                latency_seconds=args.latency_seconds,
                latency_rate=args.latency_rate,
                linger_ms=args.linger_ms,
                isolation_level=args.isolation,
            )
        )
    print(json.dumps({"command": " ".join(sys.argv), "machine": machine_info(), "consume": res}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
