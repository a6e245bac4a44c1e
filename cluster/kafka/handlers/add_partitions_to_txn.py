"""AddPartitionsToTxn (key 24), the classic protocol's explicit add (versions 0-3).

A classic client adds every partition to its transaction before its first
batch there; the coordinator records them (``TransactionCoordinator.add_partitions``)
and answers once the previous transaction's marker is written on each of them,
so the partition leader's KIP-890 verification of that first batch finds the
partition in the transaction. Versions 4 and up (the brokers' batched,
verify-only form of KIP-890) are not served.

Answers per partition, as Kafka does: WRITE on the transactional id, else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED everywhere; WRITE on each topic, else
TOPIC_AUTHORIZATION_FAILED there; a topic or partition that does not exist is
UNKNOWN_TOPIC_OR_PARTITION. Any of these leaves the transaction unchanged and
answers OPERATION_NOT_ATTEMPTED for the other partitions. A coordinator error
(fenced, NOT_COORDINATOR, CONCURRENT_TRANSACTIONS, ...) is every partition's
code; a fenced producer gets PRODUCER_FENCED from version 2,
INVALID_PRODUCER_EPOCH below.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import AddPartitionsToTxnRequest, AddPartitionsToTxnResponse

from clients.protocol import BrokerError, ErrorCode
from coordinator.metadata import TopicPartition

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext
from ..txn_requests import coded, identifier, producer_identity

__all__ = ["API"]

_Topic = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
_Partition = _Topic.AddPartitionsToTxnPartitionResult
_FENCED_SINCE = 2


def _answer(codes: dict[TopicPartition, int]) -> Any:
    by_topic: dict[str, list[Any]] = {}
    for tp, code in codes.items():
        by_topic.setdefault(tp.topic, []).append(_Partition(partition_index=tp.partition, partition_error_code=code))
    return AddPartitionsToTxnResponse(
        throttle_time_ms=0,
        results_by_topic_v3_and_below=[_Topic(name=t, results_by_partition=ps) for t, ps in by_topic.items()],
    )


def _refusals(ctx: RequestContext, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """Partitions the caller may not write or that do not exist, with their codes."""
    refused: dict[TopicPartition, int] = {}
    known: dict[str, int | None] = {}
    for tp in tps:
        if not ctx.guard.allowed(Operation.WRITE, ResourceType.TOPIC, tp.topic):
            refused[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
            continue
        if tp.topic not in known:
            try:
                known[tp.topic] = len(ctx.services.controller.topic(tp.topic).partitions)
            except BrokerError:
                known[tp.topic] = None
        count = known[tp.topic]
        if count is None or not 0 <= tp.partition < count:
            refused[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code
    return refused


async def handle(ctx: RequestContext, request: Any) -> Any:
    tps = list(dict.fromkeys(
        TopicPartition(t.name, p) for t in request.v3_and_below_topics for p in t.partitions
    ))  # fmt: skip
    try:
        tid = identifier(request.v3_and_below_transactional_id, "transactional_id")
        pid, epoch = producer_identity(request.v3_and_below_producer_id, request.v3_and_below_producer_epoch)
        if not tps:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "no partitions to add")
    except BrokerError as exc:
        return _answer(dict.fromkeys(tps, coded(exc, ctx.api_version, _FENCED_SINCE)))
    if not ctx.guard.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
        return _answer(dict.fromkeys(tps, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code))
    refused = _refusals(ctx, tps)
    if refused:
        return _answer({tp: refused.get(tp, ErrorCode.OPERATION_NOT_ATTEMPTED.code) for tp in tps})
    try:
        await ctx.services.txn.add_partitions(tid, pid, epoch, tps)
    except BrokerError as exc:
        return _answer(dict.fromkeys(tps, coded(exc, ctx.api_version, _FENCED_SINCE)))
    return _answer(dict.fromkeys(tps, 0))


API = KafkaApi("AddPartitionsToTxn", AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, 0, 3, handle)
