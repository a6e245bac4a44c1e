"""``txbroker bench txn``'s commit parts: where a transactional commit's time goes.

* ``commit_cycle``: at full speed, per commit: ``flush()``, EndTxn and the
  next transaction's first acknowledgement, with the host's busy cores in
  each phase.
* ``commit_chain``: at light load, the serial time a commit puts between two
  transactions, and the nodes' CPU per transaction.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from clients.aio.producer import AsyncProducer
from clients.protocol import BrokerError

from .measure import host_cpu, quantile


async def commit_cycle(urls: list[str], opts: argparse.Namespace) -> dict[str, Any]:
    """Per commit of a full-speed transactional producer: flush, EndTxn, and the next transaction's start.

    ``flush`` drains the buffer (the broker is busy); ``end_txn`` is
    ``commit_transaction()`` after that flush (EndTxn answered at PrepareCommit);
    ``next_first_ack`` is from ``begin_transaction()`` to the acknowledgement of
    the next transaction's first record (it waits on the coordinator for its
    add and the previous marker on its partition). The last two are time in
    which the nodes have little to replicate.
    """
    topic = "bench-cycle"
    value = os.urandom(opts.record_size)
    interval = opts.commit_interval_ms / 1000
    steps: dict[str, list[float]] = {"flush": [], "end_txn": [], "next_first_ack": []}
    pending: set[asyncio.Task[None]] = set()
    # The host's busy and total CPU seconds (all cores, /proc/stat) of each phase, summed over the measured
    # commits. Both come from the same tick counters, so their ratio times the cores is at most the cores,
    # whatever the 10 ms tick granularity does to a short phase.
    busy: dict[str, list[float]] = {"sending": [0.0, 0.0], "flush": [0.0, 0.0], "end_txn": [0.0, 0.0]}
    cores = os.cpu_count() or 1

    def phase(name: str, h0: tuple[float, float], h1: tuple[float, float]) -> None:
        busy[name][0] += h1[0] - h0[0]
        busy[name][1] += h1[1] - h0[1]

    async def first_ack(fut: asyncio.Future[Any], began: float) -> None:
        with contextlib.suppress(BrokerError):
            await fut
            steps["next_first_ack"].append((time.monotonic() - began) * 1000)

    async with AsyncProducer(urls, transactional_id="bench-txn-cycle", linger_ms=opts.linger_ms,
                             buffer_memory=opts.buffer_memory) as p:  # fmt: skip
        await p.partitions_for(topic)
        await p.init_transactions()
        p.begin_transaction()
        start = time.monotonic()
        end, next_commit = start + opts.warmup + opts.duration, start + interval
        i = 0
        h_sent = host_cpu()
        while time.monotonic() < end:
            await p.send(topic, value)
            i += 1
            if i % 32 or time.monotonic() < next_commit:
                continue
            measured = time.monotonic() >= start + opts.warmup
            t0, h0 = time.monotonic(), host_cpu()
            await p.flush()
            t1, h1 = time.monotonic(), host_cpu()
            await p.commit_transaction()
            t2, h2 = time.monotonic(), host_cpu()
            p.begin_transaction()
            began = time.monotonic()
            fut = await p.send(topic, value)
            if measured:
                phase("sending", h_sent, h0)
                phase("flush", h0, h1)
                phase("end_txn", h1, h2)
                steps["flush"].append((t1 - t0) * 1000)
                steps["end_txn"].append((t2 - t1) * 1000)
                task = asyncio.create_task(first_ack(fut, began))
                pending.add(task)
                task.add_done_callback(pending.discard)
            h_sent = h2
            next_commit = time.monotonic() + interval
        await p.commit_transaction()
        await asyncio.gather(*pending)
    out: dict[str, Any] = {"commits": len(steps["flush"])}
    for name, values in steps.items():
        out[name] = {"p50_ms": quantile(values, 0.5, 1), "p90_ms": quantile(values, 0.9, 1),
                     "mean_ms": round(statistics.fmean(values), 1) if values else None}  # fmt: skip
    # Busy cores of the whole host (10 ms ticks, so only the sum over many commits means anything).
    out["host_busy_cores"] = {name: round(cores * b / w, 2) if w > 0 else None for name, (b, w) in busy.items()}
    out["config"] = {"record_size": opts.record_size, "commit_interval_ms": opts.commit_interval_ms,
                     "linger_ms": opts.linger_ms, "buffer_memory": opts.buffer_memory}  # fmt: skip
    return out


async def commit_chain(
    urls: list[str], opts: argparse.Namespace, nodes_cpu: Callable[[], float] = lambda: 0.0
) -> dict[str, Any]:
    """The serial time between two transactions at light load, against an idempotent producer's round trip.

    Each cycle sends one 100-byte record to each partition and waits for the
    acknowledgements. The transactional producer then commits. ``next_first_acks``
    is the transactional cycle's wait (from ``begin_transaction()``): the KIP-890
    verification and the add at the coordinator come before the batches'
    own Raft rounds. ``idempotent_acks`` is the same send without a
    transaction, and ``end_txn`` is ``commit_transaction()`` (EndTxn, no flush
    to speak of). The difference of the first two plus EndTxn is the serial
    time a commit puts between two transactions.

    ``nodes_cpu_ms_per_cycle`` is the node processes' CPU per cycle, less
    what the idle cluster uses in the same time (measured first): what a
    transaction costs the broker beyond the same records sent idempotently,
    the fixed cost behind the full-load overhead.
    """
    topic = "bench-chain"
    n0, t0 = nodes_cpu(), time.monotonic()
    await asyncio.sleep(3.0)
    idle_cores = (nodes_cpu() - n0) / (time.monotonic() - t0)
    cpu: dict[str, float] = {}

    def cpu_per_cycle(n0: float, t0: float) -> float:
        return 1000 * (nodes_cpu() - n0 - idle_cores * (time.monotonic() - t0)) / int(opts.chain_cycles)

    tps = list(range(opts.partitions))
    steps: dict[str, list[float]] = {"idempotent_acks": [], "next_first_acks": [], "end_txn": []}

    async def one_each(p: AsyncProducer) -> float:
        began = time.monotonic()
        await asyncio.gather(*[await p.send(topic, b"x" * 100, partition=q) for q in tps])
        return (time.monotonic() - began) * 1000

    async with AsyncProducer(urls, linger_ms=0) as p:
        await p.partitions_for(topic)
        for i in range(opts.chain_cycles + 10):
            if i == 10:
                n0, t0 = nodes_cpu(), time.monotonic()
            took = await one_each(p)
            if i >= 10:
                steps["idempotent_acks"].append(took)
        cpu["idempotent"] = cpu_per_cycle(n0, t0)
    async with AsyncProducer(urls, transactional_id="bench-txn-chain", linger_ms=0) as p:
        await p.partitions_for(topic)
        await p.init_transactions()
        for i in range(opts.chain_cycles + 10):
            if i == 10:
                n0, t0 = nodes_cpu(), time.monotonic()
            p.begin_transaction()
            took = await one_each(p)
            started = time.monotonic()
            await p.commit_transaction()
            if i >= 10:  # the first transactions warm the coordinator and the connections
                steps["next_first_acks"].append(took)
                steps["end_txn"].append((time.monotonic() - started) * 1000)
        cpu["transactional"] = cpu_per_cycle(n0, t0)
    out: dict[str, Any] = {"cycles": opts.chain_cycles, "partitions": opts.partitions}
    out["nodes_idle_cores"] = round(idle_cores, 3)
    out["nodes_cpu_ms_per_cycle"] = {k: round(v, 2) for k, v in cpu.items()}
    out["transaction_nodes_cpu_ms"] = round(cpu["transactional"] - cpu["idempotent"], 2)
    for name, values in steps.items():
        out[name] = {"p50_ms": quantile(values, 0.5, 1), "p90_ms": quantile(values, 0.9, 1)}
    p50 = {name: statistics.median(values) for name, values in steps.items()}
    out["serial_ms_per_commit_p50"] = round(p50["next_first_acks"] - p50["idempotent_acks"] + p50["end_txn"], 1)
    return out
