"""OffsetDelete (key 47): delete some of a group's committed offsets (kafka-consumer-groups.sh --delete-offsets).

The named partitions' committed offsets are deleted, except those of topics
a member of the group subscribes to: GROUP_SUBSCRIBED_TO_TOPIC for those
partitions, as Kafka answers. A group with neither metadata nor offsets is
GROUP_ID_NOT_FOUND. Deleting a partition without a committed offset
succeeds.

Authorization: DELETE on the group, READ on each topic (else
TOPIC_AUTHORIZATION_FAILED for its partitions).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import OffsetDeleteRequest, OffsetDeleteResponse

from clients.protocol import BrokerError, ErrorCode
from coordinator.metadata import TopicPartition

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code
from ..group_requests import group_refusal

__all__ = ["API"]

_Topic = OffsetDeleteResponse.OffsetDeleteResponseTopic
_Partition = _Topic.OffsetDeleteResponsePartition


async def handle(ctx: RequestContext, request: Any) -> Any:
    refusal = group_refusal(ctx, request.group_id, Operation.DELETE)
    if refusal is not None:
        return OffsetDeleteResponse(error_code=refusal.code, throttle_time_ms=0, topics=[])
    codes: dict[TopicPartition, int] = {}
    for t in request.topics:
        allowed = ctx.guard.allowed(Operation.READ, ResourceType.TOPIC, t.name)
        for p in t.partitions:
            codes[TopicPartition(t.name, p.partition_index)] = (
                0 if allowed else ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
            )
    wanted = [tp for tp, code in codes.items() if code == 0]
    try:
        result = await ctx.services.groups.delete_offsets(request.group_id, wanted)
    except BrokerError as exc:
        return OffsetDeleteResponse(error_code=error_code(exc), throttle_time_ms=0, topics=[])
    for tp in result.subscribed:
        codes[tp] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC.code
    by_topic: dict[str, list[Any]] = {}
    for tp, code in codes.items():
        by_topic.setdefault(tp.topic, []).append(_Partition(partition_index=tp.partition, error_code=code))
    topics = [_Topic(name=name, partitions=parts) for name, parts in by_topic.items()]
    return OffsetDeleteResponse(error_code=0, throttle_time_ms=0, topics=topics)


API = KafkaApi("OffsetDelete", OffsetDeleteRequest, OffsetDeleteResponse, 0, 0, handle)
