"""Moving Raft groups between nodes, and the controller leader's membership duties (loop thread).

Every node runs a ``ReassignmentDriver``. Each round it looks at the moves in
the controller's view (``ControllerView.reassignments``) and drives those of
the groups *it leads*, one Raft membership change at a time (Raft's
single-server changes, so any two majorities overlap):

1. add the next node of the target that is not a voter yet (its replica runs
   already: ``ReplicaManager``/``InternalGroups`` start a group on every node
   of a move), once every node added before it has caught up: first as a
   learner (replicated to, counted for nothing), then, once within
   ``reassignment_catch_up_entries`` of the leader's log, as a voter;
2. when every target node is a voter, the added ones have caught up and a
   majority of the target is caught up, remove the voters that are not in the
   target, one at a time; a leader that is leaving hands its leadership to a
   caught-up target node first (PySyncObj's leader cannot remove itself);
3. when the voters are exactly the target, report the move complete to the
   controller, which makes the target the placement and ends the move; the
   nodes that left stop their replica and delete its data.

The state of a move is the group's own Raft configuration (in its log and
snapshots) plus the controller's record, so a new leader after a crash picks
the move up where the old one left it; a cancelled move is driven back the
same way. Requests keep being served throughout: a membership change is one
more entry in the group's log.

On the controller leader the driver also records the founders as registered
nodes once, gives every active registered node that answers a controller vote,
and finishes decommissions: a decommissioning node that holds nothing any more
becomes ``decommissioned`` (while it still votes, so its own replica learns it),
then loses its controller vote.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from clients.protocol import BrokerError, ErrorCode
from raft import RaftError, RaftGroup, RaftNode

from .background import every
from .cluster_nodes import ClusterNodes
from .config import NodeConfig
from .controller_service import ControllerService
from .controller_view import (
    NODE_ACTIVE,
    NODE_DECOMMISSIONED,
    NODE_DECOMMISSIONING,
    ControllerView,
    NodeRecord,
    Reassignment,
)
from .membership import complete_reassignment_command, holds_anything, seed_nodes_command, set_node_state_command
from .peers import PeerView

log = logging.getLogger(__name__)

_MAX_PARALLEL_MOVES = 16


class ReassignmentDriver:
    def __init__(
        self,
        config: NodeConfig,
        raft: RaftNode,
        nodes: ClusterNodes,
        controller: ControllerService,
        peer_view: PeerView,
        internal_placements: Callable[[], Mapping[str, tuple[int, ...]]],
        high_watermark: Callable[[str], int | None] = lambda _gid: None,
    ) -> None:
        self._config = config
        self._high_watermark = high_watermark  # a local data partition's high watermark, by group id
        self._raft = raft
        self._nodes = nodes
        self._controller = controller
        self._peer_view = peer_view
        self._internal_placements = internal_placements
        self._timeout = config.request_timeout_ms / 1000
        self._task: asyncio.Task[None] | None = None
        self._sem = asyncio.Semaphore(_MAX_PARALLEL_MOVES)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            every(self._config.reassignment_check_interval_s, self.run_once), name="reassignments"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run_once(self) -> None:
        view = self._controller.view
        led = [(m, g) for m in view.reassignments.values() if (g := self._raft.group(m.group_id)) and g.is_leader()]
        if led:
            await asyncio.gather(*(self._guarded_step(g, m) for m, g in led))
        c = self._controller.group
        if c is not None and c.is_leader():
            try:
                await self._controller_duties(view, c)
            except (BrokerError, RaftError) as exc:
                log.info("controller membership duty deferred: %s", exc)

    # ---- moves ------------------------------------------------------------------------------------

    def _ids(self, addresses: Iterable[str]) -> set[int]:
        out = set()
        for a in addresses:
            n = self._nodes.node_by_raft_address(a)
            if n is not None:
                out.add(n.id)
        return out

    def _address(self, node_id: int) -> str:
        n = self._nodes.node(node_id)
        if n is None:
            raise BrokerError(ErrorCode.BROKER_ID_NOT_REGISTERED, f"node {node_id} has no known address")
        return n.raft_address

    def _caught_up(self, group: RaftGroup, node_id: int) -> bool:
        lag = group.member_lag(self._address(node_id))
        return lag is not None and lag <= self._config.reassignment_catch_up_entries

    async def _guarded_step(self, group: RaftGroup, move: Reassignment) -> None:
        async with self._sem:
            try:
                await self.step(group, move)
            except (BrokerError, RaftError) as exc:
                log.info("move of %s: next step deferred (%s)", move.group_id, exc)

    async def step(self, group: RaftGroup, move: Reassignment) -> str:
        """One change towards ``move.target`` on a group this node leads; what it did (for logs and tests)."""
        me = self._config.node_id
        voters = self._ids(group.voters())
        joined = [n for n in move.target if n in voters and n != me and n not in move.original]
        if any(not self._caught_up(group, n) for n in joined):
            return "waiting for new replicas to catch up"
        for n in move.target:
            if n in voters:
                continue
            address = self._address(n)
            if address not in group.learners():
                # A learner first: it catches up without counting for commits, so the group's quorum is never
                # waiting for an empty log. Learners live on the leader only: a new leader adds it again.
                await group.add_learner(address, timeout=self._timeout)
                log.info("move of %s: node %d replicates as a learner", move.group_id, n)
                return f"learner {n}"
            lag = group.learner_lag(address)
            if lag is None or lag > self._config.reassignment_catch_up_entries:
                return f"waiting for learner {n} to catch up"
            await group.change_membership(add=address, timeout=self._timeout)
            log.info("move of %s: node %d added to the voters", move.group_id, n)
            return f"added {n}"
        leaving = sorted(voters - set(move.target))
        if leaving and not self._target_quorum_caught_up(group, move.target):
            # Removing a voter while most of the target is not answering would cost the leader its quorum.
            return "waiting for a majority of the target to be caught up"
        if me in leaving:
            ready = [n for n in move.target if n in voters and self._caught_up(group, n)]
            if ready:
                group.transfer_leadership(self._address(ready[0]))
                log.info("move of %s: leadership handed to node %d before leaving", move.group_id, ready[0])
                return f"leadership to {ready[0]}"
            return "waiting for a target replica to take over"
        if leaving:
            await group.change_membership(remove=self._address(leaving[0]), timeout=self._timeout)
            log.info("move of %s: node %d removed from the voters", move.group_id, leaving[0])
            return f"removed {leaving[0]}"
        for address in group.learners():  # a node a cancelled move had begun to add
            if address not in {self._address(n) for n in move.target}:
                await group.remove_learner(address, timeout=self._timeout)
        await self._controller.submit_at_leader(complete_reassignment_command(move.group_id, voters))
        log.info("move of %s complete: replicas %s", move.group_id, list(move.target))
        return "complete"

    def _target_quorum_caught_up(self, group: RaftGroup, target: tuple[int, ...]) -> bool:
        me = self._config.node_id
        fit = sum(1 for n in target if n == me or self._caught_up(group, n))
        return fit > len(target) // 2

    def progress(self, move: Reassignment) -> dict[str, Any] | None:
        """The move as its group's leader sees it (None when this node does not lead the group).

        Per target node: its role (voter, learner, or pending: not replicated to yet), the Raft entries it
        is behind the leader's log, and for a data partition the offsets its replica is behind the leader's
        high watermark (as that node last reported it to its peers)."""
        group = self._raft.group(move.group_id)
        if group is None or not group.is_leader():
            return None
        voters = self._ids(group.voters())
        learners = self._ids(group.learners())
        hw = self._high_watermark(move.group_id) if move.topic is not None else None
        roles: dict[str, str] = {}
        entries: dict[str, int | None] = {}
        offsets: dict[str, int | None] = {}
        for n in move.target:
            if n == self._config.node_id:
                continue
            roles[str(n)] = "voter" if n in voters else "learner" if n in learners else "pending"
            entries[str(n)] = group.member_lag(self._address(n)) if roles[str(n)] != "pending" else None
            if hw is not None:
                reported = self._peer_view.reported(n, move.group_id).get("high_watermark")
                offsets[str(n)] = max(0, hw - int(reported)) if isinstance(reported, int) else None
        out: dict[str, Any] = {
            "group_id": move.group_id,
            "leader": self._config.node_id,
            "voters": sorted(voters),
            "roles": roles,
            "entries_behind": entries,
        }
        if hw is not None:
            out["high_watermark"] = hw
            out["offsets_behind"] = offsets
        return out

    # ---- the controller leader's duties ------------------------------------------------------------

    async def _controller_duties(self, view: ControllerView, group: RaftGroup) -> None:
        if not view.nodes:
            records = [
                NodeRecord(n.id, n.host, n.http_port, n.raft_port, n.scheme, kafka_port=n.kafka_port)
                for n in self._config.nodes
            ]
            await self._controller.submit_command(seed_nodes_command(records))
            return
        voters = self._ids(group.voters())
        for rec in sorted(view.nodes.values(), key=lambda r: r.node_id):
            if rec.state == NODE_ACTIVE and rec.node_id not in voters and self._peer_view.is_alive(rec.node_id):
                await group.change_membership(add=rec.address.raft_address, timeout=self._timeout)
                log.info("node %d has a controller vote", rec.node_id)
                return
        internal = self._internal_placements()
        for rec in sorted(view.nodes.values(), key=lambda r: r.node_id):
            if rec.state == NODE_DECOMMISSIONING and not holds_anything(view, rec.node_id, internal):
                # Recorded while the node still votes, so its own replica learns it too.
                await self._controller.submit_command(set_node_state_command(rec.node_id, NODE_DECOMMISSIONED))
                log.info("node %d is decommissioned", rec.node_id)
                return
            if rec.state == NODE_DECOMMISSIONED and rec.node_id in voters:
                await self._drop_controller_vote(group, rec, voters)
                return

    async def _drop_controller_vote(self, group: RaftGroup, rec: NodeRecord, voters: set[int]) -> None:
        if rec.node_id == self._config.node_id:
            others = [n for n in sorted(voters) if n != rec.node_id and self._caught_up(group, n)]
            if others:
                group.transfer_leadership(self._address(others[0]))
            return
        lag = group.member_lag(rec.address.raft_address)
        if lag is not None and lag > 0 and self._peer_view.is_alive(rec.node_id):
            return  # let it apply its decommissioned state first (a stopped node needs nothing more)
        await group.change_membership(remove=rec.address.raft_address, timeout=self._timeout)
        log.info("node %d gave up its controller vote", rec.node_id)
