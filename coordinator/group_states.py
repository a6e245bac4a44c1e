"""Consumer-group states and the table of allowed transitions (Kafka's classic ``GroupState`` names).

* ``Empty``: no members; the group may still hold committed offsets (a group
  used only to store offsets, or one whose members all left).
* ``PreparingRebalance``: a member joined, left, changed its subscription or
  missed its session timeout; every member must (re)join before the new
  generation is formed (or be dropped when the rebalance timeout passes).
* ``CompletingRebalance`` (groups whose leader member assigns: Kafka
  clients): the generation is formed and stored, every member has its
  JoinGroup answer, and the coordinator waits for the leader's SyncGroup
  with the assignment; followers' SyncGroups wait for it.
* ``Stable``: a generation is formed: every member knows its assignment and
  heartbeats with that generation id.

A group whose assignment the coordinator computes (HTTP members) goes from
``PreparingRebalance`` straight to ``Stable`` (or ``Empty``): its members get
their assignment in the join answer. Kafka's ``Dead`` is what DescribeGroups
reports for a group the coordinator does not know (never used, or deleted
while ``Empty``). States are not persisted: the replicated ``GroupMetadata``
of a completed rebalance implies ``Stable`` (members), ``CompletingRebalance``
(members, ``awaiting_sync``) or ``Empty`` (none).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from coordinator.errors import CoordinatorError

__all__ = ["VALID_PREVIOUS", "GroupState", "IllegalGroupTransitionError", "validate_group_transition"]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"

    @property
    def display_name(self) -> str:
        return self.value

    def __str__(self) -> str:
        return self.value


S = GroupState

#: Allowed previous states of each state.
VALID_PREVIOUS: Mapping[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),  # a rebalance completed with no member left
    S.PREPARING_REBALANCE: frozenset({S.EMPTY, S.STABLE, S.COMPLETING_REBALANCE}),
    # the join phase of a client-assigned group completed: waiting for the leader's SyncGroup
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    # server-assigned groups complete in one step; client-assigned ones when the leader's assignment is stored
    S.STABLE: frozenset({S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE}),
}


class IllegalGroupTransitionError(CoordinatorError):
    """A group state change the table forbids (a programming error, never a client's)."""

    def __init__(self, group_id: str, old: GroupState, new: GroupState) -> None:
        super().__init__(f"group {group_id!r}: illegal transition {old} -> {new}")
        self.group_id = group_id
        self.old = old
        self.new = new


def validate_group_transition(group_id: str, old: GroupState, new: GroupState) -> None:
    if old not in VALID_PREVIOUS[new]:
        raise IllegalGroupTransitionError(group_id, old, new)
