"""DescribeTransactions (key 65): the coordinator's state of transactional ids (version 0).

Answered per id by its coordinator (NOT_COORDINATOR elsewhere; the admin
client asks FindCoordinator first): state (Kafka's names), timeout, start
time, producer id and epoch and the partitions of the open transaction, as
``GET /v1/transactions/{id}`` shows them. DESCRIBE on the transactional id,
else TRANSACTIONAL_ID_AUTHORIZATION_FAILED; an unknown id is
TRANSACTIONAL_ID_NOT_FOUND.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeTransactionsRequest, DescribeTransactionsResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import ResourceType
from ..api import KafkaApi, RequestContext, error_code

__all__ = ["API"]

_State = DescribeTransactionsResponse.TransactionState
_TopicData = _State.TopicData


def _describe(ctx: RequestContext, tid: str) -> Any:
    try:
        if not ctx.guard.may_describe(ResourceType.TRANSACTIONAL_ID, tid):
            raise BrokerError(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "DESCRIBE on the transactional id")
        d = ctx.services.txn.describe(tid)
    except BrokerError as exc:
        return _State(error_code=error_code(exc), transactional_id=tid, transaction_state="",
                      transaction_timeout_ms=0, transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1,
                      topics=[])  # fmt: skip
    topics: dict[str, list[int]] = {}
    for p in d["partitions"]:
        topics.setdefault(p["topic"], []).append(p["partition"])
    return _State(
        error_code=0,
        transactional_id=tid,
        transaction_state=d["state"],
        transaction_timeout_ms=d["timeout_ms"],
        transaction_start_time_ms=d["start_time_ms"],
        producer_id=d["producer_id"],
        producer_epoch=d["producer_epoch"],
        topics=[_TopicData(topic=t, partitions=ps) for t, ps in topics.items()],
    )


async def handle(ctx: RequestContext, request: Any) -> Any:
    return DescribeTransactionsResponse(
        throttle_time_ms=0, transaction_states=[_describe(ctx, t) for t in dict.fromkeys(request.transactional_ids)]
    )


API = KafkaApi("DescribeTransactions", DescribeTransactionsRequest, DescribeTransactionsResponse, 0, 0, handle)
