"""The transaction coordinator's API: the ``__transaction_state-p`` groups at work (DESIGN.md "Transaction").

Every state change is a command replicated through the id's partition and
decided in ``TransactionStateMachine.apply``; this facade builds commands,
submits them (``TransactionStateManager``) and hands what the applied state
asks for to its collaborators:

* ``MarkerDriver`` writes a decided transaction's markers, then CompleteTxn.
  EndTxn answers as soon as its PrepareCommit/PrepareAbort is applied (the
  decision is durable; Kafka's behaviour), unless the caller asks to wait for
  completion or the transaction was Prepared for an external coordinator,
  which relies on visibility when its call returns.
* ``PartitionAdder``: the next transaction begins while the previous one's
  markers are written (pipelined adds). InitProducerId, EndTxn and Prepare
  wait for the whole marker driver (bounded by the request timeout) instead
  of answering CONCURRENT_TRANSACTIONS at once; only a wait that runs out
  answers it (retriable).
* ``PartitionVerification``: KIP-890's produce-side check.
* ``CommitGroups``: prepared transactions decided together.
* a periodic scan fences and aborts Ongoing transactions past their timeout
  and Prepared ones past ``transaction_max_prepared_ms``, and expires idle
  transactional ids.

Everything here runs on the asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from clients.protocol import BrokerError, ControlType, ErrorCode
from coordinator.commands import (
    Command,
    EndTxn,
    ExpireTransactionalId,
    FenceAndAbort,
    GroupMember,
    InitProducerId,
    Prepare,
)
from coordinator.group_commit import GroupDecision
from coordinator.metadata import MarkerPlan, TopicPartition, TransactionMetadata
from coordinator.results import AddPartitionsResult, EndTxnResult, InitProducerIdResult, PrepareResult
from coordinator.states import OPEN_STATES, TransactionState
from coordinator.transitions import carries_reservation
from raft import RaftNode
from storage.store import NodeStore

from ..background import every
from ..config import NodeConfig
from ..controller_view import ControllerView
from ..metrics import CoordinatorKind, NodeMetrics, TransactionSample, TxnOutcome
from ..peers import PeerView
from ..seams import Clock, MarkerWriter, NodeDirectory, PeerClient, ProducerIdSource, TopicDirectory
from .add_partitions import PartitionAdder
from .commit_groups import CommitGroups
from .completions import CompletionCounter
from .markers import MarkerDriver, MarkerLeaders
from .state_manager import TransactionStateManager, TxnPartition
from .tokens import CarriedMarker, TxnTokens
from .verification import PartitionVerification

__all__ = ["EndTxnAnswer", "TransactionCoordinator"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EndTxnAnswer:
    """EndTxn's result and the transaction's state when the call answered (Prepare* or Complete*)."""

    result: EndTxnResult
    state: TransactionState
    # Carried markers: per data partition of the ended transaction, the token for the next one's first batch.
    tokens: dict[TopicPartition, bytes] = dataclasses.field(default_factory=dict)


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


class TransactionCoordinator:
    """Kafka's ``TransactionCoordinator`` for the ids whose ``__transaction_state`` partitions this node leads."""

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
        producer_ids: ProducerIdSource,
        markers: MarkerWriter,
        topics: TopicDirectory,
        tokens: TxnTokens,
        metrics: NodeMetrics,
        marker_leaders: MarkerLeaders | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self._tokens = tokens
        self._metrics = metrics
        request_timeout_s = config.request_timeout_ms / 1000
        self.state = TransactionStateManager(config, store, raft, peer_view, clock, nodes, peers, producer_ids)
        self.groups = self.state.groups
        self._completions = CompletionCounter(metrics)
        self._driver = MarkerDriver(
            self.state, markers, metrics, self._completions, clock, request_timeout_s, config.txn_reservation_ms / 1000,
            marker_leaders,
        )  # fmt: skip
        self._adder = PartitionAdder(self.state, self._driver, topics, metrics, config.offsets_topic_partitions)
        self._verification = PartitionVerification(self.state, self._driver, self._adder)
        self._commit_groups = CommitGroups(self.state, self._driver, request_timeout_s)
        self.state.on_plan = self._driver.plan_ready
        self.state.on_decision = self._commit_groups.decision_ready
        self.state.on_leader_change = self._on_leader_change
        self._tasks: list[asyncio.Task[None]] = []

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self, view: ControllerView | None = None) -> None:
        self.state.start(view)
        self._metrics.set_transaction_source(self.sample)
        interval = self._config.transaction_abort_scan_interval_ms / 1000
        self._tasks.append(asyncio.get_running_loop().create_task(every(interval, self._scan)))

    async def close(self) -> None:
        self._driver.closing = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._driver.close()
        await self._commit_groups.close()
        self.state.stop()

    def _on_leader_change(self, part: TxnPartition) -> None:
        if self._driver.closing:
            return
        if not part.group.is_leader():
            # Deposed: whatever waits on this partition's drivers answers NOT_COORDINATOR now, not at its timeout.
            self._driver.deposed(part.partition)
            self._commit_groups.deposed(part.partition)
            return
        started = time.monotonic()
        plans = part.sm.pending_completions()
        decisions = part.sm.pending_group_decisions()
        self._metrics.coordinator_loaded(CoordinatorKind.TRANSACTION, time.monotonic() - started)
        log.info(
            "%s: coordinator for term %d; resuming %d transaction(s) and %d commit group(s)",
            part.group_id, part.term, len(plans), len(decisions),
        )  # fmt: skip
        for plan in plans:
            self._driver.plan_ready(part.partition, plan)
        for decision in decisions:
            self._commit_groups.decision_ready(part.partition, decision)

    # ---- routing ------------------------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return self.state.partition_for(transactional_id)

    def coordinator_json(self, key: str) -> dict[str, Any]:
        return self.state.coordinator_json(key)

    def leading(self, key: str) -> TxnPartition:
        return self.state.leading(key)

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
        retried = False
        while True:
            await self._driver.await_previous(part, transactional_id)
            before = part.sm.get(transactional_id)
            try:
                result = await self.state.propose(
                    part,
                    InitProducerId,
                    transactional_id=transactional_id,
                    timeout_ms=timeout_ms,
                    producer_id_candidate=await self.state.candidate(before),
                    expected_producer_id=expected_producer_id,
                    expected_producer_epoch=expected_producer_epoch,
                    max_timeout_ms=self._config.transaction_max_timeout_ms,
                )
            except BrokerError as exc:
                # CONCURRENT_TRANSACTIONS that changed the state: this InitProducerId fenced an open transaction.
                fenced = part.sm.get(transactional_id) != before
                if retried or exc.error_code is not ErrorCode.CONCURRENT_TRANSACTIONS or not fenced:
                    raise
                retried = True
                continue
            assert isinstance(result, InitProducerIdResult), result
            self._metrics.producer_ids_allocated.inc()
            return result.producer_id, result.producer_epoch

    async def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Iterable[TopicPartition]
    ) -> AddPartitionsResult:
        """AddPartitionsToTxn / AddOffsetsToTxn; answers once the previous transaction's markers on them are written."""
        tps = self._adder.checked(partitions)
        part = self.leading(transactional_id)
        return await self._adder.add_ahead(part, transactional_id, producer_id, producer_epoch, tps)

    async def end_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        *,
        wait_for_completion: bool = False,
        receipts: dict[TopicPartition, bytes] | None = None,
        classic: bool = False,
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

        ``classic``: the classic protocol of Kafka clients (EndTxn below version 5): no epoch bump, the
        client keeps its producer id and epoch, and the markers carry that epoch (no carried markers).
        """
        part = self.leading(transactional_id)
        before = part.sm.get(transactional_id)
        carry = receipts is not None and self._config.txn_carried_markers and not wait_for_completion and not classic
        settle, settled = False, self._valid_receipts(transactional_id, producer_id, producer_epoch, receipts or {})
        pending = before.marker_plan() if before is not None else None
        folds = carry and before is not None and carries_reservation(before, producer_id, producer_epoch)
        if folds:
            assert pending is not None
            await self._driver.await_markers(part, pending, pending.explicit)
            used = await self._driver.settle(part, pending, pending.carried, settled)
            settle, settled = used is not None, settled | (used or frozenset())
        else:
            await self._driver.await_previous(part, transactional_id, (producer_id, producer_epoch), retry=True)
            before = part.sm.get(transactional_id)
        carry = carry and not (before is not None and before.state is TransactionState.PREPARED)
        candidate = await self.state.candidate(before)
        try:
            result = await self.state.propose(
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
                classic=classic,
            )
        finally:
            if settle and pending is not None:
                self._driver.wake(pending)  # its driver looks again: the fold completed it, or it settles and completes
        assert isinstance(result, EndTxnResult), result
        if settle and pending is not None:
            self._driver.completed_by_fold(pending, before)
        tokens: dict[TopicPartition, bytes] = {}
        if result.markers is not None:
            self._adder.hints.ended(transactional_id, producer_id, producer_epoch)
            task = self._driver.ensure_driver(part, result.markers)
            if wait_for_completion or (before is not None and before.state is TransactionState.PREPARED):
                await self._driver.bounded(task)
            tokens = self._next_tokens(result.markers, result.producer_id, result.producer_epoch)
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
        if meta is None or not carries_reservation(meta, producer_id, producer_epoch):
            return []
        plan = meta.marker_plan()
        assert plan is not None
        tps = sorted(set(partitions) & set(plan.carried))
        if tps:
            await self._driver.settle(part, plan, tps)
        return tps

    def _valid_receipts(
        self, transactional_id: str, producer_id: int, producer_epoch: int, receipts: dict[TopicPartition, bytes]
    ) -> frozenset[TopicPartition]:
        """The partitions whose receipt is the cluster's for this producer and epoch (others are ignored)."""
        check = self._tokens.check_receipt
        return frozenset(
            tp for tp, raw in receipts.items()
            if check(raw, transactional_id, producer_id, producer_epoch, tp.topic, tp.partition)
        )  # fmt: skip

    def _next_tokens(self, plan: MarkerPlan, next_pid: int, next_epoch: int) -> dict[TopicPartition, bytes]:
        control = ControlType.COMMIT if plan.commit else ControlType.ABORT
        marker = CarriedMarker(control, plan.coordinator_epoch)
        make = self._tokens.token
        return {tp: make(plan.transactional_id, next_pid, next_epoch, tp.topic, tp.partition, marker)
                for tp in plan.carried}  # fmt: skip

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
        await self._driver.await_previous(part, transactional_id, (producer_id, producer_epoch))
        result = await self.state.propose(
            part,
            Prepare,
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            group_id=group_id,
        )
        assert isinstance(result, PrepareResult), result
        return result

    async def abort(self, transactional_id: str) -> TransactionMetadata:
        """Admin abort of an open transaction (hanging-transaction tooling): fence, then abort."""
        part = self.leading(transactional_id)
        meta = part.sm.get(transactional_id)
        if meta is None:
            raise BrokerError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"no transactional id {transactional_id!r}")
        if meta.group_id is not None:
            await self._commit_groups.orphan_abort(meta)
        else:
            result = await self.state.submit(part, _fence_and_abort(meta))
            if isinstance(result, EndTxnResult) and result.markers is not None:
                await self._driver.bounded(self._driver.ensure_driver(part, result.markers))
        after = part.sm.get(transactional_id)
        return after if after is not None else meta

    # ---- commit groups and verification (delegated) ------------------------------------------------

    async def group_commit(self, group_id: str, members: list[GroupMember], commit: bool) -> GroupDecision:
        return await self._commit_groups.group_commit(group_id, members, commit)

    async def bind_prepared(self, member: GroupMember, group_id: str) -> None:
        await self._commit_groups.bind_prepared(member, group_id)

    async def resolve_prepared(self, member: GroupMember, group_id: str, commit: bool) -> EndTxnResult:
        return await self._commit_groups.resolve_prepared(member, group_id, commit)

    async def verify_partition(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int,
        state: object = None, add: bool = True,
    ) -> None:  # fmt: skip
        await self._verification.verify_partition(
            transactional_id, producer_id, producer_epoch, topic, partition, state, add
        )

    async def verify_here(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int,
        add: bool = True,
    ) -> None:  # fmt: skip
        await self._verification.verify_here(transactional_id, producer_id, producer_epoch, topic, partition, add)

    # ---- timeouts and expiry --------------------------------------------------------------------

    async def _scan(self) -> None:
        cfg = self._config
        now = self._clock.now_ms()
        for part in self.state.led():
            for meta in part.sm.expired_transactions(now, cfg.transaction_max_prepared_ms):
                try:
                    if meta.group_id is not None:
                        await self._commit_groups.orphan_abort(meta)
                    else:
                        log.info("aborting %s: past its timeout of %d ms", meta.transactional_id, meta.timeout_ms)
                        self._completions.abort_reason(meta.transactional_id, TxnOutcome.TIMED_OUT)
                        await self.state.submit(part, _fence_and_abort(meta))
                except BrokerError as exc:
                    log.info("timeout abort of %s not done now: %s", meta.transactional_id, exc)
            for meta in part.sm.expired_transactional_ids(now, cfg.transactional_id_expiration_ms):
                with contextlib.suppress(BrokerError):
                    await self.state.submit(part, _expire(meta, cfg.transactional_id_expiration_ms))

    # ---- reads ------------------------------------------------------------------------------------

    def local_transactions(self, states: set[TransactionState] | None = None) -> list[dict[str, Any]]:
        """Transactions of the partitions this node leads (each id is listed by exactly one node)."""
        return [m.describe() for m in self.state.transactions(states)]

    def describe(self, transactional_id: str) -> dict[str, Any]:
        part = self.leading(transactional_id)
        meta = part.sm.get(transactional_id)
        if meta is None:
            raise BrokerError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"no transactional id {transactional_id!r}")
        return meta.describe()

    def prefix_matches(self, prefix: str) -> list[TransactionMetadata]:
        out: list[TransactionMetadata] = []
        for part in self.state.led():
            out.extend(part.sm.transactions_matching_prefix(prefix))
        return out

    def sample(self) -> TransactionSample:
        """Open transactions and the oldest one's start over the partitions this node leads (scrape time)."""
        open_ = [m for m in self.state.transactions() if m.state in OPEN_STATES]
        starts = [m.txn_start_time_ms for m in open_ if m.txn_start_time_ms >= 0]
        return TransactionSample(
            open=len(open_),
            oldest_open_start_ms=min(starts) if starts else None,
            max_timeout_ms=self._config.transaction_max_timeout_ms,
            coordinator_partitions=len(self.state.led()),
        )
