"""Kafka's ACL model: resource types, operations, pattern types, permissions, bindings, filters, and their JSON.

An ACL (``AclBinding``) says that a principal, connecting from a host, is
allowed or denied an operation on the resources a pattern names: a LITERAL
name (the literal ``*`` names every resource of the type) or a PREFIXED one.
Names and rules follow Kafka (``org.apache.kafka.common.acl``): the CLUSTER
resource is named ``kafka-cluster``; a binding's pattern type is LITERAL or
PREFIXED, never ANY or MATCH (those exist only in filters).

JSON (API.md "Security"): ``{"principal", "host", "resource_type",
"resource_name", "pattern_type", "operation", "permission"}``. Enum values
are accepted in any case and written in Kafka's upper-case names; ``host``
defaults to ``*`` and ``pattern_type`` to LITERAL. Any bad field is
``INVALID_REQUEST`` naming it.

A filter (``AclFilter``) has every field optional (absent: any value). Its
``pattern_type`` may also be ``ANY`` (absent) or ``MATCH``: with a resource
name, MATCH selects the bindings that apply to that name (the literal name,
the literal ``*``, and every prefix of it), as Kafka's ``PatternType.MATCH``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from clients.protocol import BrokerError, ErrorCode

from .principals import WILDCARD_PRINCIPAL, is_valid_principal

__all__ = [
    "CLUSTER_NAME",
    "MAX_RESOURCE_NAME",
    "WILDCARD_HOST",
    "WILDCARD_RESOURCE",
    "AclBinding",
    "AclFilter",
    "Operation",
    "PatternType",
    "Permission",
    "Resource",
    "ResourceType",
    "binding_key",
    "describe",
]

#: The one name of the CLUSTER resource (Kafka's ``Resource.CLUSTER_NAME``).
CLUSTER_NAME = "kafka-cluster"
#: A LITERAL pattern with this name matches every resource of its type.
WILDCARD_RESOURCE = "*"
#: A host that matches every client address.
WILDCARD_HOST = "*"
MAX_RESOURCE_NAME = 255
_MAX_HOST = 255
_BINDING_KEYS = frozenset(
    {"principal", "host", "resource_type", "resource_name", "pattern_type", "operation", "permission"}
)
_ANY = "ANY"


class _FastHash(enum.Enum):
    """Members hash by identity (in C; ``enum.Enum`` hashes the member's name in Python), which keeps the
    authorizer's index lookups cheap. Members are singletons compared by identity, so nothing else changes."""

    __hash__ = object.__hash__


class ResourceType(_FastHash):
    TOPIC = "TOPIC"
    GROUP = "GROUP"
    CLUSTER = "CLUSTER"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"


class Operation(_FastHash):
    ALL = "ALL"
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DELETE = "DELETE"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"


class PatternType(_FastHash):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Permission(_FastHash):
    ALLOW = "ALLOW"
    DENY = "DENY"


_E = TypeVar("_E", bound=enum.Enum)


def _bad(message: str) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_REQUEST, message)


def _enum(cls: type[_E], key: str, value: object) -> _E:
    """``value`` as a member of ``cls`` by name, in any case; INVALID_REQUEST naming ``key`` otherwise."""
    if isinstance(value, str):
        try:
            return cls[value.strip().upper()]
        except KeyError:
            pass
    names = "|".join(m.name for m in cls)
    raise _bad(f"{key} must be one of {names}, not {value!r}")


def _principal(value: object, key: str = "principal") -> str:
    if not isinstance(value, str) or not (value == WILDCARD_PRINCIPAL or is_valid_principal(value)):
        raise _bad(f"{key} must be 'User:NAME' (a printable name without ':') or 'User:*', not {value!r}")
    return value


def _host(value: object) -> str:
    if (
        not isinstance(value, str)
        or not value
        or len(value) > _MAX_HOST
        or not value.isprintable()
        or any(c.isspace() for c in value)
    ):
        raise _bad(f"host must be '*' or a client address (1-{_MAX_HOST} printable characters), not {value!r}")
    return value


def _resource_name(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _bad("resource_name must be a non-empty string")
    if len(value) > MAX_RESOURCE_NAME:
        raise _bad(f"resource_name is longer than {MAX_RESOURCE_NAME} characters")
    if not value.isprintable():
        raise _bad("resource_name must be printable")
    return value


@dataclass(frozen=True, slots=True)
class Resource:
    """A concrete resource a request acts on."""

    resource_type: ResourceType
    name: str


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: ``permission`` of ``operation`` for ``principal`` from ``host`` on the resources the pattern names."""

    principal: str
    host: str
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    operation: Operation
    permission: Permission

    def to_json(self) -> dict[str, str]:
        return {
            "principal": self.principal,
            "host": self.host,
            "resource_type": self.resource_type.value,
            "resource_name": self.resource_name,
            "pattern_type": self.pattern_type.value,
            "operation": self.operation.value,
            "permission": self.permission.value,
        }

    @classmethod
    def from_json(cls, obj: object) -> AclBinding:
        """A validated binding; ``BrokerError(INVALID_REQUEST)`` naming the first bad field."""
        if not isinstance(obj, Mapping):
            raise _bad("an ACL must be a JSON object")
        unknown = sorted(str(k) for k in obj if k not in _BINDING_KEYS)
        if unknown:
            raise _bad(f"unknown ACL fields: {', '.join(unknown)}")
        for key in ("principal", "resource_type", "resource_name", "operation", "permission"):
            if key not in obj:
                raise _bad(f"an ACL needs {key}")
        principal = _principal(obj["principal"])
        host = _host(obj.get("host", WILDCARD_HOST))
        resource_type = _enum(ResourceType, "resource_type", obj["resource_type"])
        name = _resource_name(obj["resource_name"])
        raw_pattern = obj.get("pattern_type", PatternType.LITERAL.value)
        if isinstance(raw_pattern, str) and raw_pattern.strip().upper() in (_ANY, "MATCH"):
            raise _bad(f"pattern_type {raw_pattern.strip().upper()} is only for filters; an ACL is LITERAL or PREFIXED")
        pattern_type = _enum(PatternType, "pattern_type", raw_pattern)
        operation = _enum(Operation, "operation", obj["operation"])
        permission = _enum(Permission, "permission", obj["permission"])
        if resource_type is ResourceType.CLUSTER and name != CLUSTER_NAME:
            raise _bad(f"the only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        return cls(principal, host, resource_type, name, pattern_type, operation, permission)

    def applies_to(self, resource_type: ResourceType, name: str) -> bool:
        """This binding's pattern names ``name`` (of ``resource_type``)."""
        if resource_type is not self.resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD_RESOURCE)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Selects bindings; ``None`` fields match anything. ``match``: the pattern-type filter is MATCH."""

    principal: str | None = None
    host: str | None = None
    resource_type: ResourceType | None = None
    resource_name: str | None = None
    pattern_type: PatternType | None = None
    operation: Operation | None = None
    permission: Permission | None = None
    match: bool = False

    def matches(self, binding: AclBinding) -> bool:
        if self.principal is not None and binding.principal != self.principal:
            return False
        if self.host is not None and binding.host != self.host:
            return False
        if self.operation is not None and binding.operation is not self.operation:
            return False
        if self.permission is not None and binding.permission is not self.permission:
            return False
        if self.resource_type is not None and binding.resource_type is not self.resource_type:
            return False
        if self.pattern_type is not None and binding.pattern_type is not self.pattern_type:
            return False
        if self.resource_name is None:
            return True
        if self.match:
            return binding.applies_to(binding.resource_type, self.resource_name)
        return binding.resource_name == self.resource_name

    def to_json(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key in ("principal", "host", "resource_name"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        for key in ("resource_type", "operation", "permission"):
            member = getattr(self, key)
            if member is not None:
                out[key] = member.value
        if self.match:
            out["pattern_type"] = "MATCH"
        elif self.pattern_type is not None:
            out["pattern_type"] = self.pattern_type.value
        return out

    @classmethod
    def from_json(cls, obj: object) -> AclFilter:
        """A validated filter (absent fields, JSON null and ``ANY`` match anything); INVALID_REQUEST otherwise."""
        if not isinstance(obj, Mapping):
            raise _bad("an ACL filter must be a JSON object")
        unknown = sorted(str(k) for k in obj if k not in _BINDING_KEYS)
        if unknown:
            raise _bad(f"unknown ACL filter fields: {', '.join(unknown)}")

        def given(key: str) -> object | None:
            value = obj.get(key)
            if isinstance(value, str) and value.strip().upper() == _ANY and key not in ("principal", "resource_name"):
                return None
            return value

        principal = given("principal")
        host = given("host")
        name = given("resource_name")
        raw_pattern = given("pattern_type")
        match = isinstance(raw_pattern, str) and raw_pattern.strip().upper() == "MATCH"
        raw_type = given("resource_type")
        raw_op = given("operation")
        raw_perm = given("permission")
        return cls(
            principal=None if principal is None else _principal(principal),
            host=None if host is None else _host(host),
            resource_type=None if raw_type is None else _enum(ResourceType, "resource_type", raw_type),
            resource_name=None if name is None else _resource_name(name),
            pattern_type=None if raw_pattern is None or match else _enum(PatternType, "pattern_type", raw_pattern),
            operation=None if raw_op is None else _enum(Operation, "operation", raw_op),
            permission=None if raw_perm is None else _enum(Permission, "permission", raw_perm),
            match=match,
        )

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> AclFilter:
        """A filter from URL query parameters (the same names as the JSON fields)."""
        unknown = sorted(k for k in query if k not in _BINDING_KEYS)
        if unknown:
            raise _bad(f"unknown ACL filter parameters: {', '.join(unknown)}")
        return cls.from_json({k: query[k] for k in query})


def binding_key(binding: AclBinding) -> tuple[str, ...]:
    """A total order of bindings (listings are sorted by it)."""
    return (
        binding.resource_type.value,
        binding.resource_name,
        binding.pattern_type.value,
        binding.principal,
        binding.host,
        binding.operation.value,
        binding.permission.value,
    )


def describe(bindings: Iterable[AclBinding], flt: AclFilter) -> list[AclBinding]:
    """The bindings ``flt`` matches, sorted."""
    return sorted((b for b in bindings if flt.matches(b)), key=binding_key)
