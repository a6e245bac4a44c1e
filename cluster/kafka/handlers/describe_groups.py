"""DescribeGroups (key 15): state, protocol and members of groups this node coordinates.

Each member shows its client id and host and its metadata and assignment
bytes: a Kafka member's as its client sent them, an HTTP member's encoded in
Kafka's consumer protocol (``coordinator.consumer_protocol``), so Kafka's
tools read every group alike. A group the coordinator does not know is
``Dead`` with no members; one coordinated elsewhere is NOT_COORDINATOR.
Authorized operations (version 3 and up) are not reported.

Authorization: DESCRIBE on each group (else GROUP_AUTHORIZATION_FAILED for it).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse

from clients.protocol import BrokerError

from ...security.acl import Operation
from ..api import KafkaApi, RequestContext, error_code, error_message
from ..group_requests import group_refusal

__all__ = ["API"]

_Group = DescribeGroupsResponse.DescribedGroup
_Member = _Group.DescribedGroupMember


def _refused(group_id: str, code: int, message: str | None) -> Any:
    return _Group(error_code=code, error_message=message, group_id=group_id, group_state="", protocol_type="",
                  protocol_data="", members=[])  # fmt: skip


def _describe(ctx: RequestContext, group_id: str) -> Any:
    refusal = group_refusal(ctx, group_id, Operation.DESCRIBE)
    if refusal is not None:
        return _refused(group_id, refusal.code, None)
    try:
        summary, members = ctx.services.groups.kafka_group(group_id)
    except BrokerError as exc:
        return _refused(group_id, error_code(exc), error_message(exc))
    return _Group(
        error_code=0,
        error_message=None,
        group_id=group_id,
        group_state=summary["state"],
        protocol_type=summary["protocol_type"] if members else "",
        protocol_data=(summary["protocol"] or "") if members else "",
        members=[
            _Member(member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                    client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
            for m in members
        ],
    )  # fmt: skip


async def handle(ctx: RequestContext, request: Any) -> Any:
    return DescribeGroupsResponse(throttle_time_ms=0, groups=[_describe(ctx, g) for g in request.groups])


API = KafkaApi("DescribeGroups", DescribeGroupsRequest, DescribeGroupsResponse, 0, 5, handle)
