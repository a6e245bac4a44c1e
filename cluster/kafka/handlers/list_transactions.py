"""ListTransactions (key 66): the transactions this node coordinates (versions 0-1).

Kafka's admin client asks every broker and merges the answers; each node lists
the transactional ids of the ``__transaction_state`` partitions it leads, so
every id is listed by exactly one node (the HTTP ``GET /v1/transactions`` fans
out instead). Filters: states (Kafka's names, e.g. ``Ongoing``; unknown names
come back in ``unknown_state_filters`` and match nothing), producer ids, and
from version 1 the minimum running time in ms (``duration_filter``, -1: any).
Only ids the caller may DESCRIBE are listed.
"""

from __future__ import annotations

import time
from typing import Any

from kafka.protocol.admin import ListTransactionsRequest, ListTransactionsResponse

from coordinator.states import TransactionState

from ...security.acl import ResourceType
from ..api import KafkaApi, RequestContext

__all__ = ["API"]

_State = ListTransactionsResponse.TransactionState
_DURATION_SINCE = 1


async def handle(ctx: RequestContext, request: Any) -> Any:
    states: set[TransactionState] = set()
    unknown: list[str] = []
    for name in request.state_filters or ():
        try:
            states.add(TransactionState.from_name(name))
        except ValueError:
            unknown.append(name)
    pids = set(request.producer_id_filters or ())
    min_age = request.duration_filter if ctx.api_version >= _DURATION_SINCE else -1
    now_ms = int(time.time() * 1000)
    listed = []
    # A state filter of unknown names only matches nothing (no filter at all matches everything).
    found = [] if unknown and not states else ctx.services.txn.local_transactions(states or None)
    for t in found:
        if pids and t["producer_id"] not in pids:
            continue
        if min_age >= 0 and (t["start_time_ms"] < 0 or now_ms - t["start_time_ms"] < min_age):
            continue
        if not ctx.guard.may_describe(ResourceType.TRANSACTIONAL_ID, t["transactional_id"]):
            continue
        listed.append(_State(transactional_id=t["transactional_id"], producer_id=t["producer_id"],
                             transaction_state=t["state"]))  # fmt: skip
    listed.sort(key=lambda s: s.transactional_id)
    return ListTransactionsResponse(
        throttle_time_ms=0, error_code=0, unknown_state_filters=unknown, transaction_states=listed
    )


API = KafkaApi("ListTransactions", ListTransactionsRequest, ListTransactionsResponse, 0, 1, handle)
