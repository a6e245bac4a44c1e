"""``txbroker bench txn``'s produce part: long-lived producers taking turns in short windows of full-speed sends.

Each mode is one producer: idempotent (the baseline), transactional (a
commit every ``--commit-interval-ms``), and the controls: a second
idempotent producer (A/A), one that only flushes every interval, one that
flushes and makes one offset commit (the floor), one that commits with
``commit_and_begin`` (pipelined). ``bench.txn_report`` turns the windows
into the report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from clients.aio.producer import AsyncProducer

from .measure import self_cpu
from .txn_report import Windows, produce_report

# The topic of each mode's producer (``bench.txn`` creates them all).
TOPICS = {"idempotent": "bench-idempotent", "transactional": "bench-transactional", "control": "bench-control",
          "flushing": "bench-flushing", "one_write": "bench-one-write", "pipelined": "bench-pipelined"}  # fmt: skip


async def _send_window(
    p: AsyncProducer,
    topic: str,
    value: bytes,
    opts: argparse.Namespace,
    *,
    transactional: bool,
    pipelined: bool = False,
    nodes_cpu: Callable[[], float] = lambda: 0.0,
    flush_only: bool = False,
    after_flush: Callable[[], Awaitable[None]] | None = None,
    nodes_cpu_by_kind: Callable[[], dict[str, float]] = dict,
    counters: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """One window of ``opts.window`` s of full-speed sends; records/s acknowledged after ``opts.window_warmup`` s.

    A transactional window commits every ``commit_interval_ms`` (Kafka's
    perf test: the commit blocks the sending loop; ``pipelined``:
    ``commit_and_begin``, the loop goes on sending the next transaction's
    records while the commit runs, and ``commit_ms`` is how long each commit
    took, not how long it blocked). At its end the open
    transaction is committed and everything drained outside the measured
    time, so each window starts from an idle producer.
    """
    interval = opts.commit_interval_ms / 1000
    commits: list[float] = []
    pending: asyncio.Future[None] | None = None  # pipelined: the commit under way
    # The nodes' counters over the whole window (warm-up and final drain included), read outside the timed loop.
    counted0 = await asyncio.to_thread(counters) if counters is not None else {}
    acked0 = p.metrics()["records_acked"]
    ends = 0  # commits (or flushes) in the whole window, the final one included
    start = now = time.monotonic()
    t_w, t_end = start + opts.window_warmup, start + opts.window
    a0, c0, n0, q0, b0 = -1, 0.0, 0.0, 0, 0
    k0: dict[str, float] = {}
    next_commit = start + interval
    i = 0
    while now < t_end:
        await p.send(topic, value)
        i += 1
        if i % 32:
            continue
        now = time.monotonic()
        if a0 < 0 and now >= t_w:
            m0 = p.metrics()
            a0, c0, n0, t_w = m0["records_acked"], self_cpu(), nodes_cpu(), now
            k0, q0, b0 = nodes_cpu_by_kind(), m0["requests"], m0["batches"]
        if pipelined and now >= next_commit:
            if pending is not None and pending.done():
                pending.result()  # a failed commit stops the bench
            pending = await p.commit_and_begin()
            began = time.monotonic()
            if a0 >= 0:
                pending.add_done_callback(functools.partial(_took, commits, began))
            ends += 1
            now, next_commit = began, began + interval
        elif (transactional or flush_only) and now >= next_commit:
            if transactional:
                await p.commit_transaction()
            else:
                await p.flush()  # what a commit does first, without the transaction
                if after_flush is not None:
                    await after_flush()
            done = time.monotonic()
            ends += 1
            if a0 >= 0:
                commits.append((done - now) * 1000)
            if transactional:
                p.begin_transaction()
            now, next_commit = done, done + interval
    m1 = p.metrics()
    a1, c1, n1, k1 = m1["records_acked"], self_cpu(), nodes_cpu(), nodes_cpu_by_kind()
    wall = now - t_w
    if transactional or pipelined:
        await p.commit_transaction()
        p.begin_transaction()
        ends += 1
    await p.flush()
    counted1 = await asyncio.to_thread(counters) if counters is not None else {}
    out: dict[str, Any] = {"counters": {k: v - counted0.get(k, 0.0) for k, v in counted1.items()},
                           "window_records": p.metrics()["records_acked"] - acked0, "window_commits": ends,
                           "records": a1 - a0, "seconds": wall, "client_cpu_s": c1 - c0, "nodes_cpu_s": n1 - n0,
                           "nodes_cpu_by_thread_s": {k: v - k0.get(k, 0.0) for k, v in k1.items()},
                           "requests": m1["requests"] - q0,
                           "batches": m1["batches"] - b0}  # fmt: skip
    if transactional or flush_only or pipelined:
        out["commit_ms"] = commits  # how long each commit (or flush) blocked the sending loop (pipelined: took)
    return out


def _took(into: list[float], began: float, fut: asyncio.Future[None]) -> None:
    """A pipelined commit's done callback: how long it took, in ms (failed ones too: the loop raises them)."""
    into.append((time.monotonic() - began) * 1000)


class _OneWrite:
    """The floor control's "commit": one OffsetCommit sent straight to its group coordinator.

    It is one HTTP round trip and one replicated write on a Raft group of its
    own, which is what a commit protocol whose markers ride on the next
    transaction's batches would still cost (docs/pipelined-transactions.md).
    """

    _GROUP = "bench-one-write-floor"

    def __init__(self, urls: list[str]) -> None:
        self._urls = urls
        self._session: aiohttp.ClientSession | None = None
        self._url = ""
        self._n = 0

    async def __aenter__(self) -> _OneWrite:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        async with self._session.get(f"{self._urls[0]}/v1/coordinators/group/{self._GROUP}") as r:
            r.raise_for_status()
            self._url = str((await r.json())["url"])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def commit(self) -> None:
        assert self._session is not None
        self._n += 1
        body = {"offsets": [{"topic": "bench-one-write", "partition": 0, "offset": self._n}]}
        async with self._session.post(f"{self._url}/v1/groups/{self._GROUP}/offsets", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"the floor control's offset commit failed: {r.status} {await r.text()}")


async def produce_comparison(
    urls: list[str],
    opts: argparse.Namespace,
    nodes_cpu: Callable[[], float] = lambda: 0.0,
    nodes_cpu_by_kind: Callable[[], dict[str, float]] = dict,
    counters: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Idempotent vs transactional, in short alternating windows of long-lived producers.

    Every producer starts once (connections, ids, metadata warm) and they take
    turns: round r runs one window of each, in an order shuffled per round
    (``--seed``), so slow drift of the machine and whatever a window leaves
    to the next fall on every mode alike (a fixed ABBA order over four modes
    puts the same neighbours around each mode every round). The overhead is
    from the ratio of the totals over every window. A second idempotent
    producer (the A/A control, ``--no-aa-control`` drops it) is compared with
    the first the same way: the ratio an overhead of 0 would show on this
    machine (the noise floor). A third idempotent producer flushes every
    ``commit_interval_ms`` (``flush_only``): the part of the overhead that a
    commit's flush costs by itself, transaction or not. A fourth
    (``--floor-control``, the default) flushes and then sends one offset
    commit to its group coordinator (``_OneWrite``): one round trip and one
    replicated write per commit, the least any commit protocol could cost. A
    fifth (``--pipelined``) is transactional and commits with
    ``commit_and_begin``: its sending loop never waits for a commit. The
    ratios come with a 95 % bootstrap interval over the rounds.
    ``nodes_cpu_us_per_record`` is the node processes' CPU per acknowledged
    record: the broker's own cost of a transactional record, steadier than
    throughput on a shared machine.
    """
    value = os.urandom(opts.record_size)
    modes = ["idempotent", "transactional"] + (["control"] if opts.aa_control else []) + ["flushing"]
    modes += ["one_write"] if opts.floor_control else []
    modes += ["pipelined"] if opts.pipelined else []
    tids = {"transactional": "bench-txn-produce", "pipelined": "bench-txn-pipelined"}
    kw: dict[str, Any] = {"linger_ms": opts.linger_ms, "buffer_memory": opts.buffer_memory}
    windows: dict[str, Windows] = {m: [] for m in modes}
    async with contextlib.AsyncExitStack() as stack:
        one_write = await stack.enter_async_context(_OneWrite(urls)) if opts.floor_control else None
        prods: dict[str, AsyncProducer] = {}
        for m in modes:
            prods[m] = await stack.enter_async_context(AsyncProducer(urls, transactional_id=tids.get(m), **kw))
            await prods[m].partitions_for(TOPICS[m])
        for m in tids.keys() & set(modes):
            await prods[m].init_transactions()
            prods[m].begin_transaction()
        rng = random.Random(opts.seed)
        for _ in range(opts.produce_windows):
            for m in rng.sample(modes, len(modes)):
                windows[m].append(
                    await _send_window(
                        prods[m],
                        TOPICS[m],
                        value,
                        opts,
                        transactional=m == "transactional",
                        pipelined=m == "pipelined",
                        nodes_cpu=nodes_cpu,
                        nodes_cpu_by_kind=nodes_cpu_by_kind,
                        counters=counters,
                        flush_only=m in ("flushing", "one_write"),
                        after_flush=one_write.commit if m == "one_write" and one_write is not None else None,
                    )
                )
        for m in tids.keys() & set(modes):
            await prods[m].commit_transaction()
    return produce_report(windows, opts)
