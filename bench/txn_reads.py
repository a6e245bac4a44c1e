"""``txbroker bench txn``'s read parts: what aborted transactions cost a reader, and when committed records show.

* ``consume_comparison``: a log of transactions, every 10th aborted, read
  from its start to its end offsets with read_committed and with
  read_uncommitted in turn; the ratio of log offsets covered per second.
* ``visible_latency``: a transactional producer at a fixed rate, committing
  every interval, and a read_committed consumer tailing the topic in the same
  process: ``send()`` to the ``poll()`` that returned the record.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from typing import Any

from clients.aio import AsyncConsumer
from clients.aio.producer import AsyncProducer
from clients.records import TopicPartition

from .measure import STAMP, quantile, self_cpu


def _median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r[key])[len(runs) // 2]


async def fill_with_aborts(urls: list[str], topic: str, opts: argparse.Namespace) -> dict[str, Any]:
    """``opts.fill_txns`` transactions of ``opts.fill_txn_records`` records; every 10th is aborted."""
    value = os.urandom(opts.record_size)
    aborted = 0
    t0 = time.perf_counter()
    async with AsyncProducer(urls, transactional_id="bench-txn-fill", linger_ms=20, batch_size=256 * 1024) as p:
        await p.init_transactions()
        for n in range(opts.fill_txns):
            p.begin_transaction()
            for _ in range(opts.fill_txn_records):
                await p.send(topic, value)
            if n % 10 == 9:
                await p.flush()  # the aborted records are in the log, to be skipped by readers
                await p.abort_transaction()
                aborted += 1
            else:
                await p.commit_transaction()
    return {"transactions": opts.fill_txns, "aborted": aborted, "records_per_txn": opts.fill_txn_records,
            "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip


async def consume_to_end(urls: list[str], topic: str, partitions: int, isolation: str) -> dict[str, Any]:
    tps: list[TopicPartition] = [(topic, p) for p in range(partitions)]
    async with AsyncConsumer(urls, isolation_level=isolation, auto_offset_reset="earliest",
                             max_poll_records=10_000) as c:  # fmt: skip
        c.assign(tps)
        ends = await c.end_offsets(tps)
        begins = await c.beginning_offsets(tps)
        got = payload = 0
        t0, c0 = time.perf_counter(), self_cpu()
        while True:
            positions = [await c.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            # A short poll: when the log ends with an aborted transaction, read_committed reaches the end
            # offsets with nothing left to return, and poll() then waits out its whole timeout (Kafka's poll
            # does too). That wait is not work done to get through the log.
            for r in await c.poll(timeout_ms=10):
                got += 1
                payload += len(r.value or b"")
        wall, cpu = time.perf_counter() - t0, self_cpu() - c0
    log_offsets = sum(ends[tp] - begins[tp] for tp in tps)
    return {
        "seconds": round(wall, 3),
        "log_offsets_per_s": round(log_offsets / wall),
        "records_returned": got,
        "records_per_s": round(got / wall),
        "mb_returned_per_s": round(payload / wall / 1e6, 2),
        "client_cpu_pct": round(100 * cpu / wall, 1),
    }


async def consume_comparison(urls: list[str], opts: argparse.Namespace) -> dict[str, Any]:
    topic = "bench-aborted-10pct"
    fill = await fill_with_aborts(urls, topic, opts)
    runs: dict[str, list[dict[str, Any]]] = {"read_committed": [], "read_uncommitted": []}
    ratios: list[float] = []
    for r in range(opts.rounds):
        order = ["read_committed", "read_uncommitted"]
        if r % 2:
            order.reverse()
        got = {iso: await consume_to_end(urls, topic, opts.partitions, iso) for iso in order}
        for iso, res in got.items():
            runs[iso].append(res)
        ratios.append(got["read_committed"]["log_offsets_per_s"] / max(1, got["read_uncommitted"]["log_offsets_per_s"]))
    ratio = statistics.median(ratios)
    return {
        "log": fill,
        "read_committed": _median_run(runs["read_committed"], "log_offsets_per_s"),
        "read_uncommitted": _median_run(runs["read_uncommitted"], "log_offsets_per_s"),
        "ratio_per_round": [round(x, 3) for x in ratios],
        "ratio_committed_vs_uncommitted": round(ratio, 3),
        "target_ratio_ge_0.98": ratio >= 0.98,
    }


async def visible_latency(urls: list[str], opts: argparse.Namespace) -> dict[str, Any]:
    topic = "bench-visible"
    pad = os.urandom(max(0, opts.record_size - STAMP.size))
    interval = opts.commit_interval_ms / 1000
    latencies: list[float] = []
    commits: list[float] = []
    sent = 0
    producing = True
    tps: list[TopicPartition] = [(topic, p) for p in range(opts.partitions)]
    async with AsyncConsumer(urls, isolation_level="read_committed", auto_offset_reset="latest",
                             fetch_max_wait_ms=500) as consumer:  # fmt: skip
        consumer.assign(tps)
        for tp in tps:
            await consumer.position(tp)  # resolve "latest" before anything is sent

        async def receive() -> None:
            while producing or len(latencies) < sent:
                records = await consumer.poll(timeout_ms=200)
                now = time.perf_counter_ns()
                latencies.extend((now - STAMP.unpack_from(r.value or b"")[0]) / 1e6 for r in records)

        receiver = asyncio.create_task(receive())
        try:
            async with AsyncProducer(urls, transactional_id="bench-txn-visible", linger_ms=opts.linger_ms) as p:
                await p.init_transactions()
                p.begin_transaction()
                tick = 0.01
                per_tick = max(1, round(opts.latency_rate * tick))
                start = time.monotonic()
                next_commit = start + interval
                n = 0
                while time.monotonic() - start < opts.latency_seconds:
                    for _ in range(per_tick):
                        await p.send(topic, STAMP.pack(time.perf_counter_ns()) + pad)
                        sent += 1
                    n += 1
                    if time.monotonic() >= next_commit:
                        t = time.monotonic()
                        await p.commit_transaction()
                        commits.append((time.monotonic() - t) * 1000)
                        p.begin_transaction()
                        next_commit += interval
                    await asyncio.sleep(max(0.0, start + n * tick - time.monotonic()))
                await p.commit_transaction()
            producing = False
            await asyncio.wait_for(receiver, 60)
        finally:
            producing = False
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await receiver
    return {
        "records": sent,
        "received": len(latencies),
        "p50_ms": quantile(latencies, 0.5, 1),
        "p99_ms": quantile(latencies, 0.99, 1),
        "max_ms": quantile(latencies, 1.0, 1),
        "commit_ms_p50": quantile(commits, 0.5, 1),
        "commit_ms_p99": quantile(commits, 0.99, 1),
        "target_p99_le_interval_plus_50ms": (quantile(latencies, 0.99, 1) or 1e9) <= opts.commit_interval_ms + 50,
        "config": {"rate": opts.latency_rate, "seconds": opts.latency_seconds,
                   "commit_interval_ms": opts.commit_interval_ms},
    }  # fmt: skip
