"""Kafka's authorization rules over ACLs indexed by resource (``AclAuthorizer`` / ``StandardAuthorizer``).

``authorize(principal, host, operation, resource_type, name)``:

1. a super user is allowed;
2. the ACLs that apply to the resource are those whose pattern names it: the
   LITERAL name, the LITERAL ``*``, and every PREFIXED pattern the name starts
   with -- of any principal, host and operation. If there are none, the
   answer is ``allow_everyone_if_no_acl_found``;
3. otherwise, among those whose principal is the caller's or ``User:*`` and
   whose host is the caller's or ``*``: a DENY of the operation (or of ALL)
   denies, whatever else allows; else an ALLOW of the operation (or of ALL;
   for DESCRIBE also of READ, WRITE, DELETE or ALTER, which imply it) allows;
   else the answer is no.

``authorize_any(principal, host, operation, resource_type)`` is Kafka's
``authorizeByResourceType``: could the caller do ``operation`` on *some*
resource of the type (InitProducerId without a transactional id asks for
WRITE on any topic)? It answers yes when the check of a made-up literal name
does, else when some ALLOW of the operation (or ALL) for the caller is not
dominated by the caller's DENYs: an ALLOW on the literal ``*`` with no DENY
on the literal ``*``; a literal name without a DENY of the same name or of a
prefix of it; a prefix without a DENY of a prefix of it.

An ``Authorizer`` is immutable; a new one is built when the ACLs change.
Literal patterns are a dict per resource type, prefixed ones a dict per
resource type probed at the prefix lengths that exist, so one decision is a
handful of dict lookups however many ACLs there are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .acl import WILDCARD_HOST, WILDCARD_RESOURCE, AclBinding, Operation, PatternType, Permission, ResourceType
from .principals import WILDCARD_PRINCIPAL

__all__ = ["Authorizer"]

#: What an ALLOW must name to allow an operation (Kafka: READ, WRITE, DELETE and ALTER imply DESCRIBE).
_ALLOWED_BY: dict[Operation, frozenset[Operation]] = {
    op: frozenset({op, Operation.ALL}) for op in Operation
}  # fmt: skip
_ALLOWED_BY[Operation.DESCRIBE] = frozenset(
    {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER, Operation.ALL}
)
#: What a DENY must name to deny an operation (no implications: a DENY of READ does not deny DESCRIBE).
_DENIED_BY: dict[Operation, frozenset[Operation]] = {op: frozenset({op, Operation.ALL}) for op in Operation}

#: The name Kafka's ``authorizeByResourceType`` checks first (super users, ``*`` ALLOWs, no ACL found).
_PROBE_NAME = "hardcode"


@dataclass(frozen=True, slots=True)
class _Grants:
    """What the ACLs of one (pattern, principal, host) allow and deny."""

    allow: frozenset[Operation]
    deny: frozenset[Operation]


#: authorize_any's index key: (host, operation, permission, pattern type) -> resource names.
_AnyKey = tuple[str, Operation, Permission, PatternType]

#: The ACLs of one pattern: principal -> host -> grants.
_Entry = dict[str, dict[str, _Grants]]


class _PrefixIndex:
    """PREFIXED patterns of one resource type: prefix -> entry, probed at the prefix lengths in use."""

    __slots__ = ("entries", "lengths")

    def __init__(self, entries: dict[str, _Entry]) -> None:
        self.entries = entries
        self.lengths = tuple(sorted({len(p) for p in entries}))


class Authorizer:
    """Kafka's authorization decision over a fixed set of ACLs (see the module docstring)."""

    def __init__(
        self,
        acls: Iterable[AclBinding],
        super_users: frozenset[str] = frozenset(),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self.acls: tuple[AclBinding, ...] = tuple(dict.fromkeys(acls))
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        raw: dict[tuple[ResourceType, PatternType], dict[str, dict[str, dict[str, tuple[set[Operation], ...]]]]] = {}
        by_principal: dict[tuple[ResourceType, str], dict[_AnyKey, set[str]]] = {}
        for b in self.acls:
            hosts = raw.setdefault((b.resource_type, b.pattern_type), {}).setdefault(b.resource_name, {})
            allow, deny = hosts.setdefault(b.principal, {}).setdefault(b.host, (set(), set()))
            (allow if b.permission is Permission.ALLOW else deny).add(b.operation)
            names = by_principal.setdefault((b.resource_type, b.principal), {})
            names.setdefault((b.host, b.operation, b.permission, b.pattern_type), set()).add(b.resource_name)
        built = {
            key: {
                name: {
                    principal: {host: _Grants(frozenset(a), frozenset(d)) for host, (a, d) in hosts.items()}
                    for principal, hosts in entry.items()
                }
                for name, entry in names.items()
            }
            for key, names in raw.items()
        }
        self._literal: dict[ResourceType, dict[str, _Entry]] = {
            rt: built.get((rt, PatternType.LITERAL), {}) for rt in ResourceType
        }
        self._prefixed: dict[ResourceType, _PrefixIndex] = {
            rt: _PrefixIndex(built.get((rt, PatternType.PREFIXED), {})) for rt in ResourceType
        }
        self._by_principal = {key: {k: frozenset(v) for k, v in sets.items()} for key, sets in by_principal.items()}

    def __len__(self) -> int:
        return len(self.acls)

    def _matching(self, resource_type: ResourceType, name: str) -> list[_Entry]:
        """The ACL entries whose pattern names ``name``: literal, literal ``*``, and each matching prefix."""
        out: list[_Entry] = []
        literal = self._literal[resource_type]
        if literal:
            entry = literal.get(name)
            if entry is not None:
                out.append(entry)
            if name != WILDCARD_RESOURCE:
                entry = literal.get(WILDCARD_RESOURCE)
                if entry is not None:
                    out.append(entry)
        prefixed = self._prefixed[resource_type]
        if prefixed.lengths:
            entries = prefixed.entries
            size = len(name)
            for length in prefixed.lengths:
                if length > size:
                    break
                entry = entries.get(name[:length])
                if entry is not None:
                    out.append(entry)
        return out

    def authorize(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        """Whether ``principal`` connecting from ``host`` may do ``operation`` on the named resource."""
        if principal in self.super_users:
            return True
        entries = self._matching(resource_type, name)
        if not entries:
            return self.allow_everyone_if_no_acl_found
        allowed_by = _ALLOWED_BY[operation]
        denied_by = _DENIED_BY[operation]
        principals = (principal,) if principal == WILDCARD_PRINCIPAL else (principal, WILDCARD_PRINCIPAL)
        hosts = (host,) if host == WILDCARD_HOST else (host, WILDCARD_HOST)
        allowed = False
        for entry in entries:
            for p in principals:
                by_host = entry.get(p)
                if by_host is None:
                    continue
                for h in hosts:
                    grants = by_host.get(h)
                    if grants is None:
                        continue
                    if grants.deny and not grants.deny.isdisjoint(denied_by):
                        return False
                    if not allowed and not grants.allow.isdisjoint(allowed_by):
                        allowed = True
        return allowed

    def authorize_any(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether some ACL could let ``principal`` do ``operation`` on some resource of the type (Kafka's
        ``authorizeByResourceType``)."""
        if self.authorize(principal, host, operation, resource_type, _PROBE_NAME):
            return True
        found: dict[tuple[Permission, PatternType], list[frozenset[str]]] = {
            (permission, pattern): [] for permission in Permission for pattern in PatternType
        }
        principals = (principal,) if principal == WILDCARD_PRINCIPAL else (principal, WILDCARD_PRINCIPAL)
        hosts = (host,) if host == WILDCARD_HOST else (host, WILDCARD_HOST)
        operations = (operation,) if operation is Operation.ALL else (operation, Operation.ALL)
        for p in principals:
            sets = self._by_principal.get((resource_type, p))
            if not sets:
                continue
            for h in hosts:
                for op in operations:
                    for (permission, pattern), out in found.items():
                        names = sets.get((h, op, permission, pattern))
                        if names:
                            out.append(names)
        deny_literal = found[Permission.DENY, PatternType.LITERAL]
        deny_prefixed: set[str] = set().union(*found[Permission.DENY, PatternType.PREFIXED])
        allow_literal = found[Permission.ALLOW, PatternType.LITERAL]
        if any(WILDCARD_RESOURCE in names for names in deny_literal):
            return False
        if any(WILDCARD_RESOURCE in names for names in allow_literal):
            return True
        for names in allow_literal:
            for name in names:
                if not any(name in denied for denied in deny_literal) and not _dominated(name, deny_prefixed):
                    return True
        return any(
            not _dominated(prefix, deny_prefixed)
            for names in found[Permission.ALLOW, PatternType.PREFIXED]
            for prefix in names
        )


def _dominated(name: str, deny_prefixes: set[str]) -> bool:
    """Some denied prefix is a prefix of ``name``."""
    return bool(deny_prefixes) and any(name[:i] in deny_prefixes for i in range(1, len(name) + 1))
