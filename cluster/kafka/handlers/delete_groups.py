"""DeleteGroups (key 42): delete empty groups with their committed offsets.

The same deletion as ``DELETE /v1/groups/{g}``: NON_EMPTY_GROUP while a group
has members or a rebalance is under way, GROUP_ID_NOT_FOUND for a group with
neither metadata nor offsets, CONCURRENT_TRANSACTIONS while a transaction's
offsets wait for its marker; each group is answered on its own.

Authorization: DELETE on each group.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DeleteGroupsRequest, DeleteGroupsResponse

from clients.protocol import BrokerError

from ...security.acl import Operation
from ..api import KafkaApi, RequestContext, error_code
from ..group_requests import group_refusal

__all__ = ["API"]

_Result = DeleteGroupsResponse.DeletableGroupResult


async def _delete(ctx: RequestContext, group_id: str) -> int:
    refusal = group_refusal(ctx, group_id, Operation.DELETE)
    if refusal is not None:
        return refusal.code
    try:
        await ctx.services.groups.delete_group(group_id)
    except BrokerError as exc:
        return error_code(exc)
    return 0


async def handle(ctx: RequestContext, request: Any) -> Any:
    results = [_Result(group_id=g, error_code=await _delete(ctx, g)) for g in request.groups_names]
    return DeleteGroupsResponse(throttle_time_ms=0, results=results)


API = KafkaApi("DeleteGroups", DeleteGroupsRequest, DeleteGroupsResponse, 0, 2, handle)
