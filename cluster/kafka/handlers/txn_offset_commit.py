"""TxnOffsetCommit (key 28): a consumer's offsets committed inside the producer's transaction (versions 0-3).

Sent to the group's coordinator after AddOffsetsToTxn put the group's offsets
partition into the transaction; the offsets stay pending until the
transaction's marker reaches that partition (COMMIT: they become the group's
committed offsets; ABORT: dropped). The group coordinator checks with the
transaction coordinator that the offsets partition is in the producer's
transaction first (KIP-890's verification), so no pending offsets outlive
their transaction. From version 3 the consumer's generation and member id are
checked against the group (KIP-447); the static member id is not. From
version 2 each partition's committed leader epoch is kept with its offset
(OffsetFetch answers it).
Classic clients send AddOffsetsToTxn first, and the check only verifies (it
adds nothing, unlike the HTTP door's TV2 commit): offsets of a group whose
partition is not in the transaction are INVALID_TXN_STATE.

Authorization as the HTTP route: WRITE on the transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), READ on the group
(GROUP_AUTHORIZATION_FAILED), READ on each topic (TOPIC_AUTHORIZATION_FAILED
on that topic's partitions, the others OPERATION_NOT_ATTEMPTED). A fenced
producer is INVALID_PRODUCER_EPOCH, what clients of these versions expect
from the group coordinator.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import TxnOffsetCommitRequest, TxnOffsetCommitResponse

from clients.protocol import BrokerError, ErrorCode
from coordinator.group_commands import OffsetCommit
from coordinator.group_metadata import NO_GENERATION

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext
from ..txn_requests import coded, identifier, producer_identity

__all__ = ["API"]

_Topic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
_Partition = _Topic.TxnOffsetCommitResponsePartition
_FENCED_SINCE = 4  # every version served answers INVALID_PRODUCER_EPOCH
_GROUP_FIELDS_SINCE = 3
_EPOCH_SINCE = 2  # the version that carries each partition's committed leader epoch


def _answer(codes: dict[tuple[str, int], int]) -> Any:
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), code in codes.items():
        by_topic.setdefault(topic, []).append(_Partition(partition_index=partition, error_code=code))
    return TxnOffsetCommitResponse(
        throttle_time_ms=0, topics=[_Topic(name=t, partitions=ps) for t, ps in by_topic.items()]
    )


async def handle(ctx: RequestContext, request: Any) -> Any:
    offsets: dict[tuple[str, int], OffsetCommit] = {}
    for t in request.topics:
        for p in t.partitions:
            epoch = p.committed_leader_epoch if ctx.api_version >= _EPOCH_SINCE else -1
            offsets[(t.name, p.partition_index)] = OffsetCommit(
                t.name, p.partition_index, p.committed_offset, p.committed_metadata or "", max(epoch, -1)
            )
    keys = list(offsets)
    generation, member_id = NO_GENERATION, ""
    if ctx.api_version >= _GROUP_FIELDS_SINCE:
        generation, member_id = request.generation_id, request.member_id or ""
    guard = ctx.guard
    try:
        tid = identifier(request.transactional_id, "transactional_id")
        group = identifier(request.group_id, "group_id")
        pid, epoch = producer_identity(request.producer_id, request.producer_epoch)
        if not guard.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            raise BrokerError(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "WRITE on the transactional id")
        if not guard.allowed(Operation.READ, ResourceType.GROUP, group):
            raise BrokerError(ErrorCode.GROUP_AUTHORIZATION_FAILED, "READ on the group")
        if any(o.offset < 0 for o in offsets.values()):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "a committed offset must not be negative")
    except BrokerError as exc:
        return _answer(dict.fromkeys(keys, coded(exc, ctx.api_version, _FENCED_SINCE)))
    denied = {k for k in keys if not guard.allowed(Operation.READ, ResourceType.TOPIC, k[0])}
    if denied:
        return _answer({k: ErrorCode.TOPIC_AUTHORIZATION_FAILED.code if k in denied
                        else ErrorCode.OPERATION_NOT_ATTEMPTED.code for k in keys})  # fmt: skip
    if not keys:
        return _answer({})
    try:
        await ctx.services.groups.txn_commit_offsets(
            group, tid, pid, epoch, tuple(offsets.values()), generation, member_id, verify_only=True
        )
        code = 0
    except BrokerError as exc:
        code = coded(exc, ctx.api_version, _FENCED_SINCE)
    return _answer(dict.fromkeys(keys, code))


API = KafkaApi("TxnOffsetCommit", TxnOffsetCommitRequest, TxnOffsetCommitResponse, 0, 3, handle)
