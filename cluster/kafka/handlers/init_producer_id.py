"""InitProducerId (key 22): a producer id and epoch for an idempotent or transactional producer.

* With a transactional id: the coordinator's InitProducerId (WRITE on the
  transactional id). It fences every earlier producer of the id (its epoch is
  bumped) and aborts a transaction the earlier one left open; from version 3 a
  producer naming its current (producer id, epoch) gets that producer's epoch
  bumped (KIP-360). A fenced request is PRODUCER_FENCED from version 4,
  INVALID_PRODUCER_EPOCH below.
* Without one (an idempotent producer; IDEMPOTENT_WRITE on the cluster or WRITE
  on some topic): a new producer id at epoch 0, from the node's blocks of ids
  (``services.producer_ids``). From version 3 a producer naming its
  (producer id, epoch) gets that producer id at epoch + 1 (KIP-360: it resets
  its sequences after an unknown-producer or sequence error), or a new
  producer id once the epoch is exhausted.

Versions 0-4; version 5 and up belong to KIP-890's transaction version 2 and
KIP-939, which no Python client uses.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import CLUSTER_NAME, Operation, ResourceType
from ..api import KafkaApi, RequestContext
from ..txn_requests import coded, producer_identity

__all__ = ["API"]

_FENCED_SINCE = 4
_KIP360_SINCE = 3
#: Kafka's isEpochExhausted: an idempotent producer at this epoch gets a new producer id instead of a bump.
_EPOCH_EXHAUSTED = 32766


def _answer(code: int, producer_id: int = -1, producer_epoch: int = -1) -> Any:
    return InitProducerIdResponse(throttle_time_ms=0, error_code=code, producer_id=producer_id,
                                  producer_epoch=producer_epoch)  # fmt: skip


async def _idempotent(ctx: RequestContext, expected: tuple[int, int] | None) -> tuple[int, int]:
    g = ctx.guard
    if not g.allowed(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME) and not g.may_on_some(
        Operation.WRITE, ResourceType.TOPIC
    ):
        raise BrokerError(
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            f"{g.principal} needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic",
        )
    if expected is not None and expected[1] < _EPOCH_EXHAUSTED:
        return expected[0], expected[1] + 1
    pid = await ctx.services.producer_ids.next_producer_id()
    ctx.services.metrics.producer_ids_allocated.inc()
    return pid, 0


async def handle(ctx: RequestContext, request: Any) -> Any:
    tid: str | None = request.transactional_id
    try:
        expected: tuple[int, int] | None = None
        if ctx.api_version >= _KIP360_SINCE and (request.producer_id, request.producer_epoch) != (-1, -1):
            expected = producer_identity(request.producer_id, request.producer_epoch)
        if tid is None:
            pid, epoch = await _idempotent(ctx, expected)
            return _answer(0, pid, epoch)
        if not tid:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "transactional_id must not be empty (use null)")
        if not ctx.guard.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            return _answer(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code)
        if request.transaction_timeout_ms <= 0:
            raise BrokerError(ErrorCode.INVALID_TRANSACTION_TIMEOUT, "transaction_timeout_ms must be positive")
        exp_pid, exp_epoch = expected if expected is not None else (None, None)
        pid, epoch = await ctx.services.txn.init_producer_id(tid, request.transaction_timeout_ms, exp_pid, exp_epoch)
    except BrokerError as exc:
        return _answer(coded(exc, ctx.api_version, _FENCED_SINCE))
    return _answer(0, pid, epoch)


API = KafkaApi("InitProducerId", InitProducerIdRequest, InitProducerIdResponse, 0, 4, handle)
