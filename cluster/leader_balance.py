"""Kafka's automatic leader rebalance: each Raft group's leadership goes back to its preferred replica.

The preferred replica is the first of a group's replicas (for a data partition
its placement's first node). Placements spread preferred replicas evenly, so
leadership spreads too, also after a move or a decommission (a move's target
order names the new preferred replica).

Leadership moves only to a preferred replica seen answering and caught up in
every round for ``leader_balance_hold_s``: a node back from a fault gets its
leaderships back a while after it rejoined, not at the heal itself (one leader
change per fault, not two at once). A group that is moving is left alone: its
move decides its leadership. Loop thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from raft import RaftError, RaftGroup

from .seams import NodeDirectory


@dataclass(frozen=True, slots=True)
class Candidate:
    """A group this node may lead, and the node that should."""

    group: RaftGroup
    preferred: int


class LeaderBalancer:
    def __init__(
        self, node_id: int, nodes: NodeDirectory, hold_s: float, candidates: Callable[[], Iterable[Candidate]]
    ) -> None:
        self._me = node_id
        self._nodes = nodes
        self._hold_s = hold_s
        self._candidates = candidates
        self._healthy_since: dict[str, float] = {}  # group id -> preferred replica seen fit to lead since

    async def run_once(self) -> None:
        now = time.monotonic()
        seen = set()
        for c in list(self._candidates()):
            gid = c.group.group_id
            seen.add(gid)
            if c.preferred == self._me or not c.group.is_leader():
                self._healthy_since.pop(gid, None)
                continue
            addr = self._nodes.node(c.preferred)
            if addr is None:
                continue
            st = c.group.status()
            if addr.raft_address not in st.responsive or st.match_index.get(addr.raft_address, -1) < st.commit_index:
                self._healthy_since.pop(gid, None)
                continue
            since = self._healthy_since.setdefault(gid, now)
            if now - since >= self._hold_s:
                with contextlib.suppress(RaftError):  # refused while a transfer is in flight: next round
                    c.group.transfer_leadership(addr.raft_address)
        for gid in [g for g in self._healthy_since if g not in seen]:
            del self._healthy_since[gid]
