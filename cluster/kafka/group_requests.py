"""What the Kafka group APIs share: the group id check and the group ACL check, as Kafka error codes.

Kafka answers an empty group id with INVALID_GROUP_ID and a caller without
the group right with GROUP_AUTHORIZATION_FAILED; the HTTP API's identifier
rules (at most ``MAX_ID_BYTES``, no control characters) apply to group ids
from either door, so a group made through one can be named through the other.
"""

from __future__ import annotations

from clients.protocol import BrokerError, ErrorCode

from ..http import parsing
from ..security.acl import Operation, ResourceType
from .api import RequestContext

__all__ = ["group_refusal"]


def group_refusal(ctx: RequestContext, group_id: str | None, operation: Operation) -> ErrorCode | None:
    """The error for a request on ``group_id`` (None: the caller may go on)."""
    if not group_id:
        return ErrorCode.INVALID_GROUP_ID
    try:
        parsing.identifier(group_id, "group_id")
    except BrokerError:
        return ErrorCode.INVALID_GROUP_ID
    if not ctx.guard.allowed(operation, ResourceType.GROUP, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    return None
