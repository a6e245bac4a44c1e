"""LeaveGroup (key 13): members leave; the others rebalance at once.

Versions 0-2 name one member; version 3 and up a batch, each answered on its
own (a member named only by its ``group_instance_id`` is UNKNOWN_MEMBER_ID:
members leave by member id). The same call as the HTTP leave.

Authorization: READ on the group.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import LeaveGroupRequest, LeaveGroupResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import Operation
from ..api import KafkaApi, RequestContext, error_code
from ..group_requests import group_refusal

__all__ = ["API"]

_Member = LeaveGroupResponse.MemberResponse
_COORDINATOR_ERRORS = frozenset(
    e.code
    for e in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
)


def _leave(ctx: RequestContext, group_id: str, member_id: str) -> int:
    if not member_id:
        return ErrorCode.UNKNOWN_MEMBER_ID.code
    try:
        ctx.services.groups.leave(group_id, member_id)
    except BrokerError as exc:
        return error_code(exc)
    return 0


async def handle(ctx: RequestContext, request: Any) -> Any:
    refusal = group_refusal(ctx, request.group_id, Operation.READ)
    if ctx.api_version < 3:
        code = refusal.code if refusal is not None else _leave(ctx, request.group_id, request.member_id)
        return LeaveGroupResponse(throttle_time_ms=0, error_code=code)
    if refusal is not None:
        return LeaveGroupResponse(throttle_time_ms=0, error_code=refusal.code, members=[])
    answers = [
        _Member(member_id=m.member_id, group_instance_id=m.group_instance_id,
                error_code=_leave(ctx, request.group_id, m.member_id))
        for m in request.members
    ]  # fmt: skip
    # Kafka: the top-level error is a coordinator error; per-member errors stay per member
    top = next((a.error_code for a in answers if a.error_code in _COORDINATOR_ERRORS), 0)
    return LeaveGroupResponse(throttle_time_ms=0, error_code=top, members=answers)


API = KafkaApi("LeaveGroup", LeaveGroupRequest, LeaveGroupResponse, 0, 5, handle)
