"""JoinGroup (key 11): a Kafka consumer joins a group whose leader member assigns the partitions.

The member's protocols (``(name, metadata bytes)``) go to the group
coordinator (``GroupService.join``), which answers when the rebalance
completes: the generation, the protocol every member supports, the leader,
and -- to the leader only -- every member's metadata for that protocol. From
version 4 a member without an id first gets ``MEMBER_ID_REQUIRED`` with the id
to join with (KIP-394); a static member (``group_instance_id``, KIP-345) joins
at once and replaces the member holding its instance id (the group
rebalances; Kafka would hand it the old member's assignment). A group formed by HTTP members (the
broker assigns) answers ``INCONSISTENT_GROUP_PROTOCOL``, and so does a
protocol no other member supports. Version 0's missing rebalance timeout is
the session timeout, as Kafka takes it.

Authorization: READ on the group.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import JoinGroupRequest, JoinGroupResponse

from clients.protocol import BrokerError, ErrorCode
from coordinator.consumer_protocol import CONSUMER_PROTOCOL_TYPE, ConsumerProtocolError, decode_subscription
from coordinator.group_membership import ClientProtocols

from ...security.acl import Operation
from ..api import KafkaApi, RequestContext, error_code
from ..group_requests import group_refusal

__all__ = ["API"]

_Member = JoinGroupResponse.JoinGroupResponseMember


def _refused(ctx: RequestContext, code: int, member_id: str) -> Any:
    return JoinGroupResponse(
        throttle_time_ms=0, error_code=code, generation_id=-1, protocol_type=None,
        protocol_name=None if ctx.api_version >= 7 else "", leader="", member_id=member_id, members=[],
    )  # fmt: skip


def _subscribed_topics(protocol_type: str, protocols: tuple[tuple[str, bytes], ...]) -> tuple[str, ...]:
    """The topics a consumer subscribes to (shown in describe and lag), from its first protocol's metadata."""
    if protocol_type != CONSUMER_PROTOCOL_TYPE or not protocols:
        return ()
    try:
        return decode_subscription(protocols[0][1])
    except ConsumerProtocolError:
        return ()


async def handle(ctx: RequestContext, request: Any) -> Any:
    v = ctx.api_version
    member_id = request.member_id or ""
    refusal = group_refusal(ctx, request.group_id, Operation.READ)
    if refusal is not None:
        return _refused(ctx, refusal.code, member_id)
    protocols = tuple((p.name, bytes(p.metadata)) for p in request.protocols)
    client = ClientProtocols(
        protocol_type=request.protocol_type,
        protocols=protocols,
        group_instance_id=request.group_instance_id if v >= 5 else None,
        client_id=ctx.client_id or "",
        client_host=ctx.connection.peer_host,
    )
    session = request.session_timeout_ms
    rebalance = request.rebalance_timeout_ms if v >= 1 and request.rebalance_timeout_ms > 0 else session
    svc = ctx.services.groups
    try:
        if v >= 4 and not member_id and client.group_instance_id is None:  # a static member joins at once
            new_id = svc.new_member_id(request.group_id, client.client_id, session)
            return _refused(ctx, ErrorCode.MEMBER_ID_REQUIRED.code, new_id)
        topics = _subscribed_topics(request.protocol_type, protocols)
        answer = await svc.join(request.group_id, member_id, topics, "", session, rebalance, client)
    except BrokerError as exc:
        return _refused(ctx, error_code(exc), member_id)
    return JoinGroupResponse(
        throttle_time_ms=0,
        error_code=0,
        generation_id=answer.generation_id,
        protocol_type=answer.protocol_type,
        protocol_name=answer.protocol,
        leader=answer.leader_id or "",
        skip_assignment=False,
        member_id=answer.member_id,
        members=[
            _Member(member_id=i.member_id, group_instance_id=i.group_instance_id, metadata=i.metadata)
            for i in answer.member_metadata
        ],
    )


API = KafkaApi("JoinGroup", JoinGroupRequest, JoinGroupResponse, 0, 9, handle)
