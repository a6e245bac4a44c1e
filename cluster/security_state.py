"""Users and ACLs in the controller's replicated state: the immutable ``SecurityView`` and its transitions (pure).

The controller state machine (``cluster.controller``) applies the commands
built here through ``apply_security`` and persists the view under its own
key when it changes. Transitions are deterministic -- no clock, no
randomness: a credential's salt is drawn, and its keys derived, on the node
that proposes the command, so a command carries only hashed credentials.

- ``upsert_user``: replaces the user's credentials (one per SCRAM mechanism)
  with the command's; creates the user if new.
- ``delete_user``: removes the user (RESOURCE_NOT_FOUND when there is none).
- ``create_acls``: adds bindings (one already there is left as it is).
- ``delete_acls``: removes every binding any of the filters matches and
  answers them.
- ``bootstrap``: records the configured bootstrap users and ACLs once (users
  already present are left as they are); the ``bootstrapped`` flag then
  keeps them from coming back after an operator deletes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clients.protocol import BrokerError, ErrorCode

from .security.acl import AclBinding, AclFilter, binding_key
from .security.scram import ScramCredential

__all__ = [
    "SECURITY_OPS",
    "SecurityChange",
    "SecurityView",
    "apply_security",
    "bootstrap_command",
    "create_acls_command",
    "delete_acls_command",
    "delete_user_command",
    "upsert_user_command",
]

#: name -> mechanism -> credential
Users = Mapping[str, Mapping[str, ScramCredential]]


@dataclass(frozen=True, slots=True)
class SecurityView:
    """The replicated users (hashed SCRAM credentials) and ACLs. Never mutated: transitions make new ones."""

    users: Users = field(default_factory=dict)
    acls: tuple[AclBinding, ...] = ()  # unique, sorted by ``binding_key``
    bootstrapped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "users": {name: [creds[m].to_json() for m in sorted(creds)] for name, creds in sorted(self.users.items())},
            "acls": [b.to_json() for b in self.acls],
            "bootstrapped": self.bootstrapped,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SecurityView:
        users = {str(name): _creds(raw) for name, raw in d["users"].items()}
        return cls(users, _sorted_acls(AclBinding.from_json(a) for a in d["acls"]), bool(d["bootstrapped"]))

    def users_json(self) -> list[dict[str, Any]]:
        """``GET /v1/users``: names and mechanisms, never a secret."""
        return [{"name": name, "mechanisms": sorted(creds)} for name, creds in sorted(self.users.items())]


@dataclass(frozen=True, slots=True)
class SecurityChange:
    """What the controller answers a security command with: its Raft index and the transition's result."""

    index: int
    value: Any


def _creds(raw: Iterable[Mapping[str, Any]]) -> dict[str, ScramCredential]:
    creds = [ScramCredential.from_json(c) for c in raw]
    return {c.mechanism: c for c in creds}


def _sorted_acls(bindings: Iterable[AclBinding]) -> tuple[AclBinding, ...]:
    return tuple(sorted(set(bindings), key=binding_key))


# ---- commands (JSON) -------------------------------------------------------------------------


def upsert_user_command(name: str, credentials: Iterable[ScramCredential]) -> bytes:
    return json.dumps({"op": "upsert_user", "name": name, "credentials": [c.to_json() for c in credentials]}).encode()


def delete_user_command(name: str) -> bytes:
    return json.dumps({"op": "delete_user", "name": name}).encode()


def create_acls_command(bindings: Sequence[AclBinding]) -> bytes:
    return json.dumps({"op": "create_acls", "acls": [b.to_json() for b in bindings]}).encode()


def delete_acls_command(filters: Sequence[AclFilter]) -> bytes:
    return json.dumps({"op": "delete_acls", "filters": [f.to_json() for f in filters]}).encode()


def bootstrap_command(users: Users, bindings: Sequence[AclBinding]) -> bytes:
    return json.dumps(
        {
            "op": "bootstrap_security",
            "users": {name: [c.to_json() for c in creds.values()] for name, creds in users.items()},
            "acls": [b.to_json() for b in bindings],
        }
    ).encode()


SECURITY_OPS = frozenset({"upsert_user", "delete_user", "create_acls", "delete_acls", "bootstrap_security"})


# ---- transitions -----------------------------------------------------------------------------


def apply_security(view: SecurityView, cmd: Mapping[str, Any]) -> tuple[Any, SecurityView]:
    """Pure transition: (result, next view). Bad commands are error results, and change nothing."""
    try:
        return _apply(view, cmd)
    except BrokerError as exc:
        return exc, view
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return BrokerError(ErrorCode.INVALID_REQUEST, f"malformed security command: {exc!r}"), view


def _apply(view: SecurityView, cmd: Mapping[str, Any]) -> tuple[Any, SecurityView]:
    op = cmd["op"]
    if op == "upsert_user":
        name = str(cmd["name"])
        creds = _creds(cmd["credentials"])
        if not creds:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "a user needs a credential")
        users = dict(view.users)
        created = name not in users
        users[name] = creds
        return {"name": name, "created": created}, SecurityView(users, view.acls, view.bootstrapped)
    if op == "delete_user":
        name = str(cmd["name"])
        if name not in view.users:
            return BrokerError(ErrorCode.RESOURCE_NOT_FOUND, f"no user {name!r}"), view
        users = dict(view.users)
        del users[name]
        return name, SecurityView(users, view.acls, view.bootstrapped)
    if op == "create_acls":
        bindings = [AclBinding.from_json(a) for a in cmd["acls"]]
        new = set(bindings) - set(view.acls)
        if not new:
            return bindings, view
        return bindings, SecurityView(view.users, _sorted_acls([*view.acls, *new]), view.bootstrapped)
    if op == "delete_acls":
        filters = [AclFilter.from_json(f) for f in cmd["filters"]]
        deleted = [b for b in view.acls if any(f.matches(b) for f in filters)]
        if not deleted:
            return [], view
        gone = set(deleted)
        return deleted, SecurityView(view.users, tuple(b for b in view.acls if b not in gone), view.bootstrapped)
    if op == "bootstrap_security":
        if view.bootstrapped:
            return False, view
        users = dict(view.users)
        for name, raw in cmd["users"].items():
            users.setdefault(str(name), _creds(raw))
        bindings = [AclBinding.from_json(a) for a in cmd["acls"]]
        return True, SecurityView(users, _sorted_acls([*view.acls, *bindings]), True)
    raise BrokerError(ErrorCode.INVALID_REQUEST, f"unknown security command {op!r}")
