"""Kafka's RecordBatch v2, the second batch format a partition log stores (``BatchFormat.KAFKA``).

A Kafka producer's batch is stored exactly as received (possibly compressed),
so a Kafka Fetch ships the stored bytes with only ``baseOffset`` and
``partitionLeaderEpoch`` patched: both precede the part the CRC-32C covers.
Everything else reads a Kafka batch through this module:

* ``parse_kafka_batch``: the checks and the ``BatchHeader`` (txbroker's
  attribute bits: ``is_transactional``, ``is_control``, ``last_sequence``
  read as for a txbroker batch), the only door into the log;
* ``kafka_records`` / ``batch_records``: the records (HTTP JSON fetch,
  ListOffsets by timestamp);
* ``kafka_to_txbroker`` / ``as_txbroker``: a txbroker batch with the same
  producer state and records (the HTTP binary fetch, which the Python
  clients and Spark read);
* ``stored_to_kafka`` / ``kafka_fetch_payload``: any stored batch as Kafka v2
  bytes at its base offset (a Kafka Fetch), txbroker batches and markers
  built anew.

aiokafka's compiled record codec reads and builds the records (a tenth of
a pure-Python codec's cost per record; checking runs on the leader's event
loop); ``storage.kafka_codecs`` decompresses them first (gzip, snappy, lz4,
zstd) within ``MAX_DECOMPRESSED_BYTES``. kafka-python's batch class gives the
header layout.

What ``parse_kafka_batch`` refuses (``CORRUPT_MESSAGE`` unless noted): fewer
bytes than the 61-byte header, magic other than 2, a ``batchLength`` other
than the rest of the buffer (one batch per partition and request), a CRC-32C
mismatch, fewer than one record, ``lastOffsetDelta`` other than count - 1, a
compression type Kafka does not define (``UNSUPPORTED_COMPRESSION_TYPE``);
with ``verify``, also records that decompress to more than
``MAX_DECOMPRESSED_BYTES`` (``MESSAGE_TOO_LARGE``) or do not decode to the
end of the batch with offset deltas 0..n-1, timestamps within int64, and a
CreateTime batch whose ``maxTimestamp`` is not its records' largest. Hostile
bytes therefore never reach a log. Control batches and producer-state rules
are the log's to judge (``PartitionLog.check_append``), as for txbroker
batches.

Kafka numbers the marker types the other way round from txbroker's
``ControlType``: a control record's key is ``version i16 | type i16`` with
ABORT 0 and COMMIT 1 (Kafka's ``ControlRecordType``), its value ``version
i16 | coordinator_epoch i32`` as in txbroker's markers.

Conversions of stored batches are cached (``ConversionCache``): consumers of
one partition read the same batches, and building a batch costs far more than
looking it up (docs/kafka-listener.md, "Record batches"). The module is
otherwise pure; the cache is thread-safe.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import crc32c
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch as RecordReader
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.default_records import DefaultRecordBatch

from clients.protocol import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    NO_PRODUCER_EPOCH,
    NO_SEQUENCE,
    BatchFormat,
    BatchHeader,
    BrokerError,
    ControlType,
    ErrorCode,
    Record,
    StoredBatch,
    control_type_of,
    decode_records,
    encode_batch,
    parse_batch,
)
from storage.kafka_codecs import CODEC_NONE, decompress

__all__ = [
    "KAFKA_HEADER_SIZE",
    "MAX_DECOMPRESSED_BYTES",
    "NO_LEADER_EPOCH",
    "ConversionCache",
    "all_as_txbroker",
    "as_txbroker",
    "batch_records",
    "kafka_fetch_payload",
    "kafka_records",
    "kafka_to_txbroker",
    "parse_kafka_batch",
    "stored_to_kafka",
    "txbroker_to_kafka",
]

_HEADER: struct.Struct = DefaultRecordBatch.HEADER_STRUCT  # baseOffset .. recordCount
KAFKA_HEADER_SIZE: int = _HEADER.size  # 61
_LENGTH_END = 12  # baseOffset i64 + batchLength i32: what batchLength does not count
_ATTRIBUTES_OFFSET: int = DefaultRecordBatch.ATTRIBUTES_OFFSET  # 21: the CRC covers from here to the end
_CRC_OFFSET: int = DefaultRecordBatch.CRC_OFFSET
_MAGIC_OFFSET = 16
_OFFSET_AND_LENGTH = struct.Struct(">qii")  # baseOffset, batchLength, partitionLeaderEpoch
_COMPRESSION_MASK = 0x07
_KNOWN_CODECS = (0, 1, 2, 3, 4)  # none, gzip, snappy, lz4, zstd
_LOG_APPEND_TIME = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_NO_LIMIT = 2**31 - 1
_INT64 = (-(2**63), 2**63 - 1)
#: The most bytes one batch's records may decompress to (``MESSAGE_TOO_LARGE`` beyond): 64 times Kafka's
#: default ``max.message.bytes``, far above what real data compresses by.
MAX_DECOMPRESSED_BYTES = 64 << 20
NO_LEADER_EPOCH = -1  # leader epochs are not tracked: clients skip KIP-320's checks
#: A control record's key in Kafka: version 0, then Kafka's ControlRecordType (ABORT 0, COMMIT 1).
_KAFKA_CONTROL_KEY: dict[ControlType | None, bytes] = {
    ControlType.ABORT: struct.pack(">hh", 0, 0),
    ControlType.COMMIT: struct.pack(">hh", 0, 1),
    None: struct.pack(">hh", 0, -1),  # a type txbroker does not know: one Kafka does not know either (ignored)
}


def _corrupt(why: str) -> BrokerError:
    return BrokerError(ErrorCode.CORRUPT_MESSAGE, f"Kafka record batch: {why}")


# --------------------------------------------------------------------------
# Parsing and verification
# --------------------------------------------------------------------------


def parse_kafka_batch(data: bytes | bytearray | memoryview, *, verify: bool = True) -> BatchHeader:
    """Check a Kafka record batch v2 and return its header in txbroker's terms (module docstring).

    Without ``verify`` only the header and the CRC are checked (what a stored
    batch, verified before it was proposed, needs). A plain batch (producer id
    -1) reads as epoch and sequence -1 whatever the client filled in there
    (clients write -1 or 0). Raises ``BrokerError``.
    """
    mv = memoryview(data)
    if len(mv) < KAFKA_HEADER_SIZE:
        raise _corrupt(f"{len(mv)} bytes, shorter than the {KAFKA_HEADER_SIZE}-byte header")
    (_base, length, _leader_epoch, magic, crc, attrs, last_delta, first_ts, max_ts, pid, epoch, seq, count) = (
        _HEADER.unpack_from(mv, 0)
    )
    if magic != 2:
        raise _corrupt(f"magic {magic} (only record batch v2 is taken)")
    if length != len(mv) - _LENGTH_END:
        raise _corrupt(f"batchLength {length} for {len(mv)} bytes (one batch per partition)")
    if crc32c.crc32c(mv[_ATTRIBUTES_OFFSET:]) != crc:
        raise _corrupt("CRC-32C mismatch")
    if attrs & _COMPRESSION_MASK not in _KNOWN_CODECS:
        raise BrokerError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"compression type {attrs & _COMPRESSION_MASK}")
    if count < 1 or last_delta != count - 1:
        raise _corrupt(f"{count} records with last offset delta {last_delta}")
    if pid < 0:
        epoch, seq = NO_PRODUCER_EPOCH, NO_SEQUENCE
    header = BatchHeader(
        crc=crc,
        attributes=(ATTR_TRANSACTIONAL if attrs & _TRANSACTIONAL else 0) | (ATTR_CONTROL if attrs & _CONTROL else 0),
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        record_count=count,
        first_timestamp=first_ts,
        max_timestamp=max_ts,
    )
    if verify:
        _verify_records(mv, max_ts, not attrs & _LOG_APPEND_TIME)
    return header


def _record_reader(data: bytes | bytearray | memoryview, limit: int) -> Any:
    """aiokafka's record reader over a batch whose header checks passed, its records decompressed first
    (within ``limit`` bytes, ``storage.kafka_codecs``); the reader itself is told no compression."""
    mv = memoryview(data)
    codec = mv[_ATTRIBUTES_OFFSET + 1] & _COMPRESSION_MASK  # attributes is an int16: the codec is in its low byte
    if codec == CODEC_NONE:
        return RecordReader(mv)
    plain = bytearray(mv[:KAFKA_HEADER_SIZE])
    plain[_ATTRIBUTES_OFFSET + 1] &= ~_COMPRESSION_MASK
    plain += decompress(codec, mv[KAFKA_HEADER_SIZE:], limit)
    return RecordReader(plain)


def _checked_records(data: bytes | bytearray | memoryview) -> Iterator[tuple[int, Any]]:
    """``(timestamp, record)`` of every record, checked as ``verify`` describes (the reader checks the framing
    to the batch's end and the record count); raises ``BrokerError``."""
    reader = _record_reader(data, MAX_DECOMPRESSED_BYTES)
    lo, hi = _INT64
    base = reader.base_offset  # what the producer sent (0 as a rule): only the deltas count
    i = 0
    try:
        for r in reader:
            if r.offset - base != i:
                raise _corrupt(f"record {i} has offset delta {r.offset - base}")
            ts = r.timestamp
            if not lo <= ts <= hi:
                raise _corrupt(f"record {i} has timestamp {ts}, outside int64")
            yield ts, r
            i += 1
    except (CorruptRecordException, ValueError, IndexError, struct.error) as exc:  # UnicodeDecodeError: a header key
        raise _corrupt(f"records do not decode: {exc}") from exc


def _verify_records(data: bytes | bytearray | memoryview, max_timestamp: int, create_time: bool) -> None:
    newest = max(ts for ts, _r in _checked_records(data))
    if create_time and newest != max_timestamp:
        raise _corrupt(f"maxTimestamp {max_timestamp} is not the largest record timestamp")


def _decode(data: bytes | bytearray | memoryview) -> list[Record]:
    """Every record of a batch whose header checks passed, checked as ``verify`` describes."""
    return [
        Record(value=r.value, key=r.key, headers=tuple(r.headers), timestamp=ts) for ts, r in _checked_records(data)
    ]


def kafka_records(data: bytes | bytearray | memoryview) -> list[Record]:
    """The records of a Kafka batch (decompressed; timestamps absolute, in ms).

    Raises ``BrokerError(CORRUPT_MESSAGE)`` if they do not decode.
    """
    return _decode(data)


def batch_records(batch: StoredBatch) -> list[Record]:
    """The records of a stored batch of either format, in offset order."""
    if batch.format is BatchFormat.KAFKA:
        return kafka_records(batch.data)
    return list(decode_records(batch.data))


# --------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------


def kafka_to_txbroker(data: bytes | bytearray | memoryview) -> bytes:
    """A Kafka batch as a txbroker batch: same producer id, epoch, base sequence, transactional flag,
    records and timestamps. Raises ``BrokerError`` as ``parse_kafka_batch`` with ``verify``.

    Kafka control batches are not converted (``INVALID_REQUEST``): txbroker writes markers itself.
    """
    header = parse_kafka_batch(data, verify=False)
    if header.is_control:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "a Kafka control batch has no txbroker form")
    records = _decode(data)
    if not header.is_idempotent:
        return encode_batch(records)
    return encode_batch(
        records,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        transactional=header.is_transactional,
    )


def txbroker_to_kafka(batch: StoredBatch) -> bytes:
    """A stored txbroker batch (or marker, as a Kafka control batch) built anew as an uncompressed Kafka
    batch at its base offset; ``stored_to_kafka`` is the cached door."""
    h = batch.header
    builder: Any = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=h.is_transactional, producer_id=h.producer_id,
        producer_epoch=h.producer_epoch, base_sequence=h.base_sequence, batch_size=_NO_LIMIT,
    )  # fmt: skip
    control_key = _KAFKA_CONTROL_KEY[control_type_of(batch.data)] if h.is_control else None
    for i, r in enumerate(decode_records(batch.data)):
        builder.append(i, r.timestamp, r.key if control_key is None else control_key, r.value, list(r.headers))
    buf: bytearray = builder.build()
    _OFFSET_AND_LENGTH.pack_into(buf, 0, batch.base_offset, len(buf) - _LENGTH_END, NO_LEADER_EPOCH)
    if h.is_control:
        buf[_ATTRIBUTES_OFFSET + 1] |= _CONTROL  # attributes is an int16; the flags are in its low byte
        struct.pack_into(">I", buf, _CRC_OFFSET, crc32c.crc32c(memoryview(buf)[_ATTRIBUTES_OFFSET:]))
    return bytes(buf)


def _patched_kafka(batch: StoredBatch) -> bytes:
    mv = memoryview(batch.data)
    return _OFFSET_AND_LENGTH.pack(batch.base_offset, len(mv) - _LENGTH_END, NO_LEADER_EPOCH) + mv[_MAGIC_OFFSET:]


class ConversionCache:
    """A bounded LRU of converted stored batches, by total bytes held (stored and converted bytes).

    An entry is found by the batch's base offset, format, CRC and length, and
    answers only if its stored bytes equal the batch's (one ``memcmp``, no
    hashing of the bytes), so it can never answer for another batch, whatever
    partition, topic or incarnation of a topic it came from. Thread-safe (one
    lock around the dictionary; conversions run outside it).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, BatchFormat, int, int], tuple[bytes, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, batch: StoredBatch, convert: Callable[[StoredBatch], bytes]) -> bytes:
        """``convert(batch)``, from the cache when an earlier call converted the same batch."""
        key = (batch.base_offset, batch.format, batch.header.crc, len(batch.data))
        with self._lock:
            found = self._entries.get(key)
            if found is not None and found[0] == batch.data:
                self._entries.move_to_end(key)
                self.hits += 1
                return found[1]
            self.misses += 1
        value = convert(batch)
        size = len(batch.data) + len(value)
        if size > self.max_bytes // 8:  # one huge batch must not flush everything else
            return value
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old[0]) + len(old[1])
            self._entries[key] = (batch.data, value)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _key, (data, converted) = self._entries.popitem(last=False)
                self._bytes -= len(data) + len(converted)
        return value

    @property
    def size_bytes(self) -> int:
        """Bytes held (stored and converted)."""
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


#: Conversions for Kafka fetches (txbroker batches) and HTTP binary fetches (Kafka batches).
_TO_KAFKA = ConversionCache(32 << 20)
_TO_TXBROKER = ConversionCache(32 << 20)


def stored_to_kafka(batch: StoredBatch) -> bytes:
    """A stored batch as Kafka record batch v2 bytes at its base offset.

    A Kafka batch is its stored bytes with ``baseOffset`` and
    ``partitionLeaderEpoch`` (-1) patched, compressed as written; a txbroker
    batch or marker is built uncompressed (markers as Kafka control batches).
    """
    if batch.format is BatchFormat.KAFKA:
        return _patched_kafka(batch)
    return _TO_KAFKA.get(batch, txbroker_to_kafka)


def kafka_fetch_payload(batches: Iterable[StoredBatch]) -> bytes:
    """The ``records`` of one partition of a Kafka FetchResponse: the batches, one after another."""
    return b"".join(stored_to_kafka(b) for b in batches)


def _converted_to_txbroker(batch: StoredBatch) -> bytes:
    return kafka_to_txbroker(batch.data)


def as_txbroker(batch: StoredBatch) -> StoredBatch:
    """A stored batch in txbroker's format (a Kafka batch converted; a txbroker batch as it is)."""
    if batch.format is BatchFormat.TXBROKER:
        return batch
    data = _TO_TXBROKER.get(batch, _converted_to_txbroker)
    return StoredBatch(batch.base_offset, batch.log_append_time, data, parse_batch(data, verify=False))


def all_as_txbroker(batches: Sequence[StoredBatch]) -> list[StoredBatch]:
    """``as_txbroker`` of each batch."""
    return [as_txbroker(b) for b in batches]
