"""A PartitionLog holding Kafka producers' batches (KAFKA_APPEND) next to txbroker's, on a real RocksDB.

The same producer-state rules hold for both formats (KIP-98 sequences, KIP-890
transactions); reads give each batch back in its stored format, and both
conversions (txbroker for the HTTP doors, Kafka for a Kafka Fetch) read the same records.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Sequence

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from clients.protocol import (
    BatchFormat,
    BrokerError,
    ControlType,
    ErrorCode,
    Record,
    StoredBatch,
    decode_records,
    encode_batch,
)
from clients.txn_filter import visible_records
from storage.commands import AppendResult, TxnMarkerResult, decode_command, encode_append, encode_txn_marker
from storage.errors import StorageCorruptionError
from storage.kafka_batch import all_as_txbroker, kafka_fetch_payload, kafka_records, parse_kafka_batch
from storage.partition_log import PartitionLog
from storage.store import NodeStore

PREFIX = b"P\x00\x00\x00\x09\x00\x00\x00\x00"
TS = 1_700_000_000_000
ZSTD = 4


def kafka_batch(
    pid: int = -1, epoch: int = -1, seq: int = -1, *, records: int = 2, txn: bool = False, codec: int = 0,
    tag: str = "r", ts: int = TS,
) -> bytes:  # fmt: skip
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=txn, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=2**20)  # fmt: skip
    for i in range(records):
        b.append(i, ts + i, None, f"{tag}{i}".encode() * 40, [])
    return bytes(b.build())


class Log:
    """Applies commands at consecutive Raft indexes with a clock 1 ms per command."""

    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.now = TS

    def apply(self, command: bytes) -> object:
        self.now += 1
        return self.log.apply(self.log.last_applied + 1, command)

    def kafka(self, batch: bytes) -> AppendResult | BrokerError:
        result = self.apply(encode_append(batch, self.now + 1, BatchFormat.KAFKA))
        assert isinstance(result, (AppendResult, BrokerError)), result
        return result

    def txbroker(self, batch: bytes) -> AppendResult | BrokerError:
        result = self.apply(encode_append(batch, self.now + 1))
        assert isinstance(result, (AppendResult, BrokerError)), result
        return result

    def marker(self, pid: int, epoch: int, ctype: ControlType) -> TxnMarkerResult:
        """A classic marker (Kafka clients' transactions keep their epoch across transactions)."""
        result = self.apply(encode_txn_marker(pid, epoch, 0, ctype, self.now + 1, classic=True))
        assert isinstance(result, TxnMarkerResult), result
        return result


@pytest.fixture
def make_log(store: NodeStore) -> Callable[..., Log]:
    def factory(s: NodeStore | None = None) -> Log:
        return Log(PartitionLog(s or store, PREFIX, "t-0"))

    return factory


def ok(result: AppendResult | BrokerError) -> AppendResult:
    assert isinstance(result, AppendResult), result
    return result


def error_of(result: object) -> ErrorCode:
    assert isinstance(result, BrokerError), result
    return result.error_code


def values(batches: list[StoredBatch], aborted: Sequence[tuple[int, int]] = ()) -> list[bytes | None]:
    return [r.value for _off, r in visible_records(all_as_txbroker(batches), aborted)]


def kafka_fetch_values(batches: list[StoredBatch]) -> list[tuple[int, bytes | None]]:
    """What a Kafka consumer decodes from the Fetch payload (control records included, as ``None``)."""
    payload = kafka_fetch_payload(batches)
    out: list[tuple[int, bytes | None]] = []
    pos = 0
    while pos < len(payload):
        (length,) = struct.unpack_from(">i", payload, pos + 8)
        batch = DefaultRecordBatch(payload[pos : pos + 12 + length])
        assert batch.validate_crc()
        out += [(r.offset, None if batch.is_control_batch else r.value) for r in batch]
        pos += 12 + length
    return out


def test_kafka_batches_are_stored_as_received_and_read_back_in_their_format(make_log: Callable[..., Log]) -> None:
    log = make_log()
    compressed = kafka_batch(records=3, codec=ZSTD, tag="z")
    assert (ok(log.kafka(kafka_batch(tag="a"))).base_offset, ok(log.kafka(compressed)).base_offset) == (0, 2)
    assert ok(log.txbroker(encode_batch([Record(b"t", timestamp=TS)]))).base_offset == 5
    batches = log.log.read(0, 1 << 20)
    assert [b.format for b in batches] == [BatchFormat.KAFKA, BatchFormat.KAFKA, BatchFormat.TXBROKER]
    assert batches[1].data == compressed  # compressed as written
    assert log.log.size_bytes == sum(len(b.data) for b in batches)
    expected = [b"a0" * 40, b"a1" * 40, b"z0" * 40, b"z1" * 40, b"z2" * 40, b"t"]
    assert values(batches) == expected  # the HTTP doors' view: txbroker batches
    assert [v for _o, v in kafka_fetch_values(batches)] == expected  # a Kafka consumer's
    assert [o for o, _v in kafka_fetch_values(batches)] == [0, 1, 2, 3, 4, 5]


def test_idempotent_kafka_batches_follow_the_sequence_rules(make_log: Callable[..., Log]) -> None:
    # KIP-98: sequences continue per producer and epoch; a retried batch gets its first offsets back.
    log = make_log()
    first = ok(log.kafka(kafka_batch(5, 0, 0)))
    ok(log.kafka(kafka_batch(5, 0, 2)))
    dup = ok(log.kafka(kafka_batch(5, 0, 0)))
    assert dup.duplicate and (dup.base_offset, dup.last_offset) == (first.base_offset, first.last_offset)
    assert error_of(log.kafka(kafka_batch(5, 0, 7))) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    # The same producer may continue through the other door: one producer state per partition.
    txb = encode_batch([Record(b"x", timestamp=TS)], producer_id=5, producer_epoch=0, base_sequence=4)
    assert ok(log.txbroker(txb)).base_offset == 4
    assert log.log.producer_entry(5).next_seq == 5  # type: ignore[union-attr]


def test_a_plain_kafka_batch_with_epoch_and_sequence_zero_is_plain(make_log: Callable[..., Log]) -> None:
    log = make_log()
    ok(log.kafka(kafka_batch(-1, 0, 0)))
    ok(log.kafka(kafka_batch(-1, 0, 0)))  # not a duplicate: no producer state
    assert log.log.high_watermark == 4 and log.log.producer_entries() == []


def test_a_kafka_control_batch_cannot_be_appended(make_log: Callable[..., Log]) -> None:
    log = make_log()
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=7,
                                  producer_epoch=0, base_sequence=-1, batch_size=2**20)  # fmt: skip
    b.append(0, TS, struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 0), [])  # a COMMIT marker, as Kafka writes it
    data = b.build()
    struct.pack_into(">h", data, 21, 0x30)
    struct.pack_into(">I", data, 17, crc32c.crc32c(memoryview(data)[21:]))
    assert parse_kafka_batch(bytes(data)).is_control
    assert error_of(log.kafka(bytes(data))) is ErrorCode.INVALID_REQUEST
    assert log.log.high_watermark == 0


def test_a_kafka_transaction_with_markers_reads_back_through_both_conversions(make_log: Callable[..., Log]) -> None:
    # kafka_txn.md §7: an aborted transaction is filtered by read_committed readers; a committed one is not.
    # The producers are classic ones (as Kafka clients are): one epoch across transactions.
    log = make_log()
    ok(log.kafka(kafka_batch(10, 0, 0, txn=True, tag="a")))  # 0-1, aborted below
    ok(log.kafka(kafka_batch(11, 0, 0, txn=True, codec=ZSTD, tag="c")))  # 2-3, committed below
    assert log.log.last_stable_offset == 0
    abort = log.marker(10, 0, ControlType.ABORT)
    ok(log.kafka(kafka_batch(10, 0, 2, txn=True, tag="late")))  # 5-6: a new transaction of producer 10
    commit = log.marker(11, 0, ControlType.COMMIT)
    assert (abort.offset, commit.offset, log.log.last_stable_offset) == (4, 7, 5)
    info = log.log.fetch(0, 1 << 20, read_committed=True)
    assert info.upper_bound == 5 and info.aborted_transactions == [(10, 0)]
    assert values(info.batches, info.aborted_transactions) == [b"c0" * 40, b"c1" * 40]
    log.marker(10, 0, ControlType.COMMIT)
    info = log.log.fetch(0, 1 << 20, read_committed=True)
    assert values(info.batches, info.aborted_transactions) == [b"c0" * 40, b"c1" * 40, b"late0" * 40,
                                                               b"late1" * 40]  # fmt: skip
    # A Kafka consumer gets the same batches with the markers as control batches (it filters itself).
    fetched = kafka_fetch_values(info.batches)
    assert [o for o, v in fetched if v is None] == [4, 7, 8]
    assert [b.format for b in info.batches if b.header.is_control] == [BatchFormat.TXBROKER] * 3


def test_offset_for_timestamp_reads_kafka_batches(make_log: Callable[..., Log]) -> None:
    log = make_log()
    log.kafka(kafka_batch(records=3, ts=1000))
    log.kafka(kafka_batch(records=3, ts=2000, codec=ZSTD))
    assert [log.log.offset_for_timestamp(t) for t in (0, 1001, 2001, 2002, 2003)] == [0, 1, 4, 5, None]


def test_kafka_batches_survive_a_reopen_and_a_snapshot(
    make_log: Callable[..., Log], store: NodeStore, open_store: Callable[..., NodeStore]
) -> None:
    log = make_log()
    log.kafka(kafka_batch(3, 0, 0, codec=ZSTD))
    log.kafka(kafka_batch(3, 0, 2))
    before = log.log.read(0, 1 << 20)
    store.close()
    reopened = make_log(open_store("db"))
    assert reopened.log.read(0, 1 << 20) == before
    assert reopened.log.producer_entry(3).next_seq == 4  # type: ignore[union-attr]
    out = io.BytesIO()
    reopened.log.write_snapshot(out)
    copy = Log(PartitionLog(open_store("copy"), PREFIX, "t-0"))
    copy.log.read_snapshot(io.BytesIO(out.getvalue()), reopened.log.last_applied)
    assert [b.format for b in copy.log.read(0, 1 << 20)] == [BatchFormat.KAFKA] * 2


def test_a_flipped_byte_in_a_stored_kafka_batch_fails_the_read(make_log: Callable[..., Log], store: NodeStore) -> None:
    log = make_log()
    log.kafka(kafka_batch())
    key = PREFIX + b"b" + bytes(8)
    value = bytearray(store.db.get(key))
    value[-5] ^= 0x01
    store.db.put(key, bytes(value))
    with pytest.raises(BrokerError) as exc:
        log.log.read(0, 1 << 20)
    assert exc.value.error_code is ErrorCode.CORRUPT_MESSAGE
    with pytest.raises(StorageCorruptionError):
        make_log()  # the tail batch is checked on load


def test_the_kafka_append_command_keeps_the_old_tags() -> None:
    # Commands already in Raft logs must read as before: APPEND stays 0x01, Kafka batches get their own tag.
    batch = kafka_batch()
    assert encode_append(batch, 5)[0] == 0x01 and encode_append(batch, 5, BatchFormat.KAFKA)[0] == 0x07
    cmd = decode_command(encode_append(batch, 5, BatchFormat.KAFKA))
    assert (cmd.format, cmd.log_append_time, bytes(cmd.batch)) == (BatchFormat.KAFKA, 5, batch)  # type: ignore[union-attr]
    old = decode_command(b"\x01" + struct.pack(">q", 5) + b"xyz")
    assert old.format is BatchFormat.TXBROKER  # type: ignore[union-attr]


def test_kafka_records_of_a_stored_batch_are_the_producers(make_log: Callable[..., Log]) -> None:
    log = make_log()
    log.kafka(kafka_batch(records=2, codec=ZSTD, tag="q"))
    (batch,) = log.log.read(0, 1 << 20)
    assert [r.value for r in kafka_records(batch.data)] == [b"q0" * 40, b"q1" * 40]
    (txb,) = all_as_txbroker([batch])
    assert [r.value for r in decode_records(txb.data)] == [b"q0" * 40, b"q1" * 40]
