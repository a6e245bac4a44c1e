"""This node's ``__transaction_state`` partitions: who coordinates an id, and proposing to its Raft group.

Kafka's ``TransactionStateManager``: the coordinator for transactional id T is
the ready leader of partition ``coordinator_partition(T, N)``. Every change
is a command stamped with the leader's clock and its Raft term (the
coordinator epoch) and decided in ``TransactionStateMachine.apply``; this
class builds nothing itself, it routes and submits.

Runs on the asyncio loop; the state machines' callbacks arrive on Raft
threads and are handed to the loop here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from clients.protocol import BrokerError, ErrorCode
from coordinator.commands import Command, encode_command
from coordinator.group_commit import GroupDecision
from coordinator.metadata import MarkerPlan, TransactionMetadata
from coordinator.placement import coordinator_partition
from coordinator.scans import producer_id_needed
from coordinator.state_machine import TransactionStateMachine
from coordinator.states import TransactionState
from raft import RaftNode
from storage.store import NodeStore

from ..config import NodeConfig
from ..controller_view import ControllerView
from ..deadline import Deadline, call_at_leader, current_deadline, loop_now
from ..internal_groups import InternalGroups, InternalPartition
from ..peers import PeerView
from ..seams import Clock, NodeDirectory, PeerClient, ProducerIdSource

__all__ = ["TXN_STATE_KIND", "TransactionStateManager", "TxnPartition", "txn_storage_prefix"]

TXN_STATE_KIND = "__transaction_state"

TxnPartition = InternalPartition[TransactionStateMachine]


def txn_storage_prefix(partition: int) -> bytes:
    return b"X" + partition.to_bytes(4, "big")


class TransactionStateManager:
    """Routing, leadership and proposals for this node's replicas of ``__transaction_state``.

    ``on_plan`` / ``on_decision`` are called on the loop when an applied command leaves a
    transaction with markers to write (a ``MarkerPlan``) or a commit group with a decision to
    carry out; ``on_leader_change`` when a partition's leadership changes.
    """

    def __init__(
        self,
        config: NodeConfig,
        store: NodeStore,
        raft: RaftNode,
        peer_view: PeerView,
        clock: Clock,
        nodes: NodeDirectory,
        peers: PeerClient,
        producer_ids: ProducerIdSource,
    ) -> None:
        self.config = config
        self.count = config.transaction_state_partitions
        self._store = store
        self._clock = clock
        self._nodes = nodes
        self._peers = peers
        self._producer_ids = producer_ids
        self._loop = asyncio.get_running_loop()
        self.on_plan: Callable[[int, MarkerPlan], None] = lambda _p, _plan: None
        self.on_decision: Callable[[int, GroupDecision], None] = lambda _p, _d: None
        self.on_leader_change: Callable[[TxnPartition], None] = lambda _part: None
        self.groups: InternalGroups[TransactionStateMachine] = InternalGroups(
            TXN_STATE_KIND, self.count, config, raft, peer_view, self._make_sm,
            on_leader_change=lambda part: self.on_leader_change(part), nodes=nodes,
            forget=lambda p: store.delete_prefix(txn_storage_prefix(p)),
        )  # fmt: skip

    def _make_sm(self, partition: int) -> TransactionStateMachine:
        sm = TransactionStateMachine(self._store, txn_storage_prefix(partition), partition)
        loop = self._loop

        def on_markers(plan: MarkerPlan) -> None:  # Raft thread
            loop.call_soon_threadsafe(self.on_plan, partition, plan)

        def on_decision(decision: GroupDecision) -> None:  # Raft thread
            loop.call_soon_threadsafe(self.on_decision, partition, decision)

        sm.on_markers = on_markers
        sm.on_group_decision = on_decision
        return sm

    def start(self, view: ControllerView | None = None) -> None:
        self.groups.start(view)

    def stop(self) -> None:
        self.groups.stop()

    # ---- who coordinates ------------------------------------------------------------------

    def partition_for(self, key: str) -> int:
        return coordinator_partition(key, self.count)

    def coordinator_json(self, key: str) -> dict[str, Any]:
        p = self.partition_for(key)
        node = self.groups.leader_id(p)
        if node is None:
            raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{TXN_STATE_KIND}-{p} has no leader")
        return {"node_id": node, "url": self._nodes.node_url(node), "partition": p}

    def leading(self, key: str) -> TxnPartition:
        """The partition of ``key`` if this node is its ready leader; else NOT_COORDINATOR and friends."""
        return self.groups.leading(self.partition_for(key))

    def not_coordinator(self, partition: int) -> BrokerError:
        """The error for a request this node cannot serve on ``partition`` (any longer)."""
        return self.groups.not_coordinator(partition)

    def local_partition(self, partition: int) -> TxnPartition | None:
        """This node's replica of ``partition``, if it has one."""
        return self.groups.local.get(partition)

    def leading_local(self, key: str) -> TxnPartition | None:
        """The partition of ``key`` if this node leads it, else None (the call goes to another node)."""
        local = self.groups.local.get(self.partition_for(key))
        return local if local is not None and local.group.is_leader() else None

    def led(self) -> list[TxnPartition]:
        """The partitions this node leads now."""
        return [part for part in self.groups.local.values() if part.group.is_leader()]

    def transactions(self, states: set[TransactionState] | None = None) -> list[TransactionMetadata]:
        """Transactions of the partitions this node leads (each id is listed by exactly one node)."""
        out: list[TransactionMetadata] = []
        for part in self.led():
            out.extend(part.sm.transactions(states))
        return out

    async def remote(self, key: str, path: str, body: dict[str, Any]) -> Any:
        """Call ``path`` on the node that coordinates ``key`` (another node), within the request's deadline.

        Retried at the coordinator as this node then knows it while the answer says it moved
        (``cluster.deadline.call_at_leader``); NOT_COORDINATOR if it moved here.
        """
        partition = self.partition_for(key)
        me = self._nodes.node_id

        def resolve(_last: BrokerError | None) -> int | None:
            node = self.groups.leader_id(partition)
            if node == me:
                raise self.groups.not_coordinator(partition)  # the caller serves it here when it asks again
            return node

        deadline = current_deadline() or Deadline.after(loop_now(), self.config.request_timeout_ms / 1000)
        return await call_at_leader(
            resolve, lambda node: self._peers.call(node, path, body), deadline, what=f"{path} at the coordinator"
        )

    # ---- proposing --------------------------------------------------------------------------

    async def submit(self, part: TxnPartition, build: Callable[[int, int], Command]) -> Any:
        """Propose ``build(now_ms, coordinator_epoch)`` on ``part``; a ``BrokerError`` result is raised."""
        cmd = build(self._clock.now_ms(), part.group.term())
        return await self.groups.submit(part, encode_command(cmd), self.config.request_timeout_ms / 1000, "coordinator")

    async def propose(self, part: TxnPartition, command: type[Command], **fields: Any) -> Any:
        """Submit ``command(**fields)`` stamped with the leader's clock and term (``submit``)."""
        return await self.submit(part, lambda now, cepoch: command(now_ms=now, coordinator_epoch=cepoch, **fields))

    async def candidate(self, meta: TransactionMetadata | None, *, always: bool = False) -> int | None:
        """A fresh producer id for a command that may need one (epoch exhaustion, a new id), else None."""
        if always or producer_id_needed(meta):
            return await self._producer_ids.next_producer_id()
        return None
