"""ListGroups (key 16): the groups this node coordinates (a Kafka admin client asks every node).

Each node lists the groups of the ``__consumer_offsets`` partitions it leads,
as the HTTP listing's fan-out does, so every group is listed by exactly one
node. Every group is a classic consumer group (protocol type ``consumer``,
group type ``classic``), whether Kafka clients or HTTP members formed it.
``states_filter`` (version 4 and up) and ``types_filter`` (5 and up) match
case-insensitively, as Kafka does.

Authorization: only the groups the caller may DESCRIBE are listed.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import ListGroupsRequest, ListGroupsResponse

from coordinator.consumer_protocol import CONSUMER_PROTOCOL_TYPE

from ...security.acl import ResourceType
from ..api import KafkaApi, RequestContext

__all__ = ["API"]

CLASSIC = "classic"
_Listed = ListGroupsResponse.ListedGroup


async def handle(ctx: RequestContext, request: Any) -> Any:
    v = ctx.api_version
    states = {s.lower() for s in request.states_filter} if v >= 4 and request.states_filter else None
    types = {t.lower() for t in request.types_filter} if v >= 5 and request.types_filter else None
    listed = []
    for g in ctx.services.groups.local_groups():
        if not ctx.guard.may_describe(ResourceType.GROUP, g["group_id"]):
            continue
        if states is not None and g["state"].lower() not in states:
            continue
        if types is not None and CLASSIC not in types:
            continue
        listed.append(_Listed(group_id=g["group_id"], protocol_type=g.get("protocol_type") or CONSUMER_PROTOCOL_TYPE,
                              group_state=g["state"], group_type=CLASSIC))  # fmt: skip
    return ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=listed)


API = KafkaApi("ListGroups", ListGroupsRequest, ListGroupsResponse, 0, 5, handle)
