"""Idempotent-producer rules at the partition (kafka_txn.md §3.1, rules 1-5 and 9).

Scenario tests run through ``PartitionLog.apply`` on a real RocksDB so the
offsets answered for duplicates are the ones the log assigned.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import crc32c
import pytest

from clients.protocol import BrokerError, ErrorCode, Record, encode_batch, parse_batch
from storage.commands import AppendResult, encode_append, encode_delete_records
from storage.errors import StorageCorruptionError
from storage.partition_log import PartitionLog
from storage.producer_state import (
    MAX_SEQUENCE,
    BatchMetadata,
    ProducerStateEntry,
    ProducerStateManager,
    decode_entry,
    encode_entry,
)
from storage.store import NodeStore

PID = 1000


def make_batch(pid: int = -1, epoch: int = -1, seq: int = -1, count: int = 1, *, transactional: bool = False) -> bytes:
    """A batch of one record whose header claims ``count`` records (apply trusts the header)."""
    buf = bytearray(
        encode_batch(
            [Record(value=b"v")],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            transactional=transactional,
        )
    )
    struct.pack_into(">i", buf, 20, count)
    struct.pack_into(">I", buf, 1, crc32c.crc32c(bytes(buf[5:])))
    return bytes(buf)


class Producer:
    """Applies batches to a log with consecutive Raft indexes."""

    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.index = log.last_applied

    def send(
        self, pid: int = PID, epoch: int = 0, seq: int = 0, count: int = 1, *, ts: int = 1000
    ) -> AppendResult | BrokerError:
        self.index += 1
        result = self.log.apply(self.index, encode_append(make_batch(pid, epoch, seq, count), ts))
        assert isinstance(result, (AppendResult, BrokerError))
        return result

    def ok(self, pid: int = PID, epoch: int = 0, seq: int = 0, count: int = 1) -> AppendResult:
        result = self.send(pid, epoch, seq, count)
        assert isinstance(result, AppendResult), result
        return result

    def error(self, pid: int = PID, epoch: int = 0, seq: int = 0, count: int = 1) -> ErrorCode:
        result = self.send(pid, epoch, seq, count)
        assert isinstance(result, BrokerError), result
        return result.error_code


@pytest.fixture
def make_log(store: NodeStore) -> Callable[..., PartitionLog]:
    def factory(prefix: bytes = b"P\x00\x00\x00\x01\x00\x00\x00\x00") -> PartitionLog:
        return PartitionLog(store, prefix, "t-0")

    return factory


@pytest.fixture
def producer(make_log: Callable[..., PartitionLog]) -> Producer:
    return Producer(make_log())


# -- named scenarios (kafka_txn.md §14 tests 1-4) -----------------------------------


def test_duplicate_batch_returns_original_offset(producer: Producer) -> None:
    # Rule 1: a retry inside the window answers the original offsets, writes nothing.
    first = producer.ok(seq=0, count=3)
    producer.ok(seq=3, count=2)
    hw, size = producer.log.high_watermark, producer.log.size_bytes
    retry = producer.ok(seq=0, count=3)
    assert (retry.base_offset, retry.last_offset) == (first.base_offset, first.last_offset)
    assert retry.log_append_time == first.log_append_time
    assert retry.duplicate
    assert not first.duplicate
    assert (producer.log.high_watermark, producer.log.size_bytes) == (hw, size)
    assert producer.log.last_applied == producer.index


def test_sequence_gap_is_out_of_order(producer: Producer) -> None:
    # Rule 4: first_seq must be last_seq + 1; the log is unchanged.
    producer.ok(seq=0)
    assert producer.error(seq=2) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert producer.log.high_watermark == 1
    assert producer.ok(seq=1).base_offset == 1


def test_old_epoch_is_invalid_producer_epoch(producer: Producer) -> None:
    # Rules 2 and 3 (§14 test 3): epoch 1, then 0 -> fenced; epoch 2 must start at 0.
    producer.ok(epoch=1, seq=0)
    assert producer.error(epoch=0, seq=1) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert producer.error(epoch=2, seq=1) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert producer.ok(epoch=2, seq=0).base_offset == 1


def test_new_epoch_must_start_at_zero(producer: Producer) -> None:
    # Rule 3: a bumped epoch restarts sequences and forgets the old dedup window.
    producer.ok(epoch=0, seq=0)
    producer.ok(epoch=0, seq=1)
    assert producer.error(epoch=1, seq=2) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    producer.ok(epoch=1, seq=0)
    entry = producer.log.producer_entry(PID)
    assert entry is not None
    assert entry.producer_epoch == 1
    assert [(b.first_seq, b.last_seq) for b in entry.batches] == [(0, 0)]
    # The old epoch's batch (seq 1) is no longer a duplicate: it is fenced.
    assert producer.error(epoch=0, seq=1) is ErrorCode.INVALID_PRODUCER_EPOCH


def test_sequence_wraps_at_int32_max(producer: Producer) -> None:
    # Rule 4: the only wrap allowed is 2**31-1 -> 0 (§14 test 4).
    producer.ok(seq=0, count=MAX_SEQUENCE)  # last seq 2**31-2
    producer.ok(seq=MAX_SEQUENCE, count=1)  # last seq 2**31-1
    assert producer.error(seq=1) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    producer.ok(seq=0, count=2)
    producer.ok(seq=2)


def test_batch_spanning_the_wrap_continues_after_zero(producer: Producer) -> None:
    producer.ok(seq=0, count=MAX_SEQUENCE)
    wrapped = producer.ok(seq=MAX_SEQUENCE, count=3)  # sequences 2**31-1, 0, 1
    assert producer.ok(seq=2).base_offset == wrapped.last_offset + 1


def test_only_last_five_batches_are_deduplicated(producer: Producer) -> None:
    # §14 test 1: seq 0..5; seq 0 fell out of the window -> out of order; 1..5 dedup.
    results = [producer.ok(seq=s) for s in range(6)]
    hw = producer.log.high_watermark
    assert producer.error(seq=0) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    for s in range(1, 6):
        retry = producer.ok(seq=s)
        assert retry.duplicate
        assert retry.base_offset == results[s].base_offset
    assert producer.log.high_watermark == hw


def test_plain_writes_need_no_producer_state(producer: Producer) -> None:
    first = producer.ok(pid=-1, epoch=-1, seq=-1, count=2)
    second = producer.ok(pid=-1, epoch=-1, seq=-1, count=2)  # same bytes: not a duplicate
    assert (first.base_offset, second.base_offset) == (0, 2)
    assert not second.duplicate
    assert producer.log.producer_entries() == []


def test_unknown_producer_must_start_at_zero(producer: Producer) -> None:
    # Rule 5 (txbroker's choice): a new pid with seq != 0 and no lost state is out of order.
    assert producer.error(seq=5) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert producer.log.high_watermark == 0


def test_unknown_producer_after_deleted_records_is_unknown_producer_id(
    producer: Producer,
) -> None:
    # Rule 5 / KIP-360: once records were deleted, an unknown pid may have lost its state.
    producer.ok(pid=7, seq=0)
    producer.index += 1
    producer.log.apply(producer.index, encode_delete_records(1))
    assert producer.error(pid=8, seq=3) is ErrorCode.UNKNOWN_PRODUCER_ID
    producer.ok(pid=8, seq=0)


def test_epoch_bump_with_retained_state_is_not_a_duplicate(producer: Producer) -> None:
    producer.ok(epoch=0, seq=0)
    bumped = producer.ok(epoch=1, seq=0)
    assert not bumped.duplicate
    assert bumped.base_offset == 1


def test_producers_are_independent(producer: Producer) -> None:
    producer.ok(pid=1, seq=0)
    producer.ok(pid=2, seq=0)
    assert producer.ok(pid=1, seq=1).base_offset == 2
    assert producer.error(pid=2, seq=2) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_transactional_batches_follow_the_same_sequence_rules(producer: Producer) -> None:
    producer.index += 1
    batch = make_batch(PID, 0, 0, 1, transactional=True)
    ok = producer.log.apply(producer.index, encode_append(batch, 5))
    assert isinstance(ok, AppendResult)
    entry = producer.log.producer_entry(PID)
    assert entry is not None
    assert entry.current_txn_first_offset == 0  # it opened a transaction (test_storage_txn.py)
    producer.index += 1
    dup = producer.log.apply(producer.index, encode_append(batch, 6))
    assert isinstance(dup, AppendResult)
    assert dup.duplicate


@pytest.mark.parametrize(
    ("batch", "code"),
    [
        (make_batch(-1, -1, -1, 1, transactional=True), ErrorCode.INVALID_REQUEST),
        (make_batch(-5, 0, 0), ErrorCode.INVALID_REQUEST),
        (make_batch(PID, -1, 0), ErrorCode.INVALID_REQUEST),
        (make_batch(PID, 0, -1), ErrorCode.INVALID_REQUEST),
    ],
    ids=["transactional-without-pid", "negative-pid", "no-epoch", "no-sequence"],
)
def test_malformed_producer_fields_are_rejected(producer: Producer, batch: bytes, code: ErrorCode) -> None:
    assert producer.log.check_append(parse_batch(batch)) is not None
    result = producer.log.apply(1, encode_append(batch, 1))
    assert isinstance(result, BrokerError)
    assert result.error_code is code
    assert producer.log.high_watermark == 0
    assert producer.log.last_applied == 1


# -- the leader's pre-check ------------------------------------------------------------


def test_check_append_admits_pipelined_batches_and_mutates_nothing(producer: Producer) -> None:
    # Up to 5 batches per partition may be in flight (proposed, not yet applied), so the
    # leader's pre-check must not judge sequences against applied state: apply does.
    producer.ok(seq=0)
    before = (producer.log.producer_entry(PID), producer.log.high_watermark)
    log = producer.log
    assert log.check_append(parse_batch(make_batch(PID, 0, 1))) is None
    assert log.check_append(parse_batch(make_batch(PID, 0, 0))) is None  # duplicate: fine
    assert log.check_append(parse_batch(make_batch(PID, 0, 5))) is None  # may follow in-flight batches
    assert log.check_append(parse_batch(make_batch(PID + 1, 0, 9))) is None  # first batch may be in flight
    assert (log.producer_entry(PID), log.high_watermark) == before


def test_check_append_rejects_a_fenced_epoch_like_apply(producer: Producer) -> None:
    producer.ok(epoch=1, seq=0)
    stale = parse_batch(make_batch(PID, 0, 1))
    err = producer.log.check_append(stale)
    assert err is not None and err.error_code is ErrorCode.INVALID_PRODUCER_EPOCH
    assert producer.error(epoch=0, seq=1) is ErrorCode.INVALID_PRODUCER_EPOCH


def test_prepare_append_mutates_nothing() -> None:
    entry = ProducerStateEntry(PID, 0, (BatchMetadata(0, 0, 0, 0, 1),), 1)
    manager = ProducerStateManager([entry])
    info = manager.prepare_append(PID, state_may_be_lost=False)
    header = parse_batch(make_batch(PID, 0, 1))
    assert info.validate(header) is None
    info.append(header, base_offset=1, log_append_time=2)
    assert manager.get(PID) == entry


# -- persisted entry --------------------------------------------------------------------


ENTRY = ProducerStateEntry(
    PID,
    3,
    tuple(BatchMetadata(s, s + 1, 10 * s, 10 * s + 1, 100 + s) for s in range(5)),
    last_timestamp=123,
    coordinator_epoch=4,
    current_txn_first_offset=None,
)


@pytest.mark.parametrize("entry", [ENTRY, ProducerStateEntry(1, 0), ProducerStateEntry(2, 1, (), 5, -1, 77, 4)])
def test_entry_encoding_round_trips(entry: ProducerStateEntry) -> None:
    assert decode_entry(encode_entry(entry)) == entry


def test_flipped_byte_in_entry_is_detected() -> None:
    data = encode_entry(ENTRY)
    for pos in range(len(data)):
        corrupt = bytearray(data)
        corrupt[pos] ^= 0x40
        with pytest.raises(StorageCorruptionError):
            decode_entry(bytes(corrupt))


@pytest.mark.parametrize("cut", [0, 1, 10, 40, -1])
def test_truncated_entry_is_detected(cut: int) -> None:
    data = encode_entry(ENTRY)
    with pytest.raises(StorageCorruptionError):
        decode_entry(data[:cut])
