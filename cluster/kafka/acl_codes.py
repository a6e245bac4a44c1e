"""Kafka's numeric codes of the ACL model (``org.apache.kafka.common.acl`` / ``resource``) and txbroker's names.

The ACL APIs speak in codes: resource type TOPIC 2, GROUP 3, CLUSTER 4,
TRANSACTIONAL_ID 5; pattern type ANY 1, MATCH 2, LITERAL 3, PREFIXED 4;
operation ANY 1, ALL 2, READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7,
DESCRIBE 8, IDEMPOTENT_WRITE 12; permission ANY 1, DENY 2, ALLOW 3. A code
Kafka has and txbroker's model lacks (DELEGATION_TOKEN and USER resources,
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, the token operations) names
no ACL here: an ACL with it is refused, a filter with it matches nothing.
"""

from __future__ import annotations

from typing import Any

from clients.protocol import BrokerError, ErrorCode

from ..security.acl import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType

__all__ = [
    "ANY",
    "MATCH",
    "OPERATION_CODES",
    "PATTERN_CODES",
    "PERMISSION_CODES",
    "RESOURCE_CODES",
    "binding_of",
    "filter_of",
    "operation_of",
    "pattern_of",
    "permission_of",
    "resource_of",
]

ANY = 1
MATCH = 2

RESOURCE_CODES: dict[ResourceType, int] = {
    ResourceType.TOPIC: 2,
    ResourceType.GROUP: 3,
    ResourceType.CLUSTER: 4,
    ResourceType.TRANSACTIONAL_ID: 5,
}
PATTERN_CODES: dict[PatternType, int] = {PatternType.LITERAL: 3, PatternType.PREFIXED: 4}
OPERATION_CODES: dict[Operation, int] = {
    Operation.ALL: 2,
    Operation.READ: 3,
    Operation.WRITE: 4,
    Operation.CREATE: 5,
    Operation.DELETE: 6,
    Operation.ALTER: 7,
    Operation.DESCRIBE: 8,
    Operation.IDEMPOTENT_WRITE: 12,
}
PERMISSION_CODES: dict[Permission, int] = {Permission.DENY: 2, Permission.ALLOW: 3}

_RESOURCES = {v: k for k, v in RESOURCE_CODES.items()}
_PATTERNS = {v: k for k, v in PATTERN_CODES.items()}
_OPERATIONS = {v: k for k, v in OPERATION_CODES.items()}
_PERMISSIONS = {v: k for k, v in PERMISSION_CODES.items()}


def resource_of(code: int) -> ResourceType | None:
    return _RESOURCES.get(code)


def pattern_of(code: int) -> PatternType | None:
    return _PATTERNS.get(code)


def operation_of(code: int) -> Operation | None:
    return _OPERATIONS.get(code)


def permission_of(code: int) -> Permission | None:
    return _PERMISSIONS.get(code)


def binding_of(creation: Any) -> AclBinding:
    """A CreateAcls creation as an ``AclBinding``; INVALID_REQUEST naming what does not fit txbroker's model."""
    resource_type = resource_of(creation.resource_type)
    pattern = pattern_of(getattr(creation, "resource_pattern_type", 3))
    operation = operation_of(creation.operation)
    permission = permission_of(creation.permission_type)
    if resource_type is None:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"resource type {creation.resource_type} is not offered")
    if pattern is None:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "an ACL's pattern type is LITERAL (3) or PREFIXED (4)")
    if operation is None:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"operation {creation.operation} is not offered")
    if permission is None:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "an ACL's permission is DENY (2) or ALLOW (3)")
    return AclBinding.from_json({
        "principal": creation.principal, "host": creation.host, "resource_type": resource_type.value,
        "resource_name": creation.resource_name, "pattern_type": pattern.value, "operation": operation.value,
        "permission": permission.value,
    })  # fmt: skip


def filter_of(f: Any) -> AclFilter | None:
    """A DescribeAcls/DeleteAcls filter as an ``AclFilter``; None when it names a resource type or operation that
    txbroker's model lacks (it matches no ACL); INVALID_REQUEST for UNKNOWN (0) codes."""
    codes = (f.resource_type_filter, getattr(f, "pattern_type_filter", 3), f.operation, f.permission_type)
    if 0 in codes:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "an ACL filter names an UNKNOWN (0) code")
    pattern_code = getattr(f, "pattern_type_filter", 3)
    resource_type = None if f.resource_type_filter == ANY else resource_of(f.resource_type_filter)
    operation = None if f.operation == ANY else operation_of(f.operation)
    permission = None if f.permission_type == ANY else permission_of(f.permission_type)
    pattern = None if pattern_code in (ANY, MATCH) else pattern_of(pattern_code)
    if (
        (f.resource_type_filter != ANY and resource_type is None)
        or (f.operation != ANY and operation is None)
        or (f.permission_type != ANY and permission is None)
        or (pattern_code not in (ANY, MATCH) and pattern is None)
    ):
        return None
    return AclFilter(
        principal=f.principal_filter,
        host=f.host_filter,
        resource_type=resource_type,
        resource_name=f.resource_name_filter,
        pattern_type=pattern,
        operation=operation,
        permission=permission,
        match=pattern_code == MATCH,
    )
