"""FindCoordinator (key 10): the node coordinating a consumer group or a transactional id (versions 0-4).

A group's coordinator leads the group's ``__consumer_offsets`` partition, a
transactional id's leads its ``__transaction_state`` partition (the same nodes
``GET /v1/coordinators/group|transaction/{key}`` name); the answer is that
node's Kafka listener. While the partition has no leader:
COORDINATOR_NOT_AVAILABLE (retriable). From version 4 several keys are asked
at once (KIP-699), one answer each. DESCRIBE on the group or transactional
id, else GROUP_AUTHORIZATION_FAILED / TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
an unknown key type is INVALID_REQUEST.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import ResourceType
from ..api import KafkaApi, RequestContext, error_code, error_message

__all__ = ["API"]

_GROUP, _TRANSACTION = 0, 1
_BATCHED_SINCE = 4
_KEY_TYPE_SINCE = 1


def _locate(ctx: RequestContext, key: str, key_type: int) -> tuple[int, str, int]:
    """(node id, host, port) of ``key``'s coordinator; raises BrokerError."""
    if not key:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "the key must not be empty")
    if key_type == _GROUP:
        if not ctx.guard.may_describe(ResourceType.GROUP, key):
            raise BrokerError(ErrorCode.GROUP_AUTHORIZATION_FAILED, f"DESCRIBE on group {key}")
        found = ctx.services.groups.coordinator_json(key)
    elif key_type == _TRANSACTION:
        if not ctx.guard.may_describe(ResourceType.TRANSACTIONAL_ID, key):
            raise BrokerError(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, f"DESCRIBE on {key}")
        found = ctx.services.txn.coordinator_json(key)
    else:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"unknown coordinator key type {key_type}")
    node_id = int(found["node_id"])
    addr = ctx.services.nodes.node(node_id)
    if addr is None or addr.kafka_port is None:
        raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"node {node_id} has no Kafka listener")
    return node_id, addr.host, addr.kafka_port


async def handle(ctx: RequestContext, request: Any) -> Any:
    key_type = request.key_type if ctx.api_version >= _KEY_TYPE_SINCE else _GROUP
    if ctx.api_version >= _BATCHED_SINCE:
        answers = []
        for key in dict.fromkeys(request.coordinator_keys):
            try:
                node_id, host, port = _locate(ctx, key, key_type)
                answers.append(FindCoordinatorResponse.Coordinator(
                    key=key, node_id=node_id, host=host, port=port, error_code=0, error_message=None))  # fmt: skip
            except BrokerError as exc:
                answers.append(FindCoordinatorResponse.Coordinator(
                    key=key, node_id=-1, host="", port=-1, error_code=error_code(exc),
                    error_message=error_message(exc)))  # fmt: skip
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=answers)
    try:
        node_id, host, port = _locate(ctx, request.key, key_type)
    except BrokerError as exc:
        return FindCoordinatorResponse(throttle_time_ms=0, error_code=error_code(exc),
                                       error_message=error_message(exc), node_id=-1, host="", port=-1)  # fmt: skip
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=0, error_message=None, node_id=node_id, host=host,
                                   port=port)  # fmt: skip


API = KafkaApi("FindCoordinator", FindCoordinatorRequest, FindCoordinatorResponse, 0, 4, handle)
