"""AddOffsetsToTxn (key 25): a consumer group's offsets partition joins the transaction (versions 0-3).

The classic protocol's step before TxnOffsetCommit (``send_offsets_to_transaction``):
the coordinator adds ``__consumer_offsets-p`` of the group to the transaction,
so its COMMIT/ABORT marker reaches the offsets the client commits next.
Authorization as the HTTP route: WRITE on the transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and READ on the group
(GROUP_AUTHORIZATION_FAILED). A fenced producer gets PRODUCER_FENCED from
version 2, INVALID_PRODUCER_EPOCH below.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import AddOffsetsToTxnRequest, AddOffsetsToTxnResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext
from ..txn_requests import coded, identifier, producer_identity

__all__ = ["API"]

_FENCED_SINCE = 2


async def handle(ctx: RequestContext, request: Any) -> Any:
    try:
        tid = identifier(request.transactional_id, "transactional_id")
        group = identifier(request.group_id, "group_id")
        pid, epoch = producer_identity(request.producer_id, request.producer_epoch)
        if not ctx.guard.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            raise BrokerError(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "WRITE on the transactional id")
        if not ctx.guard.allowed(Operation.READ, ResourceType.GROUP, group):
            raise BrokerError(ErrorCode.GROUP_AUTHORIZATION_FAILED, "READ on the group")
        await ctx.services.groups.add_offsets_to_txn(tid, pid, epoch, group)
        code = 0
    except BrokerError as exc:
        code = coded(exc, ctx.api_version, _FENCED_SINCE)
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=code)


API = KafkaApi("AddOffsetsToTxn", AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, 0, 3, handle)
