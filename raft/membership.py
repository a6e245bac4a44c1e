"""Pure rules of a group's configuration (its voters) under single-server membership changes.

Raft's rule, as PySyncObj applies it: a membership entry takes effect on a
replica as soon as it is in the replica's log, committed or not, and a
truncated one is undone. So the configuration is a function of the log: the
configuration of the latest snapshot, then every membership entry after it,
in log order. Each entry adds or removes one voter and is *effective* (the
leader appends it only when it changes the configuration), so the last entry
naming a node decides whether it is a voter.

A group changes one voter at a time, and only when no earlier change is
still uncommitted: any majority of the old configuration then overlaps any
majority of the new one, so two leaders of one term are impossible.

Everything here is deterministic and free of PySyncObj; ``raft.membership_log``
applies it to a running group.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

#: PySyncObj's ``_COMMAND_TYPE.MEMBERSHIP``: the first byte of a membership entry's command.
MEMBERSHIP_COMMAND = 2
ADD = "add"
REMOVE = "rem"


@dataclass(frozen=True, slots=True)
class Change:
    """One membership entry: ``op`` is ``ADD`` or ``REMOVE`` of the voter at ``address``."""

    op: str
    address: str


def parse_change(command: Any) -> Change | None:
    """The change a log entry's command makes, or None for any other entry.

    PySyncObj writes ``bytes([MEMBERSHIP]) + pickle(['add'|'rem', node_id, node])``;
    the log only holds entries from authenticated members of the group.
    """
    if not isinstance(command, bytes | bytearray) or not command or command[0] != MEMBERSHIP_COMMAND:
        return None  # checked on every applied entry: no allocation
    request = pickle.loads(command[1:])
    op, address = request[0], request[1]
    if op not in (ADD, REMOVE) or not isinstance(address, str):
        return None
    return Change(op, address)


def replay(base: Iterable[str], changes: Iterable[Change]) -> frozenset[str]:
    """The configuration after applying ``changes`` (log order) to ``base``."""
    voters = set(base)
    for change in changes:
        if change.op == ADD:
            voters.add(change.address)
        else:
            voters.discard(change.address)
    return frozenset(voters)


def rewind(current: Iterable[str], changes_after: Iterable[Change]) -> frozenset[str]:
    """The configuration before ``changes_after`` (log order), given the one after them.

    Every entry is effective, so the first entry naming a node after the point
    tells what the node was at the point: an ``ADD`` means it was no voter.
    """
    voters = set(current)
    seen: set[str] = set()
    for change in changes_after:
        if change.address in seen:
            continue
        seen.add(change.address)
        if change.op == ADD:
            voters.discard(change.address)
        else:
            voters.add(change.address)
    return frozenset(voters)


class Plan(Enum):
    """What a requested change needs."""

    PROPOSE = "propose"  # append the entry
    NOTHING = "nothing"  # the configuration already is so


class RequestError(ValueError):
    """A change request that no configuration allows (see ``plan_change``)."""


class RemovesLeader(RequestError):
    """The leader asked to remove itself; leadership must move first."""


def check_address(address: str) -> str:
    """``address`` if it is ``host:port``; else RequestError."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RequestError(f"raft address must be 'host:port', got {address!r}")
    return address


def requested(add: str | None, remove: str | None) -> Change:
    """The one change asked for: exactly one of ``add`` and ``remove``."""
    if (add is None) == (remove is None):
        raise RequestError("exactly one of add and remove is required")
    if add is not None:
        return Change(ADD, check_address(add))
    assert remove is not None
    return Change(REMOVE, check_address(remove))


def plan_change(voters: frozenset[str], leader: str, change: Change) -> Plan:
    """Whether the leader must propose ``change`` to configuration ``voters``.

    Raises RemovesLeader for the leader removing itself (PySyncObj cannot
    apply that: the leader would go on counting itself). Adding a voter or
    removing a non-voter needs nothing.
    """
    if change.op == REMOVE and change.address == leader:
        raise RemovesLeader(f"the leader {leader} cannot remove itself; transfer leadership first")
    present = change.address in voters
    if (change.op == ADD) == present:
        return Plan.NOTHING
    return Plan.PROPOSE


def lag(last_index: int, match_index: int | None) -> int | None:
    """Entries a member misses: the leader's last index minus the member's match index."""
    if match_index is None:
        return None
    return max(0, last_index - match_index)
