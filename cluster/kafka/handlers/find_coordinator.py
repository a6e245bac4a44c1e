"""FindCoordinator (key 10): the node coordinating a consumer group or a transactional id.

A group's coordinator is the leader of its ``__consumer_offsets`` partition,
a transactional id's the leader of its ``__transaction_state`` partition (the
same nodes the HTTP API's ``/v1/coordinators/*`` name); the answer is that
node's Kafka listener. COORDINATOR_NOT_AVAILABLE while the partition has no
leader or the leader has no Kafka listener (clients retry). Version 4 and up
carry a batch of keys (``coordinator_keys``), each answered on its own.

Authorization: DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED) or on the
transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code, error_message

__all__ = ["API"]

GROUP_KEY, TRANSACTION_KEY = 0, 1
_Coordinator = FindCoordinatorResponse.Coordinator


def _find(ctx: RequestContext, key: str, key_type: int) -> tuple[int, str | None, int, str, int]:
    """``(error code, message, node id, host, port)``."""
    if key_type == GROUP_KEY:
        resource, denied = ResourceType.GROUP, ErrorCode.GROUP_AUTHORIZATION_FAILED
    elif key_type == TRANSACTION_KEY:
        resource, denied = ResourceType.TRANSACTIONAL_ID, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    else:
        return ErrorCode.INVALID_REQUEST.code, f"unknown coordinator key type {key_type}", -1, "", -1
    if not key and key_type == TRANSACTION_KEY:
        return ErrorCode.INVALID_REQUEST.code, "the transactional id must not be empty", -1, "", -1
    if not ctx.guard.allowed(Operation.DESCRIBE, resource, key):
        return denied.code, None, -1, "", -1
    try:
        svc = ctx.services.groups if key_type == GROUP_KEY else ctx.services.txn
        node_id = int(svc.coordinator_json(key)["node_id"])
    except BrokerError as exc:
        return error_code(exc), error_message(exc), -1, "", -1
    addr = ctx.services.nodes.node(node_id)
    if addr is None or addr.kafka_port is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE.code, f"node {node_id} has no Kafka listener", -1, "", -1
    return 0, None, node_id, addr.host, addr.kafka_port


async def handle(ctx: RequestContext, request: Any) -> Any:
    if ctx.api_version >= 4:
        coordinators = []
        for key in request.coordinator_keys:
            code, message, node_id, host, port = _find(ctx, key, request.key_type)
            coordinators.append(_Coordinator(key=key, node_id=node_id, host=host, port=port, error_code=code,
                                             error_message=message))  # fmt: skip
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)
    key_type = request.key_type if ctx.api_version >= 1 else GROUP_KEY
    code, message, node_id, host, port = _find(ctx, request.key, key_type)
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=code, error_message=message, node_id=node_id,
                                   host=host, port=port)  # fmt: skip


API = KafkaApi("FindCoordinator", FindCoordinatorRequest, FindCoordinatorResponse, 0, 4, handle)
