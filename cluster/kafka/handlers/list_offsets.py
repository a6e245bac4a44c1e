"""ListOffsets (key 2): a partition's earliest or latest offset, or the first offset at a timestamp.

Answered by the partition's leader (NOT_LEADER_OR_FOLLOWER elsewhere, as Kafka
does; clients refresh metadata and ask the leader). ``LATEST`` is the high
watermark, or the last stable offset for read_committed (isolation level 1);
a timestamp finds the first record at or after it (-1: none). Version 0's
``max_num_offsets`` list form is not served (versions 1 and up).
Authorization: DESCRIBE on the topic.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code

__all__ = ["API"]

_Topic = ListOffsetsResponse.ListOffsetsTopicResponse
_Partition = _Topic.ListOffsetsPartitionResponse


async def _offset(ctx: RequestContext, topic: str, p: Any, read_committed: bool) -> Any:
    try:
        offset, timestamp = await ctx.services.partitions.list_offset(
            topic, p.partition_index, p.timestamp, read_committed
        )
    except BrokerError as exc:
        return _Partition(partition_index=p.partition_index, error_code=error_code(exc), timestamp=-1, offset=-1)
    return _Partition(partition_index=p.partition_index, error_code=0, timestamp=timestamp, offset=offset,
                      leader_epoch=-1)  # fmt: skip


async def handle(ctx: RequestContext, request: Any) -> Any:
    read_committed = ctx.api_version >= 2 and request.isolation_level == 1
    topics = []
    for t in request.topics:
        if not ctx.guard.allowed(Operation.DESCRIBE, ResourceType.TOPIC, t.name):
            denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
            parts = [_Partition(partition_index=p.partition_index, error_code=denied, timestamp=-1, offset=-1)
                     for p in t.partitions]  # fmt: skip
        else:
            parts = [await _offset(ctx, t.name, p, read_committed) for p in t.partitions]
        topics.append(_Topic(name=t.name, partitions=parts))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


API = KafkaApi("ListOffsets", ListOffsetsRequest, ListOffsetsResponse, 1, 7, handle)
