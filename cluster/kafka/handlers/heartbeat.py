"""Heartbeat (key 12): a member's liveness; the answer tells it when to rejoin.

Restarts the member's session timer. REBALANCE_IN_PROGRESS while the group
prepares a rebalance (the member rejoins), ILLEGAL_GENERATION for an old
generation, UNKNOWN_MEMBER_ID for a member the coordinator does not know
(expired, or never joined). The same call as the HTTP heartbeat.

Authorization: READ on the group.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import HeartbeatRequest, HeartbeatResponse

from clients.protocol import BrokerError

from ...security.acl import Operation
from ..api import KafkaApi, RequestContext, error_code
from ..group_requests import group_refusal

__all__ = ["API"]


async def handle(ctx: RequestContext, request: Any) -> Any:
    refusal = group_refusal(ctx, request.group_id, Operation.READ)
    if refusal is not None:
        return HeartbeatResponse(throttle_time_ms=0, error_code=refusal.code)
    try:
        ctx.services.groups.heartbeat(request.group_id, request.member_id, request.generation_id)
    except BrokerError as exc:
        return HeartbeatResponse(throttle_time_ms=0, error_code=error_code(exc))
    return HeartbeatResponse(throttle_time_ms=0, error_code=0)


API = KafkaApi("Heartbeat", HeartbeatRequest, HeartbeatResponse, 0, 4, handle)
