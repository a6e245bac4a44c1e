"""SyncGroup (key 14): the leader sends every member's assignment; each member gets its own.

The leader's assignments are replicated (``StoreAssignment``) before any
member is answered; a follower's SyncGroup waits for them. In a Stable group
a member gets its current assignment at once; during a rebalance it gets
REBALANCE_IN_PROGRESS (it rejoins); an old generation ILLEGAL_GENERATION; an
unknown member UNKNOWN_MEMBER_ID. From version 5 a protocol type or name
other than the group's is INCONSISTENT_GROUP_PROTOCOL.

Authorization: READ on the group.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import SyncGroupRequest, SyncGroupResponse

from clients.protocol import BrokerError

from ...security.acl import Operation
from ..api import KafkaApi, RequestContext, error_code
from ..group_requests import group_refusal

__all__ = ["API"]


def _refused(code: int) -> Any:
    return SyncGroupResponse(throttle_time_ms=0, error_code=code, protocol_type=None, protocol_name=None,
                             assignment=b"")  # fmt: skip


async def handle(ctx: RequestContext, request: Any) -> Any:
    refusal = group_refusal(ctx, request.group_id, Operation.READ)
    if refusal is not None:
        return _refused(refusal.code)
    assignments = tuple((a.member_id, bytes(a.assignment)) for a in request.assignments)
    v5 = ctx.api_version >= 5
    try:
        answer = await ctx.services.groups.sync(
            request.group_id, request.member_id, request.generation_id, assignments,
            protocol_type=request.protocol_type if v5 else None, protocol=request.protocol_name if v5 else None,
        )  # fmt: skip
    except BrokerError as exc:
        return _refused(error_code(exc))
    return SyncGroupResponse(throttle_time_ms=0, error_code=0, protocol_type=answer.protocol_type,
                             protocol_name=answer.protocol, assignment=answer.assignment)  # fmt: skip


API = KafkaApi("SyncGroup", SyncGroupRequest, SyncGroupResponse, 0, 5, handle)
