"""Raft groups on PySyncObj: many groups per node over one port and a few ticker threads.

Public API: ``RaftNode`` (the node's groups), ``RaftGroup`` (one group:
leadership, submit-and-wait), ``RaftSettings``, ``LeadershipEvent``,
``GroupStatus``, the ``StateMachine`` protocol and the ``RaftError`` tree.
"""

from raft.errors import (
    NotLeaderError,
    QueueFullError,
    RaftApplyError,
    RaftCommandFailed,
    RaftError,
    RaftTimeoutError,
    SnapshotCorruptError,
)
from raft.group import RaftGroup
from raft.node import RaftNode
from raft.settings import GroupStatus, LeadershipEvent, RaftSettings
from raft.state_machine import NOOP_COMMAND, StateMachine

__all__ = [
    "NOOP_COMMAND",
    "GroupStatus",
    "LeadershipEvent",
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
