"""Pure producer logic: batch encoding, accumulator, sending order, retries, expiry and the KIP-360 epoch bump.

No sockets and no threads: a fake clock, and for the simulation a model broker
that applies the real sequence rules (``storage.producer_state``, kafka_txn.md
§3.1) to requests delivered in random order, with lost requests, lost
responses and requests that land long after the client gave up on them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.aio._accumulator import Outcome, RecordAccumulator
from clients.aio._batch import BatchState, DeliveryTimeoutError, ProducerBatch, encode_headers, record_size
from clients.aio._idempotence import EPOCH_EXHAUSTED, IdempotenceManager, ProducerIdState
from clients.protocol import BrokerError, ErrorCode, Record, decode_records, encode_batch, parse_batch
from clients.records import RecordMetadata
from storage.producer_state import ProducerStateManager

T = "t"


class Sink:
    """A minimal RecordSink (what asyncio/concurrent futures provide)."""

    def __init__(self) -> None:
        self.result: RecordMetadata | None = None
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def set_result(self, result: RecordMetadata) -> None:
        assert not self.done()
        self.result = result

    def set_exception(self, exception: BaseException) -> None:
        assert not self.done()
        self.error = exception

    def exception(self) -> BaseException | None:
        return self.error


def make(
    *,
    idempotent: bool = True,
    batch_size: int = 1000,
    linger_s: float = 0.005,
    max_in_flight: int = 5,
    delivery_timeout_s: float = 120.0,
    retries: int = 2**31 - 1,
    max_request_size: int = 1 << 20,
) -> tuple[IdempotenceManager, RecordAccumulator]:
    idem = IdempotenceManager(enabled=idempotent)
    if idempotent:
        idem.set_producer_id(7, 0)
    acc = RecordAccumulator(
        idem,
        batch_size=batch_size,
        linger_s=linger_s,
        max_in_flight=max_in_flight,
        delivery_timeout_s=delivery_timeout_s,
        retry_backoff_s=0.1,
        retries=retries,
        max_request_size=max_request_size,
        rng=random.Random(1),
    )
    return idem, acc


def put(acc: RecordAccumulator, partition: int, value: bytes, now: float = 0.0, topic: str = T) -> Sink:
    sink = Sink()
    acc.append(topic, partition, 1000, None, value, b"\x00\x00", record_size(None, value, b"\x00\x00"), sink, now)
    return sink


def leader(_topic: str, _p: int) -> str:
    return "http://leader"


def error(code: ErrorCode) -> BrokerError:
    return BrokerError(code, "test")


# ---- encoding ------------------------------------------------------------------------------------

records_st = st.lists(
    st.builds(
        Record,
        value=st.none() | st.binary(max_size=40),
        key=st.none() | st.binary(max_size=10),
        headers=st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=8)), max_size=3).map(tuple),
        timestamp=st.integers(0, 2**41),
    ),
    min_size=1,
    max_size=8,
)


@given(records_st, st.integers(0, 2**40), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1))
@settings(max_examples=200, deadline=None)
def test_batch_bytes_equal_protocol_encode_batch(records, pid, epoch, seq):
    b = ProducerBatch(T, 0, 0.0)
    for r in records:
        b.append(r.timestamp, r.key, r.value, encode_headers(r.headers), Sink())
    b.seal_wire(pid, epoch, seq, transactional=False)
    assert b.wire == encode_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    assert b.size == len(b.wire)
    assert list(decode_records(b.wire)) == list(records)


def test_record_size_counts_the_encoded_bytes():
    hb = encode_headers([("h", b"12"), ("k", None)])
    b = ProducerBatch(T, 0, 0.0)
    b.append(5, b"key", b"value", hb, Sink())
    assert b.size - 40 == record_size(b"key", b"value", hb)


def test_batch_transition_table_rejects_illegal_moves():
    b = ProducerBatch(T, 0, 0.0)
    with pytest.raises(BrokerError, match="QUEUED -> RETRY_WAIT"):
        b.transition_to(BatchState.RETRY_WAIT)


# ---- accumulating and draining ---------------------------------------------------------------------


def test_batches_fill_up_to_batch_size_and_wait_for_linger():
    _, acc = make(batch_size=300, linger_s=0.005)
    for _ in range(5):
        put(acc, 0, b"v" * 100)  # 116 bytes each: two fit in 300 with the 40-byte header
    pq = acc.partitions[(T, 0)]
    assert [b.record_count for b in pq.queue] == [2, 2, 1]
    # the full batches go now, the open one only after linger_ms
    assert [b.record_count for _, bs in acc.drain(0.001, leader) for b in bs] == [2, 2]
    assert acc.drain(0.002, leader) == []
    assert [b.record_count for _, bs in acc.drain(0.006, leader) for b in bs] == [1]


def test_flush_makes_an_open_batch_sendable_at_once():
    _, acc = make(linger_s=10)
    put(acc, 0, b"x")
    assert acc.drain(0.0, leader) == []
    acc.flushing += 1
    assert len(acc.drain(0.0, leader)) == 1


def test_at_most_max_in_flight_batches_per_partition_and_one_per_request():
    _, acc = make(batch_size=60, max_in_flight=5)
    for _ in range(8):
        put(acc, 0, b"v" * 4)
        put(acc, 1, b"v" * 4)
    reqs = acc.drain(1.0, leader)
    for _, batches in reqs:
        tps = [(b.topic, b.partition) for b in batches]
        assert len(tps) == len(set(tps)), "a partition twice in one request"
    sent = [b for _, bs in reqs for b in bs]
    assert sum(1 for b in sent if b.partition == 0) == 5
    assert sum(1 for b in sent if b.partition == 1) == 5
    assert len(reqs) == 5  # partition 0 and 1 share each request (same leader)
    # sequences are consecutive per partition, in send order
    seqs = [b.base_sequence for b in sent if b.partition == 0]
    assert seqs == sorted(seqs) and seqs[0] == 0


def test_requests_respect_max_request_size():
    _, acc = make(batch_size=200, max_request_size=300)
    put(acc, 0, b"a" * 150)
    put(acc, 1, b"b" * 150)
    reqs = acc.drain(1.0, leader)
    assert [len(bs) for _, bs in reqs] == [1, 1]


def test_partitions_without_a_leader_wait_and_stay_queued():
    _, acc = make()
    put(acc, 0, b"x")
    assert acc.drain(1.0, lambda _t, _p: None) == []
    assert acc.no_leader == {(T, 0)}
    assert acc.partitions[(T, 0)].queue[0].state is BatchState.QUEUED
    assert len(acc.drain(1.0, leader)) == 1


def test_sticky_partition_for_null_keys_moves_on_when_the_batch_is_full():
    _, acc = make(batch_size=300)
    seen = []
    for _ in range(6):
        p = acc.sticky_partition(T, lambda: [0, 1, 2], 116)
        seen.append(p)
        put(acc, p, b"v" * 100)
    assert seen[0] == seen[1]  # two records fill a batch on the sticky partition
    assert seen[2] != seen[1]  # the next record starts on another partition


def test_sticky_partitioner_moves_to_the_least_loaded_partition():
    # KIP-794: the next sticky partition is one with the fewest batches queued or in flight, so a
    # partition whose in-flight window is full does not keep collecting batches while another is idle.
    _, acc = make(batch_size=300)
    for _ in range(3):  # partition 0: three full batches waiting
        put(acc, 0, b"v" * 100)
        put(acc, 0, b"v" * 100)
    put(acc, 1, b"v" * 100)
    put(acc, 1, b"v" * 100)  # partition 1: one full batch
    acc.sticky[T] = 1
    picks = set()
    for _ in range(20):
        acc.sticky.pop(T, None)
        picks.add(acc.sticky_partition(T, lambda: [0, 1, 2], 116))
    assert picks == {2}  # partition 2 holds nothing
    put(acc, 2, b"v" * 100)
    put(acc, 2, b"v" * 100)  # now 0: 3, 1: 1, 2: 1 -> never partition 0
    acc.sticky.pop(T, None)
    assert {acc.sticky_partition(T, lambda: [0, 1, 2], 116) for _ in range(20)} <= {1, 2}


# ---- answers, retries, ordering ---------------------------------------------------------------------


def test_success_completes_every_record_with_consecutive_offsets():
    _, acc = make()
    sinks = [put(acc, 0, f"r{i}".encode()) for i in range(3)]
    [(_, [b])] = acc.drain(1.0, leader)
    acc.request_finished()
    assert acc.handle_response(b, 40, 123, None, 1.0) is Outcome.ACKED
    assert [s.result.offset for s in sinks] == [40, 41, 42]
    assert sinks[0].result.log_append_time == 123
    assert acc.buffered_bytes == 0
    assert not acc.has_pending()


def test_retry_resends_exactly_the_same_bytes():
    _, acc = make()
    put(acc, 0, b"x")
    [(_, [b])] = acc.drain(1.0, leader)
    wire = b.wire
    acc.request_finished()
    assert acc.handle_transport_error(b, error(ErrorCode.NETWORK_EXCEPTION), 1.0) is Outcome.RETRY
    assert b.maybe_written
    assert acc.drain(1.05, leader) == []  # backoff
    [(_, [again])] = acc.drain(1.2, leader)
    assert again is b and b.wire == wire and b.attempts == 2


def test_out_of_order_while_a_predecessor_is_in_flight_waits_for_it_then_resends():
    # Requests overtake each other on different connections: batch 2 reaches the broker first.
    _, acc = make(batch_size=60)
    for _ in range(3):
        put(acc, 0, b"v" * 4)
    sent = [b for _, bs in acc.drain(1.0, leader) for b in bs]
    b0, b1 = sent[0], sent[1]
    acc.request_finished()
    assert acc.handle_response(b1, -1, -1, error(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 1.0) is Outcome.RETRY
    assert acc.idem.state is ProducerIdState.READY  # reordering is not an unresolved sequence
    assert acc.drain(5.0, leader) == []  # b0 still in flight: b1 must not go ahead of it again
    acc.request_finished()
    acc.handle_response(b0, 0, 0, None, 1.0)
    [(_, [again])] = acc.drain(1.0, leader)  # no backoff: resent as soon as b0 is acknowledged
    assert again is b1 and again.base_sequence == b1.base_sequence


def test_new_batches_wait_behind_a_retry_and_retries_go_in_sequence_order():
    _, acc = make(batch_size=60)
    for _ in range(2):
        put(acc, 0, b"v" * 4)
    b0, b1 = (b for _, bs in acc.drain(1.0, leader) for b in bs)
    acc.request_finished()
    acc.request_finished()
    # b1's error arrives first and its backoff ends first; b0 must still be resent before it
    acc.handle_response(b1, -1, -1, error(ErrorCode.NOT_LEADER_OR_FOLLOWER), 1.0)
    acc.handle_response(b0, -1, -1, error(ErrorCode.NOT_LEADER_OR_FOLLOWER), 1.05)
    put(acc, 0, b"new", now=1.0)
    assert acc.drain(1.12, leader) == []  # b0's backoff not over: nothing, not even new batches
    sent = [b for _, bs in acc.drain(1.2, leader) for b in bs]
    assert sent[:2] == [b0, b1]  # the retries, in sequence order, then the new batch behind them
    assert [b.base_sequence for b in sent] == [0, 1, 2]


def test_non_retriable_error_fails_the_batch_and_requests_an_epoch_bump():
    idem, acc = make()
    sink = put(acc, 0, b"x")
    [(_, [b])] = acc.drain(1.0, leader)
    acc.request_finished()
    assert acc.handle_response(b, -1, -1, error(ErrorCode.MESSAGE_TOO_LARGE), 1.0) is Outcome.FAILED
    assert sink.error.error_code is ErrorCode.MESSAGE_TOO_LARGE
    assert idem.state is ProducerIdState.BUMP_PENDING  # its sequence left a gap


def test_retries_exhausted_fails_with_the_last_error():
    _, acc = make(retries=1)
    sink = put(acc, 0, b"x")
    for t in (1.0, 2.0):
        [(_, [b])] = acc.drain(t, leader)
        acc.request_finished()
        outcome = acc.handle_response(b, -1, -1, error(ErrorCode.NOT_ENOUGH_REPLICAS), t)
    assert outcome is Outcome.FAILED
    assert sink.error.error_code is ErrorCode.NOT_ENOUGH_REPLICAS


def test_fenced_epoch_is_fatal_and_fails_everything():
    idem, acc = make()
    s1 = put(acc, 0, b"x")
    [(_, [b])] = acc.drain(1.0, leader)
    s2 = put(acc, 1, b"y", now=1.0)
    acc.request_finished()
    assert acc.handle_response(b, -1, -1, error(ErrorCode.INVALID_PRODUCER_EPOCH), 1.0) is Outcome.FATAL
    assert idem.state is ProducerIdState.FATAL
    assert s1.error.error_code is ErrorCode.INVALID_PRODUCER_EPOCH
    assert s2.error.error_code is ErrorCode.INVALID_PRODUCER_EPOCH
    assert not acc.has_pending()


# ---- delivery timeout and KIP-360 ---------------------------------------------------------------------


def test_queued_batch_expires_without_a_bump():
    idem, acc = make(delivery_timeout_s=2.0)
    sink = put(acc, 0, b"x")
    assert acc.expire(2.0) == 1
    assert isinstance(sink.error, DeliveryTimeoutError)
    assert sink.error.error_code is ErrorCode.REQUEST_TIMED_OUT and not sink.error.maybe_written
    assert idem.state is ProducerIdState.READY  # never sequenced: nothing unresolved


def test_expired_in_flight_batch_bumps_the_epoch_only_after_its_request_returns():
    # KIP-360: fail the futures, stop sequencing, wait for in-flight requests, bump, restart at 0.
    idem, acc = make(delivery_timeout_s=2.0, batch_size=60)
    first = put(acc, 0, b"v" * 4)
    [(_, [b0])] = acc.drain(0.01, leader)
    later = put(acc, 1, b"w", now=1.0)
    acc.expire(2.0)
    assert isinstance(first.error, DeliveryTimeoutError) and first.error.maybe_written
    assert idem.state is ProducerIdState.BUMP_PENDING
    assert acc.drain(2.0, leader) == []  # nothing new is sequenced while the sequence is unresolved
    assert not acc.ready_to_bump()  # b0's request is still out
    acc.request_finished()
    assert acc.handle_response(b0, 5, 0, None, 2.5) is Outcome.LATE  # it landed after all: still reported failed
    assert acc.stats["late_success"] == 1
    assert acc.ready_to_bump()
    assert idem.bump_epoch()
    acc.reset_after_bump()
    [(_, [b1])] = acc.drain(2.5, leader)
    assert (b1.producer_epoch, b1.base_sequence) == (1, 0)
    assert parse_batch(b1.wire).producer_epoch == 1
    acc.request_finished()
    acc.handle_response(b1, 0, 0, None, 2.6)
    assert later.result.offset == 0


def test_batch_rejected_out_of_order_after_a_gap_is_resequenced_under_the_new_epoch():
    idem, acc = make(batch_size=60, delivery_timeout_s=2.0)
    put(acc, 0, b"v" * 4)  # each record fills a 60-byte batch
    s1 = put(acc, 0, b"w" * 4)
    b0, b1 = (b for _, bs in acc.drain(0.0, leader) for b in bs)
    acc.request_finished()
    acc.request_finished()
    # b0 was never written (the broker rejected it), so b1, in flight behind it, cannot land either
    acc.handle_response(b0, -1, -1, error(ErrorCode.CORRUPT_MESSAGE), 0.1)
    assert acc.handle_response(b1, -1, -1, error(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 0.1) is Outcome.RESEQUENCE
    assert acc.ready_to_bump()
    idem.bump_epoch()
    acc.reset_after_bump()
    [(_, [b1_new])] = acc.drain(0.2, leader)
    assert b1_new is b1 and (b1.producer_epoch, b1.base_sequence) == (1, 0)
    acc.request_finished()
    acc.handle_response(b1, 0, 0, None, 0.3)
    assert s1.result is not None


def test_batches_behind_a_certainly_unwritten_batch_are_resequenced_not_left_to_expire():
    # b0 is rejected outright; b1 (whose first answer was lost) can then never land under this epoch.
    idem, acc = make(batch_size=60, delivery_timeout_s=60.0)
    put(acc, 0, b"v" * 4)
    s1 = put(acc, 0, b"w" * 4)
    b0, b1 = (b for _, bs in acc.drain(0.0, leader) for b in bs)
    acc.request_finished()
    acc.request_finished()
    acc.handle_transport_error(b1, error(ErrorCode.NETWORK_EXCEPTION), 0.1)
    assert b1.maybe_written and b1.state is BatchState.RETRY_WAIT
    acc.handle_response(b0, -1, -1, error(ErrorCode.INVALID_REQUEST), 0.1)
    assert b1.state is BatchState.RESEQUENCE
    assert acc.ready_to_bump()
    idem.bump_epoch()
    acc.reset_after_bump()
    [(_, [again])] = acc.drain(0.2, leader)
    assert again is b1 and (b1.producer_epoch, b1.base_sequence) == (1, 0)
    acc.request_finished()
    acc.handle_response(b1, 0, 0, None, 0.3)
    assert s1.result.offset == 0


def test_maybe_written_batch_is_never_resequenced():
    # A batch whose earlier attempt may have landed must not be sent under a new epoch: that could write it twice.
    idem, acc = make(delivery_timeout_s=2.0)
    sink = put(acc, 0, b"x")
    [(_, [b])] = acc.drain(0.01, leader)
    acc.request_finished()
    acc.handle_transport_error(b, error(ErrorCode.REQUEST_TIMED_OUT), 0.1)
    [(_, [b])] = acc.drain(0.3, leader)
    acc.request_finished()
    assert acc.handle_response(b, -1, -1, error(ErrorCode.UNKNOWN_PRODUCER_ID), 0.4) is Outcome.RETRY
    assert idem.state is ProducerIdState.BUMP_PENDING and not acc.ready_to_bump()
    acc.expire(2.0)
    assert isinstance(sink.error, DeliveryTimeoutError) and sink.error.maybe_written
    assert acc.ready_to_bump()


def test_epoch_exhaustion_asks_for_a_new_producer_id():
    idem = IdempotenceManager(enabled=True)
    idem.set_producer_id(3, EPOCH_EXHAUSTED)
    idem.request_bump("test")
    assert not idem.bump_epoch()
    assert idem.state is ProducerIdState.UNINITIALIZED
    idem.set_producer_id(4, 0)
    assert idem.next_sequence((T, 0), 3) == 0 and idem.next_sequence((T, 0), 1) == 3


def test_producer_state_transition_table_rejects_illegal_moves():
    idem = IdempotenceManager(enabled=True)
    with pytest.raises(BrokerError, match="UNINITIALIZED -> BUMP_PENDING"):
        idem._transition_to(ProducerIdState.BUMP_PENDING)


def test_sequences_wrap_like_kafka():
    idem = IdempotenceManager(enabled=True)
    idem.set_producer_id(1, 0)
    idem._next_seq[(T, 0)] = 2**31 - 2
    assert idem.next_sequence((T, 0), 5) == 2**31 - 2
    assert idem.next_sequence((T, 0), 1) == 3


# ---- simulation against the real sequence rules ---------------------------------------------------------


@dataclass
class ModelBroker:
    """Per partition: the log and ProducerStateManager, applying batches as the leader's apply does."""

    logs: dict[int, list[bytes]] = field(default_factory=dict)
    states: dict[int, ProducerStateManager] = field(default_factory=dict)

    def apply(self, partition: int, wire: bytes) -> tuple[int, BrokerError | None]:
        header = parse_batch(wire)
        log = self.logs.setdefault(partition, [])
        info = self.states.setdefault(partition, ProducerStateManager()).prepare_append(
            header.producer_id, state_may_be_lost=False
        )
        dup = info.duplicate_of(header)
        if dup is not None:
            return dup.base_offset, None
        err = info.validate(header)
        if err is not None:
            return -1, err
        base = len(log)
        self.states[partition].update(info.append(header, base, 0))
        log.extend(r.value or b"" for r in decode_records(wire))
        return base, None


def simulate(
    seed: int, *, delivery_timeout_s: float, records: int = 300
) -> tuple[ModelBroker, list[tuple[int, bytes, Sink]], IdempotenceManager]:
    rng = random.Random(seed)
    idem, acc = make(batch_size=120, linger_s=0.002, delivery_timeout_s=delivery_timeout_s, max_in_flight=5)
    acc.retry_backoff_s = 0.005
    broker = ModelBroker()
    sent: list[tuple[int, bytes, Sink]] = []
    pending: list[list[tuple[ProducerBatch, bytes]]] = []
    zombies: list[list[tuple[ProducerBatch, bytes]]] = []  # given up on by the client, applied later
    judged: dict[int, bool] = {}
    keep: list[ProducerBatch] = []
    now = 0.0
    while len(sent) < records or acc.has_pending() or pending:
        now += rng.random() * 0.003
        for _ in range(rng.randint(0, 4)):
            if len(sent) < records:
                p = rng.randrange(3)
                v = f"{len(sent):05d}".encode()
                sent.append((p, v, put(acc, p, v, now)))
        acc.expire(now)
        if acc.ready_to_bump():
            idem.bump_epoch()
            acc.reset_after_bump()
        for _, batches in acc.drain(now, leader):
            pending.append([(b, b.wire) for b in batches])
            for b in batches:  # ~1% of batches are rejected outright, every attempt (like a corrupt batch)
                if id(b) not in judged:
                    judged[id(b)] = rng.random() < 0.01
                    keep.append(b)  # ids stay unique
        if zombies and rng.random() < 0.1:
            for b, wire in zombies.pop(rng.randrange(len(zombies))):
                if not judged[id(b)]:
                    broker.apply(b.partition, wire)
        if not pending:
            deadline = acc.next_deadline(now)
            if deadline is not None and deadline > now:
                now = deadline
            continue
        req = pending.pop(rng.randrange(len(pending)))  # requests overtake each other
        acc.request_finished()
        fate = rng.random()
        if fate < 0.08:  # lost before reaching the broker
            for b, _ in req:
                acc.handle_transport_error(b, error(ErrorCode.NETWORK_EXCEPTION), now)
        elif fate < 0.16:  # the client timed out, the broker applies it much later
            zombies.append(req)
            for b, _ in req:
                acc.handle_transport_error(b, error(ErrorCode.REQUEST_TIMED_OUT), now)
        else:
            answers = []
            for b, wire in req:
                if judged[id(b)]:
                    answers.append((b, -1, error(ErrorCode.INVALID_REQUEST)))
                else:
                    answers.append((b, *broker.apply(b.partition, wire)))
            if fate < 0.26:  # applied, but the response is lost
                for b, _, _ in answers:
                    acc.handle_transport_error(b, error(ErrorCode.NETWORK_EXCEPTION), now)
            else:
                for b, base, err in answers:
                    acc.handle_response(b, base, 0, err, now)
    for req in zombies:  # stragglers land after everything else
        for b, wire in req:
            if not judged[id(b)]:
                broker.apply(b.partition, wire)
    return broker, sent, idem


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("delivery_timeout_s", [0.05, 1000.0])
def test_simulated_faults_never_duplicate_or_reorder(seed, delivery_timeout_s):
    broker, sent, _ = simulate(seed, delivery_timeout_s=delivery_timeout_s)
    for p in range(3):
        mine = [(v, s) for q, v, s in sent if q == p]
        order = {v: i for i, (v, _) in enumerate(mine)}
        log = broker.logs.get(p, [])
        assert len(set(log)) == len(log), f"partition {p}: duplicate"
        idx = [order[v] for v in log]
        assert idx == sorted(idx), f"partition {p}: reordered"
        for v, s in mine:
            assert s.done(), "a future never resolved"
            if s.result is not None:
                assert log[s.result.offset] == v, f"partition {p}: acknowledged offset is wrong"
            elif isinstance(s.error, DeliveryTimeoutError):
                assert s.error.maybe_written or v not in log, "a record said to be unwritten is in the log"
            else:
                assert s.error.error_code is ErrorCode.INVALID_REQUEST, s.error
                assert v not in log, "a rejected record is in the log"
    if delivery_timeout_s > 100:
        # without expiry every record is acknowledged, except those the broker rejected outright
        assert all(s.result is not None or not isinstance(s.error, DeliveryTimeoutError) for _, _, s in sent)


def test_simulation_exercises_expiry_bumps_and_late_landings():
    # Guards the test above: with a short delivery timeout the unresolved-sequence path really runs.
    runs = [simulate(seed, delivery_timeout_s=0.05) for seed in range(10)]
    assert any(idem.current.epoch >= 1 for _, _, idem in runs)
    landed_after_timeout = 0
    for broker, sent, _ in runs:
        in_log = {v for log in broker.logs.values() for v in log}
        landed_after_timeout += sum(1 for _, v, s in sent if s.error is not None and v in in_log)
    assert landed_after_timeout > 0
