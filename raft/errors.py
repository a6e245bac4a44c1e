"""Exceptions raised by the ``raft`` package (one root: ``RaftError``).

Outcome vocabulary: a command whose outcome is *unknown* may still commit
later (PySyncObj cannot cancel a proposal), so callers retry idempotently
(producer sequence numbers, coordinator epochs checked at apply).
"""

from __future__ import annotations


class RaftError(Exception):
    """Root of every error raised by this package."""


class NotLeaderError(RaftError):
    """This node is not the ready leader of the group; ``leader`` is the known leader, if any."""

    def __init__(self, leader: str | None, group_id: str = "") -> None:
        super().__init__(f"not leader of group {group_id!r}; leader={leader}")
        self.leader = leader
        self.group_id = group_id


class RaftTimeoutError(RaftError):
    """No answer within the deadline. Outcome unknown: the command may still commit."""


class RaftCommandFailed(RaftError):
    """PySyncObj reported a failure; retriable, outcome unknown.

    ``reason`` is the FAIL_REASON name: DISCARDED, LEADER_CHANGED, UNKNOWN_OUTCOME,
    MISSING_LEADER, NOT_LEADER or REQUEST_DENIED.
    """

    def __init__(self, reason: str, group_id: str = "") -> None:
        super().__init__(f"command failed in group {group_id!r}: {reason}")
        self.reason = reason
        self.group_id = group_id


class QueueFullError(RaftError):
    """The group's bounded command queue is full (backpressure); nothing was proposed."""


class RaftApplyError(RaftError):
    """``StateMachine.apply`` raised. The entry is committed and counted as applied.

    Instances are *returned* (never raised) inside the ticker thread so that
    PySyncObj is never wedged; ``RaftGroup.submit`` raises the returned value.
    """

    def __init__(self, group_id: str, index: int, detail: str) -> None:
        super().__init__(f"apply failed in group {group_id!r} at index {index}: {detail}")
        self.group_id = group_id
        self.index = index
        self.detail = detail


class SnapshotCorruptError(RaftError):
    """A snapshot container failed its checksum or structure checks."""


class MembershipChangeInProgress(RaftError):
    """A membership change is still uncommitted (or queued): a group changes one voter at a time."""


class CannotRemoveLeader(RaftError):
    """The leader was asked to remove itself; transfer leadership first, then remove it from the new leader."""
