"""Transaction coordinator rules (kafka_txn.md §4, §5, §8; §14 item numbers cited per test).

Real RocksDB in tmp_path; commands go through their byte encoding and
``TransactionStateMachine.apply`` exactly as Raft delivers them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from clients.protocol import BrokerError, ErrorCode
from coordinator import transitions
from coordinator.commands import (
    AddPartitions,
    BindPrepared,
    Command,
    CompleteTxn,
    DecideGroup,
    EndTxn,
    ExpireTransactionalId,
    FenceAndAbort,
    ForgetGroup,
    GroupMember,
    GroupMemberDone,
    InitProducerId,
    Prepare,
    ResolvePrepared,
    encode_command,
)
from coordinator.errors import IllegalTransitionError
from coordinator.group_commit import GroupDecisionResult, check_member_ready, member_commits
from coordinator.metadata import EPOCH_EXHAUSTED, MarkerPlan, TopicPartition, encode_metadata
from coordinator.placement import coordinator_partition
from coordinator.results import EndTxnResult, InitProducerIdResult
from coordinator.state_machine import TransactionStateMachine
from coordinator.states import VALID_PREVIOUS, TransactionState, validate_transition
from storage.store import NodeStore

S = TransactionState
TID = "tx-1"
TP0, TP1, TP2 = TopicPartition("orders", 0), TopicPartition("payments", 1), TopicPartition("refunds", 0)


class Coordinator:
    """One ``__transaction_state`` partition plus a Raft-index counter and command shortcuts."""

    def __init__(self, store: NodeStore, prefix: bytes = b"X\x00\x00\x00\x01") -> None:
        self.store, self.prefix = store, prefix
        self.sm = TransactionStateMachine(store, prefix, 1)
        self.index = self.sm.last_applied
        self.ce = 1
        self.next_pid = 1000
        self.markers: list[MarkerPlan] = []
        self.sm.on_markers = self.markers.append

    def apply(self, cmd: Command) -> Any:
        self.index += 1
        return self.sm.apply(self.index, encode_command(cmd))

    def reopen(self) -> None:
        self.sm = TransactionStateMachine(self.store, self.prefix, 1)
        self.sm.on_markers = self.markers.append

    def seed(self, meta: Any) -> None:
        """Install a metadata value as if loaded from disk (for states many steps away, like epoch 32766)."""
        self.store.db.put(self.prefix + b"T" + meta.transactional_id.encode(), encode_metadata(meta))
        self.reopen()

    def candidate(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def init(
        self, tid: str = TID, timeout: int = 60_000, now: int = 0, expected: tuple[int, int] | None = None, **kw: Any
    ) -> Any:
        kw.setdefault("producer_id_candidate", self.candidate())
        return self.apply(
            InitProducerId(
                transactional_id=tid,
                timeout_ms=timeout,
                now_ms=now,
                coordinator_epoch=self.ce,
                expected_producer_id=expected[0] if expected else None,
                expected_producer_epoch=expected[1] if expected else None,
                **kw,
            )
        )

    def add(self, pid: int, epoch: int, *tps: TopicPartition, tid: str = TID, now: int = 0) -> Any:
        return self.apply(
            AddPartitions(
                transactional_id=tid,
                producer_id=pid,
                producer_epoch=epoch,
                partitions=tps or (TP0,),
                now_ms=now,
                coordinator_epoch=self.ce,
            )
        )

    def end(self, pid: int, epoch: int, commit: bool, tid: str = TID, now: int = 0, **kw: Any) -> Any:
        return self.apply(
            EndTxn(
                transactional_id=tid,
                producer_id=pid,
                producer_epoch=epoch,
                commit=commit,
                now_ms=now,
                coordinator_epoch=self.ce,
                **kw,
            )
        )

    def complete(self, plan: MarkerPlan, now: int = 0) -> Any:
        return self.apply(
            CompleteTxn(
                transactional_id=plan.transactional_id,
                producer_id=plan.producer_id,
                producer_epoch=plan.producer_epoch,
                commit=plan.commit,
                now_ms=now,
                coordinator_epoch=self.ce,
            )
        )

    def prepare(self, pid: int, epoch: int, tid: str = TID, group: str | None = None, now: int = 0) -> Any:
        return self.apply(
            Prepare(
                transactional_id=tid,
                producer_id=pid,
                producer_epoch=epoch,
                now_ms=now,
                coordinator_epoch=self.ce,
                group_id=group,
            )
        )

    def fence(self, pid: int, epoch: int, tid: str = TID, now: int = 0) -> Any:
        return self.apply(
            FenceAndAbort(
                transactional_id=tid, producer_id=pid, producer_epoch=epoch, now_ms=now, coordinator_epoch=self.ce
            )
        )

    def meta(self, tid: str = TID) -> Any:
        return self.sm.get(tid)

    def open_txn(self, tid: str = TID, *tps: TopicPartition) -> tuple[int, int]:
        r = self.init(tid)
        assert isinstance(r, InitProducerIdResult)
        assert self.add(r.producer_id, r.producer_epoch, *tps, tid=tid).added
        return r.producer_id, r.producer_epoch


@pytest.fixture
def coord(store: NodeStore) -> Coordinator:
    return Coordinator(store)


def err(result: Any) -> ErrorCode:
    assert isinstance(result, BrokerError), result
    return result.error_code


# -- §4.1 the transition table -------------------------------------------------------


def test_transition_table_is_kafkas_plus_prepared() -> None:
    # §4.1, restated: state -> allowed previous states (TV2 column for PrepareAbort).
    kafka = {
        S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.PREPARE_COMMIT: {S.ONGOING},
        S.PREPARE_ABORT: {S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
        S.COMPLETE_ABORT: {S.PREPARE_ABORT},
        S.DEAD: {S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT},
        S.PREPARE_EPOCH_FENCE: {S.ONGOING},
    }
    for state, previous in kafka.items():
        assert set(VALID_PREVIOUS[state]) - {S.PREPARED} == previous, state
    # Prepared is reached from an open or finished txn and leaves only through a decision or a fence.
    assert {s for s, prev in VALID_PREVIOUS.items() if S.PREPARED in prev} == {
        S.PREPARE_COMMIT,
        S.PREPARE_ABORT,
        S.PREPARE_EPOCH_FENCE,
        S.PREPARED,
    }
    assert [s.id for s in S] == list(range(9))
    assert [s.display_name for s in S][:8] == [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    ]


def test_illegal_transition_error_names_both_states() -> None:
    with pytest.raises(IllegalTransitionError, match=r"'t': illegal transition Empty -> CompleteCommit"):
        validate_transition("t", S.EMPTY, S.COMPLETE_COMMIT)
    validate_transition("t", S.ONGOING, S.PREPARE_COMMIT)


# -- InitProducerId (§4.3) -------------------------------------------------------------


def test_new_transactional_id_gets_the_candidate_pid_at_epoch_0(coord: Coordinator) -> None:
    assert coord.init(producer_id_candidate=4242) == InitProducerIdResult(4242, 0)
    m = coord.meta()
    assert (m.state, m.producer_id, m.producer_epoch, m.timeout_ms) == (S.EMPTY, 4242, 0, 60_000)


def test_empty_transactional_id_is_invalid_request(coord: Coordinator) -> None:
    assert err(coord.init("")) is ErrorCode.INVALID_REQUEST
    assert coord.sm.transactions() == []


def test_transaction_timeout_above_max_is_rejected(coord: Coordinator) -> None:
    # §14 item 10: 900001 ms -> INVALID_TRANSACTION_TIMEOUT, 900000 ms accepted; the max is configurable.
    assert err(coord.init(timeout=900_001)) is ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert err(coord.init(timeout=0)) is ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert coord.meta() is None
    assert coord.init(timeout=900_000).producer_epoch == 0
    assert err(coord.init(timeout=5_000, max_timeout_ms=4_000)) is ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert coord.meta().producer_epoch == 0


def test_init_bumps_epoch_and_fences_the_older_producer(coord: Coordinator) -> None:
    first = coord.init()
    second = coord.init()
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
    assert err(coord.add(first.producer_id, 0)) is ErrorCode.PRODUCER_FENCED
    assert coord.add(second.producer_id, 1).added == (TP0,)


def test_init_on_ongoing_fences_aborts_and_the_retry_lands_two_epochs_above_the_zombie(coord: Coordinator) -> None:
    # §14 item 7.
    pid, zombie = coord.open_txn(TID, TP0, TP1)
    assert err(coord.init()) is ErrorCode.CONCURRENT_TRANSACTIONS
    m = coord.meta()
    assert (m.state, m.producer_epoch) == (S.PREPARE_ABORT, zombie + 1)
    plan = MarkerPlan(TID, pid, zombie + 1, False, (TP0, TP1), coord.ce)
    assert coord.sm.pending_completions() == [plan] and coord.markers == [plan]
    # The zombie can neither commit nor add; the client's retry waits for the abort to complete.
    assert err(coord.end(pid, zombie, True)) is ErrorCode.PRODUCER_FENCED
    assert err(coord.add(pid, zombie, TP1)) is ErrorCode.PRODUCER_FENCED
    assert err(coord.init()) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert coord.complete(plan).state is S.COMPLETE_ABORT
    assert coord.init() == InitProducerIdResult(pid, zombie + 2)


def test_kip360_expected_epoch_bumps_retry_returns_same_other_is_fenced(coord: Coordinator) -> None:
    # §14 item 8.
    r = coord.init()
    pid = r.producer_id
    bumped = coord.init(expected=(pid, 0))
    assert bumped == InitProducerIdResult(pid, 1)
    assert coord.init(expected=(pid, 0)) == InitProducerIdResult(pid, 1)  # lost answer, retried
    assert coord.meta().producer_epoch == 1
    assert err(coord.init(expected=(pid, 7))) is ErrorCode.PRODUCER_FENCED
    assert err(coord.init(expected=(pid + 999, 1))) is ErrorCode.PRODUCER_FENCED
    assert coord.init(expected=(pid, 1)) == InitProducerIdResult(pid, 2)
    assert err(coord.init(expected=(pid, None))) is ErrorCode.INVALID_REQUEST  # type: ignore[arg-type]


def test_kip360_expected_identity_on_a_new_id_gets_a_new_pid(coord: Coordinator) -> None:
    # §8 KIP-360: INVALID_PRODUCER_ID_MAPPING -> InitProducerId with the old identity -> a new PID if no mapping.
    assert coord.init(expected=(77, 3), producer_id_candidate=500) == InitProducerIdResult(500, 0)


def _at_epoch(coord: Coordinator, epoch: int) -> tuple[int, int]:
    r = coord.init()
    coord.seed(dataclasses.replace(coord.meta(), producer_epoch=epoch))
    return r.producer_id, epoch


def test_epoch_exhaustion_rotates_the_pid_at_init(coord: Coordinator) -> None:
    # §14 item 9 (InitProducerId), and KIP-360's "previous PID with exhausted epoch" retry.
    old_pid, _ = _at_epoch(coord, EPOCH_EXHAUSTED)
    rotated = coord.init(expected=(old_pid, EPOCH_EXHAUSTED), producer_id_candidate=9000)
    assert rotated == InitProducerIdResult(9000, 0)
    assert coord.init(expected=(old_pid, EPOCH_EXHAUSTED)) == rotated  # the retry of the rotation
    m = coord.meta()
    assert (m.last_producer_id, m.last_producer_epoch) == (old_pid, EPOCH_EXHAUSTED)
    assert err(coord.add(old_pid, EPOCH_EXHAUSTED)) is ErrorCode.PRODUCER_FENCED


def test_epoch_exhaustion_without_a_candidate_asks_for_a_retry(coord: Coordinator) -> None:
    _at_epoch(coord, EPOCH_EXHAUSTED)
    before = coord.meta()
    assert err(coord.init(producer_id_candidate=None)) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert coord.meta() == before


def test_epoch_exhaustion_rotates_the_pid_at_end_txn(coord: Coordinator) -> None:
    # §14 item 9 (TV2 EndTxn): markers carry 32767, the answer is (new pid, 0); a retry gets the same answer.
    pid, epoch = _at_epoch(coord, EPOCH_EXHAUSTED)
    coord.add(pid, epoch)
    r = coord.end(pid, epoch, True, producer_id_candidate=7000)
    assert (r.producer_id, r.producer_epoch) == (7000, 0)
    assert r.markers == MarkerPlan(TID, pid, EPOCH_EXHAUSTED + 1, True, (TP0,), coord.ce)
    # The client is ahead of the markers: its next transaction's add waits in next_partitions.
    assert err(coord.end(7000, 0, True)) is ErrorCode.CONCURRENT_TRANSACTIONS
    coord.complete(r.markers)
    m = coord.meta()
    assert (m.state, m.producer_id, m.producer_epoch) == (S.COMPLETE_COMMIT, 7000, 0)
    retry = coord.end(pid, epoch, True)
    assert (retry.producer_id, retry.producer_epoch, retry.retry) == (7000, 0, True)
    assert coord.add(7000, 0).added == (TP0,)


def test_epoch_32767_is_only_a_marker_epoch(coord: Coordinator) -> None:
    # A fence at epoch 32766 leaves 32767 on the markers; no request may use it (it cannot be bumped).
    pid, epoch = _at_epoch(coord, EPOCH_EXHAUSTED)
    coord.add(pid, epoch)
    assert coord.fence(pid, epoch).markers.producer_epoch == 32767
    coord.complete(coord.sm.pending_completions()[0])
    for result in (coord.add(pid, 32767), coord.end(pid, 32767, False), coord.prepare(pid, 32767)):
        assert err(result) is ErrorCode.PRODUCER_FENCED
    assert coord.init(producer_id_candidate=555) == InitProducerIdResult(555, 0)


def test_end_txn_at_exhausted_epoch_without_candidate_asks_for_a_retry(coord: Coordinator) -> None:
    pid, epoch = _at_epoch(coord, EPOCH_EXHAUSTED)
    coord.add(pid, epoch)
    assert err(coord.end(pid, epoch, True)) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert coord.meta().state is S.ONGOING


# -- AddPartitionsToTxn and KIP-890 verification ------------------------------------------


def test_add_partitions_error_table(coord: Coordinator) -> None:
    # §4.3 AddPartitionsToTxn table.
    assert err(coord.add(1, 0)) is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    r = coord.init()
    pid = r.producer_id
    assert err(coord.add(pid + 1, 0)) is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert err(coord.add(pid, 1)) is ErrorCode.PRODUCER_FENCED
    assert err(coord.add(pid, 0, TopicPartition("", 0))) is ErrorCode.INVALID_REQUEST
    assert err(coord.add(pid, 0, TopicPartition("t", -1))) is ErrorCode.INVALID_REQUEST
    assert coord.meta().state is S.EMPTY
    first = coord.add(pid, 0, TP0, now=100)
    assert first.added == (TP0,)
    again = coord.add(pid, 0, TP0, now=200)  # already in the txn: nothing written
    assert again.added == ()
    assert coord.meta().txn_last_update_ms == 100
    coord.add(pid, 0, TP1, TP0, now=300)
    m = coord.meta()
    assert (m.partitions, m.txn_start_time_ms, m.txn_last_update_ms) == (frozenset({TP0, TP1}), 100, 300)
    coord.end(pid, 0, True)
    # PrepareCommit: Kafka answers CONCURRENT_TRANSACTIONS; txbroker records the next transaction's add.
    assert coord.add(pid, 1).added == (TP0,)
    assert coord.meta().state is S.PREPARE_COMMIT


# -- pipelined adds: the next transaction adds partitions while the previous one completes ----------


def test_add_while_completing_is_recorded_for_the_next_transaction(coord: Coordinator) -> None:
    pid, epoch = coord.open_txn(TID, TP0, TP1)
    r = coord.end(pid, epoch, True)
    assert r.markers is not None and r.markers.partitions == (TP0, TP1)
    a = coord.add(pid, epoch + 1, TP1, now=500)
    assert (a.producer_id, a.producer_epoch, a.added) == (pid, epoch + 1, (TP1,))
    assert coord.add(pid, epoch + 1, TP1, now=600).added == ()  # already recorded: nothing written
    coord.add(pid, epoch + 1, TP2, TP1, now=700)
    m = coord.meta()
    # The previous transaction is untouched: same state, same marker plan.
    assert (m.state, m.partitions, m.marker_plan()) == (S.PREPARE_COMMIT, frozenset({TP0, TP1}), r.markers)
    assert (m.next_partitions, m.next_start_ms) == (frozenset({TP1, TP2}), 500)
    assert m.describe()["next_transaction_partitions"] == [
        {"topic": TP1.topic, "partition": TP1.partition},
        {"topic": TP2.topic, "partition": TP2.partition},
    ]
    verify = coord.sm.partition_in_txn
    assert verify(TID, pid, epoch + 1, TP1.topic, TP1.partition) is None
    assert verify(TID, pid, epoch + 1, TP0.topic, TP0.partition).error_code is ErrorCode.INVALID_TXN_STATE
    assert verify(TID, pid, epoch, TP1.topic, TP1.partition).error_code is ErrorCode.INVALID_PRODUCER_EPOCH
    # EndTxn of the next transaction still waits for the previous one's markers.
    assert err(coord.end(pid, epoch + 1, True)) is ErrorCode.CONCURRENT_TRANSACTIONS
    # CompleteTxn opens the next transaction with what it added, in the same apply.
    done = coord.complete(r.markers, now=800)
    assert done.state is S.ONGOING and not done.already_complete
    m = coord.meta()
    assert (m.state, m.producer_id, m.producer_epoch) == (S.ONGOING, pid, epoch + 1)
    assert (m.partitions, m.txn_start_time_ms, m.next_partitions, m.next_start_ms) == (
        frozenset({TP1, TP2}),
        500,
        frozenset(),
        -1,
    )
    end = coord.end(pid, epoch + 1, False)
    assert end.markers.partitions == (TP1, TP2)


def test_add_while_completing_checks_the_identity(coord: Coordinator) -> None:
    pid, epoch = coord.open_txn()
    r = coord.end(pid, epoch, False)
    before = coord.meta()
    assert err(coord.add(pid, epoch)) is ErrorCode.PRODUCER_FENCED  # the ended transaction's epoch (RETRY)
    assert err(coord.add(pid, epoch + 2)) is ErrorCode.PRODUCER_FENCED
    assert err(coord.add(pid + 1, epoch + 1)) is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert coord.meta() == before
    coord.complete(r.markers)
    assert coord.meta().state is S.COMPLETE_ABORT  # nothing was added: no transaction opens


def test_add_while_a_fence_aborts_is_fenced(coord: Coordinator) -> None:
    # A fence (timeout, InitProducerId) bumps past the client: its next identity does not exist.
    pid, epoch = coord.open_txn()
    coord.fence(pid, epoch)
    before = coord.meta()
    assert err(coord.add(pid, epoch)) is ErrorCode.PRODUCER_FENCED
    # The fence's own epoch was never handed to a client: Kafka's answer, nothing recorded.
    assert err(coord.add(pid, epoch + 1)) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert coord.meta() == before and not before.next_partitions


def test_add_while_completing_a_rotation_uses_the_new_producer_id(coord: Coordinator) -> None:
    pid, epoch = _at_epoch(coord, EPOCH_EXHAUSTED)
    coord.add(pid, epoch)
    r = coord.end(pid, epoch, True, producer_id_candidate=7000)
    assert err(coord.add(pid, epoch + 1)) is ErrorCode.PRODUCER_FENCED  # the marker epoch is never the client's
    a = coord.add(7000, 0, TP1, now=900)
    assert (a.producer_id, a.producer_epoch, a.added) == (7000, 0, (TP1,))
    assert coord.sm.partition_in_txn(TID, 7000, 0, TP1.topic, TP1.partition) is None
    coord.complete(r.markers)
    m = coord.meta()
    assert (m.state, m.producer_id, m.producer_epoch, m.partitions) == (S.ONGOING, 7000, 0, frozenset({TP1}))


def test_next_partitions_survive_a_restart(coord: Coordinator) -> None:
    pid, epoch = coord.open_txn()
    coord.end(pid, epoch, True)
    coord.add(pid, epoch + 1, TP1, now=42)
    before = coord.meta()
    coord.reopen()
    assert coord.meta() == before
    assert (before.next_partitions, before.next_start_ms) == (frozenset({TP1}), 42)


def test_partition_verification_accepts_only_partitions_of_the_open_txn(coord: Coordinator) -> None:
    # KIP-890 part 1 (§4.3 Produce): the leader asks before the first transactional write to a partition.
    r = coord.init()
    pid = r.producer_id
    verify = coord.sm.partition_in_txn
    assert verify(TID, pid, 0, "orders", 0).error_code is ErrorCode.INVALID_TXN_STATE
    coord.add(pid, 0, TP0)  # the implicit add of a first produce (KIP-890 part 2) is the same command
    assert verify(TID, pid, 0, "orders", 0) is None
    assert verify(TID, pid, 0, "payments", 1).error_code is ErrorCode.INVALID_TXN_STATE
    assert verify("other", pid, 0, "orders", 0).error_code is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    coord.end(pid, 0, False)
    # After EndTxn the old epoch is stale and no transaction is open.
    assert verify(TID, pid, 0, "orders", 0).error_code is ErrorCode.INVALID_PRODUCER_EPOCH
    assert verify(TID, pid, 1, "orders", 0).error_code is ErrorCode.INVALID_TXN_STATE


# -- EndTxn / CompleteTxn ---------------------------------------------------------------------


def test_end_txn_retries_are_idempotent(coord: Coordinator) -> None:
    # §14 item 6: commit then commit-retry -> NONE; commit then abort -> INVALID_TXN_STATE;
    # retry while PrepareCommit -> CONCURRENT_TRANSACTIONS.
    pid, epoch = coord.open_txn()
    r = coord.end(pid, epoch, True)
    assert isinstance(r, EndTxnResult) and (r.producer_id, r.producer_epoch, r.retry) == (pid, epoch + 1, False)
    assert err(coord.end(pid, epoch, True)) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert err(coord.end(pid, epoch, False)) is ErrorCode.INVALID_TXN_STATE
    coord.complete(r.markers)
    retry = coord.end(pid, epoch, True)
    assert (retry.producer_id, retry.producer_epoch, retry.retry, retry.markers) == (pid, epoch + 1, True, None)
    assert err(coord.end(pid, epoch, False)) is ErrorCode.INVALID_TXN_STATE
    assert coord.meta().state is S.COMPLETE_COMMIT


def test_abort_retries_mirror_commit_retries(coord: Coordinator) -> None:
    pid, epoch = coord.open_txn()
    r = coord.end(pid, epoch, False)
    assert err(coord.end(pid, epoch, False)) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert err(coord.end(pid, epoch, True)) is ErrorCode.INVALID_TXN_STATE
    coord.complete(r.markers)
    assert coord.end(pid, epoch, False).retry
    assert err(coord.end(pid, epoch, True)) is ErrorCode.INVALID_TXN_STATE


def test_end_txn_state_table_tv2(coord: Coordinator) -> None:
    # §4.3 EndTxn table: Empty + commit -> INVALID_TXN_STATE; TV2 abort from Empty/Complete* bumps the epoch.
    r = coord.init()
    pid = r.producer_id
    assert err(coord.end(pid, 0, True)) is ErrorCode.INVALID_TXN_STATE
    aborted = coord.end(pid, 0, False)
    assert (aborted.producer_epoch, aborted.markers) == (1, None)  # nothing to mark: completes at once
    assert coord.meta().state is S.COMPLETE_ABORT
    assert err(coord.end(pid, 1, True)) is ErrorCode.INVALID_TXN_STATE  # CompleteAbort, current epoch, commit
    assert err(coord.end(pid, 5, False)) is ErrorCode.PRODUCER_FENCED
    assert err(coord.end(pid + 1, 1, False)) is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert err(coord.end(pid, 1, False, tid="unknown")) is ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_next_transaction_waits_while_the_previous_completes(coord: Coordinator) -> None:
    # TV2: the client got epoch + 1 from EndTxn before the markers are written.
    pid, epoch = coord.open_txn()
    coord.end(pid, epoch, True)
    for commit in (True, False):
        assert err(coord.end(pid, epoch + 1, commit)) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert err(coord.prepare(pid, epoch + 1)) is ErrorCode.CONCURRENT_TRANSACTIONS


def test_late_end_txn_never_touches_the_next_transaction(coord: Coordinator) -> None:
    # §14 item 24 (KAFKA-17754): a delayed EndTxn of txn 1 arrives after txn 2 started.
    pid, epoch = coord.open_txn()
    r = coord.end(pid, epoch, True)
    coord.complete(r.markers)
    coord.add(pid, epoch + 1, TP1)
    txn2 = coord.meta()
    # Once txn 2 is open the old epoch is no retry identity any more: the late request is fenced.
    for commit in (True, False):
        assert err(coord.end(pid, epoch, commit)) is ErrorCode.PRODUCER_FENCED
    assert coord.meta() == txn2


def test_complete_txn_needs_the_matching_marker_identity(coord: Coordinator) -> None:
    pid, epoch = coord.open_txn()
    plan = coord.end(pid, epoch, True).markers
    before = coord.meta()
    wrong_dir = dataclasses.replace(plan, commit=False)
    wrong_epoch = dataclasses.replace(plan, producer_epoch=epoch)
    assert err(coord.complete(wrong_dir)) is ErrorCode.INVALID_TXN_STATE
    assert err(coord.complete(wrong_epoch)) is ErrorCode.INVALID_TXN_STATE
    assert coord.meta() == before
    done = coord.complete(plan)
    assert (done.state, done.already_complete) == (S.COMPLETE_COMMIT, False)
    assert coord.meta().partitions == frozenset()
    assert coord.complete(plan).already_complete
    assert coord.sm.pending_completions() == []


def test_new_leader_resumes_prepare_states_after_reopen(store: NodeStore) -> None:
    # §14 item 26 / DESIGN "a new coordinator leader resumes any txn left in a Prepare state".
    coord = Coordinator(store)
    pid, epoch = coord.open_txn(TID, TP0, TP1)
    coord.end(pid, epoch, True)
    other = Coordinator(store)  # the same partition after a restart / on the new leader
    [plan] = other.sm.pending_completions()
    assert plan == MarkerPlan(TID, pid, epoch + 1, True, (TP0, TP1), 1)
    other.ce = 2  # the new leader's term
    assert other.complete(plan).state is S.COMPLETE_COMMIT


# -- coordinator epoch ----------------------------------------------------------------------


def test_command_from_a_deposed_leader_is_not_coordinator(coord: Coordinator) -> None:
    # DESIGN rule 7: a command of term 1 committing after one of term 2 changes nothing.
    r = coord.init()
    coord.ce = 2
    coord.add(r.producer_id, 0)
    before = coord.meta()
    coord.ce = 1
    assert err(coord.end(r.producer_id, 0, True)) is ErrorCode.NOT_COORDINATOR
    assert coord.meta() == before
    coord.reopen()
    assert coord.sm.coordinator_epoch == 2
    assert err(coord.end(r.producer_id, 0, True)) is ErrorCode.NOT_COORDINATOR


def test_prepare_step_mutates_nothing(coord: Coordinator) -> None:
    # STYLE "Prepare, then complete": the rules and preview compute, apply changes.
    pid, epoch = coord.open_txn()
    before, db_before = coord.meta(), dict(coord.store.iter_prefix(coord.prefix))
    cmd = EndTxn(
        transactional_id=TID, producer_id=pid, producer_epoch=epoch, commit=True, now_ms=5, coordinator_epoch=1
    )
    outcome = transitions.end_txn(before, cmd)
    assert outcome.metadata.state is S.PREPARE_COMMIT and before.state is S.ONGOING
    assert isinstance(coord.sm.preview(cmd), EndTxnResult)
    assert coord.meta() is before and dict(coord.store.iter_prefix(coord.prefix)) == db_before


# -- timeouts, expiry, prefix, listing ----------------------------------------------------------


def test_timed_out_transaction_is_fenced_and_aborted(coord: Coordinator) -> None:
    # §5 / §14 item 19: Ongoing past start + timeout is listed; fence (epoch + 1) then abort.
    r = coord.init(timeout=100)
    pid = r.producer_id
    coord.add(pid, 0, TP0, now=1_000)
    assert coord.sm.expired_transactions(1_100) == []
    [expired] = coord.sm.expired_transactions(1_101)
    assert (expired.producer_id, expired.producer_epoch) == (pid, 0)
    assert err(coord.fence(pid, 1, now=1_101)) is ErrorCode.INVALID_TXN_STATE  # stale scan view: no change
    res = coord.fence(pid, 0, now=1_101)
    assert res.markers == MarkerPlan(TID, pid, 1, False, (TP0,), 1)
    assert coord.sm.partition_in_txn(TID, pid, 0, "orders", 0).error_code is ErrorCode.INVALID_PRODUCER_EPOCH
    assert err(coord.end(pid, 0, True)) is ErrorCode.PRODUCER_FENCED
    assert err(coord.end(pid, 0, False)) is ErrorCode.PRODUCER_FENCED  # a fence leaves no retry identity
    assert coord.sm.expired_transactions(10**9) == []


def test_transactional_id_expires_only_when_idle_and_finished(coord: Coordinator) -> None:
    # §5 / §14 item 28: 7 days idle in Empty/Complete* -> removed; a new InitProducerId gets a new pid.
    week = 604_800_000
    pid, epoch = coord.open_txn()
    assert coord.sm.expired_transactional_ids(week * 2, week) == []  # Ongoing never expires
    plan = coord.end(pid, epoch, True, now=10).markers
    coord.complete(plan, now=20)
    assert coord.sm.expired_transactional_ids(20 + week, week) == []
    [idle] = coord.sm.expired_transactional_ids(21 + week, week)
    expire = ExpireTransactionalId(
        transactional_id=TID,
        producer_id=idle.producer_id,
        producer_epoch=idle.producer_epoch,
        now_ms=20 + week,
        coordinator_epoch=1,
    )
    assert err(coord.apply(expire)) is ErrorCode.INVALID_TXN_STATE
    assert coord.apply(dataclasses.replace(expire, now_ms=21 + week)).producer_id == pid
    assert coord.meta() is None
    assert err(coord.end(pid, epoch + 1, False)) is ErrorCode.INVALID_PRODUCER_ID_MAPPING  # the zombie
    assert coord.init(producer_id_candidate=31337) == InitProducerIdResult(31337, 0)


def test_abort_by_prefix_lists_open_and_prepared_transactions(coord: Coordinator) -> None:
    coord.open_txn("job-7-a")
    pid, epoch = coord.open_txn("job-7-b")
    coord.prepare(pid, epoch, tid="job-7-b")
    coord.init("job-7-c")  # Empty: nothing to abort
    coord.open_txn("job-8-a")
    found = coord.sm.transactions_matching_prefix("job-7-")
    assert [(m.transactional_id, m.state) for m in found] == [("job-7-a", S.ONGOING), ("job-7-b", S.PREPARED)]
    for m in found:
        coord.fence(m.producer_id, m.producer_epoch, tid=m.transactional_id)
    assert coord.sm.transactions_matching_prefix("job-7-") == []


def test_list_and_describe_filter_by_state(coord: Coordinator) -> None:
    coord.open_txn("b")
    coord.init("a")
    assert [m.transactional_id for m in coord.sm.transactions()] == ["a", "b"]
    [ongoing] = coord.sm.transactions(states={S.ONGOING})
    d = ongoing.describe()
    assert (d["transactional_id"], d["state"], d["partitions"], d["next_transaction_partitions"]) == (
        "b",
        "Ongoing",
        [{"topic": "orders", "partition": 0}],
        [],
    )
    # The HTTP API's view: every key the API documents, JSON-ready.
    assert set(d) == {
        "transactional_id", "producer_id", "producer_epoch", "state", "timeout_ms", "start_time_ms",
        "last_update_time_ms", "partitions", "prepared_ms", "group_id", "next_transaction_partitions",
        "carried_partitions",
    }  # fmt: skip
    assert json.loads(json.dumps(d)) == d


# -- prepared transactions (KIP-939 idea) -------------------------------------------------------------


def test_prepared_txn_is_durable_exempt_from_timeout_and_completed_by_any_holder(store: NodeStore) -> None:
    coord = Coordinator(store)
    r = coord.init(timeout=100)
    pid = r.producer_id
    coord.add(pid, 0, TP0, now=0)
    p = coord.prepare(pid, 0, now=50)
    assert (p.producer_id, p.producer_epoch, p.prepared_ms, p.retry) == (pid, 0, 50, False)
    assert coord.prepare(pid, 0, now=60).retry  # idempotent
    assert err(coord.add(pid, 0, TP1)) is ErrorCode.INVALID_TXN_STATE  # content is fixed once prepared
    assert coord.sm.expired_transactions(10_000, max_prepared_ms=20_000) == []  # timeout does not apply
    assert [m.transactional_id for m in coord.sm.expired_transactions(20_051, max_prepared_ms=20_000)] == [TID]
    # Another process (a restarted writer, a driver) completes it with (tid, pid, epoch) after a restart.
    other = Coordinator(store)
    assert other.meta().state is S.PREPARED
    done = other.end(pid, 0, True)
    assert done.markers == MarkerPlan(TID, pid, 1, True, (TP0,), 1)
    assert other.meta().prepared is None


def test_init_producer_id_aborts_an_unbound_prepared_txn(coord: Coordinator) -> None:
    # KIP-939 keepPreparedTxn=false: a new incarnation aborts what its predecessor prepared.
    pid, epoch = coord.open_txn()
    coord.prepare(pid, epoch)
    assert err(coord.init()) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert coord.meta().state is S.PREPARE_ABORT


# -- commit groups -------------------------------------------------------------------------------------


class Group:
    """Two members on two ``__transaction_state`` partitions and the group's decision partition."""

    def __init__(self, store: NodeStore) -> None:
        self.a = Coordinator(store, b"X\x00\x00\x00\x02")
        self.b = Coordinator(store, b"X\x00\x00\x00\x03")
        self.g = Coordinator(store, b"X\x00\x00\x00\x04")
        self.members = []
        for c, tid in ((self.a, "w-a"), (self.b, "w-b")):
            pid, epoch = c.open_txn(tid, TP0)
            assert c.prepare(pid, epoch, tid=tid, group="job-1").group_id == "job-1"
            self.members.append(GroupMember(tid, pid, epoch))

    def decide(self, commit: bool, members: tuple[GroupMember, ...] | None = None) -> GroupDecisionResult:
        members = tuple(self.members) if members is None else members
        return self.g.apply(
            DecideGroup(group_id="job-1", commit=commit, members=members, now_ms=1, coordinator_epoch=1)
        )

    def resolve(self, c: Coordinator, m: GroupMember, commit: bool) -> Any:
        return c.apply(
            ResolvePrepared(
                transactional_id=m.transactional_id,
                producer_id=m.producer_id,
                producer_epoch=m.producer_epoch,
                group_id="job-1",
                commit=commit,
                now_ms=2,
                coordinator_epoch=1,
            )
        )

    def done(self, m: GroupMember) -> Any:
        return self.g.apply(
            GroupMemberDone(group_id="job-1", transactional_id=m.transactional_id, now_ms=3, coordinator_epoch=1)
        )


def test_group_commit_survives_the_caller_dying_after_the_decision(store: NodeStore) -> None:
    grp = Group(store)
    ma, mb = grp.members
    assert check_member_ready(grp.a.meta("w-a"), "job-1", ma) is None
    decided = grp.decide(True)
    assert decided.created and decided.decision.commit
    # A racing abort (a member's orphan resolution) gets the recorded commit back.
    later = grp.decide(False, ())
    assert not later.created and later.decision == decided.decision
    assert grp.resolve(grp.a, ma, True).markers.commit
    grp.done(ma)
    # The caller dies here. The decision partition restarts and knows what is left to do.
    grp.g.reopen()
    [pending] = grp.g.sm.pending_group_decisions()
    assert pending.pending == (mb,)
    assert member_commits(pending, mb)
    assert grp.resolve(grp.b, mb, True).markers.commit
    assert grp.resolve(grp.b, mb, True).retry  # the resumed driver may repeat itself
    grp.done(mb)
    assert grp.g.sm.pending_group_decisions() == []
    assert grp.a.meta("w-a").state is S.PREPARE_COMMIT and grp.b.meta("w-b").state is S.PREPARE_COMMIT


def test_bound_member_ends_only_through_its_group(store: NodeStore) -> None:
    grp = Group(store)
    ma = grp.members[0]
    before = grp.a.meta("w-a")
    assert err(grp.a.end(ma.producer_id, ma.producer_epoch, False, tid="w-a")) is ErrorCode.INVALID_TXN_STATE
    assert err(grp.a.fence(ma.producer_id, ma.producer_epoch, tid="w-a")) is ErrorCode.INVALID_TXN_STATE
    assert err(grp.a.init("w-a")) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert grp.a.meta("w-a") == before
    # The resolution must name the group it is bound to.
    wrong = dataclasses.replace(ma)
    res = grp.a.apply(
        ResolvePrepared(
            transactional_id="w-a",
            producer_id=wrong.producer_id,
            producer_epoch=wrong.producer_epoch,
            group_id="job-2",
            commit=True,
            now_ms=2,
            coordinator_epoch=1,
        )
    )
    assert err(res) is ErrorCode.INVALID_TXN_STATE


def test_orphaned_group_aborts_as_a_whole(store: NodeStore) -> None:
    # No decision was recorded (the caller died before it): a member's max prepared time passes,
    # its coordinator records ABORT for the group first; the caller's late commit gets the abort back.
    grp = Group(store)
    ma, mb = grp.members
    [expired] = grp.a.sm.expired_transactions(10**12)
    assert expired.group_id == "job-1"
    abort = grp.decide(False, ())
    assert abort.created and not member_commits(abort.decision, ma)
    late_commit = grp.decide(True)
    assert not late_commit.created and not late_commit.decision.commit
    for c, m in ((grp.a, ma), (grp.b, mb)):
        assert grp.resolve(c, m, False).markers.commit is False
        assert err(grp.resolve(c, m, True)) is ErrorCode.INVALID_TXN_STATE  # never both ways


def test_member_left_out_of_a_commit_decision_aborts(store: NodeStore) -> None:
    grp = Group(store)
    ma, mb = grp.members
    decision = grp.decide(True, (ma,)).decision
    assert member_commits(decision, ma) and not member_commits(decision, mb)
    assert not member_commits(decision, dataclasses.replace(ma, producer_epoch=ma.producer_epoch + 1))


def test_bind_prepared_and_member_checks(coord: Coordinator) -> None:
    pid, epoch = coord.open_txn()
    member = GroupMember(TID, pid, epoch)
    assert err(check_member_ready(coord.meta(), "g", member)) is ErrorCode.INVALID_TXN_STATE  # Ongoing
    coord.prepare(pid, epoch)
    assert err(check_member_ready(coord.meta(), "g", member)) is ErrorCode.INVALID_TXN_STATE  # unbound

    def bind(group: str, epoch_: int = epoch) -> Any:
        return coord.apply(
            BindPrepared(
                transactional_id=TID,
                producer_id=pid,
                producer_epoch=epoch_,
                group_id=group,
                now_ms=1,
                coordinator_epoch=1,
            )
        )

    assert not bind("g").retry and bind("g").retry
    assert err(bind("h")) is ErrorCode.INVALID_TXN_STATE
    assert err(bind("g", epoch + 3)) is ErrorCode.PRODUCER_FENCED
    assert check_member_ready(coord.meta(), "g", member) is None
    assert err(check_member_ready(coord.meta(), "g", GroupMember(TID, pid, epoch + 1))) is ErrorCode.PRODUCER_FENCED
    assert err(coord.prepare(pid, epoch, group="h")) is ErrorCode.INVALID_TXN_STATE


def test_group_decision_validation_and_forgetting(store: NodeStore) -> None:
    g = Coordinator(store)
    m = GroupMember("t", 1, 0)

    def decide(group: str, commit: bool, members: tuple[GroupMember, ...]) -> Any:
        return g.apply(DecideGroup(group_id=group, commit=commit, members=members, now_ms=100, coordinator_epoch=1))

    assert err(decide("", True, (m,))) is ErrorCode.INVALID_REQUEST
    assert err(decide("g", True, ())) is ErrorCode.INVALID_REQUEST
    assert err(decide("g", True, (m, dataclasses.replace(m, producer_epoch=1)))) is ErrorCode.INVALID_REQUEST
    assert g.sm.group_decisions() == []
    decide("g", True, (m,))

    def forget(now: int) -> Any:
        return g.apply(ForgetGroup(group_id="g", now_ms=now, coordinator_epoch=1, retention_ms=1_000))

    assert err(forget(10_000)) is ErrorCode.INVALID_TXN_STATE  # a member is pending
    assert err(g.apply(GroupMemberDone(group_id="g", transactional_id="x", now_ms=1, coordinator_epoch=1))) is (
        ErrorCode.INVALID_REQUEST
    )
    g.apply(GroupMemberDone(group_id="g", transactional_id="t", now_ms=1, coordinator_epoch=1))
    assert err(forget(1_100)) is ErrorCode.INVALID_TXN_STATE  # within retention
    assert forget(1_101).decision.group_id == "g"
    assert g.sm.group_decision("g") is None
    assert err(forget(1_102)) is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND


def test_group_decision_partition_is_chosen_by_the_same_stable_hash() -> None:
    assert coordinator_partition("job-1", 16) == coordinator_partition("job-1", 16)
    assert {coordinator_partition(f"job-{i}", 16) for i in range(200)} == set(range(16))
