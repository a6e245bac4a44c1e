"""Group coordinators: the ``__consumer_offsets-p`` groups at work (DESIGN.md "Raft groups").

The coordinator of consumer group G is the ready leader of partition
``coordinator_partition(G, M)`` (Kafka's hash; M = ``offsets_topic_partitions``,
default 8, fixed for the cluster's life). Its replicated state
(``coordinator.group_state_machine``): each group's last completed rebalance,
committed offsets, pending transactional offsets and producer fences. Every
change is a command stamped with the leader's clock and its Raft term
(the coordinator epoch), decided in ``apply``.

Live membership (``coordinator.group_membership``) exists only on the leader,
in memory: joins long-poll until their rebalance completes, heartbeats and
session timers run here, and the outcome of each rebalance is replicated
(``StoreGroup``) before any member hears of it, so the generation a member
holds is always durable. For a group whose leader member assigns (Kafka
clients) the leader's SyncGroup assignment is replicated too
(``StoreAssignment``) before any member's SyncGroup is answered; followers'
syncs wait for it. A new leader rebuilds membership from the stored
generation (``Stable``, or ``CompletingRebalance`` while the assignment is
still to come) and restarts the session timers; a lost leadership fails every
waiting join and sync with ``NOT_COORDINATOR``.

Transactions (KIP-98/447/890): AddOffsetsToTxn adds ``__consumer_offsets-p``
to the producer's transaction; a TxnOffsetCommit is checked against the live
membership, verified with the transaction coordinator (which adds the
partition if needed) and replicated as pending; the transaction's COMMIT/ABORT
marker reaches the partition through ``write_txn_marker`` (the node's marker writer routes offsets
partitions here).

Everything runs on the asyncio loop; the state machines' Raft threads only
write RocksDB and publish immutable values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from clients.protocol import BrokerError, ControlType, ErrorCode
from coordinator.group_admin import LogOffsets, ResetTo, reset_rows
from coordinator.group_commands import (
    DEFAULT_PRODUCER_EXPIRATION_MS,
    CommitOffsets,
    DeleteGroup,
    DeleteOffsets,
    ExpireProducers,
    GroupsCommand,
    OffsetCommit,
    StoreAssignment,
    StoreGroup,
    TxnCommitOffsets,
    WriteTxnMarker,
    encode_group_command,
)
from coordinator.group_membership import (
    AssignmentPlan,
    ClientProtocols,
    GroupMembership,
    JoinAnswer,
    KafkaMember,
    RebalancePlan,
    SyncAnswer,
)
from coordinator.group_metadata import NO_GENERATION, OFFSETS_TOPIC, CommittedOffset
from coordinator.group_rules import GroupDeleted, GroupStored, OffsetsCommitted, OffsetsDeleted
from coordinator.group_state_machine import GroupStateMachine
from coordinator.group_states import GroupState
from coordinator.metadata import TopicPartition
from coordinator.placement import coordinator_partition
from raft import RaftNode
from storage.commands import TxnMarkerResult
from storage.store import NodeStore

from .config import NodeConfig
from .controller_view import ControllerView
from .group_views import GroupViews
from .group_waiters import MemberWaiters, track_task
from .internal_groups import InternalGroups, InternalPartition
from .metrics import CoordinatorKind, GroupCoordinatorSample, NodeMetrics
from .offset_lookup import OffsetLookup
from .peers import PeerView
from .seams import Clock, NodeDirectory, PeerClient, TopicDirectory, TransactionPartitions

log = logging.getLogger(__name__)

__all__ = ["OFFSETS_TOPIC", "GroupService", "offsets_storage_prefix"]

GroupPartition = InternalPartition[GroupStateMachine]
_MAX_TIMER_WAIT_S = 1.0  # subscribed-topic changes are noticed within this
_PRODUCER_SCAN_S = 60.0
_JOIN_GRACE_S = 5.0
_MAX_LOOKUPS = 16  # partition leaders asked at once by an offset reset


def offsets_storage_prefix(partition: int) -> bytes:
    return b"O" + partition.to_bytes(4, "big")


def _offset_json(c: CommittedOffset) -> dict[str, Any]:
    return {"topic": c.topic, "partition": c.partition, "offset": c.offset, "metadata": c.metadata}


class GroupService:
    """Kafka's ``GroupCoordinator`` for the groups whose ``__consumer_offsets`` partitions this node leads."""

    def __init__(
        self,
        config: NodeConfig,
        store: NodeStore,
        raft: RaftNode,
        peer_view: PeerView,
        *,
        clock: Clock,
        nodes: NodeDirectory,
        peers: PeerClient,
        topics: TopicDirectory,
        txn: TransactionPartitions,
        metrics: NodeMetrics,
        offsets: OffsetLookup,
    ) -> None:
        self.config = config
        self.offsets = offsets
        self._store = store
        self._clock = clock
        self._nodes = nodes
        self._peers = peers
        self._topics = topics
        self._txn = txn
        self._metrics = metrics
        self.count = config.offsets_topic_partitions
        self.groups: InternalGroups[GroupStateMachine] = InternalGroups(
            OFFSETS_TOPIC, self.count, config, raft, peer_view, self._make_sm,
            on_leader_change=self._on_leader_change, nodes=nodes,
            forget=lambda p: store.delete_prefix(offsets_storage_prefix(p)),
        )  # fmt: skip
        # partition -> group -> live membership, for the partitions this node leads (loaded in that term)
        self._live: dict[int, dict[str, GroupMembership]] = {}
        self.views = GroupViews(config.node_id, config.metrics_max_lag_series, topics, self._live)
        self._loaded_term: dict[int, int] = {}
        self._joins: MemberWaiters[JoinAnswer] = MemberWaiters("rebalance")
        self._syncs: MemberWaiters[SyncAnswer] = MemberWaiters("leader's assignment")
        self._completions: dict[str, asyncio.Task[None]] = {}
        self._assignments: dict[str, asyncio.Task[None]] = {}  # leaders' SyncGroup assignments being stored
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    # ---- lifecycle ------------------------------------------------------------------------

    def _make_sm(self, partition: int) -> GroupStateMachine:
        return GroupStateMachine(self._store, offsets_storage_prefix(partition), partition)

    def start(self, view: ControllerView | None = None) -> None:
        self.groups.start(view)
        self._metrics.set_group_source(self.sample)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run_timers()), loop.create_task(self._expire_producers())]

    async def close(self) -> None:
        self._closing = True
        tasks = [*self._tasks, *self._completions.values(), *self._assignments.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in list(self._live):
            self._drop(p, BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the node is shutting down"))
        self.groups.stop()

    def _on_leader_change(self, part: GroupPartition) -> None:
        if part.group.is_leader() and not self._closing:
            self._ensure_loaded(part)
        else:
            self._drop(part.partition, self.groups.not_coordinator(part.partition))

    def _ensure_loaded(self, part: GroupPartition) -> None:
        """Build this term's live membership from the stored groups (once per term of leadership).

        Called from the leadership event, and again from every request and
        timer tick, so a leadership event that arrives late (or reports no
        change) never leaves a ready leader without its groups.
        """
        term = part.group.term()
        if self._loaded_term.get(part.partition) == term:
            return
        self._drop(part.partition, self.groups.not_coordinator(part.partition))
        started = time.monotonic()
        now = self._clock.now_ms()
        delay = self.config.group_initial_rebalance_delay_ms
        live = {
            g.group_id: GroupMembership.from_metadata(g, now, initial_rebalance_delay_ms=delay)
            for g in part.sm.groups()
            if g.members
        }
        self._live[part.partition] = live
        self._loaded_term[part.partition] = term
        self._metrics.coordinator_loaded(CoordinatorKind.GROUP, time.monotonic() - started)
        log.info("%s: group coordinator for term %d; %d group(s) with members", part.group_id, term, len(live))
        self._wake.set()

    def _drop(self, partition: int, error: BrokerError) -> None:
        """Forget the live membership of a partition this node no longer leads; its waiting joins fail."""
        self._loaded_term.pop(partition, None)
        for group_id in self._live.pop(partition, {}):
            self._fail_waiters(group_id, error)

    # ---- routing and submitting -------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return coordinator_partition(group_id, self.count)

    def coordinator_json(self, group_id: str) -> dict[str, Any]:
        p = self.partition_for(group_id)
        node = self.groups.leader_id(p)
        if node is None:
            raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{OFFSETS_TOPIC}-{p} has no leader")
        return {"node_id": node, "url": self._nodes.node_url(node), "partition": p}

    def leading(self, group_id: str) -> GroupPartition:
        part = self.groups.leading(self.partition_for(group_id))
        self._ensure_loaded(part)
        return part

    async def _submit(self, part: GroupPartition, build: Callable[[int, int], GroupsCommand]) -> Any:
        """Propose ``build(now_ms, coordinator_epoch)``; a ``BrokerError`` result is raised."""
        command = encode_group_command(build(self._clock.now_ms(), part.group.term()))
        return await self.groups.submit(part, command, self.config.request_timeout_ms / 1000, "group coordinator")

    def _membership(self, part: GroupPartition, group_id: str, member_id: str = "") -> GroupMembership:
        """The group's live membership, loaded from its stored metadata or new.

        A request naming a member of a group this coordinator does not know is
        answered without creating anything.
        """
        live = self._live.setdefault(part.partition, {})
        m = live.get(group_id)
        if m is None:
            meta = part.sm.group(group_id)
            delay = self.config.group_initial_rebalance_delay_ms
            if meta is not None:
                m = GroupMembership.from_metadata(meta, self._clock.now_ms(), initial_rebalance_delay_ms=delay)
            elif member_id:
                raise BrokerError(ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} is not a member of {group_id!r}")
            else:
                m = GroupMembership(group_id, initial_rebalance_delay_ms=delay)
            live[group_id] = m
        return m

    def _partition_counts(self) -> dict[str, int]:
        return self._topics.partition_counts()

    def _settle_syncs(self, group_id: str, m: GroupMembership) -> None:
        """Waiting syncs fail once their group is no longer waiting for its leader's assignment."""
        if m.state is not GroupState.COMPLETING_REBALANCE or m.completing is not None:
            self._syncs.fail_group(
                group_id, BrokerError(ErrorCode.REBALANCE_IN_PROGRESS, f"{group_id!r} is rebalancing: rejoin")
            )

    # ---- membership ----------------------------------------------------------------------------

    def _check_session_timeout(self, session_timeout_ms: int) -> None:
        cfg = self.config
        if not cfg.group_min_session_timeout_ms <= session_timeout_ms <= cfg.group_max_session_timeout_ms:
            raise BrokerError(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"session_timeout_ms must be between {cfg.group_min_session_timeout_ms} "
                f"and {cfg.group_max_session_timeout_ms}",
            )

    def new_member_id(self, group_id: str, client_id: str, session_timeout_ms: int) -> str:
        """KIP-394: a member id for a Kafka client's first JoinGroup (answered MEMBER_ID_REQUIRED with it)."""
        self._check_session_timeout(session_timeout_ms)
        part = self.leading(group_id)
        mid = f"{client_id}-{uuid.uuid4()}"
        self._membership(part, group_id).add_pending(mid, session_timeout_ms, self._clock.now_ms())
        self._wake.set()
        return mid

    async def join(
        self,
        group_id: str,
        member_id: str,
        topics: tuple[str, ...],
        protocol: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client: ClientProtocols | None = None,
    ) -> JoinAnswer:
        """JoinGroup: answers when the member's rebalance completes (or at once for a retried join).

        ``client``: a Kafka member (the group's leader member assigns; ``coordinator.group_membership``).
        """
        self._check_session_timeout(session_timeout_ms)
        part = self.leading(group_id)
        m = self._membership(part, group_id, member_id)  # a KIP-394 pending id lives in the live membership
        mid = member_id or (f"{client.client_id}-{uuid.uuid4()}" if client is not None else str(uuid.uuid4()))
        outcome = m.join(
            mid, new=not member_id, topics=topics, protocol=protocol, session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms, now_ms=self._clock.now_ms(), client=client,
        )  # fmt: skip
        if client is not None and client.group_instance_id:  # a replaced static member's requests end
            replaced = BrokerError(ErrorCode.UNKNOWN_MEMBER_ID, "replaced by a new member of its group.instance.id")
            self._joins.fail_absent(group_id, m.members, replaced)
            self._syncs.fail_absent(group_id, m.members, replaced)
        self._settle_syncs(group_id, m)
        if isinstance(outcome, BrokerError):
            raise outcome
        if outcome is not None:
            return outcome
        fut = self._joins.add(group_id, mid)
        self._wake.set()
        wait_s = (rebalance_timeout_ms + self.config.group_initial_rebalance_delay_ms) / 1000 + _JOIN_GRACE_S
        return await self._joins.wait(group_id, mid, fut, wait_s)

    async def sync(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        assignments: tuple[tuple[str, bytes], ...],
        protocol_type: str | None = None,
        protocol: str | None = None,
    ) -> SyncAnswer:
        """SyncGroup: the member's assignment; the leader's carries everyone's, stored before anyone is answered."""
        part = self.leading(group_id)
        m = self._membership(part, group_id, member_id)
        mismatch = (protocol_type is not None and protocol_type != m.protocol_type) or (
            protocol is not None and protocol != m.protocol
        )
        if mismatch and member_id in m.members and generation_id == m.generation_id:  # Kafka checks identity first
            raise BrokerError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"the group's protocol is {m.protocol_type!r}/{m.protocol!r}, not {protocol_type!r}/{protocol!r}",
            )
        outcome = m.sync(member_id, generation_id, assignments, self._clock.now_ms())
        if isinstance(outcome, BrokerError):
            raise outcome
        if isinstance(outcome, SyncAnswer):
            return outcome
        fut = self._syncs.add(group_id, member_id)
        if isinstance(outcome, AssignmentPlan):
            track_task(self._assignments, group_id, self._store_assignment(part, group_id, m, outcome))
        live = m.members.get(member_id)
        wait_s = (live.meta.rebalance_timeout_ms if live is not None else 0) / 1000 + _JOIN_GRACE_S
        return await self._syncs.wait(group_id, member_id, fut, wait_s)

    async def _store_assignment(self, part: GroupPartition, group_id: str, m: GroupMembership,
                                plan: AssignmentPlan) -> None:  # fmt: skip
        """Replicate the leader's assignment, then answer every waiting sync of the generation."""
        try:
            result = await self._submit(
                part,
                lambda now, cepoch: StoreAssignment(
                    group_id=group_id, generation_id=plan.generation_id, assignments=plan.assignments,
                    now_ms=now, coordinator_epoch=cepoch,
                ),
            )  # fmt: skip
        except BrokerError as exc:
            if self._live.get(part.partition, {}).get(group_id) is m:
                log.warning("group %s: assignment not stored (%s); members must rejoin", group_id, exc)
                m.assignment_failed(self._clock.now_ms())
                self._syncs.fail_group(group_id, exc)
                self._wake.set()
            return
        if self._live.get(part.partition, {}).get(group_id) is not m:
            return  # leadership moved meanwhile; the waiters were failed then
        assert isinstance(result, GroupStored), result
        for answer in m.assignment_stored(result.metadata):
            self._syncs.resolve(group_id, answer.member_id, answer)
        self._settle_syncs(group_id, m)
        log.info("group %s: generation %d assigned by its leader", group_id, result.metadata.generation_id)

    def heartbeat(self, group_id: str, member_id: str, generation_id: int) -> None:
        part = self.leading(group_id)
        err = self._membership(part, group_id, member_id).heartbeat(member_id, generation_id, self._clock.now_ms())
        if err is not None:
            raise err

    def leave(self, group_id: str, member_id: str) -> None:
        part = self.leading(group_id)
        m = self._membership(part, group_id, member_id)
        err = m.leave(member_id, self._clock.now_ms())
        if err is not None:
            raise err
        left = BrokerError(ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} left the group")
        self._joins.fail(group_id, member_id, left)
        self._syncs.fail(group_id, member_id, left)
        self._settle_syncs(group_id, m)
        self._wake.set()

    def _fail_waiters(self, group_id: str, error: BrokerError) -> None:
        self._joins.fail_group(group_id, error)
        self._syncs.fail_group(group_id, error)

    async def _run_timers(self) -> None:
        """Session expiry, rebalance deadlines and subscribed-topic changes, for every led group."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._next_wait())
            self._wake.clear()
            try:
                self._tick()
            except Exception:
                log.exception("group coordinator timers failed")

    def _next_wait(self) -> float:
        deadlines = [d for groups in self._live.values() for m in groups.values() if (d := m.next_deadline())]
        if not deadlines:
            return _MAX_TIMER_WAIT_S
        return min(_MAX_TIMER_WAIT_S, max(0.005, (min(deadlines) - self._clock.now_ms()) / 1000))

    def _tick(self) -> None:
        now = self._clock.now_ms()
        counts = self._partition_counts()
        for part in list(self.groups.local.values()):
            if not part.group.is_leader():
                if part.partition in self._live:
                    self._drop(part.partition, self.groups.not_coordinator(part.partition))
                continue
            self._ensure_loaded(part)
            groups = self._live[part.partition]
            for group_id, m in list(groups.items()):
                for mid in m.tick(now, counts):
                    log.info("group %s: member %s expired (no heartbeat within its session timeout)", group_id, mid)
                    self._syncs.fail(group_id, mid, BrokerError(ErrorCode.UNKNOWN_MEMBER_ID, f"{mid!r} expired"))
                self._settle_syncs(group_id, m)
                if m.ready(now) and group_id not in self._completions:
                    plan = m.begin_completion(now, counts)
                    for mid in plan.removed:
                        log.info("group %s: member %s removed (did not rejoin in the rebalance timeout)", group_id, mid)
                    track_task(self._completions, group_id, self._complete(part, group_id, m, plan))
                elif m.idle and group_id not in self._assignments:
                    del groups[group_id]  # nothing live left; the stored metadata is the whole state

    async def _complete(self, part: GroupPartition, group_id: str, m: GroupMembership, plan: RebalancePlan) -> None:
        """Replicate a rebalance's plan, then form the generation and answer the waiting joins."""
        try:
            result = await self._submit(
                part,
                lambda now, cepoch: StoreGroup(
                    group_id=group_id, protocol=plan.protocol, leader_id=plan.leader_id, members=plan.members,
                    topic_partitions=plan.topic_partitions, protocol_type=plan.protocol_type, now_ms=now,
                    coordinator_epoch=cepoch,
                ),
            )  # fmt: skip
        except BrokerError as exc:
            if self._live.get(part.partition, {}).get(group_id) is m:
                log.warning("group %s: rebalance not stored (%s); members must rejoin", group_id, exc)
                m.completion_failed(self._clock.now_ms())
                self._fail_waiters(group_id, exc)
            return
        if self._live.get(part.partition, {}).get(group_id) is not m:
            return  # leadership moved meanwhile; the waiters were failed then
        assert isinstance(result, GroupStored), result
        for answer in m.complete(result.metadata, self._clock.now_ms()):
            self._joins.resolve(group_id, answer.member_id, answer)
        self._settle_syncs(group_id, m)
        self._metrics.group_rebalanced(group_id)
        log.info(
            "group %s: generation %d with %d member(s)", group_id, result.metadata.generation_id,
            len(result.metadata.members),
        )  # fmt: skip
        self._wake.set()

    # ---- offsets --------------------------------------------------------------------------------

    def _precheck(self, part: GroupPartition, cmd: CommitOffsets | TxnCommitOffsets, transactional: bool) -> None:
        """Fail fast on the leader: live membership (ahead of the stored one), then the stored rules."""
        m = self._live.get(part.partition, {}).get(cmd.group_id)
        err = m.validate_commit(cmd.member_id, cmd.generation_id, transactional=transactional) if m else None
        result = err if err is not None else part.sm.preview(cmd)
        if isinstance(result, BrokerError):
            raise result

    async def commit_offsets(
        self, group_id: str, offsets: tuple[OffsetCommit, ...], generation_id: int = NO_GENERATION, member_id: str = ""
    ) -> OffsetsCommitted:
        part = self.leading(group_id)

        def build(now: int, cepoch: int) -> CommitOffsets:
            return CommitOffsets(
                group_id=group_id, offsets=offsets, generation_id=generation_id, member_id=member_id,
                now_ms=now, coordinator_epoch=cepoch,
            )  # fmt: skip

        self._precheck(part, build(self._clock.now_ms(), part.group.term()), transactional=False)
        result = await self._submit(part, build)
        assert isinstance(result, OffsetsCommitted), result
        return result

    async def txn_commit_offsets(
        self,
        group_id: str,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        offsets: tuple[OffsetCommit, ...],
        generation_id: int = NO_GENERATION,
        member_id: str = "",
        *,
        verify_only: bool = False,
    ) -> OffsetsCommitted:
        """TxnOffsetCommit: pending until the transaction's marker reaches this partition.

        ``verify_only``: the classic protocol, whose client puts the offsets partition into the
        transaction with AddOffsetsToTxn first: INVALID_TXN_STATE if it did not (nothing is added here).
        """
        part = self.leading(group_id)

        def build(now: int, cepoch: int) -> TxnCommitOffsets:
            return TxnCommitOffsets(
                group_id=group_id, transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=producer_epoch, offsets=offsets, generation_id=generation_id, member_id=member_id,
                now_ms=now, coordinator_epoch=cepoch,
            )  # fmt: skip

        try:
            self._precheck(part, build(self._clock.now_ms(), part.group.term()), transactional=True)
            pending_previous = False
        except BrokerError as exc:
            # The previous transaction's offsets still wait for its marker (EndTxn answers before the markers):
            # the verification below waits for them on the coordinator, then the rules are checked again.
            if exc.error_code is not ErrorCode.CONCURRENT_TRANSACTIONS:
                raise
            pending_previous = True
        # KIP-890: the offsets partition must be in the producer's ongoing transaction (added if needed),
        # so the transaction's marker is sure to reach these pending offsets.
        await self._txn.verify_partition(transactional_id, producer_id, producer_epoch, OFFSETS_TOPIC,
                                         part.partition, part.sm.producer(producer_id),
                                         add=not verify_only)  # fmt: skip
        if pending_previous:
            # Verification returned once the previous transaction completed, i.e. after its marker was
            # applied here (this node leads the offsets partition): the rules hold now, or the answer stands.
            self._precheck(part, build(self._clock.now_ms(), part.group.term()), transactional=True)
        result = await self._submit(part, build)
        assert isinstance(result, OffsetsCommitted), result
        return result

    def fetch_offsets(
        self,
        group_id: str,
        topics: Collection[str] | None = None,
        *,
        partitions: Collection[TopicPartition] | None = None,
        require_stable: bool = False,
    ) -> list[dict[str, Any]]:
        found = self.committed_offsets(group_id, topics, partitions=partitions, require_stable=require_stable)
        return [_offset_json(c) for c in found]

    def committed_offsets(
        self,
        group_id: str,
        topics: Collection[str] | None = None,
        *,
        partitions: Collection[TopicPartition] | None = None,
        require_stable: bool = False,
    ) -> list[CommittedOffset]:
        """``fetch_offsets``' offsets as committed (with Kafka's committed leader epoch)."""
        part = self.leading(group_id)
        return part.sm.fetch_offsets(group_id, topics, partitions=partitions, require_stable=require_stable)

    async def add_offsets_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                 group_id: str) -> int:  # fmt: skip
        """AddOffsetsToTxn (on the transaction coordinator): the group's offsets partition joins the transaction."""
        p = self.partition_for(group_id)
        await self._txn.add_partitions(transactional_id, producer_id, producer_epoch,
                                             [TopicPartition(OFFSETS_TOPIC, p)])  # fmt: skip
        return p

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.count:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{OFFSETS_TOPIC} has no partition {partition}")

    async def write_txn_marker(
        self, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int, control: ControlType,
        classic: bool = False,
    ) -> TxnMarkerResult:  # fmt: skip
        """A transaction's COMMIT/ABORT marker for ``__consumer_offsets-partition``: here, or on its leader.

        ``classic``: the marker of a classic-protocol transaction (its epoch may be the pending offsets' own).
        """
        self._check_partition(partition)
        local = self.groups.local.get(partition)
        if local is not None and local.group.is_leader():
            return await self.write_txn_marker_here(
                partition, producer_id, producer_epoch, coordinator_epoch, control, classic
            )
        leader = self.groups.leader_id(partition)
        if leader is None or leader == self._nodes.node_id:
            raise self.groups.not_coordinator(partition)
        body = await self._peers.call(
            leader,
            "/v1/internal/groups/marker",
            {
                "partition": partition,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "coordinator_epoch": coordinator_epoch,
                "control_type": control.name,
                "classic": classic,
            },
        )
        return TxnMarkerResult(control, None, None, int(body.get("log_append_time", -1)))

    async def write_txn_marker_here(
        self, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int, control: ControlType,
        classic: bool = False,
    ) -> TxnMarkerResult:  # fmt: skip
        self._check_partition(partition)
        part = self.groups.leading(partition)
        stamp = self._clock.now_ms()
        await self._submit(
            part,
            lambda now, cepoch: WriteTxnMarker(
                producer_id=producer_id, producer_epoch=producer_epoch, txn_coordinator_epoch=coordinator_epoch,
                commit=control is ControlType.COMMIT, now_ms=now, coordinator_epoch=cepoch, classic=classic,
            ),
        )  # fmt: skip
        return TxnMarkerResult(control, None, None, stamp)

    async def _expire_producers(self) -> None:
        """Forget idle producer fences (no pending offsets) so the state does not grow with every producer."""
        while True:
            await asyncio.sleep(_PRODUCER_SCAN_S)
            now = self._clock.now_ms()
            for part in list(self.groups.local.values()):
                if not part.group.is_leader():
                    continue
                idle = [
                    f for f in part.sm.producers()
                    if f.open_epoch is None and f.last_update_ms + DEFAULT_PRODUCER_EXPIRATION_MS <= now
                ]  # fmt: skip
                if idle:
                    with contextlib.suppress(BrokerError):
                        await self._submit(part, lambda n, c: ExpireProducers(now_ms=n, coordinator_epoch=c))

    # ---- administration: DeleteGroups and offset resets (kafka-consumer-groups.sh) ----------------

    async def _settle_empty(self, part: GroupPartition, group_id: str) -> None:
        """The last member just left: store the memberless generation first (a Kafka admin deletes a group
        right after its consumers close; Kafka's group is Empty as soon as the last member leaves)."""
        m = self._live.get(part.partition, {}).get(group_id)
        if m is None or m.members or (m.state is not GroupState.PREPARING_REBALANCE and m.completing is None):
            return
        self._tick()
        task = self._completions.get(group_id)
        if task is not None:
            await asyncio.wait({task}, timeout=self.config.request_timeout_ms / 1000)

    def _require_inactive(self, part: GroupPartition, group_id: str, why: str) -> None:
        """``NON_EMPTY_GROUP`` while the group has members or a rebalance is under way (live or stored)."""
        m = self._live.get(part.partition, {}).get(group_id)
        meta = part.sm.group(group_id)
        members = len(m.members) if m is not None else len(meta.members) if meta is not None else 0
        busy = m is not None and (m.state is not GroupState.EMPTY or m.completing is not None)
        if members or busy or group_id in self._completions:
            state = m.state if m is not None else GroupState.STABLE
            raise BrokerError(
                ErrorCode.NON_EMPTY_GROUP,
                f"{why} if the group {group_id!r} is inactive, but the current state is {state} "
                f"with {members} member(s)",
            )

    async def delete_group(self, group_id: str) -> dict[str, Any]:
        """DeleteGroups: an empty group's metadata and committed offsets go (``group_rules.delete_group``)."""
        part = self.leading(group_id)
        await self._settle_empty(part, group_id)
        self._require_inactive(part, group_id, "A group can only be deleted")
        result = await self._submit(
            part, lambda now, cepoch: DeleteGroup(group_id=group_id, now_ms=now, coordinator_epoch=cepoch)
        )
        assert isinstance(result, GroupDeleted), result
        live = self._live.get(part.partition, {})
        m = live.get(group_id)
        if m is not None and not m.members and m.state is GroupState.EMPTY and m.completing is None:
            del live[group_id]
        log.info("group %s deleted with %d committed offset(s)", group_id, result.offsets)
        return {"group_id": group_id, "deleted": True, "offsets_deleted": result.offsets}

    async def delete_offsets(self, group_id: str, partitions: Collection[TopicPartition]) -> OffsetsDeleted:
        """OffsetDelete: the partitions' committed offsets go, except those of topics a member subscribes to
        (live members too, ahead of the stored generation; ``OffsetsDeleted.subscribed``)."""
        part = self.leading(group_id)
        m = self._live.get(part.partition, {}).get(group_id)
        live = {t for mm in m.members.values() for t in mm.meta.topics} if m is not None else set()
        named = tuple(sorted((tp.topic, tp.partition) for tp in set(partitions) if tp.topic not in live))
        subscribed = {tp for tp in partitions if tp.topic in live}
        result = OffsetsDeleted(group_id, 0, ())
        if named or m is None:
            result = await self._submit(part, lambda now, cepoch: DeleteOffsets(
                group_id=group_id, partitions=named, now_ms=now, coordinator_epoch=cepoch))  # fmt: skip
            assert isinstance(result, OffsetsDeleted), result
        return replace(result, subscribed=tuple(sorted(subscribed | set(result.subscribed))))

    async def reset_offsets(
        self, group_id: str, topic: str, partitions: Collection[int] | None, to: ResetTo, *, execute: bool
    ) -> dict[str, Any]:
        """The new offset of each partition of ``topic`` (all, or ``partitions``); with ``execute`` one commit.

        Refused with ``NON_EMPTY_GROUP`` (nothing written) while the group has
        members. The partitions' offsets come from their leaders; a group that
        does not exist yet gets the offsets (as with Kafka's tool).
        """
        why = "Assignments can only be reset"
        part = self.leading(group_id)
        await self._settle_empty(part, group_id)
        self._require_inactive(part, group_id, why)
        count = len(self._topics.topic(topic).partitions)
        chosen = sorted(set(partitions)) if partitions is not None else list(range(count))
        for p in chosen:
            if not 0 <= p < count:
                raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {p}")
        ts = to.value if to.kind == "timestamp" else None
        bound = asyncio.Semaphore(_MAX_LOOKUPS)

        async def lookup(p: int) -> LogOffsets:
            async with bound:
                return await self.offsets.log_offsets(topic, p, ts)

        found = await asyncio.gather(*(lookup(p) for p in chosen))
        logs: dict[int, LogOffsets] = dict(zip(chosen, found, strict=True))
        part = self.leading(group_id)  # still the coordinator after the lookups
        rows = reset_rows(topic, chosen, to, logs, part.sm.committed_offsets(group_id))
        if execute:
            self._require_inactive(part, group_id, why)  # a member may have joined during the lookups
            offsets = tuple(OffsetCommit(r["topic"], r["partition"], r["new_offset"]) for r in rows)
            try:
                await self._submit(
                    part,
                    lambda now, cepoch: CommitOffsets(
                        group_id=group_id, offsets=offsets, now_ms=now, coordinator_epoch=cepoch
                    ),
                )
            except BrokerError as exc:
                if exc.error_code is ErrorCode.UNKNOWN_MEMBER_ID:  # the stored group gained members meanwhile
                    msg = f"{why} if the group {group_id!r} is inactive"
                    raise BrokerError(ErrorCode.NON_EMPTY_GROUP, msg) from exc
                raise
            log.info("group %s: offsets of %s reset to %s on %d partition(s)", group_id, topic, to.to_json(), len(rows))
        return {"group_id": group_id, "topic": topic, "dry_run": not execute, "to": to.to_json(), "offsets": rows}

    # ---- reads (``GroupViews``) ------------------------------------------------------------------

    def describe(self, group_id: str) -> dict[str, Any]:
        """DescribeGroups plus offsets (``GroupViews.describe``); ``Dead`` for a group the coordinator does not know."""
        return self.views.describe(self.leading(group_id), group_id)

    def kafka_group(self, group_id: str) -> tuple[dict[str, Any], list[KafkaMember]]:
        """Kafka's DescribeGroups: the group's summary and its members as Kafka shows them."""
        return self.views.kafka_group(self.leading(group_id), group_id)

    def local_groups(self) -> list[dict[str, Any]]:
        """Groups of the partitions this node leads (each group is listed by exactly one node)."""
        out = []
        for part in self.groups.local.values():
            if part.group.is_leader():
                self._ensure_loaded(part)
                out.extend(self.views.listing(part))
        return out

    def sample(self) -> GroupCoordinatorSample:
        led = sorted((p for p in self.groups.local.values() if p.group.is_leader()), key=lambda p: p.partition)
        return self.views.sample(led)
