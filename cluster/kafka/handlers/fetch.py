"""Fetch (key 1): record batches from the partitions' leaders, with read_committed and aborted transactions.

Each partition is read through the partition service (the same fetch as the
HTTP API: only the ready leader answers, read_committed stops at the LSO and
lists the aborted transactions in range). Kafka's wait rule spans the
request: partitions are first read without waiting; if they hold fewer than
``min_bytes`` and ``max_wait_ms`` allows, every partition long-polls at once
and the first that gets data ends the wait, after which the rest are read
once more without waiting. ``max_bytes`` bounds the response as in KIP-74:
the first partition with data always returns at least one batch.

Batches a Kafka producer wrote go back byte for byte (compressed as written);
batches written through the HTTP doors are converted to Kafka's v2 format
(``storage.kafka_batch``). Fetch sessions (KIP-227) are not kept: every
answer has session id 0, so clients send full fetch requests. Leader epochs
are not tracked (-1).

Authorization: READ on each topic, else TOPIC_AUTHORIZATION_FAILED for its partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse

from clients.protocol import BrokerError, ErrorCode
from storage.kafka_batch import kafka_fetch_payload

from ...partitions import READ_COMMITTED, READ_UNCOMMITTED, FetchResult
from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code

__all__ = ["API"]

_Topic = FetchResponse.FetchableTopicResponse
_Partition = _Topic.PartitionData
_Aborted = _Partition.AbortedTransaction


@dataclass
class _Read:
    topic: str
    partition: int
    offset: int
    max_bytes: int
    result: FetchResult | None = None
    error: int = 0
    payload: bytes = b""


def _partition_answer(r: _Read) -> Any:
    res = r.result
    if res is None:
        return _Partition(
            partition_index=r.partition, error_code=r.error, high_watermark=-1, last_stable_offset=-1,
            log_start_offset=-1, aborted_transactions=None, preferred_read_replica=-1, records=b"",
        )  # fmt: skip
    aborted = [_Aborted(producer_id=pid, first_offset=first) for pid, first in res.aborted_transactions]
    return _Partition(
        partition_index=r.partition,
        error_code=0,
        high_watermark=res.high_watermark,
        last_stable_offset=res.last_stable_offset,
        log_start_offset=res.log_start_offset,
        aborted_transactions=aborted,
        preferred_read_replica=-1,
        records=r.payload,
    )


async def _read(ctx: RequestContext, r: _Read, isolation: str, wait_ms: int) -> None:
    try:
        r.result = await ctx.services.partitions.fetch(r.topic, r.partition, r.offset, r.max_bytes, wait_ms, isolation)
        r.error = 0
    except BrokerError as exc:
        r.result, r.error = None, error_code(exc)


def _payload_bytes(reads: list[_Read], budget: int) -> int:
    """Fill each read's payload in request order within ``budget`` bytes (the first non-empty one always)."""
    total = 0
    for r in reads:
        if r.result is None or not r.result.batches:
            r.payload = b""
            continue
        batches = r.result.batches
        if total > 0:
            kept, size = [], 0
            for b in batches:
                if total + size + len(b.data) > budget:
                    break
                kept.append(b)
                size += len(b.data)
            batches = kept
        r.payload = kafka_fetch_payload(batches) if batches else b""
        total += len(r.payload)
    return total


async def handle(ctx: RequestContext, request: Any) -> Any:
    isolation = READ_COMMITTED if request.isolation_level == 1 else READ_UNCOMMITTED
    guard = ctx.guard
    reads: list[_Read] = []
    for topic in request.topics:
        allowed = guard.allowed(Operation.READ, ResourceType.TOPIC, topic.topic)
        for p in topic.partitions:
            r = _Read(topic.topic, p.partition, p.fetch_offset, max(1, p.partition_max_bytes))
            if not allowed:
                r.error = ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
            reads.append(r)
    live = [r for r in reads if r.error == 0]
    await asyncio.gather(*(_read(ctx, r, isolation, 0) for r in live))
    budget = max(1, request.max_bytes)
    total = _payload_bytes(reads, budget)
    if total < request.min_bytes and request.max_wait_ms > 0 and live:
        await _wait_for_data(ctx, live, isolation, request.max_wait_ms)
        _payload_bytes(reads, budget)
    by_topic: dict[str, list[Any]] = {}
    for r in reads:
        by_topic.setdefault(r.topic, []).append(_partition_answer(r))
    return FetchResponse(
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[_Topic(topic=name, partitions=parts) for name, parts in by_topic.items()],
    )


async def _wait_for_data(ctx: RequestContext, live: list[_Read], isolation: str, max_wait_ms: int) -> None:
    """Long-poll every readable partition; the first to get data ends the wait, then the rest are read again."""
    waiting = [r for r in live if r.result is not None]
    if not waiting:
        return
    tasks = {asyncio.ensure_future(_read(ctx, r, isolation, max_wait_ms)): r for r in waiting}
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(tasks[t].result is None or tasks[t].result.batches for t in done):  # type: ignore[union-attr]
                break
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
    unfinished = [r for t, r in tasks.items() if t.cancelled()]
    await asyncio.gather(*(_read(ctx, r, isolation, 0) for r in unfinished))


API = KafkaApi("Fetch", FetchRequest, FetchResponse, 4, 12, handle)
