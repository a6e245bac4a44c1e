"""Raft groups on PySyncObj: many groups per node over one port and a few ticker threads.

Public API: ``RaftNode`` (the node's groups), ``RaftGroup`` (one group:
leadership, submit-and-wait), ``RaftSettings``, ``LeadershipEvent``,
``GroupStatus``, the ``StateMachine`` protocol and the ``RaftError`` tree.
Membership changes (one voter at a time, learners): ``RaftGroup.change_membership``.
"""

from raft.errors import (
    CannotRemoveLeader,
    MembershipChangeInProgress,
    NotLeaderError,
    QueueFullError,
    RaftApplyError,
    RaftCommandFailed,
    RaftError,
    RaftTimeoutError,
    SnapshotCorruptError,
)
from raft.group import RaftGroup
from raft.node import GroupSpec, RaftNode
from raft.settings import GroupStatus, LeadershipEvent, RaftSettings
from raft.state_machine import NOOP_COMMAND, StateMachine

__all__ = [
    "NOOP_COMMAND",
    "CannotRemoveLeader",
    "GroupSpec",
    "GroupStatus",
    "LeadershipEvent",
    "MembershipChangeInProgress",
    "NotLeaderError",
    "QueueFullError",
    "RaftApplyError",
    "RaftCommandFailed",
    "RaftError",
    "RaftGroup",
    "RaftNode",
    "RaftSettings",
    "RaftTimeoutError",
    "SnapshotCorruptError",
    "StateMachine",
]
