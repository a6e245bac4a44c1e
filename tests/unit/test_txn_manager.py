"""The transactional producer's pure half: ``TransactionManager`` states, and the accumulator in transactional mode.

No sockets, no threads, a fake clock. The rules are Kafka's client rules
(kafka_txn.md §4.3 "client" columns, §8 KIP-890 TV2, §12): fenced -> fatal,
a failed batch -> abortable, one identity per transaction, sequences restart
at 0 with each EndTxn's identity, a commit is never turned into an abort.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.aio._accumulator import Outcome, RecordAccumulator
from clients.aio._batch import ProducerBatch, record_size
from clients.aio._idempotence import IdempotenceManager, ProducerIdState
from clients.aio._transactions import (
    VALID_PREVIOUS,
    TransactionAbortedError,
    TransactionManager,
    TxnState,
)
from clients.aio._txn_coordinator import offset_commit_entries
from clients.protocol import (
    ATTR_TRANSACTIONAL,
    BrokerError,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    encode_produce_request,
    parse_batch,
)
from clients.records import OffsetAndMetadata
from tests.unit.test_producer_accumulator import Sink, error, leader

S = TxnState
TID = "tx-unit"


def make(*, batch_size: int = 1000, max_request_size: int = 1 << 20) -> tuple[TransactionManager, RecordAccumulator]:
    idem = IdempotenceManager(enabled=False, transactional=True)
    txn = TransactionManager(TID, idem)
    acc = RecordAccumulator(
        idem,
        batch_size=batch_size,
        linger_s=0.005,
        max_in_flight=5,
        delivery_timeout_s=120.0,
        retry_backoff_s=0.1,
        retries=2**31 - 1,
        max_request_size=max_request_size,
        rng=random.Random(1),
        request_overhead=len(TID.encode()),
    )
    return txn, acc


def ready(pid: int = 7, epoch: int = 0) -> tuple[TransactionManager, RecordAccumulator]:
    txn, acc = make()
    txn.begin_init()
    txn.initialized(pid, epoch)
    return txn, acc


def put(acc: RecordAccumulator, partition: int, value: bytes = b"v", now: float = 0.0) -> Sink:
    sink = Sink()
    acc.append("t", partition, 1000, None, value, b"\x00\x00", record_size(None, value, b"\x00\x00"), sink, now)
    return sink


def send_all(acc: RecordAccumulator, now: float = 1.0) -> list:
    out = [b for _, batches in acc.drain(now, leader) for b in batches]
    for _ in out:
        acc.request_finished()
    return out


# ---- the table --------------------------------------------------------------------------------------


def test_transition_table_rejects_illegal_moves_naming_both_states():
    txn, _ = make()
    with pytest.raises(BrokerError, match="UNINITIALIZED -> COMMITTING") as ei:
        txn.transition_to(S.COMMITTING)
    assert ei.value.error_code is ErrorCode.INVALID_TXN_STATE
    assert txn.state is S.UNINITIALIZED


def test_every_state_can_become_fatal_and_fatal_is_absorbing():
    assert all(s in VALID_PREVIOUS[S.FATAL_ERROR] for s in TxnState if s is not S.FATAL_ERROR)
    assert all(S.FATAL_ERROR not in prev for target, prev in VALID_PREVIOUS.items() if target is not S.FATAL_ERROR)


def test_transactional_producer_state_is_idempotent_and_never_bumps_locally():
    txn, _ = ready()
    assert txn.idem.enabled and txn.idem.transactional
    txn.begin()
    txn.idem.request_bump("unresolved sequence")  # KIP-360 bump of an idempotent producer...
    assert txn.idem.state is ProducerIdState.READY  # ...is not for a transactional one: the txn is abortable
    assert txn.state is S.ABORTABLE_ERROR
    assert "unresolved sequence" in txn.abortable_error.message


# ---- Kafka's client rules ------------------------------------------------------------------------------


def test_send_and_begin_need_init_and_begin_first():
    txn, _ = make()
    for call in (txn.check_send, txn.begin, txn.check_offsets):
        with pytest.raises(BrokerError, match="init_transactions") as ei:
            call()
        assert ei.value.error_code is ErrorCode.INVALID_TXN_STATE
    txn.begin_init()
    txn.initialized(7, 0)
    with pytest.raises(BrokerError, match="begin_transaction"):
        txn.check_send()
    txn.begin()
    txn.check_send()
    with pytest.raises(BrokerError, match="already open"):
        txn.begin()


def test_batches_are_sequenced_only_while_a_transaction_sends():
    txn, acc = ready()
    put(acc, 0)
    assert acc.drain(1.0, leader) == []  # READY: nothing is sequenced (records cannot even be appended by send())
    txn.begin()
    [b] = send_all(acc)
    header = parse_batch(b.wire)
    assert header.attributes & ATTR_TRANSACTIONAL
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 0, 0)
    acc.handle_response(b, 0, -1, None, 1.0)
    txn.begin_end(S.COMMITTING)
    put(acc, 0, now=1.0)
    assert send_all(acc, 2.0), "COMMITTING flushes the open transaction's batches"


def test_first_batches_of_a_transaction_travel_together_and_are_retried_in_order():
    # KIP-890: the leader holds a transaction's first batch to a partition while the coordinator adds the
    # partition; the batches behind it share that verification there and reach Raft in sequence order
    # (cluster/sequencer.py), so they travel at once -- up to max_in_flight -- in every transaction.
    txn, acc = ready()
    txn.begin()
    for _ in range(4):
        put(acc, 0, b"x" * 600)  # one batch each (batch_size 1000)
    first = send_all(acc)
    assert [parse_batch(b.wire).base_sequence for b in first] == [0, 1, 2, 3]
    # The previous transaction was still completing: every batch gets the shared, retriable answer.
    for b in first:
        assert acc.handle_response(b, -1, -1, error(ErrorCode.CONCURRENT_TRANSACTIONS), 1.0) is Outcome.RETRY
    again = send_all(acc, 1.5)
    assert [(b.base_sequence, b.producer_epoch) for b in again] == [(0, 0), (1, 0), (2, 0), (3, 0)], (
        "resent in order, same identity and sequences"
    )
    for off, b in enumerate(again):
        assert acc.handle_response(b, off, -1, None, 1.6) is Outcome.ACKED
    txn.begin_end(S.COMMITTING)
    txn.ended(7, 1, committed=True)
    txn.begin()
    for _ in range(5):
        put(acc, 0, b"x" * 600, now=2.0)
    nxt = send_all(acc, 3.0)
    assert [(b.base_sequence, b.producer_epoch) for b in nxt] == [(i, 1) for i in range(5)], (
        "the next transaction starts at sequence 0 under its new epoch, a full window at once"
    )


def test_a_pipelined_commit_holds_the_next_transactions_batches_until_it_ends():
    txn, acc = ready()
    txn.begin()
    put(acc, 0, b"x" * 300)  # an open batch, not full: it belongs to the committing transaction
    txn.begin_pipelined_commit()
    acc.hold_new_batches()
    later = put(acc, 0, b"y" * 300)  # must not join the open batch: a new, held one
    put(acc, 1, b"z" * 300, now=0.0)
    txn.check_send()  # the next transaction is open for sends
    assert [b.held for b in acc.unreported()] == [False, True, True]
    assert len(list(acc.unreported(held=False))) == 1, "the commit's flush waits for its own batch only"
    [first] = send_all(acc, 5.0)  # long past linger: still only the committing transaction's batch
    assert (first.partition, first.record_count, first.producer_epoch) == (0, 1, 0)
    assert acc.next_deadline(5.0) == pytest.approx(120.0), "only the in-flight batch's expiry: held ones arm none"
    assert acc.handle_response(first, 0, -1, None, 5.0) is Outcome.ACKED
    assert send_all(acc, 6.0) == []
    txn.ended(7, 1, committed=True)  # EndTxn answered with the next identity
    assert txn.state is S.IN_TRANSACTION
    acc.release_held()
    nxt = sorted(send_all(acc, 6.0), key=lambda b: b.partition)
    assert [(b.partition, b.producer_epoch, b.base_sequence) for b in nxt] == [(0, 1, 0), (1, 1, 0)], (
        "the held batches go out under the next transaction's identity, from sequence 0"
    )
    assert not later.done()


def committing_one_batch() -> tuple[TransactionManager, RecordAccumulator, ProducerBatch]:
    """A transaction whose one batch is in flight, now committing by ``commit_and_begin`` (held from here)."""
    txn, acc = ready()
    txn.begin()
    put(acc, 0)
    [b] = send_all(acc)
    txn.begin_pipelined_commit()
    acc.hold_new_batches()
    return txn, acc, b


def test_held_batches_do_not_expire_while_the_commit_runs():
    txn, acc, b = committing_one_batch()
    held = put(acc, 0, now=1.0)
    assert acc.handle_response(b, 0, -1, None, 2.0) is Outcome.ACKED
    assert acc.expire(500.0) == 0, "a held batch is not the committing transaction's to expire"
    assert not held.done() and txn.state is S.PIPELINED_COMMIT
    assert acc.next_deadline(500.0) is None, "nor a time to wake the sender for: it would spin"


def test_a_failed_pipelined_commit_fails_the_held_batches_and_stays_a_commit():
    txn, acc, b = committing_one_batch()
    assert acc.handle_response(b, 0, -1, None, 1.0) is Outcome.ACKED
    held = [put(acc, p, now=1.0) for p in (0, 1)]
    txn.pipelined_commit_unsettled()  # EndTxn timed out: outcome unknown
    assert acc.fail_held(TransactionAbortedError("previous did not commit")) == 2
    assert all(isinstance(s.error, TransactionAbortedError) for s in held)
    assert txn.state is S.COMMITTING, "failing the held batches must not turn the commit into an abort"
    assert list(acc.unreported()) == [] and not acc.holding
    with pytest.raises(BrokerError, match="commit_transaction"):
        txn.check_send()
    txn.begin_end(S.COMMITTING)  # commit_transaction() resumes it
    txn.ended(7, 1, committed=True)
    assert txn.state is S.READY


def test_a_batch_of_the_committing_transaction_failing_makes_the_pipelined_commit_abortable():
    txn, acc, b = committing_one_batch()
    put(acc, 0, now=1.0)
    assert acc.handle_response(b, -1, -1, error(ErrorCode.MESSAGE_TOO_LARGE), 1.0) is Outcome.FAILED
    assert txn.state is S.ABORTABLE_ERROR
    with pytest.raises(BrokerError) as ei:
        txn.raise_if_abortable()
    assert ei.value.error_code is ErrorCode.TRANSACTION_ABORTABLE
    with pytest.raises(BrokerError):
        txn.begin_pipelined_commit()


def test_request_size_counts_the_transactional_id():
    # The accumulator's framing must equal the encoder's, or a full request exceeds max_request_size
    txn, acc = make(batch_size=100_000)
    txn.begin_init()
    txn.initialized(1, 0)
    txn.begin()
    put(acc, 0, b"x" * 500)
    [(_, [b])] = acc.drain(1.0, leader)
    req = ProduceRequest((ProducePartition("t", 0, b.wire),), transactional_id=TID)
    assert len(encode_produce_request(req)) == acc.request_framing + len(b.wire) + 10 + len(b"t")


def test_failed_batch_makes_the_transaction_abortable_and_commit_raises():
    txn, acc = ready()
    txn.begin()
    s_fail = put(acc, 0)
    put(acc, 1)
    b0, b1 = sorted(send_all(acc), key=lambda b: b.partition)
    assert acc.handle_response(b0, -1, -1, error(ErrorCode.MESSAGE_TOO_LARGE), 1.0) is Outcome.FAILED
    assert s_fail.error.error_code is ErrorCode.MESSAGE_TOO_LARGE
    assert txn.state is S.ABORTABLE_ERROR
    for call in (txn.check_send, txn.check_offsets, txn.raise_if_abortable, lambda: txn.begin_end(S.COMMITTING)):
        with pytest.raises(BrokerError) as ei:
            call()
        assert ei.value.error_code is ErrorCode.TRANSACTION_ABORTABLE
    assert acc.handle_response(b1, 5, -1, None, 1.0) is Outcome.ACKED  # an in-flight batch still completes
    txn.begin_end(S.ABORTING)
    assert txn.needs_end_txn()
    txn.ended(7, 1, committed=False)
    assert txn.state is S.READY
    assert txn.idem.current.epoch == 1
    txn.begin()
    put(acc, 0, now=2.0)
    [b] = send_all(acc, 3.0)
    assert (b.producer_epoch, b.base_sequence) == (1, 0), "sequences restart at 0 with the next identity"


def test_commit_failure_during_flush_moves_committing_to_abortable():
    txn, acc = ready()
    txn.begin()
    put(acc, 0)
    txn.begin_end(S.COMMITTING)
    [b] = send_all(acc)
    acc.handle_response(b, -1, -1, error(ErrorCode.INVALID_TXN_STATE), 1.0)
    with pytest.raises(BrokerError) as ei:
        txn.raise_if_abortable()
    assert ei.value.error_code is ErrorCode.TRANSACTION_ABORTABLE


def test_queued_batch_expiring_makes_the_transaction_abortable():
    # An idempotent producer lets a never-sent batch expire without consequence; in a txn its records are lost
    txn, acc = ready()
    txn.begin()
    s = put(acc, 0)  # never drained (no leader known, say)
    assert acc.expire(200.0) == 1
    assert s.error.error_code is ErrorCode.REQUEST_TIMED_OUT
    assert txn.state is S.ABORTABLE_ERROR


def test_abort_fails_undrained_batches_and_leaves_in_flight_ones_to_their_answer():
    txn, acc = ready()
    txn.begin()
    s_flight = put(acc, 0)
    [b_flight] = send_all(acc)
    s_retry = put(acc, 1, now=1.0)
    [b_retry] = send_all(acc, 2.0)
    assert acc.handle_response(b_retry, -1, -1, error(ErrorCode.NOT_ENOUGH_REPLICAS), 2.0) is Outcome.RETRY
    s_queued = put(acc, 2, now=2.0)
    txn.begin_end(S.ABORTING)
    assert acc.has_undrained()
    assert acc.fail_undrained(TransactionAbortedError("aborted")) == 2
    for s in (s_retry, s_queued):
        assert isinstance(s.error, TransactionAbortedError)
        assert s.error.error_code is ErrorCode.TRANSACTION_ABORTABLE
    assert not s_flight.done() and not acc.has_undrained()
    assert txn.state is S.ABORTING, "failures while aborting change nothing"
    assert acc.drain(10.0, leader) == [], "ABORTING sends nothing new and resends nothing"
    acc.handle_response(b_flight, 3, -1, None, 3.0)
    assert s_flight.result.offset == 3


def test_fencing_is_fatal_and_every_later_call_raises_producer_fenced():
    txn, acc = ready()
    txn.begin()
    s = put(acc, 0)
    [b] = send_all(acc)
    assert acc.handle_response(b, -1, -1, error(ErrorCode.INVALID_PRODUCER_EPOCH), 1.0) is Outcome.FATAL
    assert s.error.error_code is ErrorCode.INVALID_PRODUCER_EPOCH  # the record reports what the broker said
    assert txn.state is S.FATAL_ERROR
    calls = (txn.check_send, txn.begin, txn.check_offsets, txn.begin_init, lambda: txn.begin_end(S.ABORTING))
    for call in calls:
        with pytest.raises(BrokerError) as ei:
            call()
        assert ei.value.error_code is ErrorCode.PRODUCER_FENCED
        assert ei.value.extra["cause"] == "INVALID_PRODUCER_EPOCH"


def test_end_rejections_abortable_or_fatal():
    txn, _ = ready()
    txn.begin()
    txn.begin_end(S.COMMITTING)
    err = txn.end_rejected(error(ErrorCode.TRANSACTION_ABORTABLE))
    assert err.error_code is ErrorCode.TRANSACTION_ABORTABLE and txn.state is S.ABORTABLE_ERROR
    txn.begin_end(S.ABORTING)
    err = txn.end_rejected(error(ErrorCode.PRODUCER_FENCED))
    assert err.error_code is ErrorCode.PRODUCER_FENCED and txn.state is S.FATAL_ERROR


def test_a_timed_out_commit_resumes_and_can_never_become_an_abort():
    # kafka_txn.md §12 (KAFKA-17754): an ambiguous commit is retried, never turned into an abort
    txn, _ = ready()
    txn.begin()
    txn.begin_end(S.COMMITTING)
    txn.begin_end(S.COMMITTING)  # the retry after REQUEST_TIMED_OUT resumes
    with pytest.raises(BrokerError, match="commit is under way") as ei:
        txn.begin_end(S.ABORTING)
    assert ei.value.error_code is ErrorCode.INVALID_TXN_STATE
    assert txn.state is S.COMMITTING


def test_empty_transaction_ends_locally():
    txn, _ = ready()
    txn.begin()
    assert not txn.needs_end_txn()
    txn.offset_groups.add("g")
    assert txn.needs_end_txn(), "offsets alone put the coordinator in the transaction"


def test_prepared_producer_may_only_be_reinitialised():
    txn, _ = ready()
    txn.begin()
    txn.begin_end(S.PREPARING)
    txn.prepared()
    for call in (txn.check_send, txn.begin, lambda: txn.begin_end(S.COMMITTING), lambda: txn.begin_end(S.ABORTING)):
        with pytest.raises(BrokerError, match="prepared") as ei:
            call()
        assert ei.value.error_code is ErrorCode.INVALID_TXN_STATE
    txn.begin_init()
    txn.initialized(7, 3)
    assert txn.state is S.READY and txn.idem.current.epoch == 3


def test_init_timeout_allows_a_second_init():
    txn, _ = make()
    txn.begin_init()
    txn.init_failed()
    assert txn.state is S.UNINITIALIZED
    txn.begin_init()
    assert txn.state is S.INITIALIZING


def test_offset_entries_accept_ints_and_offset_and_metadata_and_reject_garbage():
    assert offset_commit_entries({("in", 0): 42, ("in", 1): OffsetAndMetadata(7, "m")}) == [
        {"topic": "in", "partition": 0, "offset": 42, "metadata": ""},
        {"topic": "in", "partition": 1, "offset": 7, "metadata": "m"},
    ]
    for bad in ({}, {("in", 0): -1}, {("in", "0"): 1}, {"in": 1}, {("in", 0): True}, [("in", 0)]):
        with pytest.raises(BrokerError) as ei:
            offset_commit_entries(bad)  # type: ignore[arg-type]
        assert ei.value.error_code is ErrorCode.INVALID_REQUEST


# ---- the state machine against a model --------------------------------------------------------------

OPS = ("init", "init_fail", "initialized", "begin", "send", "commit", "abort", "prepare", "prepared",
       "ended", "batch_failed", "offsets", "fenced", "pipelined", "unsettled")  # fmt: skip


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_random_calls_follow_the_model(data):
    """Every call either follows the model's transition or raises without changing anything.

    Each step draws from every op plus (three times over) the ops the model
    allows, so runs get deep into the table instead of dying in the first states.
    """
    txn, _ = make()
    model = S.UNINITIALIZED
    for _ in range(data.draw(st.integers(1, 60), label="steps")):
        allowed = [op for op in OPS if op != "fenced" and _model_step(model, op) not in (None, model)]
        op = data.draw(st.sampled_from(list(OPS) + allowed * 3), label="op")
        before = txn.state
        expected = _model_step(model, op)
        raised: BrokerError | None = None
        try:
            _apply(txn, op)
        except BrokerError as exc:
            raised = exc
        if raised is not None:
            assert expected is None, (op, model, raised)
            assert txn.state is before, f"{op} raised but changed {before} -> {txn.state}"
            if model is S.FATAL_ERROR and op in ("init", "begin", "send", "offsets", "commit", "abort", "prepare"):
                assert raised.error_code is ErrorCode.PRODUCER_FENCED
            continue
        assert expected is not None, (op, model, txn.state)
        model = expected
        assert txn.state is model, (op, txn.state, model)
        assert txn.idem.sending_allowed == (model in (S.IN_TRANSACTION, S.COMMITTING, S.PIPELINED_COMMIT, S.PREPARING))
        assert txn.open == (model in (S.IN_TRANSACTION, S.PIPELINED_COMMIT))


def _apply(txn: TransactionManager, op: str) -> None:
    if op == "init":
        txn.begin_init()
    elif op == "init_fail":
        if txn.state is not S.INITIALIZING:
            raise BrokerError(ErrorCode.INVALID_TXN_STATE, "test: only while initializing")
        txn.init_failed()
    elif op == "initialized":
        if txn.state is not S.INITIALIZING:
            raise BrokerError(ErrorCode.INVALID_TXN_STATE, "test: only while initializing")
        txn.initialized(1, 0)
    elif op == "begin":
        txn.begin()
    elif op == "send":
        txn.check_send()
    elif op == "offsets":
        txn.check_offsets()
    elif op in ("commit", "abort", "prepare"):
        txn.begin_end({"commit": S.COMMITTING, "abort": S.ABORTING, "prepare": S.PREPARING}[op])
    elif op == "prepared":
        if txn.state is not S.PREPARING:
            raise BrokerError(ErrorCode.INVALID_TXN_STATE, "test: only while preparing")
        txn.prepared()
    elif op == "ended":
        if txn.state not in (S.COMMITTING, S.ABORTING, S.PIPELINED_COMMIT):
            raise BrokerError(ErrorCode.INVALID_TXN_STATE, "test: only while ending")
        txn.ended(1, txn.idem.current.epoch + 1, committed=txn.state is not S.ABORTING)
    elif op == "pipelined":
        txn.begin_pipelined_commit()
    elif op == "unsettled":
        if txn.state is not S.PIPELINED_COMMIT:
            raise BrokerError(ErrorCode.INVALID_TXN_STATE, "test: only while a pipelined commit runs")
        txn.pipelined_commit_unsettled()
    elif op == "batch_failed":
        txn.idem.batch_failed(error(ErrorCode.CORRUPT_MESSAGE))
    elif op == "fenced":
        txn.fail(error(ErrorCode.PRODUCER_FENCED))


def _model_step(state: TxnState, op: str) -> TxnState | None:
    """Kafka's client table restated; None = the call raises."""
    if state is S.FATAL_ERROR:
        return S.FATAL_ERROR if op in ("batch_failed", "fenced") else None
    if op == "fenced":
        return S.FATAL_ERROR
    if op == "batch_failed":
        sending = (S.IN_TRANSACTION, S.COMMITTING, S.PIPELINED_COMMIT, S.PREPARING)
        return S.ABORTABLE_ERROR if state in sending else state
    table: dict[tuple[TxnState, str], TxnState] = {
        (S.UNINITIALIZED, "init"): S.INITIALIZING,
        (S.PREPARED, "init"): S.INITIALIZING,
        (S.INITIALIZING, "init_fail"): S.UNINITIALIZED,
        (S.INITIALIZING, "initialized"): S.READY,
        (S.READY, "begin"): S.IN_TRANSACTION,
        (S.IN_TRANSACTION, "send"): S.IN_TRANSACTION,
        (S.IN_TRANSACTION, "offsets"): S.IN_TRANSACTION,
        (S.IN_TRANSACTION, "commit"): S.COMMITTING,
        (S.COMMITTING, "commit"): S.COMMITTING,
        (S.IN_TRANSACTION, "abort"): S.ABORTING,
        (S.ABORTABLE_ERROR, "abort"): S.ABORTING,
        (S.PREPARING, "abort"): S.ABORTING,
        (S.ABORTING, "abort"): S.ABORTING,
        (S.IN_TRANSACTION, "prepare"): S.PREPARING,
        (S.PREPARING, "prepare"): S.PREPARING,
        (S.PREPARING, "prepared"): S.PREPARED,
        (S.COMMITTING, "ended"): S.READY,
        (S.ABORTING, "ended"): S.READY,
        # Pipelined commit: the next transaction is open (send allowed, its batches held) while it runs;
        # its end opens that transaction, a timeout leaves COMMITTING for commit_transaction to finish.
        (S.IN_TRANSACTION, "pipelined"): S.PIPELINED_COMMIT,
        (S.PIPELINED_COMMIT, "send"): S.PIPELINED_COMMIT,
        (S.PIPELINED_COMMIT, "ended"): S.IN_TRANSACTION,
        (S.PIPELINED_COMMIT, "unsettled"): S.COMMITTING,
    }
    return table.get((state, op))
