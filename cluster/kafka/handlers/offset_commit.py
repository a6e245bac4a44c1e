"""OffsetCommit (key 8): a group's committed offsets, the same state the HTTP offsets API reads and writes.

A member commits with its generation and member id (fenced like the HTTP
commit: UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, and REBALANCE_IN_PROGRESS while
its group waits for the leader's assignment); a consumer that assigns itself
partitions commits with generation -1 and no member id, which a group with
members refuses (UNKNOWN_MEMBER_ID), as Kafka does. The partitions the caller
may commit go to the coordinator in one replicated command: they succeed or
fail together. Per partition: TOPIC_AUTHORIZATION_FAILED without READ on the
topic, UNKNOWN_TOPIC_OR_PARTITION for an invalid topic name or a negative
partition, INVALID_REQUEST for a negative offset, OFFSET_METADATA_TOO_LARGE above 4096 bytes of metadata (Kafka's
``offset.metadata.max.bytes``). ``retention_time_ms`` is ignored (offsets are
kept until the group is deleted). A partition's committed leader epoch
(version 6 and up) is kept with its offset and answered by OffsetFetch; it is
not checked (the listener reports no leader epochs). Versions 2-9 (10 names
topics by id).

Authorization: READ on the group, READ on each topic.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import OffsetCommitRequest, OffsetCommitResponse

from clients.protocol import BrokerError, ErrorCode
from coordinator.group_commands import OffsetCommit
from coordinator.group_metadata import NO_GENERATION

from ...security.acl import Operation, ResourceType
from ...topics import validate_topic_name
from ..api import KafkaApi, RequestContext, error_code
from ..group_requests import group_refusal

__all__ = ["API", "MAX_METADATA_BYTES"]

MAX_METADATA_BYTES = 4096
_EPOCH_SINCE = 6  # the version that carries each partition's committed leader epoch
_Topic = OffsetCommitResponse.OffsetCommitResponseTopic
_Partition = _Topic.OffsetCommitResponsePartition


def _partition_error(ctx: RequestContext, topic: str, p: Any) -> ErrorCode | None:
    try:
        validate_topic_name(topic)
    except BrokerError:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if p.partition_index < 0:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if p.committed_offset < 0:
        return ErrorCode.INVALID_REQUEST
    if len((p.committed_metadata or "").encode()) > MAX_METADATA_BYTES:
        return ErrorCode.OFFSET_METADATA_TOO_LARGE
    if not ctx.guard.allowed(Operation.READ, ResourceType.TOPIC, topic):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    return None


async def handle(ctx: RequestContext, request: Any) -> Any:
    refusal = group_refusal(ctx, request.group_id, Operation.READ)
    codes: dict[tuple[str, int], int] = {}
    offsets: dict[tuple[str, int], OffsetCommit] = {}
    for t in request.topics:
        for p in t.partitions:
            key = (t.name, p.partition_index)
            err = refusal or _partition_error(ctx, t.name, p)
            if err is not None:
                codes[key] = err.code
                continue
            codes[key] = 0
            epoch = p.committed_leader_epoch if ctx.api_version >= _EPOCH_SINCE else -1
            offsets[key] = OffsetCommit(t.name, p.partition_index, p.committed_offset, p.committed_metadata or "",
                                        max(epoch, -1))  # fmt: skip
    if offsets:
        generation = request.generation_id_or_member_epoch
        try:
            await ctx.services.groups.commit_offsets(
                request.group_id, tuple(offsets.values()), generation if generation >= 0 else NO_GENERATION,
                request.member_id or "",
            )  # fmt: skip
        except BrokerError as exc:
            for key in offsets:
                codes[key] = error_code(exc)
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), code in codes.items():
        by_topic.setdefault(topic, []).append(_Partition(partition_index=partition, error_code=code))
    return OffsetCommitResponse(
        throttle_time_ms=0, topics=[_Topic(name=n, partitions=ps) for n, ps in by_topic.items()]
    )


API = KafkaApi("OffsetCommit", OffsetCommitRequest, OffsetCommitResponse, 2, 9, handle)
