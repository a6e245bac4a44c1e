"""The produce load of ``txbroker bench produce``: idempotent binary batches to each partition's leader.

``PartitionWriter`` sends fixed batches (the same records every time) to one
partition, up to K requests in flight, keeping each batch's sequence across
retries; ``drive_produce`` runs one per partition of ``TOPIC`` and reports
throughput, latency and the CPU of the client, the nodes and the host over the
measured window. ``txbroker bench clients`` uses it as the broker's ceiling,
``txbroker bench metrics`` as its steady load.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from clients.aio import Http1Pool
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

from .harness import BenchCluster
from .measure import host_cpu, pct, proc_stat, self_cpu

TOPIC = "bench"
_OUT_OF_ORDER_RETRIES = 10  # once a batch's predecessor is acknowledged (0.05 s apart)


@dataclass
class Load:
    """Acked batches: (completion time, payload bytes, records, latency s), plus error counts."""

    acks: list[tuple[float, int, int, float]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    retries: int = 0

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        sel = [a for a in self.acks if t0 <= a[0] < t1]
        lat = sorted(a[3] for a in sel)
        wall = t1 - t0
        payload = sum(a[1] for a in sel)
        return {
            "seconds": round(wall, 2),
            "mb_per_s": round(payload / wall / 1e6, 2),
            "records_per_s": round(sum(a[2] for a in sel) / wall),
            "requests_per_s": round(len(sel) / wall, 1),
            "p50_ms": round(pct(lat, 0.50) * 1e3, 1),
            "p99_ms": round(pct(lat, 0.99) * 1e3, 1),
            "max_ms": round(lat[-1] * 1e3, 1) if lat else None,
            "errors": dict(self.errors),
            "retries": self.retries,
        }


PostFn = Callable[[str, bytes], Awaitable[Any]]


async def aiohttp_post(session: aiohttp.ClientSession, url: str, body: bytes) -> Any:
    """POST a binary produce request; the parsed JSON answer."""
    async with session.post(url, data=body, headers={"Content-Type": PRODUCE_CONTENT_TYPE}) as resp:
        return await resp.json()


class ProduceHttp:
    """The produce load generator's HTTP: the Python producer's lean keep-alive transport.

    The bench shares the host's cores with the nodes it measures, and aiohttp's client costs
    about 0.3 ms of CPU per request; ``clients.aio._http1`` costs a fraction of that. Every
    transport failure surfaces as ``ConnectionError``; any HTTP status returns its JSON body.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._pool = Http1Pool()

    async def post(self, url: str, body: bytes) -> Any:
        try:
            answer = await self._pool.post(url, body, PRODUCE_CONTENT_TYPE, self.timeout)
        except BrokerError as exc:
            raise ConnectionError(f"POST {url}: {exc}") from exc
        return json.loads(answer.body)

    async def close(self) -> None:
        await self._pool.close()


class PartitionWriter:
    """Idempotent writes of fixed batches to one partition of ``topic`` (``TOPIC`` by default) through its leader,
    up to K in flight.

    A batch keeps its sequence across retries; a retriable error (or an
    out-of-order answer while an earlier batch is still unacknowledged) resends
    it after its predecessor has been acknowledged.
    """

    def __init__(self, cluster: BenchCluster, post: PostFn | aiohttp.ClientSession, partition: int, leader: str,
                 pid: int, epoch: int, records: list[Record], value_bytes: int, load: Load,
                 topic: str = TOPIC) -> None:  # fmt: skip
        if isinstance(post, aiohttp.ClientSession):
            post = functools.partial(aiohttp_post, post)
        self.cluster, self.post, self.partition, self.leader = cluster, post, partition, leader
        self.pid, self.epoch, self.records, self.load = pid, epoch, records, load
        self.topic = topic
        self.payload = value_bytes * len(records)
        self.next_seq = 0
        self.done: dict[int, asyncio.Event] = {}
        self.stop = False
        self.wire_bytes = 0

    def body(self, seq: int) -> bytes:
        batch = encode_batch(self.records, producer_id=self.pid, producer_epoch=self.epoch,
                             base_sequence=seq if self.pid >= 0 else -1)  # fmt: skip
        self.wire_bytes = len(batch)
        return encode_produce_request(ProduceRequest((ProducePartition(self.topic, self.partition, batch),)))

    async def refresh_leader(self, hint: str | None) -> None:
        if hint and hint in self.cluster.live_urls():
            self.leader = hint
            return
        led = await asyncio.to_thread(self.cluster.leaders, self.topic)
        url = led.get(self.partition)
        if url:
            self.leader = url
        await asyncio.sleep(0.02)

    async def send_one(self) -> tuple[float, str]:
        """Send the next batch until acknowledged; returns (latency, leader url that acked)."""
        seq = self.next_seq
        self.next_seq += len(self.records)
        prev, mine = self.done.get(seq - len(self.records)), asyncio.Event()
        self.done[seq] = mine
        body = self.body(seq)
        t0 = time.perf_counter()
        out_of_order = 0
        try:
            while True:
                leader = self.leader
                code, hint = "NONE", None
                try:
                    res = await self.post(leader + "/v1/produce", body)
                    part = res["partitions"][0]
                    code, hint = part.get("error_code") or "NONE", part.get("leader_url") or res.get("leader_url")
                except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError, IndexError) as exc:
                    code = "CONNECTION:" + type(exc).__name__
                if code == "NONE":
                    return time.perf_counter() - t0, leader
                self.load.errors[code] += 1
                self.load.retries += 1
                if code == "OUT_OF_ORDER_SEQUENCE_NUMBER" and prev is not None and not prev.is_set():
                    await prev.wait()
                    continue
                if code == "OUT_OF_ORDER_SEQUENCE_NUMBER":
                    # Its predecessor is acknowledged. The batch was most likely written by an attempt whose answer
                    # was lost in a leader change, and the slots writing later batches have gone more than the 5
                    # batches a partition remembers past it, so the retry no longer reads as a duplicate.
                    out_of_order += 1
                    if out_of_order > _OUT_OF_ORDER_RETRIES:
                        self.load.errors["OUT_OF_ORDER_SEQUENCE_NUMBER:taken_as_written"] += 1
                        return time.perf_counter() - t0, leader
                    await asyncio.sleep(0.05)
                    continue
                retriable = code.startswith("CONNECTION:") or ErrorCode.from_name(code).retriable
                if not retriable:
                    raise RuntimeError(f"partition {self.partition} seq {seq}: {code}")
                await self.refresh_leader(hint if code == "NOT_LEADER_OR_FOLLOWER" else None)
        finally:
            mine.set()
            self.done.pop(seq - 2 * len(self.records), None)

    async def run_slot(self) -> None:
        while not self.stop:
            latency, _ = await self.send_one()
            self.load.acks.append((time.monotonic(), self.payload, len(self.records), latency))


def make_records(record_size: int, batch_bytes: int) -> list[Record]:
    value = os.urandom(record_size)
    ts = int(time.time() * 1000)
    return [Record(value=value, timestamp=ts)] * max(1, batch_bytes // record_size)


async def drive_produce(cluster: BenchCluster, leaders: dict[int, str], opts: argparse.Namespace,
                        on_window: Callable[[], Any] | None = None) -> dict[str, Any]:  # fmt: skip
    pid, epoch = cluster.init_producer() if opts.idempotence else (-1, -1)
    records = make_records(opts.record_size, opts.batch_bytes)
    load = Load()
    http = ProduceHttp(timeout=30.0)
    try:
        writers = [PartitionWriter(cluster, http.post, p, url, pid, epoch, records, opts.record_size, load)
                   for p, url in sorted(leaders.items())]  # fmt: skip
        tasks = [asyncio.create_task(w.run_slot()) for w in writers for _ in range(opts.concurrency)]
        try:
            await asyncio.sleep(opts.warmup)
            t0, c0, h0 = time.monotonic(), self_cpu(), host_cpu()
            n0 = {i: proc_stat(p.pid)[0] for i, p in cluster.procs.items()}
            extra = on_window() if on_window else None
            await asyncio.sleep(opts.duration)
            t1, c1, h1 = time.monotonic(), self_cpu(), host_cpu()
            n1 = {i: proc_stat(p.pid)[0] for i, p in cluster.procs.items()}
        finally:
            for w in writers:
                w.stop = True
            done, _ = await asyncio.wait(tasks, timeout=30)
            for t in tasks:
                t.cancel()
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    finally:
        await http.close()
    out = load.window(t0, t1)
    out["batch_wire_bytes"] = writers[0].wire_bytes
    out["idempotent"] = pid >= 0
    out["client_cpu_pct"] = round(100 * (c1 - c0) / (t1 - t0), 1)
    out["node_cpu_pct"] = {f"node{i}": round(100 * (n1[i] - n0[i]) / (t1 - t0), 1) for i in n0}
    out["host_cpu_busy_pct"] = round(100 * (h1[0] - h0[0]) / (h1[1] - h0[1]), 1)  # of all cores
    out["host_cpu_other_pct"] = round(  # busy time of processes outside this benchmark, % of one core
        100 * ((h1[0] - h0[0]) - (c1 - c0) - sum(n1[i] - n0[i] for i in n0)) / (t1 - t0), 1)  # fmt: skip
    out["leaders"] = {p: cluster.node_of_url(u) for p, u in leaders.items()}
    if extra is not None:
        out["_extra"] = extra
    return out
