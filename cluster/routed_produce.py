"""The convenience produce (``POST /v1/topics/{t}/records``): records routed like a producer would.

Records go to their explicit partition, else by key (murmur2, Kafka's
default partitioner), else to one partition per request in round robin; each
partition's records become one plain (non-idempotent) batch, written on the
partition's leader, here or forwarded once. A partition whose leader is not
known yet (an election under way, or this node not yet told of a new leader)
is tried again every ``retry.backoff.ms`` until the request's timeout, like a
producer with retries. Only answers that prove nothing was written are
retried, so a plain write is never duplicated.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any, Protocol

from clients.partitioner import partition_for_key
from clients.protocol import BrokerError, ErrorCode, ProducePartition, ProduceRequest, Record, encode_batch

from .deadline import Deadline, deadline_scope
from .partitions import PartitionProduceResult
from .seams import TopicDirectory

__all__ = ["RETRY_BACKOFF_S", "LeaderForwarder", "PartitionProducer", "RoutedProduce", "RoutedProducer"]

RETRY_BACKOFF_S = 0.1  # retry.backoff.ms: how often the convenience produce looks for a new leader


class PartitionProducer(Protocol):
    async def produce(self, req: ProduceRequest) -> list[PartitionProduceResult]:
        """Write each partition of ``req`` on this node (``PartitionService.produce``)."""
        ...


class LeaderForwarder(Protocol):
    async def produce_on(self, url: str, part: ProducePartition) -> PartitionProduceResult | None:
        """Write ``part`` on the node at ``url``; None if the request never left (nothing written)."""
        ...


@dataclass(frozen=True, slots=True)
class RoutedProduce:
    """Per partition written, its result; per record (in request order), its partition and offset or error."""

    results: list[PartitionProduceResult]
    records: list[dict[str, Any]]


def unwritten_for_want_of_a_leader(res: PartitionProduceResult) -> bool:
    """The partition answered "not the leader" before proposing anything (the answer names the
    leader it knows, possibly none): writing again cannot duplicate the records."""
    err = res.error
    return err is not None and err.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER and "leader_id" in err.extra


class RoutedProducer:
    def __init__(self, partitions: PartitionProducer, topics: TopicDirectory, request_timeout_ms: int) -> None:
        self._partitions = partitions
        self._topics = topics
        self._request_timeout_ms = request_timeout_ms
        self._rr = itertools.count()

    async def produce_records(
        self,
        topic: str,
        records: list[tuple[Record, int | None]],
        timeout_ms: int,
        forwarder: LeaderForwarder | None,
    ) -> RoutedProduce:
        """Write ``records`` (each with its explicit partition or None); ``forwarder`` None: never forward."""
        meta = self._topics.topic(topic)
        n = len(meta.partitions)
        by_partition: dict[int, list[tuple[int, Record]]] = {}
        sticky = next(self._rr) % n
        for i, (rec, explicit) in enumerate(records):
            if explicit is not None:
                if explicit >= n:
                    raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {explicit}")
                part = explicit
            elif rec.key is not None:
                part = partition_for_key(rec.key, n)
            else:
                part = sticky
            by_partition.setdefault(part, []).append((i, rec))
        max_bytes = meta.config_int("max.message.bytes")
        parts = []
        for part, recs in sorted(by_partition.items()):
            batch = encode_batch([r for _, r in recs])
            if len(batch) > max_bytes:
                code = ErrorCode.RECORD_TOO_LARGE if len(recs) == 1 else ErrorCode.MESSAGE_TOO_LARGE
                raise BrokerError(code, f"{len(batch)} bytes for partition {part} exceed max.message.bytes={max_bytes}")
            parts.append(ProducePartition(topic, part, batch))
        results = await self._with_retries(parts, timeout_ms, forwarder)
        offsets: list[dict[str, Any]] = [{} for _ in records]
        for res in results:
            for k, (i, _rec) in enumerate(by_partition[res.partition]):
                entry: dict[str, Any] = {"partition": res.partition}
                if res.error is None:
                    entry["offset"] = res.base_offset + k
                else:
                    entry.update(res.error.to_json())
                offsets[i] = entry
        return RoutedProduce(results, offsets)

    async def _with_retries(
        self, parts: list[ProducePartition], timeout_ms: int, forwarder: LeaderForwarder | None
    ) -> list[PartitionProduceResult]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(timeout_ms, self._request_timeout_ms) / 1000
        with deadline_scope(Deadline(deadline)):  # a forward to a leader takes at most what is left
            return await self._retried(parts, timeout_ms, forwarder, deadline)

    async def _retried(
        self, parts: list[ProducePartition], timeout_ms: int, forwarder: LeaderForwarder | None, deadline: float
    ) -> list[PartitionProduceResult]:
        loop = asyncio.get_running_loop()
        results = await self._once(parts, timeout_ms, forwarder)
        while forwarder is not None:
            pending = [i for i, res in enumerate(results) if unwritten_for_want_of_a_leader(res)]
            if not pending or loop.time() + RETRY_BACKOFF_S >= deadline:
                break
            await asyncio.sleep(RETRY_BACKOFF_S)
            left_ms = max(1, int((deadline - loop.time()) * 1000))
            again = await self._once([parts[i] for i in pending], left_ms, forwarder)
            for i, res in zip(pending, again, strict=True):
                results[i] = res
        return results

    async def _once(
        self, parts: list[ProducePartition], timeout_ms: int, forwarder: LeaderForwarder | None
    ) -> list[PartitionProduceResult]:
        results = await self._partitions.produce(ProduceRequest(tuple(parts), timeout_ms=timeout_ms))
        if forwarder is None:
            return results
        out = []
        for res, part in zip(results, parts, strict=True):
            url = res.error.extra.get("leader_url") if res.error else None
            if res.error is None or res.error.error_code is not ErrorCode.NOT_LEADER_OR_FOLLOWER or not url:
                out.append(res)
                continue
            forwarded = await forwarder.produce_on(str(url), part)
            out.append(res if forwarded is None else forwarded)
        return out
