"""Kafka record batch v2 <-> txbroker batches at the Kafka listener (cluster.kafka.record_batches)."""

from __future__ import annotations

import struct

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from clients.protocol import BrokerError, ControlType, ErrorCode, StoredBatch, decode_records, parse_batch
from clients.protocol import encode_control_batch as txb_control
from cluster.kafka.record_batches import kafka_fetch_payload, kafka_to_txbroker, stored_to_kafka

TS = 1_700_000_000_000
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _kafka_batch(n: int = 5, codec: int = 0, pid: int = -1, epoch: int = -1, seq: int = -1, txn: bool = False) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=txn, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=2**20)  # fmt: skip
    for i in range(n):
        key = None if i % 2 else f"k{i}".encode()
        b.append(i, TS + i, key, f"value-{i}".encode() * 30, [("h", f"{i}".encode()), ("n", None)])
    return bytes(b.build())


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_kafka_batch_becomes_a_txbroker_batch_with_the_same_records(codec: str) -> None:
    data = kafka_to_txbroker(_kafka_batch(codec=CODECS[codec]))
    header = parse_batch(data)
    assert (header.producer_id, header.record_count, header.is_transactional) == (-1, 5, False)
    records = list(decode_records(data))
    assert [r.key for r in records] == [b"k0", None, b"k2", None, b"k4"]
    assert [r.timestamp for r in records] == [TS + i for i in range(5)]
    assert records[3].value == b"value-3" * 30
    assert records[3].headers == (("h", b"3"), ("n", None))


def test_producer_state_and_the_transactional_flag_carry_over() -> None:
    header = parse_batch(kafka_to_txbroker(_kafka_batch(pid=42, epoch=3, seq=100, txn=True)))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 100)
    assert header.is_transactional and header.last_sequence == 104


def test_a_plain_batch_drops_whatever_epoch_and_sequence_the_client_wrote() -> None:
    header = parse_batch(kafka_to_txbroker(_kafka_batch(pid=-1, epoch=0, seq=0)))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)


def _refused(data: bytes | bytearray) -> ErrorCode:
    with pytest.raises(BrokerError) as exc:
        kafka_to_txbroker(bytes(data))
    return exc.value.error_code


def _recrc(buf: bytearray) -> bytearray:
    struct.pack_into(">I", buf, 17, crc32c.crc32c(memoryview(buf)[21:]))
    return buf


def test_malformed_batches_are_refused() -> None:
    good = bytearray(_kafka_batch())
    flipped = bytearray(good)
    flipped[-3] ^= 0x01
    assert _refused(flipped) is ErrorCode.CORRUPT_MESSAGE  # CRC
    assert _refused(good[:30]) is ErrorCode.CORRUPT_MESSAGE  # shorter than the header
    assert _refused(good + b"x") is ErrorCode.CORRUPT_MESSAGE  # batchLength disagrees
    magic = bytearray(good)
    magic[16] = 1
    assert _refused(magic) is ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT
    count = bytearray(good)
    struct.pack_into(">i", count, 57, 9)  # 9 records declared, 5 there (CRC made valid again)
    assert _refused(_recrc(count)) is ErrorCode.CORRUPT_MESSAGE
    codec = bytearray(good)
    struct.pack_into(">h", codec, 21, 6)  # compression type 6 does not exist
    assert _refused(_recrc(codec)) is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    control = bytearray(good)
    struct.pack_into(">h", control, 21, 0x20)
    assert _refused(_recrc(control)) is ErrorCode.INVALID_REQUEST
    garbage = bytearray(good)
    garbage[70:90] = b"\xff" * 20  # records that do not decode, under a valid CRC
    assert _refused(_recrc(garbage)) is ErrorCode.CORRUPT_MESSAGE
    zstd = bytearray(_kafka_batch(codec=4))
    zstd[65:75] = b"\x00" * 10  # a damaged compressed stream
    assert _refused(_recrc(zstd)) is ErrorCode.CORRUPT_MESSAGE


def test_a_stored_batch_goes_back_as_a_kafka_batch_at_its_offset() -> None:
    txb = kafka_to_txbroker(_kafka_batch(pid=7, epoch=1, seq=0, txn=True))
    stored = StoredBatch(1000, TS, txb, parse_batch(txb))
    out = DefaultRecordBatch(stored_to_kafka(stored))
    assert out.validate_crc()
    assert (out.base_offset, out.producer_id, out.producer_epoch, out.is_transactional) == (1000, 7, 1, True)
    assert [(r.offset, r.key, r.timestamp) for r in out][:3] == [(1000, b"k0", TS), (1001, None, TS + 1),
                                                                 (1002, b"k2", TS + 2)]  # fmt: skip


def test_a_marker_goes_back_as_a_kafka_control_batch() -> None:
    marker = txb_control(ControlType.ABORT, producer_id=7, producer_epoch=1, coordinator_epoch=3, timestamp=TS)
    raw = kafka_fetch_payload([StoredBatch(55, TS, marker, parse_batch(marker))])
    out = DefaultRecordBatch(raw)
    assert out.validate_crc() and out.is_control_batch and out.is_transactional
    (record,) = list(out)
    assert (record.offset, record.type) == (55, 0)  # Kafka's ControlRecordType.ABORT
    commit = txb_control(ControlType.COMMIT, producer_id=7, producer_epoch=1, coordinator_epoch=3, timestamp=TS)
    (record,) = list(DefaultRecordBatch(stored_to_kafka(StoredBatch(56, TS, commit, parse_batch(commit)))))
    assert record.type == 1  # COMMIT
    assert struct.unpack(">hi", record.value) == (0, 3)  # the coordinator epoch
