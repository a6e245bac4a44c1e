"""Produce (key 0): Kafka record batches (v2) appended through the same partition service as the HTTP produce.

Versions 3 and up carry record batch v2, which the log stores as the producer
wrote it (compressed or not; ``storage.kafka_batch`` checks it, decompressing
to verify every record); versions 0-2 (message sets) are advertised, as
librdkafka expects of a broker (it checks Produce's minimum before
compressing), and answered UNSUPPORTED_FOR_MESSAGE_FORMAT per partition.
Idempotence, sequence checks, transactions and KIP-890's verification at the
leader apply exactly as for the HTTP doors. ``acks=0`` gets no response, as
in Kafka.

Authorization (Kafka's): WRITE on the transactional id for a transactional
request, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED on every partition; WRITE
on each topic, else TOPIC_AUTHORIZATION_FAILED on that topic's partitions.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import ProduceRequest as KafkaProduceRequest
from kafka.protocol.producer import ProduceResponse

from clients.protocol import BatchFormat, BrokerError, ErrorCode, ProducePartition, ProduceRequest

from ...partitions import PartitionProduceResult
from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code, error_message

__all__ = ["API"]

_Topic = ProduceResponse.TopicProduceResponse
_Partition = _Topic.PartitionProduceResponse
_FIRST_BATCH_V2_VERSION = 3


def _answer(index: int, code: int, message: str | None = None, result: PartitionProduceResult | None = None) -> Any:
    if result is None:
        return _Partition(index=index, error_code=code, base_offset=-1, error_message=message)
    return _Partition(
        index=index,
        error_code=error_code(result.error),
        base_offset=result.base_offset,
        log_append_time_ms=-1,
        log_start_offset=-1,
        error_message=error_message(result.error),
    )


async def handle(ctx: RequestContext, request: Any) -> Any:
    guard = ctx.guard
    tid: str | None = request.transactional_id
    refused: dict[tuple[str, int], tuple[int, str]] = {}
    parts: list[ProducePartition] = []
    order: list[tuple[str, int]] = []
    seen: set[tuple[str, int]] = set()
    txn_denied = tid is not None and not guard.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid)
    for topic in request.topic_data:
        topic_denied = not guard.allowed(Operation.WRITE, ResourceType.TOPIC, topic.name)
        for p in topic.partition_data:
            key = (topic.name, p.index)
            if key in seen:
                refused[key] = (ErrorCode.INVALID_REQUEST.code, "partition appears twice")
                continue
            seen.add(key)
            order.append(key)
            if ctx.api_version < _FIRST_BATCH_V2_VERSION:
                refused[key] = (ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT.code, "record batch v2 needs Produce v3+")
            elif txn_denied:
                refused[key] = (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code, "WRITE on the transactional id")
            elif topic_denied:
                refused[key] = (ErrorCode.TOPIC_AUTHORIZATION_FAILED.code, f"WRITE on topic {topic.name}")
            elif not p.records:
                refused[key] = (ErrorCode.CORRUPT_MESSAGE.code, "no record batch")
            else:
                parts.append(ProducePartition(topic.name, p.index, bytes(p.records), format=BatchFormat.KAFKA))
    results: dict[tuple[str, int], PartitionProduceResult] = {}
    if parts:
        req = ProduceRequest(tuple(parts), timeout_ms=request.timeout_ms, acks=request.acks, transactional_id=tid)
        try:
            for res in await ctx.services.partitions.produce(req):
                results[(res.topic, res.partition)] = res
        except BrokerError as exc:  # the whole request is refused (acks, a node shutting down)
            for part in parts:
                results[(part.topic, part.partition)] = PartitionProduceResult(part.topic, part.partition, error=exc)
    if request.acks == 0:
        return None
    by_topic: dict[str, list[Any]] = {}
    for key in order:
        name, index = key
        if key in refused:
            code, message = refused[key]
            by_topic.setdefault(name, []).append(_answer(index, code, message))
        else:
            by_topic.setdefault(name, []).append(_answer(index, 0, result=results[key]))
    return ProduceResponse(
        responses=[_Topic(name=name, partition_responses=answers) for name, answers in by_topic.items()],
        throttle_time_ms=0,
    )


API = KafkaApi("Produce", KafkaProduceRequest, ProduceResponse, 0, 9, handle)
