"""A caller's rights: its principal, its host and the node's ``Authorizer``, asked per resource.

Both front doors hold one per caller: the HTTP layer per request
(``cluster.http.access``), the Kafka listener per authenticated connection
(``cluster.kafka``). A denied check raises the ``BrokerError`` Kafka answers
for the resource's type (``TOPIC_AUTHORIZATION_FAILED`` for a topic, and so
on).
"""

from __future__ import annotations

from collections.abc import Iterable

from clients.protocol import BrokerError, ErrorCode

from .acl import Operation, ResourceType
from .authorizer import Authorizer
from .principals import ANONYMOUS

__all__ = ["Guard", "denied_code"]

_DENIED = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
}


def denied_code(resource_type: ResourceType) -> ErrorCode:
    """The error a denied request about a resource of this type answers with (403)."""
    return _DENIED[resource_type]


class Guard:
    """The caller's rights, as the node's authorizer decides them (everything, on a node without an authorizer)."""

    __slots__ = ("authorizer", "host", "principal")

    def __init__(self, principal: str = ANONYMOUS, host: str = "*", authorizer: Authorizer | None = None) -> None:
        self.principal = principal
        self.host = host
        self.authorizer = authorizer

    def allowed(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        if self.authorizer is None:
            return True
        return self.authorizer.authorize(self.principal, self.host, operation, resource_type, name)

    def require(self, operation: Operation, resource_type: ResourceType, name: str) -> None:
        if not self.allowed(operation, resource_type, name):
            raise BrokerError(
                denied_code(resource_type),
                f"{self.principal} may not {operation.value} {resource_type.value} {name!r}",
            )

    def require_any(self, needs: Iterable[tuple[Operation, ResourceType, str]]) -> None:
        """Any one of ``needs``; denied with the first one's error."""
        needs = list(needs)
        if not any(self.allowed(op, rt, name) for op, rt, name in needs):
            rt = needs[0][1]
            alternatives = " or ".join(f"{o.value} on {r.value} {n!r}" for o, r, n in needs)
            raise BrokerError(denied_code(rt), f"{self.principal} needs {alternatives}")

    def require_topics(self, operation: Operation, topics: Iterable[str]) -> None:
        for topic in sorted(set(topics)):
            self.require(operation, ResourceType.TOPIC, topic)

    def may_describe(self, resource_type: ResourceType, name: str) -> bool:
        return self.allowed(Operation.DESCRIBE, resource_type, name)

    def may_on_some(self, operation: Operation, resource_type: ResourceType) -> bool:
        """Some ACL allows ``operation`` on some resource of this type (Kafka's authorizeByResourceType)."""
        if self.authorizer is None:
            return True
        return self.authorizer.authorize_any(self.principal, self.host, operation, resource_type)
