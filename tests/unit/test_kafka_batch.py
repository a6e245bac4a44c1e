"""Kafka record batch v2 as a stored format (storage.kafka_batch): checks, records, conversions both ways.

Batches are built by kafka-python's ``DefaultRecordBatchBuilder``, the codec the
module adapts, and read back by its ``DefaultRecordBatch``, as a Kafka client would.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from clients.protocol import (
    BatchFormat,
    BrokerError,
    ControlType,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    Record,
    StoredBatch,
    decode_records,
    encode_batch,
    encode_produce_request,
    parse_batch,
)
from clients.protocol import encode_control_batch as txb_control
from storage.errors import StorageCorruptionError
from storage.kafka_batch import (
    ConversionCache,
    as_txbroker,
    batch_records,
    kafka_fetch_payload,
    kafka_records,
    kafka_to_txbroker,
    parse_kafka_batch,
    stored_to_kafka,
)
from storage.log_format import decode_stored_batch, encode_stored_batch_header

TS = 1_700_000_000_000
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def kafka_batch(n: int = 5, codec: int = 0, pid: int = -1, epoch: int = -1, seq: int = -1, txn: bool = False) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=txn, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=2**20)  # fmt: skip
    for i in range(n):
        key = None if i % 2 else f"k{i}".encode()
        b.append(i, TS + i, key, f"value-{i}".encode() * 30, [("h", f"{i}".encode()), ("n", None)])
    return bytes(b.build())


def expected_records(n: int = 5) -> list[Record]:
    return [
        Record(
            value=f"value-{i}".encode() * 30,
            key=None if i % 2 else f"k{i}".encode(),
            headers=(("h", f"{i}".encode()), ("n", None)),
            timestamp=TS + i,
        )
        for i in range(n)
    ]


def stored(data: bytes, base: int = 1000, fmt: BatchFormat = BatchFormat.KAFKA) -> StoredBatch:
    header = parse_kafka_batch(data) if fmt is BatchFormat.KAFKA else parse_batch(data)
    return StoredBatch(base, TS, data, header, fmt)


# -- parse and records ---------------------------------------------------------------------


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_every_compression_type_parses_and_its_records_decode(codec: str) -> None:
    data = kafka_batch(codec=CODECS[codec])
    assert DefaultRecordBatch(data).compression_type == CODECS[codec]
    header = parse_kafka_batch(data)
    assert (header.producer_id, header.record_count, header.is_transactional, header.is_control) == (-1, 5, False,
                                                                                                     False)  # fmt: skip
    assert (header.first_timestamp, header.max_timestamp) == (TS, TS + 4)
    assert kafka_records(data) == expected_records()


def test_producer_state_reads_in_txbroker_terms() -> None:
    header = parse_kafka_batch(kafka_batch(pid=42, epoch=3, seq=100, txn=True))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 100)
    assert header.is_transactional and header.is_idempotent and header.last_sequence == 104
    assert header.attributes == 0x01  # txbroker's transactional bit, not Kafka's 0x10


def test_a_plain_batch_reads_as_epoch_and_sequence_minus_one_whatever_the_client_wrote() -> None:
    header = parse_kafka_batch(kafka_batch(pid=-1, epoch=0, seq=0))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)


def test_the_sequence_wraps_as_kafkas() -> None:
    assert parse_kafka_batch(kafka_batch(n=3, pid=1, epoch=0, seq=2**31 - 2)).last_sequence == 0


def test_a_control_batch_parses_as_control_for_the_log_to_refuse() -> None:
    data = bytearray(kafka_batch(pid=7, epoch=0, seq=0, txn=True))
    struct.pack_into(">h", data, 21, 0x30)
    header = parse_kafka_batch(_recrc(data), verify=False)
    assert header.is_control and header.is_transactional


# -- refused -------------------------------------------------------------------------------


def _refused(data: bytes | bytearray, *, verify: bool = True) -> ErrorCode:
    with pytest.raises(BrokerError) as exc:
        parse_kafka_batch(bytes(data), verify=verify)
    return exc.value.error_code


def _recrc(buf: bytearray) -> bytes:
    struct.pack_into(">I", buf, 17, crc32c.crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def test_a_flipped_byte_fails_the_crc() -> None:
    data = bytearray(kafka_batch())
    data[-3] ^= 0x01
    assert _refused(data) is ErrorCode.CORRUPT_MESSAGE
    assert _refused(data, verify=False) is ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("size", [0, 1, 30, 60])
def test_a_batch_shorter_than_its_header_is_refused(size: int) -> None:
    assert _refused(kafka_batch()[:size]) is ErrorCode.CORRUPT_MESSAGE


def test_a_truncated_batch_or_a_trailing_byte_disagrees_with_batch_length() -> None:
    good = kafka_batch()
    assert _refused(good[:-1]) is ErrorCode.CORRUPT_MESSAGE
    assert _refused(good + b"x") is ErrorCode.CORRUPT_MESSAGE
    assert _refused(good + good) is ErrorCode.CORRUPT_MESSAGE  # one batch per partition


def test_magic_other_than_2_is_refused() -> None:
    data = bytearray(kafka_batch())
    data[16] = 1
    assert _refused(data) is ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize(("count", "last_delta"), [(9, 4), (5, 3), (5, 5), (0, -1)])
def test_record_count_and_last_offset_delta_must_agree_with_the_records(count: int, last_delta: int) -> None:
    data = bytearray(kafka_batch())
    struct.pack_into(">i", data, 57, count)
    struct.pack_into(">i", data, 23, last_delta)
    assert _refused(_recrc(data)) is ErrorCode.CORRUPT_MESSAGE


def test_unknown_compression_is_unsupported_compression_type() -> None:
    for codec in (5, 6, 7):
        data = bytearray(kafka_batch())
        struct.pack_into(">h", data, 21, codec)
        assert _refused(_recrc(data)) is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
        assert ErrorCode.UNSUPPORTED_COMPRESSION_TYPE.code == 76


def test_garbage_records_under_a_valid_crc_are_refused_only_when_verified() -> None:
    data = bytearray(kafka_batch())
    data[70:90] = b"\xff" * 20
    garbage = _recrc(data)
    assert _refused(garbage) is ErrorCode.CORRUPT_MESSAGE
    parse_kafka_batch(garbage, verify=False)  # a stored batch was verified before it was proposed


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_damaged_compressed_stream_is_refused(codec: str) -> None:
    data = bytearray(kafka_batch(codec=CODECS[codec]))
    data[65:75] = b"\x00" * 10
    assert _refused(_recrc(data)) is ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_records_that_decompress_beyond_the_limit_are_refused_before_they_are_held(
    codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=CODECS[codec], is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=2**24)  # fmt: skip
    for i in range(64):
        b.append(i, TS, None, bytes(64 * 1024), [])  # 4 MiB of zeros: a few KiB compressed
    bomb = bytes(b.build())
    assert len(bomb) < 256 * 1024
    parse_kafka_batch(bomb)  # within the default limit
    monkeypatch.setattr("storage.kafka_batch.MAX_DECOMPRESSED_BYTES", 1 << 20)
    assert _refused(bomb) is ErrorCode.MESSAGE_TOO_LARGE


def test_records_with_offset_deltas_out_of_order_are_refused() -> None:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=2**20)  # fmt: skip
    b.append(0, TS, None, b"a", [])
    b.append(2, TS, None, b"b", [])  # delta 2 for the second record, and lastOffsetDelta 2 for 2 records
    data = bytearray(b.build())
    struct.pack_into(">i", data, 23, 1)  # lastOffsetDelta = count - 1, so only the records disagree
    assert _refused(_recrc(data)) is ErrorCode.CORRUPT_MESSAGE


def test_fewer_records_than_declared_are_refused() -> None:
    data = bytearray(kafka_batch(n=2))
    struct.pack_into(">i", data, 57, 3)
    struct.pack_into(">i", data, 23, 2)
    assert _refused(_recrc(data)) is ErrorCode.CORRUPT_MESSAGE


def test_a_max_timestamp_that_is_not_the_records_largest_is_refused() -> None:
    data = bytearray(kafka_batch())
    struct.pack_into(">q", data, 35, TS + 10**9)  # maxTimestamp far ahead (retention would keep it forever)
    assert _refused(_recrc(data)) is ErrorCode.CORRUPT_MESSAGE


# -- conversions --------------------------------------------------------------------------


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_kafka_batch_becomes_a_txbroker_batch_with_the_same_records(codec: str) -> None:
    data = kafka_to_txbroker(kafka_batch(codec=CODECS[codec]))
    header = parse_batch(data)
    assert (header.producer_id, header.record_count, header.is_transactional) == (-1, 5, False)
    assert list(decode_records(data)) == expected_records()


def test_producer_state_and_the_transactional_flag_carry_over_to_txbroker() -> None:
    header = parse_batch(kafka_to_txbroker(kafka_batch(pid=42, epoch=3, seq=100, txn=True)))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 100)
    assert header.is_transactional and header.last_sequence == 104


def test_a_kafka_control_batch_has_no_txbroker_form() -> None:
    data = bytearray(kafka_batch(n=1, pid=7, epoch=0, seq=0, txn=True))
    struct.pack_into(">h", data, 21, 0x30)
    with pytest.raises(BrokerError) as exc:
        kafka_to_txbroker(_recrc(data))
    assert exc.value.error_code is ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_stored_kafka_batch_goes_back_byte_for_byte_but_its_base_offset(codec: str) -> None:
    data = kafka_batch(codec=CODECS[codec], pid=7, epoch=1, seq=0, txn=True)
    out = stored_to_kafka(stored(data, base=1000))
    assert out[16:] == data[16:]  # magic, CRC and everything it covers: as the producer wrote them
    batch = DefaultRecordBatch(out)
    assert batch.validate_crc() and batch.compression_type == CODECS[codec]
    assert (batch.base_offset, batch.leader_epoch, batch.producer_id, batch.is_transactional) == (1000, -1, 7, True)
    assert [(r.offset, r.key, r.timestamp) for r in batch] == [(1000 + i, r.key, r.timestamp)
                                                               for i, r in enumerate(expected_records())]  # fmt: skip


def test_a_txbroker_batch_goes_back_as_a_kafka_batch_at_its_offset() -> None:
    txb = kafka_to_txbroker(kafka_batch(pid=7, epoch=1, seq=0, txn=True))
    out = DefaultRecordBatch(stored_to_kafka(stored(txb, fmt=BatchFormat.TXBROKER)))
    assert out.validate_crc()
    assert (out.base_offset, out.producer_id, out.producer_epoch, out.base_sequence) == (1000, 7, 1, 0)
    assert out.is_transactional and not out.is_control_batch
    got = [Record(r.value, r.key, tuple(r.headers), r.timestamp) for r in out]
    assert got == expected_records()


def test_a_plain_txbroker_batch_goes_back_without_producer_state() -> None:
    txb = encode_batch([Record(b"v", timestamp=TS)])
    out = DefaultRecordBatch(stored_to_kafka(stored(txb, base=3, fmt=BatchFormat.TXBROKER)))
    assert (out.producer_id, out.producer_epoch, out.base_sequence, out.base_offset) == (-1, -1, -1, 3)


def test_records_survive_kafka_to_txbroker_to_kafka() -> None:
    kafka = kafka_batch(codec=CODECS["lz4"], pid=9, epoch=2, seq=10)
    txb = as_txbroker(stored(kafka, base=50))
    assert txb.format is BatchFormat.TXBROKER and txb.base_offset == 50
    again = stored_to_kafka(txb)
    assert kafka_records(again) == expected_records()
    h = parse_kafka_batch(again)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == (9, 2, 10, 5)


@pytest.mark.parametrize(("ctype", "kafka_type"), [(ControlType.ABORT, 0), (ControlType.COMMIT, 1)])
def test_a_marker_goes_back_as_a_kafka_control_batch(ctype: ControlType, kafka_type: int) -> None:
    marker = txb_control(ctype, producer_id=7, producer_epoch=1, coordinator_epoch=3, timestamp=TS)
    raw = kafka_fetch_payload([stored(marker, base=55, fmt=BatchFormat.TXBROKER)])
    out = DefaultRecordBatch(raw)
    assert out.validate_crc() and out.is_control_batch and out.is_transactional
    (record,) = list(out)
    assert (record.offset, record.type, record.timestamp) == (55, kafka_type, TS)  # Kafka's ControlRecordType
    assert struct.unpack(">hi", record.value) == (0, 3)  # the coordinator epoch
    header = parse_kafka_batch(raw)
    assert header.is_control and (header.producer_id, header.producer_epoch) == (7, 1)


def test_a_fetch_payload_is_the_batches_one_after_another() -> None:
    a = stored(kafka_batch(n=2, codec=CODECS["zstd"]), base=0)
    b = stored(encode_batch([Record(b"x", timestamp=TS)]), base=2, fmt=BatchFormat.TXBROKER)
    c = stored(kafka_batch(n=3), base=3)
    payload = kafka_fetch_payload([a, b, c])
    offsets, pos = [], 0
    while pos < len(payload):
        (length,) = struct.unpack_from(">i", payload, pos + 8)
        batch = DefaultRecordBatch(payload[pos : pos + 12 + length])
        assert batch.validate_crc()
        offsets += [r.offset for r in batch]
        pos += 12 + length
    assert offsets == [0, 1, 2, 3, 4, 5]


def test_batch_records_reads_either_format() -> None:
    kafka = stored(kafka_batch(codec=CODECS["snappy"]))
    assert batch_records(kafka) == expected_records()
    assert batch_records(as_txbroker(kafka)) == expected_records()


# -- the conversion cache ------------------------------------------------------------------


def test_the_cache_answers_a_batch_once_converted_and_only_that_batch() -> None:
    cache = ConversionCache(1 << 20)
    calls: list[int] = []

    def convert(b: StoredBatch) -> bytes:
        calls.append(b.base_offset)
        return b.data[::-1]

    one = stored(kafka_batch(n=1))
    assert cache.get(one, convert) == cache.get(one, convert) == one.data[::-1]
    other = stored(kafka_batch(n=2), base=one.base_offset)  # same offset, other bytes (another partition)
    assert cache.get(other, convert) == other.data[::-1]
    moved = stored(one.data, base=1)  # same bytes at another offset
    cache.get(moved, convert)
    assert calls == [1000, 1000, 1] and (cache.hits, cache.misses) == (1, 3)
    # Same offset, CRC and length, other bytes (a CRC collision, or a damaged copy): not this entry.
    twin = StoredBatch(one.base_offset, TS, bytes(len(one.data)), one.header, BatchFormat.KAFKA)
    assert cache.get(twin, convert) == twin.data[::-1]
    assert cache.get(one, convert) == one.data[::-1] and len(calls) == 5


def test_the_cache_stays_within_its_bytes() -> None:
    batches = [stored(kafka_batch(n=1), base=i) for i in range(50)]
    size = 2 * len(batches[0].data)
    cache = ConversionCache(10 * size)
    for b in batches:
        cache.get(b, lambda b: b.data)
    assert cache.size_bytes <= 10 * size
    cache.get(batches[-1], lambda b: b"")  # the newest is kept
    assert cache.hits == 1
    cache.get(batches[0], lambda b: b.data)  # the oldest went first
    assert cache.misses == 51


# -- stored format ------------------------------------------------------------------------


def test_a_stored_kafka_batch_decodes_with_its_format() -> None:
    data = kafka_batch(codec=CODECS["gzip"], pid=4, epoch=0, seq=0)
    value = encode_stored_batch_header(77, TS, BatchFormat.KAFKA) + data
    batch = decode_stored_batch(value, base_offset=77, where="t-0 batch 77")
    assert (batch.format, batch.base_offset, batch.log_append_time, batch.data) == (BatchFormat.KAFKA, 77, TS, data)
    assert batch.header == parse_kafka_batch(data)
    assert encode_stored_batch_header(77, TS)[0] == 1 and value[0] == 2  # version 1 is txbroker's, 2 Kafka's


def test_a_corrupt_stored_kafka_batch_or_an_unknown_version_is_storage_corruption() -> None:
    data = bytearray(kafka_batch())
    value = encode_stored_batch_header(0, TS, BatchFormat.KAFKA) + bytes(data)
    flipped = bytearray(value)
    flipped[-1] ^= 0x40
    with pytest.raises(StorageCorruptionError, match="CRC"):
        decode_stored_batch(bytes(flipped), base_offset=0, where="t-0 batch 0")
    head = bytearray(value[:17])
    head[0] = 3
    unknown = bytes(head) + struct.pack(">I", crc32c.crc32c(bytes(head))) + bytes(data)
    with pytest.raises(StorageCorruptionError, match="unknown stored batch version 3"):
        decode_stored_batch(unknown, base_offset=0, where="t-0 batch 0")
    # A txbroker header over Kafka bytes (or the reverse) does not parse either.
    wrong = encode_stored_batch_header(0, TS, BatchFormat.TXBROKER) + bytes(data)
    with pytest.raises(StorageCorruptionError):
        decode_stored_batch(wrong, base_offset=0, where="t-0 batch 0")


def test_the_producers_base_offset_does_not_matter() -> None:
    # Producers send baseOffset 0; the log assigns offsets, so any other value is ignored, not refused.
    data = bytearray(kafka_batch())
    struct.pack_into(">q", data, 0, 12345)  # outside the CRC
    assert kafka_records(bytes(data)) == expected_records()
    out = DefaultRecordBatch(stored_to_kafka(stored(bytes(data), base=7)))
    assert [r.offset for r in out] == [7, 8, 9, 10, 11]


def test_the_binary_produce_form_carries_txbroker_batches_only() -> None:
    part = ProducePartition("t", 0, kafka_batch(), format=BatchFormat.KAFKA)
    with pytest.raises(ValueError, match="txbroker batches"):
        encode_produce_request(ProduceRequest((part,)))
