"""EndTxn (key 26): commit or abort the producer's transaction, classic protocol (versions 0-3).

The coordinator writes PrepareCommit/PrepareAbort and answers once it is
durable; the markers follow. Below version 5 a Kafka client keeps its producer
id and epoch across transactions, so the coordinator bumps no epoch here
(``classic``) and its markers carry the transaction's own epoch; a retried
EndTxn whose answer was lost is answered NONE again. Version 5 (KIP-890's
transaction version 2, which bumps the epoch and returns it) is not served.

Authorization: WRITE on the transactional id. A fenced producer gets
PRODUCER_FENCED from version 2, INVALID_PRODUCER_EPOCH below.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import EndTxnRequest, EndTxnResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext
from ..txn_requests import coded, identifier, producer_identity

__all__ = ["API"]

_FENCED_SINCE = 2


async def handle(ctx: RequestContext, request: Any) -> Any:
    try:
        tid = identifier(request.transactional_id, "transactional_id")
        pid, epoch = producer_identity(request.producer_id, request.producer_epoch)
        if not ctx.guard.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            raise BrokerError(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "WRITE on the transactional id")
        await ctx.services.txn.end_txn(tid, pid, epoch, bool(request.committed), classic=True)
        code = 0
    except BrokerError as exc:
        code = coded(exc, ctx.api_version, _FENCED_SINCE)
    return EndTxnResponse(throttle_time_ms=0, error_code=code)


API = KafkaApi("EndTxn", EndTxnRequest, EndTxnResponse, 0, 3, handle)
