"""Readiness (``GET /readyz``): what this node still lacks to serve requests.

A node is ready when it is not draining, its controller replica knows a
leader, and every internal group it replicates (the ``__transaction_state``
and ``__consumer_offsets`` partitions) has a *ready* leader: one whose term's
barrier is applied, so it serves coordinator requests at once. This node
knows that of itself (``RaftGroup.is_leader``); of another node, from the
state that node last reported (``/v1/internal/state``, read by ``PeerView``):
it must be the node this replica follows, and say ``"ready"`` for the group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .config import NodeConfig
from .internal_groups import InternalGroups
from .seams import NodeDirectory, PeerPartitions

__all__ = ["NOT_READY_AS_REPORTED", "MissingGroup", "missing_groups"]

#: The reason of a group led by another node that has not reported it ready (yet): a poll of that node may tell.
NOT_READY_AS_REPORTED = "leader not ready as last reported"


@dataclass(frozen=True, slots=True)
class MissingGroup:
    """An internal group this node replicates that has no ready leader (yet)."""

    group: str
    leader: int | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "leader": self.leader, "reason": self.reason}


def missing_groups(
    config: NodeConfig, nodes: NodeDirectory, kinds: Sequence[InternalGroups[Any]], peers: PeerPartitions
) -> list[MissingGroup]:
    """Every internal group replicated here without a ready leader, in kind and partition order."""
    out: list[MissingGroup] = []
    for kind in kinds:
        for p in sorted(kind.local):
            part = kind.local[p]
            if part.group.is_leader():
                continue
            addr = part.group.leader()
            node = nodes.node_by_raft_address(addr) if addr else None
            if node is None:
                out.append(MissingGroup(part.group_id, None, "no leader"))
            elif node.id == config.node_id:
                out.append(MissingGroup(part.group_id, node.id, "leader loading (barrier not applied)"))
            else:
                reported = peers.remote_partition(part.group_id)
                if reported is None or reported.get("leader") != node.id or reported.get("ready") is not True:
                    out.append(MissingGroup(part.group_id, node.id, NOT_READY_AS_REPORTED))
    return out
