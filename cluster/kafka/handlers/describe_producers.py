"""DescribeProducers (key 61): the active producers of partitions, from each partition's leader (version 0).

The same state as ``GET /v1/topics/{t}/partitions/{p}/producers``: per producer
its epoch, last sequence and timestamp, the coordinator epoch of its last
marker and the first offset of its open transaction (-1: none), which is what
finds a hanging transaction. Authorization: READ on the topic, else
TOPIC_AUTHORIZATION_FAILED; on a node that does not lead the partition,
NOT_LEADER_OR_FOLLOWER (the admin client asks each partition's leader).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeProducersRequest, DescribeProducersResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code, error_message

__all__ = ["API"]

_Topic = DescribeProducersResponse.TopicResponse
_Partition = _Topic.PartitionResponse
_Producer = _Partition.ProducerState


def _partition(ctx: RequestContext, topic: str, index: int, allowed: bool) -> Any:
    try:
        if not allowed:
            raise BrokerError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"READ on topic {topic}")
        producers = ctx.services.partitions.describe_producers(topic, index)
    except BrokerError as exc:
        return _Partition(partition_index=index, error_code=error_code(exc), error_message=error_message(exc),
                          active_producers=[])  # fmt: skip
    active = [
        _Producer(
            producer_id=p["producer_id"],
            producer_epoch=p["producer_epoch"],
            last_sequence=p["last_sequence"],
            last_timestamp=p["last_timestamp"],
            coordinator_epoch=p["coordinator_epoch"],
            current_txn_start_offset=-1 if p["current_txn_start_offset"] is None else p["current_txn_start_offset"],
        )
        for p in producers
    ]
    return _Partition(partition_index=index, error_code=0, error_message=None, active_producers=active)


async def handle(ctx: RequestContext, request: Any) -> Any:
    topics = []
    for t in request.topics:
        allowed = ctx.guard.allowed(Operation.READ, ResourceType.TOPIC, t.name)
        parts = [_partition(ctx, t.name, i, allowed) for i in dict.fromkeys(t.partition_indexes)]
        topics.append(_Topic(name=t.name, partitions=parts))
    return DescribeProducersResponse(throttle_time_ms=0, topics=topics)


API = KafkaApi("DescribeProducers", DescribeProducersRequest, DescribeProducersResponse, 0, 0, handle)
