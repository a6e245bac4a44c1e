"""Internal partitioned Raft groups: ``__transaction_state`` (and later ``__consumer_offsets``).

Each kind is N Raft groups. By default partition ``p`` lives on ``min(3,
founders)`` consecutive founders (the nodes of ``cluster init``, sorted by id)
starting at ``p % founders``, so every node derives it without asking the
controller. A partition moved elsewhere (a reassignment or a decommission)
has its replica set in the controller's ``internal_replicas``, and while it
moves every node of the move runs it; ``reconcile`` follows the controller's
view, starting and stopping local groups (a group that leaves this node
takes its data with it). The owner of key K (a transactional
id or a group id) is the leader of partition ``coordinator_partition(K, N)`` (Kafka's hash).

A leader that has not yet committed its term's barrier is *loading*: it
answers ``COORDINATOR_LOAD_IN_PROGRESS``; a node that does not lead the
partition answers ``NOT_COORDINATOR`` with the coordinator's URL when known.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from clients.protocol import BrokerError, ErrorCode
from coordinator.placement import coordinator_partition
from raft import (
    LeadershipEvent,
    NotLeaderError,
    QueueFullError,
    RaftCommandFailed,
    RaftGroup,
    RaftNode,
    RaftTimeoutError,
)
from raft.state_machine import StateMachine

from .config import NodeConfig
from .controller_view import ControllerView
from .membership import group_members
from .peers import PeerView
from .seams import NodeDirectory

log = logging.getLogger(__name__)

SM = TypeVar("SM", bound=StateMachine)
INTERNAL_REPLICATION = 3


def internal_placement(node_ids: list[int], partition: int) -> tuple[int, ...]:
    ids = sorted(node_ids)
    rf = min(INTERNAL_REPLICATION, len(ids))
    return tuple(ids[(partition + i) % len(ids)] for i in range(rf))


@dataclass
class InternalPartition(Generic[SM]):
    partition: int
    group_id: str
    replicas: tuple[int, ...]
    group: RaftGroup
    sm: SM
    leader_id: int | None = None
    term: int = 0
    is_leader: bool = False  # as last reported by a leadership event (ready leader: barrier committed)


class InternalGroups(Generic[SM]):
    """This node's replicas of one internal kind, and who coordinates each partition."""

    def __init__(
        self,
        kind: str,
        count: int,
        config: NodeConfig,
        raft: RaftNode,
        peers: PeerView,
        make_sm: Callable[[int], SM],
        on_leader_change: Callable[[InternalPartition[SM]], None] | None = None,
        *,
        nodes: NodeDirectory,
        forget: Callable[[int], None] | None = None,
    ) -> None:
        if count < 1:
            raise ValueError(f"{kind}: partition count must be >= 1")
        self.kind = kind
        self.count = count
        self._config = config
        self._raft = raft
        self._peers = peers
        self._make_sm = make_sm
        self._on_leader_change = on_leader_change
        self._nodes = nodes
        self._forget = forget  # deletes a partition's stored state when its group leaves this node
        self._overrides: dict[str, tuple[int, ...]] = {}
        self._moving: dict[str, tuple[int, ...]] = {}  # group id -> every node of its move
        self.local: dict[int, InternalPartition[SM]] = {}
        self._by_group: dict[str, InternalPartition[SM]] = {}

    def group_id(self, partition: int) -> str:
        return f"{self.kind}-{partition}"

    def replicas_of(self, partition: int) -> tuple[int, ...]:
        gid = self.group_id(partition)
        return self._overrides.get(gid) or internal_placement(list(self._nodes.founders), partition)

    def placements(self) -> dict[str, tuple[int, ...]]:
        """Every partition's group id -> its replica set (the controller's, else the default)."""
        return {self.group_id(p): self.replicas_of(p) for p in range(self.count)}

    def partition_for(self, key: str) -> int:
        return coordinator_partition(key, self.count)

    def start(self, view: ControllerView | None = None) -> None:
        self.reconcile(view or ControllerView())
        log.info("%s: %d of %d partitions replicated here", self.kind, len(self.local), self.count)

    def reconcile(self, view: ControllerView) -> None:
        """Run a group for every partition this node replicates or takes part in moving; stop the rest."""
        prefix = f"{self.kind}-"
        self._overrides = {g: r for g, r in view.internal_replicas.items() if g.startswith(prefix)}
        moves = view.reassignments.items()
        self._moving = {g: m.involved for g, m in moves if m.topic is None and g.startswith(prefix)}
        me = self._config.node_id
        for p in range(self.count):
            gid = self.group_id(p)
            replicas = self.replicas_of(p)
            hosts = me in replicas or me in self._moving.get(gid, ())
            if hosts and p not in self.local:
                try:
                    self._add(p, replicas)
                except Exception:
                    log.exception("%s: could not start partition %d", self.kind, p)
            elif not hosts and p in self.local:
                self._remove(p)

    def _add(self, p: int, replicas: tuple[int, ...]) -> None:
        gid = self.group_id(p)
        members = group_members(self._nodes, replicas, gid)
        sm = self._make_sm(p)
        # Coordinator writes come one at a time: their followers catch up with the next heartbeat.
        group = self._raft.add_group(gid, members, sm, on_event=self._on_event, lazy_commit_notify=True)
        part = InternalPartition(p, gid, replicas, group, sm)
        self.local[p] = part
        self._by_group[gid] = part

    def _remove(self, p: int) -> None:
        part = self.local.pop(p)
        self._by_group.pop(part.group_id, None)
        self._raft.remove_group(part.group_id, delete_data=True)
        if self._forget is not None:
            self._forget(p)
        part.is_leader = False
        part.leader_id = None
        if self._on_leader_change is not None:
            self._on_leader_change(part)
        log.info("%s: partition %d moved off this node (its data deleted)", self.kind, p)

    def stop(self) -> None:
        for gid in list(self._by_group):
            self._by_group.pop(gid)
            self._raft.remove_group(gid, delete_data=False)
        self.local.clear()

    def _on_event(self, event: LeadershipEvent) -> None:
        part = self._by_group.get(event.group_id)
        if part is None:
            return
        node = self._nodes.node_by_raft_address(event.leader) if event.leader else None
        new_leader = node.id if node else None
        # Compare with the last *event*, not with group.is_leader(): the "ready leader" event follows
        # the "leader, barrier pending" one with the same leader and term, and must still be reported.
        changed = (new_leader, event.term, event.is_leader) != (part.leader_id, part.term, part.is_leader)
        part.leader_id = new_leader
        part.term = event.term
        part.is_leader = event.is_leader
        if changed and self._on_leader_change is not None:
            self._on_leader_change(part)

    def groups(self) -> list[RaftGroup]:
        return [p.group for p in self.local.values()]

    # ---- who coordinates ------------------------------------------------------------------

    def leader_id(self, partition: int) -> int | None:
        part = self.local.get(partition)
        if part is not None:
            if part.group.is_leader():
                return self._config.node_id
            addr = part.group.leader()
            node = self._nodes.node_by_raft_address(addr) if addr else None
            if node is not None:
                return node.id
            if part.leader_id is not None:
                return part.leader_id
            # No news of a leader here (cut off from it): a live peer may follow one (non-transitive cuts).
        info = self._peers.remote_partition(self.group_id(partition)) or {}
        leader = info.get("leader")
        return int(leader) if leader is not None else None

    def coordinator_url(self, partition: int) -> str | None:
        leader = self.leader_id(partition)
        node = self._nodes.node(leader) if leader is not None else None
        return node.url if node else None

    def leading(self, partition: int) -> InternalPartition[SM]:
        """This node's partition if it is the ready leader; else the error a client should see."""
        part = self.local.get(partition)
        if part is not None and part.group.is_leader():
            return part
        if part is not None and part.group.leader() == self._raft.self_address:
            raise BrokerError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"{self.group_id(partition)}: new leader is loading"
            )
        url = self.coordinator_url(partition)
        if url is None:
            raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{self.group_id(partition)} has no leader")
        raise BrokerError(
            ErrorCode.NOT_COORDINATOR,
            f"{self.group_id(partition)} is coordinated by another node",
            coordinator_url=url,
            leader_url=url,
        )

    def not_coordinator(self, partition: int) -> BrokerError:
        """The error for a request this node cannot serve on ``partition`` (any longer)."""
        try:
            self.leading(partition)
        except BrokerError as exc:
            return exc
        return BrokerError(ErrorCode.NOT_COORDINATOR, f"{self.group_id(partition)}: leadership changed")

    async def submit(self, part: InternalPartition[SM], command: bytes, timeout: float, what: str) -> Any:
        """Propose ``command`` on ``part`` and wait for its apply; a ``BrokerError`` result is raised.

        Raft failures become what a coordinator's client sees: NOT_COORDINATOR (with the coordinator's
        URL when known) for a lost leadership, REQUEST_TIMED_OUT, THROTTLING_QUOTA_EXCEEDED.
        """
        if not part.group.is_leader():
            raise self.not_coordinator(part.partition)
        try:
            result = await part.group.submit(command, timeout=timeout)
        except (NotLeaderError, RaftCommandFailed) as exc:
            raise self.not_coordinator(part.partition) from exc
        except RaftTimeoutError as exc:
            raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"{what} write not committed in time") from exc
        except QueueFullError as exc:
            raise BrokerError(ErrorCode.THROTTLING_QUOTA_EXCEEDED, f"{what} write queue is full") from exc
        if isinstance(result, BrokerError):
            raise result
        return result

    def state_json(self) -> dict[str, dict[str, object]]:
        """This node's view of its internal partitions, for /v1/internal/state (peers read it)."""
        out: dict[str, dict[str, object]] = {}
        for p, part in self.local.items():
            leader = self._config.node_id if part.group.is_leader() else part.leader_id
            out[part.group_id] = {
                "kind": self.kind,
                "partition": p,
                "leader": leader,
                "ready": part.group.is_leader(),  # this node leads it with its barrier applied (readiness)
                "term": part.group.term(),
                "commit_index": part.group.commit_index(),
            }
        return out
