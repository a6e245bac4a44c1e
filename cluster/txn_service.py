"""Transaction coordinators: the ``__transaction_state-p`` groups at work (DESIGN.md "Transaction").

The coordinator for transactional id T is the ready leader of partition
``coordinator_partition(T, N)``. Every state change is a command replicated
through that partition's Raft group and decided in
``TransactionStateMachine.apply``; this module only builds commands (stamping
the leader's clock, its Raft term as coordinator epoch, and a fresh producer
id when one may be needed), submits them, and carries out what the applied
state asks for:

* **markers**: a PrepareCommit/PrepareAbort state carries a ``MarkerPlan``;
  the leader writes a COMMIT/ABORT marker to every partition of the
  transaction (retrying until each partition applied it), then submits
  CompleteTxn. A new leader resumes every plan it finds (``pending_completions``).
  EndTxn answers as soon as its PrepareCommit/PrepareAbort is applied (the
  decision is durable; DESIGN.md "Transaction", Kafka's behaviour), unless the
  caller asks to wait for completion or the transaction was Prepared for an
  external coordinator, which relies on visibility when its call returns.
* **the next transaction begins while the previous one's markers are written**
  (pipelined adds): while an id is in PrepareCommit/PrepareAbort after an
  EndTxn, AddPartitions/AddOffsets and the implicit add of KIP-890
  (``verify_here``) record the client's next transaction's partitions at once
  (``next_partitions``; CompleteTxn opens it) and answer once the previous
  transaction's marker is written on each of those partitions it also
  touched -- the Raft round of the add and the marker writes overlap. A
  partition therefore admits a batch of the next transaction only after the
  previous one's marker is in its log. InitProducerId, EndTxn and Prepare
  still wait for the whole marker driver (bounded by the request timeout)
  instead of answering CONCURRENT_TRANSACTIONS at once; only a wait that runs
  out answers it (retriable).
* **timeouts**: a periodic scan fences and aborts Ongoing transactions past
  their timeout and Prepared ones past ``transaction_max_prepared_ms``, and
  expires idle transactional ids.
* **commit groups**: prepared transactions bound to a group are decided by
  one write-once record on the group's partition, then resolved member by
  member (``coordinator.group_commit`` has the design).
* **produce-side verification** (KIP-890): a transactional batch that would
  open a transaction on a partition is admitted only once the coordinator has
  the partition in the transaction; the first such produce adds it (TV2's
  implicit AddPartitions).

Calls that must reach another node's coordinator go through HMAC-signed
internal endpoints (``cluster.txn_http``). Everything here runs on the
asyncio loop; state machine callbacks arrive on Raft threads and only hand off.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from clients.protocol import BrokerError, ControlType, ErrorCode
from coordinator.commands import (
    AddPartitions,
    BindPrepared,
    Command,
    CompleteTxn,
    DecideGroup,
    EndTxn,
    ExpireTransactionalId,
    FenceAndAbort,
    GroupMember,
    GroupMemberDone,
    InitProducerId,
    Prepare,
    ResolvePrepared,
    encode_command,
)
from coordinator.group_commit import GroupDecision, GroupDecisionResult, member_commits
from coordinator.group_metadata import OFFSETS_TOPIC
from coordinator.metadata import MarkerPlan, TopicPartition, TransactionMetadata
from coordinator.placement import coordinator_partition
from coordinator.results import (
    AddPartitionsResult,
    CompleteTxnResult,
    EndTxnResult,
    InitProducerIdResult,
    PrepareResult,
)
from coordinator.scans import producer_id_needed
from coordinator.state_machine import TransactionStateMachine
from coordinator.states import OPEN_STATES, TransactionState
from coordinator.transitions import Identity, classify
from raft import NotLeaderError, QueueFullError, RaftCommandFailed, RaftTimeoutError

from .internal_groups import InternalGroups, InternalPartition
from .metrics import CoordinatorKind, TransactionSample, TxnOutcome
from .txn_adds import AddsInFlight, PartitionHints
from .txn_tokens import CarriedMarker

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger(__name__)

TXN_STATE_KIND = "__transaction_state"
_VERIFIED_CACHE = 100_000
_MARKER_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
_COUNTED_KEPT = 10_000  # plans remembered as counted completed (a fold and a driver may both see one complete)

TxnPartition = InternalPartition[TransactionStateMachine]

#: Identities whose request waits for the previous transaction's markers: the client's current and
#: next identity (it is ahead of the markers); EndTxn adds its retry identity (its answer was lost).
_WAITING_IDENTITIES = frozenset({Identity.CURRENT, Identity.NEXT})


def now_ms() -> int:
    return int(time.time() * 1000)


def txn_storage_prefix(partition: int) -> bytes:
    return b"X" + partition.to_bytes(4, "big")


def _fence_and_abort(m: TransactionMetadata) -> Callable[[int, int], Command]:
    def build(now: int, cepoch: int) -> Command:
        return FenceAndAbort(
            transactional_id=m.transactional_id,
            producer_id=m.producer_id,
            producer_epoch=m.producer_epoch,
            now_ms=now,
            coordinator_epoch=cepoch,
        )

    return build


def _expire(m: TransactionMetadata, expiration_ms: int) -> Callable[[int, int], Command]:
    def build(now: int, cepoch: int) -> Command:
        return ExpireTransactionalId(
            transactional_id=m.transactional_id,
            producer_id=m.producer_id,
            producer_epoch=m.producer_epoch,
            now_ms=now,
            coordinator_epoch=cepoch,
            expiration_ms=expiration_ms,
        )

    return build


@dataclass(frozen=True, slots=True)
class EndTxnAnswer:
    """EndTxn's result and the transaction's state when the call answered (Prepare* or Complete*)."""

    result: EndTxnResult
    state: TransactionState
    # Carried markers: per data partition of the ended transaction, the token for the next one's first batch.
    tokens: dict[TopicPartition, bytes] = dataclasses.field(default_factory=dict)


_K = TypeVar("_K")


def _driver_for_term(
    drivers: dict[_K, tuple[int, asyncio.Task[None]]],
    key: _K,
    term: int,
    start: Callable[[], asyncio.Task[None]],
    on_end: Callable[[], object] | None = None,
) -> asyncio.Task[None]:
    """The running driver of ``key`` for ``term``, started with ``start()`` if there is none.

    A driver of an earlier term that is still waiting on a call (a marker to
    a paused node) is left to end on its own -- it completes nothing once
    the term changed -- so the new term gets its own. When a driver ends
    while still the registered one, its entry goes and ``on_end`` runs.
    """
    held = drivers.get(key)
    if held is not None and held[0] == term and not held[1].done():
        return held[1]
    task = start()
    drivers[key] = (term, task)

    def ended(t: asyncio.Task[None]) -> None:
        current = drivers.get(key)
        if current is not None and current[1] is t:
            del drivers[key]
            if on_end is not None:
                on_end()

    task.add_done_callback(ended)
    return task


class TransactionService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        cfg = broker.config
        self.count = cfg.transaction_state_partitions
        self.groups: InternalGroups[TransactionStateMachine] = InternalGroups(
            TXN_STATE_KIND,
            self.count,
            cfg,
            broker.raft,
            broker.peers,
            self._make_sm,
            on_leader_change=self._on_leader_change,
        )
        # Marker drivers and commit-group drivers, each with the Raft term it was started for: a driver of an
        # earlier term may still be finishing a call when this node leads again (it then ends without
        # completing anything), so a new term always gets a driver of its own.
        self._drivers: dict[tuple[str, int, int], tuple[int, asyncio.Task[None]]] = {}
        # Per running driver: one future per partition, done once that partition's marker is written.
        self._written: dict[tuple[str, int, int], dict[TopicPartition, asyncio.Future[None]]] = {}
        self._group_drivers: dict[str, tuple[int, asyncio.Task[None]]] = {}
        self._verified: OrderedDict[tuple[str, int, int, str, int], None] = OrderedDict()
        # Verifications under way: the batches a producer sends behind a transaction's first batch to a
        # partition share its verification instead of each asking the coordinator.
        self._verifying: dict[tuple[str, int, int, str, int], asyncio.Future[None]] = {}
        self._abort_reason: dict[str, TxnOutcome] = {}
        # Plans whose completion was counted in txbroker_transactions_completed_total (newest last, bounded): the
        # fold and a driver whose reservation timer fired may both see the same transaction complete.
        self._counted: OrderedDict[tuple[str, int, int], None] = OrderedDict()
        self._hints = PartitionHints()  # a transaction's first add also adds the previous one's partitions
        self._adds = AddsInFlight()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        # Carried markers (docs/carried-markers.md), per plan key: the carried partitions settled so far (True:
        # the next transaction already wrote there), a lock that makes settling one plan's partitions serial,
        # and an event that wakes the plan's driver early (the fold completed it, or a caller needs it done).
        self._settled: dict[tuple[str, int, int], dict[TopicPartition, bool]] = {}
        self._settle_locks: dict[tuple[str, int, int], asyncio.Lock] = {}
        self._wake_driver: dict[tuple[str, int, int], asyncio.Event] = {}

    # ---- lifecycle ------------------------------------------------------------------------

    def _make_sm(self, partition: int) -> TransactionStateMachine:
        sm = TransactionStateMachine(self.broker.store, txn_storage_prefix(partition), partition)
        loop = self.broker.loop

        def on_markers(plan: MarkerPlan) -> None:  # Raft thread
            loop.call_soon_threadsafe(self._plan_ready, partition, plan)

        def on_decision(decision: GroupDecision) -> None:  # Raft thread
            loop.call_soon_threadsafe(self._decision_ready, partition, decision)

        sm.on_markers = on_markers
        sm.on_group_decision = on_decision
        return sm

    def start(self) -> None:
        self.groups.start()
        self.broker.metrics.set_transaction_source(self.sample)
        interval = self.broker.config.transaction_abort_scan_interval_ms / 1000
        self._tasks.append(self.broker.loop.create_task(self._every(interval, self._scan)))

    async def close(self) -> None:
        self._closing = True
        tasks = [*self._tasks, *(t for _, t in self._drivers.values()), *(t for _, t in self._group_drivers.values())]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.groups.stop()

    async def _every(self, interval: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except Exception:
                log.exception("transaction background task failed")

    def _on_leader_change(self, part: TxnPartition) -> None:
        if not part.group.is_leader() or self._closing:
            return
        started = time.monotonic()
        plans = part.sm.pending_completions()
        decisions = part.sm.pending_group_decisions()
        self.broker.metrics.coordinator_loaded(CoordinatorKind.TRANSACTION, time.monotonic() - started)
        log.info(
            "%s: coordinator for term %d; resuming %d transaction(s) and %d commit group(s)",
            part.group_id, part.term, len(plans), len(decisions),
        )  # fmt: skip
        for plan in plans:
            self._plan_ready(part.partition, plan)
        for decision in decisions:
            self._decision_ready(part.partition, decision)

    # ---- routing and submitting --------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return coordinator_partition(transactional_id, self.count)

    def coordinator_json(self, key: str) -> dict[str, Any]:
        p = self.partition_for(key)
        node = self.groups.leader_id(p)
        if node is None:
            raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{TXN_STATE_KIND}-{p} has no leader")
        return {"node_id": node, "url": self.broker.node_url(node), "partition": p}

    def leading(self, key: str) -> TxnPartition:
        return self.groups.leading(self.partition_for(key))

    async def _submit(self, part: TxnPartition, build: Callable[[int, int], Command]) -> Any:
        """Propose ``build(now_ms, coordinator_epoch)`` on ``part``; a ``BrokerError`` result is raised."""
        if not part.group.is_leader():
            raise self._not_coordinator(part.partition)
        cmd = build(now_ms(), part.group.term())
        timeout = self.broker.config.request_timeout_ms / 1000
        try:
            result = await part.group.submit(encode_command(cmd), timeout=timeout)
        except NotLeaderError as exc:
            raise self._not_coordinator(part.partition) from exc
        except RaftTimeoutError as exc:
            raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, "coordinator write not committed in time") from exc
        except QueueFullError as exc:
            raise BrokerError(ErrorCode.THROTTLING_QUOTA_EXCEEDED, "coordinator write queue is full") from exc
        except RaftCommandFailed as exc:
            raise self._not_coordinator(part.partition) from exc
        if isinstance(result, BrokerError):
            raise result
        return result

    async def _propose(self, part: TxnPartition, command: type[Command], **fields: Any) -> Any:
        """Submit ``command(**fields)`` stamped with the leader's clock and term (``_submit``)."""
        return await self._submit(part, lambda now, cepoch: command(now_ms=now, coordinator_epoch=cepoch, **fields))

    def _not_coordinator(self, partition: int) -> BrokerError:
        try:
            self.groups.leading(partition)
        except BrokerError as exc:
            return exc
        return BrokerError(ErrorCode.NOT_COORDINATOR, f"{TXN_STATE_KIND}-{partition}: leadership changed")

    async def _candidate(self, meta: TransactionMetadata | None, *, always: bool = False) -> int | None:
        if always or producer_id_needed(meta):
            return await self.broker.producer_ids.next_producer_id()
        return None

    # ---- the transaction API -----------------------------------------------------------------

    async def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected_producer_id: int | None = None,
        expected_producer_epoch: int | None = None,
    ) -> tuple[int, int]:
        """InitProducerId; waits for a completing previous transaction instead of answering CONCURRENT_TRANSACTIONS.

        An Ongoing transaction is fenced and aborted first (Kafka answers
        CONCURRENT_TRANSACTIONS and the client retries): here the abort's
        markers are awaited and the command proposed once more, with the same
        result as the client's retry would get.
        """
        part = self.leading(transactional_id)
        max_timeout = self.broker.config.transaction_max_timeout_ms
        retried = False
        while True:
            await self._await_previous(part, transactional_id)
            before = part.sm.get(transactional_id)
            try:
                result = await self._propose(
                    part,
                    InitProducerId,
                    transactional_id=transactional_id,
                    timeout_ms=timeout_ms,
                    producer_id_candidate=await self._candidate(before),
                    expected_producer_id=expected_producer_id,
                    expected_producer_epoch=expected_producer_epoch,
                    max_timeout_ms=max_timeout,
                )
            except BrokerError as exc:
                # CONCURRENT_TRANSACTIONS that changed the state: this InitProducerId fenced an open transaction.
                fenced = part.sm.get(transactional_id) != before
                if retried or exc.error_code is not ErrorCode.CONCURRENT_TRANSACTIONS or not fenced:
                    raise
                retried = True
                continue
            assert isinstance(result, InitProducerIdResult), result
            self.broker.metrics.producer_ids_allocated.inc()
            return result.producer_id, result.producer_epoch

    async def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Iterable[TopicPartition]
    ) -> AddPartitionsResult:
        """AddPartitionsToTxn / AddOffsetsToTxn; answers once the previous transaction's markers on them are written."""
        tps = self._checked_partitions(partitions)
        part = self.leading(transactional_id)
        return await self._add_ahead(part, transactional_id, producer_id, producer_epoch, tps)

    async def _add_ahead(
        self,
        part: TxnPartition,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        tps: tuple[TopicPartition, ...],
        wait_for: tuple[TopicPartition, ...] | None = None,
    ) -> AddPartitionsResult:
        """Add ``tps``; meanwhile wait for the markers the previous transaction still owes on them.

        In a prepare state the add is recorded for the next transaction
        (``coordinator.transitions._add_next``); the two waits overlap, and the
        answer comes when both are done, so no batch of the next transaction
        can reach a partition ahead of the previous transaction's marker there.
        ``wait_for`` narrows the marker wait to the partitions the caller is
        about to write (a hinted partition waits when its own batch comes).
        """
        meta = part.sm.get(transactional_id)
        plan = meta.marker_plan() if meta is not None else None
        owed = [tp for tp in (tps if wait_for is None else wait_for) if plan is not None and tp in plan.partitions]
        if plan is None or not owed:
            return await self._add_partitions(part, transactional_id, producer_id, producer_epoch, tps)
        markers = asyncio.ensure_future(self._await_markers(part, plan, owed))
        try:
            result = await self._add_partitions(part, transactional_id, producer_id, producer_epoch, tps)
        except BaseException:
            markers.cancel()
            raise
        await markers
        return result

    def _checked_partitions(self, partitions: Iterable[TopicPartition]) -> tuple[TopicPartition, ...]:
        tps = tuple(sorted(set(partitions), key=lambda tp: (tp.topic, tp.partition)))
        for tp in tps:
            if tp.topic == OFFSETS_TOPIC:  # AddOffsetsToTxn / TxnOffsetCommit: a group's offsets partition
                if not 0 <= tp.partition < self.broker.config.offsets_topic_partitions:
                    raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp} does not exist")
                continue
            meta = self.broker.topic(tp.topic)  # UNKNOWN_TOPIC_OR_PARTITION for a missing topic
            if not 0 <= tp.partition < len(meta.partitions):
                raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp.topic} has no partition {tp.partition}")
        return tps

    async def _add_partitions(self, part: TxnPartition, transactional_id: str, producer_id: int, producer_epoch: int,
                              tps: tuple[TopicPartition, ...]) -> AddPartitionsResult:  # fmt: skip
        before = part.sm.get(transactional_id)
        starts = before is None or (before.state not in OPEN_STATES and not before.next_partitions)
        ident = (transactional_id, producer_id, producer_epoch)
        in_flight = self._adds.begin(ident, tps)
        try:
            result = await self._propose(
                part,
                AddPartitions,
                transactional_id=transactional_id,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                partitions=tps,
            )
        finally:
            self._adds.end(ident, in_flight)
        assert isinstance(result, AddPartitionsResult), result
        if starts and result.added:
            self.broker.metrics.txn_started()
        return result

    async def end_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        *,
        wait_for_completion: bool = False,
        receipts: dict[TopicPartition, bytes] | None = None,
    ) -> EndTxnAnswer:
        """EndTxn: answers once PrepareCommit/PrepareAbort is durable; the markers follow in the background.

        ``wait_for_completion`` (and ending a Prepared transaction, whose
        external coordinator expects visibility) answers only after
        CompleteCommit/CompleteAbort, or when the request timeout passes --
        the answer's state says which. A retried EndTxn (the answer was lost)
        or one of the next transaction arriving while the previous one
        completes waits for it first, as the calls that begin a transaction do.

        ``receipts`` (None: the client does not carry markers): the partition leaders' receipts of this
        transaction's batches. With the node setting ``txn_carried_markers`` the markers of the data
        partitions are then carried by the client's next transaction (the answer has their tokens), and
        the previous transaction's carried markers are settled here and completed in the same write
        (docs/carried-markers.md).
        """
        part = self.leading(transactional_id)
        before = part.sm.get(transactional_id)
        carry = receipts is not None and self.broker.config.txn_carried_markers and not wait_for_completion
        settle, settled = False, self._valid_receipts(transactional_id, producer_id, producer_epoch, receipts or {})
        pending = before.marker_plan() if before is not None else None
        folds = (
            carry
            and before is not None
            and pending is not None
            and bool(pending.carried)
            and classify(before, producer_id, producer_epoch) in _WAITING_IDENTITIES
        )
        if folds:
            assert pending is not None
            await self._await_markers(part, pending, pending.explicit)
            used = await self._settle(part, pending, pending.carried, settled)
            settle, settled = used is not None, settled | (used or frozenset())
        else:
            await self._await_previous(part, transactional_id, (producer_id, producer_epoch), retry=True)
            before = part.sm.get(transactional_id)
        carry = carry and not (before is not None and before.state is TransactionState.PREPARED)
        candidate = await self._candidate(before)
        try:
            result = await self._propose(
                part,
                EndTxn,
                transactional_id=transactional_id,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                commit=commit,
                producer_id_candidate=candidate,
                carry=carry,
                settle=settle,
                settled_partitions=tuple(sorted(settled)),
            )
        finally:
            if settle and pending is not None:
                self._wake(pending)  # its driver looks again: the fold completed it, or it settles and completes
        assert isinstance(result, EndTxnResult), result
        if settle and pending is not None:
            self._completed_by_fold(part, pending, before)
        tokens: dict[TopicPartition, bytes] = {}
        if result.markers is not None:
            self._hints.ended(transactional_id, producer_id, producer_epoch)
            task = self._ensure_driver(part, result.markers)
            if wait_for_completion or (before is not None and before.state is TransactionState.PREPARED):
                await self._bounded(task)
            tokens = self._tokens(result.markers, result.producer_id, result.producer_epoch)
        return EndTxnAnswer(result, self._end_state(part, result), tokens)

    async def release(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Iterable[TopicPartition]
    ) -> list[TopicPartition]:
        """Settle now the carried markers the client's current transaction will not use (its unused tokens).

        Only the identity the tokens were given to may release them; anything else (the transaction moved
        on, another identity) releases nothing. Returns the partitions settled by this call or before it.
        """
        part = self.leading(transactional_id)
        meta = part.sm.get(transactional_id)
        plan = meta.marker_plan() if meta is not None else None
        if meta is None or plan is None or not plan.carried:
            return []
        if classify(meta, producer_id, producer_epoch) not in _WAITING_IDENTITIES:
            return []
        tps = sorted(set(partitions) & set(plan.carried))
        if tps:
            await self._settle(part, plan, tps)
        return tps

    def _valid_receipts(
        self, transactional_id: str, producer_id: int, producer_epoch: int, receipts: dict[TopicPartition, bytes]
    ) -> frozenset[TopicPartition]:
        """The partitions whose receipt is the cluster's for this producer and epoch (others are ignored)."""
        check = self.broker.txn_tokens.check_receipt
        return frozenset(
            tp for tp, raw in receipts.items()
            if check(raw, transactional_id, producer_id, producer_epoch, tp.topic, tp.partition)
        )  # fmt: skip

    def _tokens(self, plan: MarkerPlan, next_pid: int, next_epoch: int) -> dict[TopicPartition, bytes]:
        control = ControlType.COMMIT if plan.commit else ControlType.ABORT
        marker = CarriedMarker(control, plan.coordinator_epoch)
        make = self.broker.txn_tokens.token
        return {tp: make(plan.transactional_id, next_pid, next_epoch, tp.topic, tp.partition, marker)
                for tp in plan.carried}  # fmt: skip

    def _completed_by_fold(self, part: TxnPartition, plan: MarkerPlan, before: TransactionMetadata | None) -> None:
        start_ms = before.txn_start_time_ms if before is not None else -1
        self._count_completed(plan, max(0.0, (now_ms() - start_ms) / 1000) if start_ms >= 0 else 0.0)

    def _count_completed(self, plan: MarkerPlan, duration_s: float) -> None:
        """Count ``plan``'s transaction as completed, once.

        A fold whose CompleteTxn raced the driver's (its reservation timer fired while the next EndTxn was in
        flight) finds the transaction already complete: the EndTxn then only adds partitions, and the
        completion was counted by the driver.
        """
        key = self._plan_key(plan)
        if key in self._counted:
            return
        self._counted[key] = None
        while len(self._counted) > _COUNTED_KEPT:
            self._counted.popitem(last=False)
        outcome = TxnOutcome.COMMITTED if plan.commit else self._abort_reason.pop(plan.transactional_id,
                                                                                 TxnOutcome.ABORTED)  # fmt: skip
        self.broker.metrics.txn_completed(outcome, duration_s)

    # ---- carried markers: settling (docs/carried-markers.md) ----------------------------------------

    @staticmethod
    def _plan_key(plan: MarkerPlan) -> tuple[str, int, int]:
        return plan.transactional_id, plan.producer_id, plan.producer_epoch

    def _wake(self, plan: MarkerPlan) -> None:
        self._wake_driver.setdefault(self._plan_key(plan), asyncio.Event()).set()

    async def _settle(
        self,
        part: TxnPartition,
        plan: MarkerPlan,
        tps: Iterable[TopicPartition],
        receipted: frozenset[TopicPartition] = frozenset(),
    ) -> frozenset[TopicPartition] | None:
        """Settle ``plan``'s carried markers on ``tps``: by a receipt, else by a revoking marker.

        Returns the partitions of ``tps`` the next transaction wrote to (settled earlier or now), or None
        if ``plan`` is no longer pending or this node stopped leading before all were settled. Each
        partition settled resolves its marker future (waiting verifications go on).
        """
        key = self._plan_key(plan)
        term = part.group.term()
        lock = self._settle_locks.setdefault(key, asyncio.Lock())
        async with lock:
            meta = part.sm.get(plan.transactional_id)
            if meta is None or meta.marker_plan() != plan:
                return None
            done = self._settled.setdefault(key, {})
            for tp in tps:
                if tp not in done and tp in receipted:
                    done[tp] = True
            todo = [tp for tp in tps if tp not in done]
            results = await asyncio.gather(*(self._revoke(part, plan, tp, term) for tp in todo))
            for tp, used in zip(todo, results, strict=True):
                if used is not None:
                    done[tp] = used
            for tp in tps:
                if tp in done:
                    fut = self._marker_written(plan, tp)
                    if not fut.done():
                        fut.set_result(None)
            if any(tp not in done for tp in tps):
                return None
            return frozenset(tp for tp in tps if done[tp])

    async def _revoke(self, part: TxnPartition, plan: MarkerPlan, tp: TopicPartition, term: int) -> bool | None:
        """A revoking marker on ``tp`` until it is applied: True if the reservation was used; None if deposed."""
        control = ControlType.COMMIT if plan.commit else ControlType.ABORT

        async def send() -> bool:
            res = await self.broker.revoke_txn_marker(
                tp.topic, tp.partition, plan.producer_id, plan.producer_epoch, term, control
            )
            if not res.used:
                self.broker.metrics.txn_marker_written(tp.topic, plan.commit)
            return res.used

        def leading() -> bool:
            return part.group.is_leader() and part.group.term() == term and not self._closing

        # A node that just took over, or a topic just created, may not know the topic yet: a revocation must not
        # take that for "the partition is gone" (it would settle a partition whose marker was never written).
        grace = self.broker.config.request_timeout_ms / 1000
        return await self._marker_until_applied(send, False, plan, tp, leading, "revoking marker", grace)

    @staticmethod
    async def _marker_until_applied(
        send: Callable[[], Awaitable[bool]],
        superseded: bool,
        plan: MarkerPlan,
        tp: TopicPartition,
        still_leading: Callable[[], bool],
        what: str,
        unknown_topic_grace_s: float = 0.0,
    ) -> bool | None:
        """``send()`` a marker until it is applied, with backoff, while ``still_leading()``; its answer.

        ``superseded`` is the answer when the partition is gone or saw a newer epoch of the producer;
        None when a newer coordinator fenced this one or the leadership was lost. An unknown topic counts
        as gone only once it has stayed unknown for ``unknown_topic_grace_s``.
        """
        attempt = 0
        unknown_since: float | None = None
        while still_leading():
            try:
                return await send()
            except BrokerError as exc:
                code = exc.error_code
                if code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    unknown_since = unknown_since if unknown_since is not None else time.monotonic()
                    if time.monotonic() - unknown_since < unknown_topic_grace_s:
                        code = ErrorCode.LEADER_NOT_AVAILABLE  # retried below, like a partition without a leader
                if code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_PRODUCER_EPOCH):
                    log.warning("%s for %s of %s superseded: %s", what, tp, plan.transactional_id, exc)
                    return superseded
                if code is ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                    log.info("%s for %s fenced by a newer coordinator; leaving it to it", what, tp)
                    return None
                if not code.retriable:
                    log.error("%s for %s of %s failed: %s (retrying)", what, tp, plan.transactional_id, exc)
            await asyncio.sleep(_MARKER_BACKOFF_S[min(attempt, len(_MARKER_BACKOFF_S) - 1)])
            attempt += 1
        return None

    def _end_state(self, part: TxnPartition, result: EndTxnResult) -> TransactionState:
        """Prepare* while ``result``'s markers are still owed, else Complete* (the state EndTxn answers with)."""
        pending = result.markers is not None
        if pending:
            meta = part.sm.get(result.transactional_id)
            pending = meta is not None and meta.marker_plan() == result.markers
        if result.commit:
            return TransactionState.PREPARE_COMMIT if pending else TransactionState.COMPLETE_COMMIT
        return TransactionState.PREPARE_ABORT if pending else TransactionState.COMPLETE_ABORT

    async def prepare(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str | None = None
    ) -> PrepareResult:
        part = self.leading(transactional_id)
        await self._await_previous(part, transactional_id, (producer_id, producer_epoch))
        result = await self._propose(
            part,
            Prepare,
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            group_id=group_id,
        )
        assert isinstance(result, PrepareResult), result
        return result

    async def bind_prepared(self, member: GroupMember, group_id: str) -> None:
        part = self.leading(member.transactional_id)
        await self._propose(
            part,
            BindPrepared,
            transactional_id=member.transactional_id,
            producer_id=member.producer_id,
            producer_epoch=member.producer_epoch,
            group_id=group_id,
        )

    async def resolve_prepared(self, member: GroupMember, group_id: str, commit: bool) -> EndTxnResult:
        part = self.leading(member.transactional_id)
        candidate = await self._candidate(None, always=True)
        result = await self._propose(
            part,
            ResolvePrepared,
            transactional_id=member.transactional_id,
            producer_id=member.producer_id,
            producer_epoch=member.producer_epoch,
            group_id=group_id,
            commit=commit,
            producer_id_candidate=candidate,
        )
        assert isinstance(result, EndTxnResult), result
        if result.markers is not None:
            await self._bounded(self._ensure_driver(part, result.markers))
        return result

    async def abort(self, transactional_id: str) -> TransactionMetadata:
        """Admin abort of an open transaction (hanging-transaction tooling): fence, then abort."""
        part = self.leading(transactional_id)
        meta = part.sm.get(transactional_id)
        if meta is None:
            raise BrokerError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"no transactional id {transactional_id!r}")
        if meta.group_id is not None:
            await self._orphan_group_abort(meta)
        else:
            result = await self._submit(part, _fence_and_abort(meta))
            if isinstance(result, EndTxnResult) and result.markers is not None:
                await self._bounded(self._ensure_driver(part, result.markers))
        after = part.sm.get(transactional_id)
        return after if after is not None else meta

    # ---- commit groups ------------------------------------------------------------------------

    async def group_commit(self, group_id: str, members: list[GroupMember], commit: bool) -> GroupDecision:
        """Decide a commit group: bind every member, record the decision once, carry it out.

        Answers when the decision is durable; the members are resolved before
        the answer when that is quick (within the request timeout).
        """
        part = self.leading(group_id)
        existing = part.sm.group_decision(group_id)
        if existing is None and commit:
            # Readiness: every member is Prepared and bound to this group on its own partition.
            await asyncio.gather(*(self._on_member(m, "bind", group_id=group_id) for m in members))
        result = await self._propose(
            part,
            DecideGroup,
            group_id=group_id,
            commit=commit,
            members=tuple(sorted(members)),
        )
        assert isinstance(result, GroupDecisionResult), result
        decision = result.decision
        task = self._ensure_group_driver(part.partition, decision)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), self.broker.config.request_timeout_ms / 1000)
        return decision

    def _decision_ready(self, partition: int, decision: GroupDecision) -> None:
        part = self.groups.local.get(partition)
        if part is not None and part.group.is_leader() and not self._closing:
            self._ensure_group_driver(partition, decision)

    def _ensure_group_driver(self, partition: int, decision: GroupDecision) -> asyncio.Task[None]:
        part = self.groups.local.get(partition)
        term = part.group.term() if part is not None else -1
        return _driver_for_term(
            self._group_drivers,
            decision.group_id,
            term,
            lambda: self.broker.loop.create_task(self._drive_group(partition, decision, term)),
        )

    async def _drive_group(self, partition: int, decision: GroupDecision, term: int) -> None:
        part = self.groups.local.get(partition)
        if part is None:
            return

        async def one(member: GroupMember) -> None:
            attempt = 0
            while part.group.is_leader() and part.group.term() == term and not self._closing:
                try:
                    await self._on_member(member, "resolve", group_id=decision.group_id,
                                          commit=member_commits(decision, member))  # fmt: skip
                    break
                except BrokerError as exc:
                    if exc.error_code in (ErrorCode.INVALID_TXN_STATE, ErrorCode.PRODUCER_FENCED) or (
                        exc.error_code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
                    ):
                        # Already resolved by an earlier attempt (or gone): nothing left to do for it.
                        log.info("group %s member %s: %s", decision.group_id, member.transactional_id, exc)
                        break
                    await asyncio.sleep(_MARKER_BACKOFF_S[min(attempt, len(_MARKER_BACKOFF_S) - 1)])
                    attempt += 1
            else:
                return
            with contextlib.suppress(BrokerError):
                await self._propose(
                    part,
                    GroupMemberDone,
                    group_id=decision.group_id,
                    transactional_id=member.transactional_id,
                )

        await asyncio.gather(*(one(m) for m in decision.pending))

    async def _orphan_group_abort(self, meta: TransactionMetadata) -> None:
        """A group-bound prepared txn must end: propose ABORT for its group, then resolve it by the decision.

        The decision is write-once: if the group was decided before (possibly
        COMMIT, possibly without this member), that decision comes back and
        decides this member's fate (``member_commits``) -- a bound member that
        is not listed in a COMMIT decision is aborted, so it never pins the LSO.
        """
        group_id = meta.group_id
        assert group_id is not None
        commit, members = await self._on_group(group_id, commit=False)
        member = GroupMember(meta.transactional_id, meta.producer_id, meta.producer_epoch)
        try:
            await self._on_member(member, "resolve", group_id=group_id, commit=commit and member in members)
        except BrokerError as exc:
            if exc.error_code not in (ErrorCode.INVALID_TXN_STATE, ErrorCode.PRODUCER_FENCED):
                raise
            log.info("group %s member %s already resolved: %s", group_id, member.transactional_id, exc)

    # ---- calls that may cross nodes -------------------------------------------------------------

    async def _on_member(self, member: GroupMember, op: str, **kw: Any) -> None:
        """Run a member operation on the member's coordinator, local or remote."""
        p = self.partition_for(member.transactional_id)
        local = self.groups.local.get(p)
        if local is not None and local.group.is_leader():
            if op == "bind":
                await self.bind_prepared(member, kw["group_id"])
            else:
                await self.resolve_prepared(member, kw["group_id"], kw["commit"])
            return
        body = {
            "transactional_id": member.transactional_id,
            "producer_id": member.producer_id,
            "producer_epoch": member.producer_epoch,
            **kw,
        }
        await self._remote(p, f"/v1/internal/txn/{op}", body)

    async def _on_group(self, group_id: str, commit: bool) -> tuple[bool, set[GroupMember]]:
        """Propose ``commit`` for the group (write-once) on its coordinator; the recorded decision."""
        p = self.partition_for(group_id)
        local = self.groups.local.get(p)
        if local is not None and local.group.is_leader():
            decision = await self.group_commit(group_id, [], commit)
            return decision.commit, set(decision.members)
        body = await self._remote(p, "/v1/internal/txn/decide", {"group_id": group_id, "commit": commit})
        members = {GroupMember(m["transactional_id"], m["producer_id"], m["producer_epoch"]) for m in body["members"]}
        return bool(body["committed"]), members

    async def _remote(self, partition: int, path: str, body: dict[str, Any]) -> Any:
        node = self.groups.leader_id(partition)
        if node is None or node == self.broker.config.node_id:
            raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{TXN_STATE_KIND}-{partition} has no leader")
        forward = self.broker._forward
        if forward is None:
            raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "internal forwarding is not set up")
        return await forward(node, "POST", path, body)

    # ---- markers ---------------------------------------------------------------------------------

    def _plan_ready(self, partition: int, plan: MarkerPlan) -> None:
        part = self.groups.local.get(partition)
        if part is not None and part.group.is_leader() and not self._closing:
            self._ensure_driver(part, plan)

    def _ensure_driver(self, part: TxnPartition, plan: MarkerPlan) -> asyncio.Task[None]:
        """The running driver of ``plan`` for this node's current term (``_driver_for_term``)."""
        key = (plan.transactional_id, plan.producer_id, plan.producer_epoch)
        term = part.group.term()
        return _driver_for_term(
            self._drivers,
            key,
            term,
            lambda: self.broker.loop.create_task(self._drive(part, plan, term)),
            on_end=lambda: self._written.pop(key, None),
        )

    def _marker_written(self, plan: MarkerPlan, tp: TopicPartition) -> asyncio.Future[None]:
        """The future a running driver of ``plan`` completes once the marker on ``tp`` is written."""
        futures = self._written.setdefault((plan.transactional_id, plan.producer_id, plan.producer_epoch), {})
        fut = futures.get(tp)
        if fut is None:
            fut = futures[tp] = asyncio.get_running_loop().create_future()
        return fut

    async def _await_markers(self, part: TxnPartition, plan: MarkerPlan, tps: Iterable[TopicPartition]) -> None:
        """Return once ``plan``'s markers on ``tps`` are written (or the plan completed), else raise.

        Bounded by the request timeout; if the driver ends without writing
        them (this node lost the leadership), or the wait runs out, the answer
        is CONCURRENT_TRANSACTIONS (retriable: the client resends, and the
        verification runs again wherever the coordinator is then).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.broker.config.request_timeout_ms / 1000
        carried = [tp for tp in tps if tp in plan.carried]
        if carried and part.group.is_leader():
            # A carried marker a caller waits for (a verification, an add of the next transaction): settle it
            # now with a revoking marker instead of waiting for the next EndTxn or the reservation timer.
            await self._settle(part, plan, carried)
        gave_up = False  # the driver ended with markers still owed (deposed, or fenced by a newer coordinator)
        while True:
            meta = part.sm.get(plan.transactional_id)
            if meta is None or meta.marker_plan() != plan:
                return  # CompleteTxn applied: every marker is written
            if gave_up or not part.group.is_leader() or self._closing:
                break
            task = self._ensure_driver(part, plan)
            pending = {fut for fut in (self._marker_written(plan, tp) for tp in tps) if not fut.done()}
            if not pending:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.wait({*pending, task}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            gave_up = task.done() and any(not fut.done() for fut in pending)
        raise BrokerError(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"the previous transaction of {plan.transactional_id!r} is still writing its markers",
        )

    async def _bounded(self, task: asyncio.Task[None], timeout: float | None = None) -> bool:
        """Wait for a driver task for at most ``timeout`` (default: the request timeout); True if it ended.

        The task itself is never cancelled by the wait (it is the background
        work every waiter shares) and its failure is not the waiter's: the
        state machine, re-read afterwards, tells what happened.
        """
        if timeout is None:
            timeout = self.broker.config.request_timeout_ms / 1000
        done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout))
        return bool(done)

    async def _await_previous(
        self,
        part: TxnPartition,
        transactional_id: str,
        identity: tuple[int, int] | None = None,
        *,
        retry: bool = False,
    ) -> None:
        """While the id's previous transaction writes its markers, wait for its driver (bounded).

        Kafka answers CONCURRENT_TRANSACTIONS to a call that would begin the
        next transaction during PrepareCommit/PrepareAbort, and the client
        retries after a backoff; waiting here lets it begin as soon as
        CompleteTxn is applied, in the same request. Only a request from the
        client's current/next identity waits (``retry``: EndTxn's retry
        identity too); ``identity`` None (InitProducerId) always waits. When
        the request timeout passes, or the driver ends without completing (this
        node lost the leadership), the caller goes on and the state machine
        answers as before (CONCURRENT_TRANSACTIONS, NOT_COORDINATOR).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.broker.config.request_timeout_ms / 1000
        awaited: MarkerPlan | None = None
        while True:
            meta = part.sm.get(transactional_id)
            plan = meta.marker_plan() if meta is not None else None
            if meta is None or plan is None or plan == awaited:
                return
            if identity is not None:
                ident = classify(meta, *identity)
                if ident not in _WAITING_IDENTITIES and not (retry and ident is Identity.RETRY):
                    return
            if not part.group.is_leader() or self._closing:
                return
            awaited = plan
            task = self._ensure_driver(part, plan)
            if plan.carried:
                self._wake(plan)  # settle the carried markers now: this caller needs the transaction complete
            if not await self._bounded(task, deadline - loop.time()):
                return

    async def _drive(self, part: TxnPartition, plan: MarkerPlan, term: int) -> None:
        """Write every marker of ``plan``, then CompleteTxn -- for as long as this node leads ``term``."""
        control = ControlType.COMMIT if plan.commit else ControlType.ABORT
        started = time.monotonic()
        meta = part.sm.get(plan.transactional_id)
        start_ms = meta.txn_start_time_ms if meta is not None else -1

        def still_leading() -> bool:
            return part.group.is_leader() and part.group.term() == term and not self._closing

        async def one(tp: TopicPartition) -> bool:
            written = await write(tp)
            if written:
                fut = self._marker_written(plan, tp)
                if not fut.done():
                    fut.set_result(None)
            return written

        async def write(tp: TopicPartition) -> bool:
            async def send() -> bool:
                await self.broker.write_txn_marker(
                    tp.topic, tp.partition, plan.producer_id, plan.producer_epoch, term, control
                )
                self.broker.metrics.txn_marker_written(tp.topic, plan.commit)
                return True

            # A partition gone, or one that saw a newer epoch of the producer (the transaction ended there
            # before; a later one has begun): nothing left to write there. "Gone" only once the topic has stayed
            # unknown for the request timeout: a coordinator that just took over may not know it yet, and
            # skipping the marker then would leave the transaction open on that partition for good.
            grace = self.broker.config.request_timeout_ms / 1000
            return bool(await self._marker_until_applied(send, True, plan, tp, still_leading, "marker", grace))

        results = await asyncio.gather(*(one(tp) for tp in sorted(plan.explicit, key=str)))
        if not all(results):
            return
        used: frozenset[TopicPartition] = frozenset()
        if plan.carried:
            settled = await self._await_carried(part, plan, term)
            if settled is None:
                return  # completed by the next EndTxn (the fold), or this node no longer leads
            used = settled
        attempt = 0
        while still_leading():
            try:
                result = await self._propose(
                    part,
                    CompleteTxn,
                    transactional_id=plan.transactional_id,
                    producer_id=plan.producer_id,
                    producer_epoch=plan.producer_epoch,
                    commit=plan.commit,
                    settled_partitions=tuple(sorted(used)),
                )
            except BrokerError as exc:
                if exc.retriable:
                    await asyncio.sleep(_MARKER_BACKOFF_S[min(attempt, len(_MARKER_BACKOFF_S) - 1)])
                    attempt += 1
                    continue
                meta = part.sm.get(plan.transactional_id)
                if meta is not None and meta.marker_plan() == plan:
                    log.error("CompleteTxn of %s failed: %s", plan.transactional_id, exc)
                return  # else completed meanwhile by the next EndTxn (carried markers' fold)
            if isinstance(result, CompleteTxnResult) and not result.already_complete:
                self._count_completed(
                    plan, (now_ms() - start_ms) / 1000 if start_ms >= 0 else time.monotonic() - started
                )
            return

    async def _await_carried(self, part: TxnPartition, plan: MarkerPlan, term: int) -> frozenset[TopicPartition] | None:
        """Wait for the next EndTxn to settle ``plan``'s carried markers, at most ``txn_reservation_ms``; then settle.

        A plan this leader inherited (another term wrote it) is settled at once: its tokens may be in use,
        and only revoking markers tell. Returns the partitions the next transaction wrote to, or None when
        there is nothing left to complete here.
        """
        key = self._plan_key(plan)
        wake = self._wake_driver.setdefault(key, asyncio.Event())
        if plan.coordinator_epoch == term:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.broker.config.txn_reservation_ms / 1000)
        try:
            return await self._settle(part, plan, plan.carried)
        finally:
            self._wake_driver.pop(key, None)
            self._settle_locks.pop(key, None)
            meta = part.sm.get(plan.transactional_id)
            if meta is None or meta.marker_plan() != plan:
                self._settled.pop(key, None)

    # ---- produce-side verification (KIP-890) ---------------------------------------------------

    async def verify_partition(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> None:
        """Raise unless (topic, partition) is in the producer's ongoing transaction; adds it if needed."""
        key = (transactional_id, producer_id, producer_epoch, topic, partition)
        if key in self._verified:
            self._verified.move_to_end(key)
            return
        pending = self._verifying.get(key)
        if pending is not None:
            try:
                await asyncio.shield(pending)  # its outcome (error included) is ours
                return
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # we were cancelled
            # The request that was verifying went away before an answer: verify for ourselves.
            return await self.verify_partition(transactional_id, producer_id, producer_epoch, topic, partition)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._verifying[key] = fut
        try:
            await self._verify(key)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: nobody else may be waiting
            raise
        else:
            fut.set_result(None)
        finally:
            del self._verifying[key]

    async def _verify(self, key: tuple[str, int, int, str, int]) -> None:
        transactional_id, producer_id, producer_epoch, topic, partition = key
        p = self.partition_for(transactional_id)
        local = self.groups.local.get(p)
        if local is not None and local.group.is_leader():
            await self.verify_here(transactional_id, producer_id, producer_epoch, topic, partition)
        else:
            await self._remote(
                p,
                "/v1/internal/txn/verify",
                {
                    "transactional_id": transactional_id,
                    "producer_id": producer_id,
                    "producer_epoch": producer_epoch,
                    "topic": topic,
                    "partition": partition,
                },
            )
        self._verified[key] = None
        if len(self._verified) > _VERIFIED_CACHE:
            self._verified.popitem(last=False)

    async def verify_here(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> None:
        """The coordinator's half of ``verify_partition`` (this node leads the id's partition).

        The implicit add of the next transaction's first produce to a partition
        is recorded at once, even while the previous transaction completes; the
        answer waits for the previous transaction's marker on that partition
        (``_add_ahead``). If it is still owed when the wait ends, the answer is
        CONCURRENT_TRANSACTIONS (the partition leader hands it to the producer,
        which retries).
        """
        part = self.leading(transactional_id)
        tp = TopicPartition(topic, partition)
        ident = (transactional_id, producer_id, producer_epoch)
        self._hints.written(transactional_id, producer_id, producer_epoch, tp)
        while True:
            err = part.sm.partition_in_txn(transactional_id, producer_id, producer_epoch, topic, partition)
            if err is None:
                meta = part.sm.get(transactional_id)
                plan = meta.marker_plan() if meta is not None else None
                if plan is not None and tp in plan.partitions:  # added ahead; the previous marker may be owed
                    await self._await_markers(part, plan, (tp,))
                return
            if err.error_code is not ErrorCode.INVALID_TXN_STATE:
                raise err
            joined = self._adds.covering(ident, tp)
            if joined is None:
                break
            await asyncio.shield(joined)  # an add under way includes tp: look again once it is applied
        hinted = self._hints.for_first_add(part.sm.get(transactional_id), tp)
        tps = self._checked_partitions([tp, *self._still_existing(hinted)])
        await self._add_ahead(part, transactional_id, producer_id, producer_epoch, tps, wait_for=(tp,))

    def _still_existing(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """The hinted partitions that exist and have a leader now (a hint never fails or blocks a transaction)."""
        out = []
        for tp in tps:
            try:
                meta = self.broker.topic(tp.topic)
            except BrokerError:
                continue  # the topic is gone
            # A partition beyond the topic's count has no replica anywhere, hence no leader.
            if self.broker.partition_state(meta, tp.partition).get("leader") is not None:
                out.append(tp)
        return out

    # ---- timeouts and expiry --------------------------------------------------------------------

    async def _scan(self) -> None:
        cfg = self.broker.config
        now = now_ms()
        for part in list(self.groups.local.values()):
            if not part.group.is_leader():
                continue
            for meta in part.sm.expired_transactions(now, cfg.transaction_max_prepared_ms):
                try:
                    if meta.group_id is not None:
                        await self._orphan_group_abort(meta)
                    else:
                        log.info("aborting %s: past its timeout of %d ms", meta.transactional_id, meta.timeout_ms)
                        self._abort_reason[meta.transactional_id] = TxnOutcome.TIMED_OUT
                        await self._submit(part, _fence_and_abort(meta))
                except BrokerError as exc:
                    log.info("timeout abort of %s not done now: %s", meta.transactional_id, exc)
            for meta in part.sm.expired_transactional_ids(now, cfg.transactional_id_expiration_ms):
                with contextlib.suppress(BrokerError):
                    await self._submit(part, _expire(meta, cfg.transactional_id_expiration_ms))

    # ---- reads ------------------------------------------------------------------------------------

    def local_transactions(self, states: set[TransactionState] | None = None) -> list[dict[str, Any]]:
        """Transactions of the partitions this node leads (each id is listed by exactly one node)."""
        out: list[dict[str, Any]] = []
        for part in self.groups.local.values():
            if part.group.is_leader():
                out.extend(m.describe() for m in part.sm.transactions(states))
        return out

    def describe(self, transactional_id: str) -> dict[str, Any]:
        part = self.leading(transactional_id)
        meta = part.sm.get(transactional_id)
        if meta is None:
            raise BrokerError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"no transactional id {transactional_id!r}")
        return meta.describe()

    def prefix_matches(self, prefix: str) -> list[TransactionMetadata]:
        out: list[TransactionMetadata] = []
        for part in self.groups.local.values():
            if part.group.is_leader():
                out.extend(part.sm.transactions_matching_prefix(prefix))
        return out

    def sample(self) -> TransactionSample:
        """Open transactions and the oldest one's start over the partitions this node leads (scrape time)."""
        open_ = [m for m in self._led_transactions() if m.state in OPEN_STATES]
        starts = [m.txn_start_time_ms for m in open_ if m.txn_start_time_ms >= 0]
        led = sum(1 for part in self.groups.local.values() if part.group.is_leader())
        return TransactionSample(
            open=len(open_),
            oldest_open_start_ms=min(starts) if starts else None,
            max_timeout_ms=self.broker.config.transaction_max_timeout_ms,
            coordinator_partitions=led,
        )

    def _led_transactions(self) -> list[TransactionMetadata]:
        out: list[TransactionMetadata] = []
        for part in self.groups.local.values():
            if part.group.is_leader():
                out.extend(part.sm.transactions())
        return out
