"""DeleteRecords (key 21): move partitions' log start offsets up, from each partition's leader (versions 0-2).

Each partition's leader proposes the move through the partition's Raft log
(``PartitionService.delete_records``) and answers once it is committed, with
the new log start offset as the low watermark; the batches wholly below it are
deleted, a batch it falls inside is kept whole (a fetch below the log start is
OFFSET_OUT_OF_RANGE, ListOffsets EARLIEST answers the new start). Offset -1
means the high watermark; an offset below -1 or above the high watermark is
OFFSET_OUT_OF_RANGE; an offset at or below the log start changes nothing.
Producer state stays, so an idempotent or transactional producer's sequences
go on (Kafka keeps it too). The partitions of a request are handled
concurrently; ``timeout_ms`` bounds each commit (at most the node's
``request_timeout_ms``, which 0 also means: Kafka's "do not wait for the
followers" still waits for the commit here; REQUEST_TIMED_OUT when it passes,
and the move may still happen).

Authorization: DELETE on the topic, else TOPIC_AUTHORIZATION_FAILED; an
unknown topic or partition is UNKNOWN_TOPIC_OR_PARTITION, a node that does not
lead the partition NOT_LEADER_OR_FOLLOWER (clients send each partition to its
leader). A partition that fails answers low watermark -1.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code

__all__ = ["API"]

_Topic = DeleteRecordsResponse.DeleteRecordsTopicResult
_Partition = _Topic.DeleteRecordsPartitionResult


async def _partition(ctx: RequestContext, topic: str, index: int, offset: int, allowed: bool, timeout_ms: int) -> Any:
    try:
        if not allowed:
            raise BrokerError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"DELETE on topic {topic}")
        low = await ctx.services.partitions.delete_records(topic, index, offset, timeout_ms)
    except BrokerError as exc:
        return _Partition(partition_index=index, low_watermark=-1, error_code=error_code(exc))
    return _Partition(partition_index=index, low_watermark=low, error_code=0)


async def handle(ctx: RequestContext, request: Any) -> Any:
    jobs = []
    for t in request.topics:
        allowed = ctx.guard.allowed(Operation.DELETE, ResourceType.TOPIC, t.name)
        offsets = {p.partition_index: p.offset for p in t.partitions}
        jobs.append((t.name, [_partition(ctx, t.name, i, o, allowed, request.timeout_ms) for i, o in offsets.items()]))
    results = await asyncio.gather(*(asyncio.gather(*parts) for _name, parts in jobs))
    topics = [_Topic(name=name, partitions=list(parts)) for (name, _jobs), parts in zip(jobs, results, strict=True)]
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)


API = KafkaApi("DeleteRecords", DeleteRecordsRequest, DeleteRecordsResponse, 0, 2, handle)
