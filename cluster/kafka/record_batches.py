"""Kafka's record batch v2 and txbroker's batches, converted at the listener.

A Kafka producer's batch (``RecordBatch`` v2: varint records, possibly
compressed) becomes a txbroker batch with the same producer id, epoch, base
sequence, transactional flag, records and timestamps; a stored batch goes
back to a Kafka consumer as an uncompressed v2 batch at its base offset, its
control flag and control record (COMMIT/ABORT, coordinator epoch) included.
kafka-python's record codec (``kafka.record``) reads and builds the batches
and does the decompression (gzip, snappy, lz4, zstd).

A batch is checked before anything of it is used: its length, magic, CRC-32C,
a record count that matches its last offset delta, known compression, records
that decode to the end of the batch with offset deltas 0..n-1, no control
batch; anything else is ``CORRUPT_MESSAGE`` (``UNSUPPORTED_COMPRESSION_TYPE``
for a codec Kafka does not define), so hostile bytes never reach a log.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import crc32c
from kafka.errors import CorruptRecordError, UnsupportedCodecError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from clients.protocol import (
    BrokerError,
    ControlType,
    ErrorCode,
    Record,
    StoredBatch,
    control_type_of,
    decode_records,
    encode_batch,
)

__all__ = ["kafka_fetch_payload", "kafka_to_txbroker", "stored_to_kafka"]

_HEADER = DefaultRecordBatch.HEADER_STRUCT  # baseOffset .. recordCount, 61 bytes
_LENGTH_END = 12  # baseOffset i64 + batchLength i32: what batchLength does not count
_ATTRIBUTES_OFFSET = DefaultRecordBatch.ATTRIBUTES_OFFSET
_CRC_OFFSET = DefaultRecordBatch.CRC_OFFSET
_COMPRESSION_MASK = 0x07
_KNOWN_CODECS = (0, 1, 2, 3, 4)  # none, gzip, snappy, lz4, zstd
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_NO_LIMIT = 2**31 - 1
#: A control record's key in Kafka: version 0, then the type (Kafka's ControlRecordType: ABORT 0, COMMIT 1).
_KAFKA_CONTROL_KEY: dict[ControlType | None, bytes] = {
    ControlType.ABORT: struct.pack(">hh", 0, 0),
    ControlType.COMMIT: struct.pack(">hh", 0, 1),
    None: struct.pack(">hh", 0, -1),  # a type txbroker does not know: one Kafka does not know either (ignored)
}


def _corrupt(why: str) -> BrokerError:
    return BrokerError(ErrorCode.CORRUPT_MESSAGE, f"record batch: {why}")


def kafka_to_txbroker(data: bytes) -> bytes:
    """A Kafka producer's record batch v2 as a txbroker batch (same producer state and records); raises
    ``BrokerError`` for anything malformed (module docstring)."""
    if len(data) < _HEADER.size:
        raise _corrupt(f"{len(data)} bytes, shorter than the {_HEADER.size}-byte header")
    (_base, length, _epoch, magic, crc, attrs, last_delta, _first_ts, _max_ts, pid, pepoch, seq, count) = (
        _HEADER.unpack_from(data, 0)
    )
    if magic != 2:
        raise BrokerError(ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, f"record batch magic {magic} (only v2 is taken)")
    if length != len(data) - _LENGTH_END:
        raise _corrupt(f"batchLength {length} for {len(data)} bytes (one batch per partition)")
    if crc32c.crc32c(memoryview(data)[_ATTRIBUTES_OFFSET:]) != crc:
        raise _corrupt("CRC-32C mismatch")
    if attrs & _CONTROL:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "clients may not write control batches")
    if attrs & _COMPRESSION_MASK not in _KNOWN_CODECS:
        raise BrokerError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"compression type {attrs & _COMPRESSION_MASK}")
    if count < 1 or last_delta != count - 1:
        raise _corrupt(f"{count} records with last offset delta {last_delta}")
    records: list[Record] = []
    try:
        for i, r in enumerate(DefaultRecordBatch(data)):
            if r.offset != i:
                raise _corrupt(f"record {i} has offset delta {r.offset}")
            headers = tuple((k, None if v is None else bytes(v)) for k, v in r.headers)
            records.append(
                Record(value=_bytes(r.value), key=_bytes(r.key), headers=headers, timestamp=int(r.timestamp))
            )
    except BrokerError:
        raise
    except UnsupportedCodecError as exc:
        raise BrokerError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, str(exc)) from exc
    except (CorruptRecordError, UnicodeDecodeError, ValueError, IndexError, struct.error) as exc:
        raise _corrupt(f"records do not decode: {exc}") from exc
    except Exception as exc:  # each decompressor reports a damaged stream its own way (OSError, ZstdError, ...)
        raise _corrupt(f"compressed records do not decompress: {exc}") from exc
    if len(records) != count:
        raise _corrupt(f"{len(records)} records decoded, {count} declared")
    if pid < 0:  # a plain batch: clients fill its epoch and sequence in differently (-1 or 0); they mean nothing
        return encode_batch(records)
    return encode_batch(
        records, producer_id=pid, producer_epoch=pepoch, base_sequence=seq, transactional=bool(attrs & _TRANSACTIONAL)
    )


def _bytes(value: bytes | bytearray | memoryview | None) -> bytes | None:
    return None if value is None else bytes(value)


def stored_to_kafka(batch: StoredBatch) -> bytes:
    """A stored batch as an uncompressed Kafka record batch v2 at its base offset."""
    h = batch.header
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=h.is_transactional, producer_id=h.producer_id,
        producer_epoch=h.producer_epoch, base_sequence=h.base_sequence, batch_size=_NO_LIMIT,
    )  # fmt: skip
    for i, r in enumerate(decode_records(batch.data)):
        key = r.key
        if h.is_control:  # Kafka numbers the marker types the other way round: ABORT 0, COMMIT 1
            key = _KAFKA_CONTROL_KEY[control_type_of(batch.data)]
        builder.append(i, r.timestamp, key, r.value, list(r.headers))
    buf = builder.build()
    struct.pack_into(">q", buf, 0, batch.base_offset)
    struct.pack_into(">i", buf, _LENGTH_END, -1)  # partitionLeaderEpoch: not tracked
    if h.is_control:
        buf[_ATTRIBUTES_OFFSET + 1] |= _CONTROL  # attributes is an int16; the flags are in its low byte
        struct.pack_into(">I", buf, _CRC_OFFSET, crc32c.crc32c(memoryview(buf)[_ATTRIBUTES_OFFSET:]))
    return bytes(buf)


def kafka_fetch_payload(batches: Iterable[StoredBatch]) -> bytes:
    """The ``records`` of one partition of a Kafka FetchResponse: the batches, one after another."""
    return b"".join(stored_to_kafka(b) for b in batches)
