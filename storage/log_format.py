"""On-disk encoding of a partition log: keys, the meta record and stored batches.

Keys, under the partition's prefix ``P``::

    P + b"m"                      -> LogMeta
    P + b"a" + last_offset u64    -> AbortedTxn (txn_index.encode_aborted_txn)
    P + b"b" + base_offset u64    -> stored batch
    P + b"s" + producer_id u64    -> ProducerStateEntry (producer_state.encode_entry)
    P + b"r"                      -> present only while read_snapshot runs

Big-endian u64 keys sort by offset, so a fetch is a range scan. The aborted
index sorts just below the batches, so one iterator bounded by a batch key
covers both (``PartitionLog.fetch`` relies on it).

A *stored batch* is a 21-byte header then the producer's batch bytes exactly as
received (they carry their own CRC-32C)::

    version u8 | base_offset i64 | log_append_time i64 | crc32c(previous 17 bytes) u32

The version names the batch's format: 1 a txbroker batch
(``clients.protocol``), 2 a Kafka producer's RecordBatch v2
(``storage.kafka_batch``; its own ``baseOffset`` field is whatever the producer
sent, the stored header's is the one that counts).

Every record here carries a version byte and a CRC so that corruption is
reported (``StorageCorruptionError``), never returned as data.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

from clients.protocol import BatchFormat, BrokerError, StoredBatch, parse_batch
from storage.errors import StorageCorruptionError
from storage.kafka_batch import parse_kafka_batch
from storage.txn_index import AbortedTxn, decode_aborted_txn

__all__ = [
    "ABORTED_TAG",
    "BATCH_TAG",
    "META_TAG",
    "PRODUCER_TAG",
    "RESTORE_TAG",
    "STORED_HEADER_SIZE",
    "STORED_VERSIONS",
    "LogMeta",
    "PartitionKeys",
    "decode_meta",
    "decode_stored_batch",
    "encode_meta",
    "encode_stored_batch_header",
    "offset_key_suffix",
]

META_TAG = b"m"
ABORTED_TAG = b"a"
BATCH_TAG = b"b"
PRODUCER_TAG = b"s"
RESTORE_TAG = b"r"

_U64 = struct.Struct(">Q")
_CRC = struct.Struct(">I")


def offset_key_suffix(tag: bytes, number: int) -> bytes:
    """``tag`` + ``number`` as u64 big-endian (sorts numerically)."""
    return tag + _U64.pack(number)


class PartitionKeys:
    """The keys of one partition under its non-empty ``prefix`` (layout above), and their decoding.

    ``name`` (``topic-p``) labels corruption errors. Immutable by convention; any thread.
    """

    __slots__ = ("aborted_prefix", "batch_end", "batch_prefix", "end", "meta", "name", "prefix", "producer_prefix",
                 "restore")  # fmt: skip

    def __init__(self, prefix: bytes, name: str) -> None:
        self.prefix = prefix
        self.name = name
        self.meta = prefix + META_TAG
        self.restore = prefix + RESTORE_TAG
        self.aborted_prefix = prefix + ABORTED_TAG
        self.batch_prefix = prefix + BATCH_TAG
        self.batch_end = prefix + bytes((BATCH_TAG[0] + 1,))
        self.producer_prefix = prefix + PRODUCER_TAG
        # Every key is the prefix, one tag byte and maybe a u64; every tag is below 0xff.
        self.end = prefix + b"\xff"

    def batch(self, base_offset: int) -> bytes:
        return self.prefix + offset_key_suffix(BATCH_TAG, base_offset)

    def producer(self, producer_id: int) -> bytes:
        return self.prefix + offset_key_suffix(PRODUCER_TAG, producer_id)

    def aborted(self, last_offset: int) -> bytes:
        return self.prefix + offset_key_suffix(ABORTED_TAG, last_offset)

    def decode_batch(self, key: bytes, value: bytes) -> StoredBatch:
        """The stored batch under batch key ``key``; raises ``StorageCorruptionError``."""
        (base,) = _U64.unpack_from(key, len(self.batch_prefix))
        return decode_stored_batch(value, base_offset=base, where=f"{self.name} batch {base}")

    def iter_aborted(self, pairs: Iterator[tuple[bytes, bytes]]) -> Iterator[AbortedTxn]:
        """The index entries of aborted-index ``(key, value)`` pairs; raises ``StorageCorruptionError``."""
        for key, value in pairs:
            (last,) = _U64.unpack_from(key, len(self.aborted_prefix))
            yield decode_aborted_txn(value, last_offset=last, where=f"{self.name} aborted txn {last}")


# --------------------------------------------------------------------------
# Meta
# --------------------------------------------------------------------------

META_VERSION = 2
_META_V1 = struct.Struct(">Bqqqqqq")
_META = struct.Struct(">Bqqqqqqq")


@dataclass(frozen=True, slots=True)
class LogMeta:
    """The partition's summary, written in the same WriteBatch as every change.

    Readers on other threads take this one immutable object, so the offsets
    they see always agree with each other.

    * ``log_start_offset``: first offset a fetch may ask for.
    * ``next_offset``: next offset to assign == the high watermark (everything
      applied is committed, DESIGN.md rule 2).
    * ``last_applied``: Raft index of the last applied entry (rule 3).
    * ``size_bytes`` / ``batch_count``: producer batch bytes / batches stored
      (control batches included).
    * ``expired_producers``: producer entries ever expired here.
    * ``first_unstable_offset``: the smallest first offset of an open
      transaction, None when none is open (kafka_txn.md §7.2; a marker applied
      here is committed at once, so no completed transaction stays unstable).
    """

    log_start_offset: int = 0
    next_offset: int = 0
    last_applied: int = 0
    size_bytes: int = 0
    batch_count: int = 0
    expired_producers: int = 0
    first_unstable_offset: int | None = None

    @property
    def state_may_be_lost(self) -> bool:
        """Some producer's state may be gone: records were deleted or entries expired."""
        return self.log_start_offset > 0 or self.expired_producers > 0

    @property
    def last_stable_offset(self) -> int:
        """The LSO: the first unstable offset (never below the log start), else the HW."""
        if self.first_unstable_offset is None:
            return self.next_offset
        return min(max(self.first_unstable_offset, self.log_start_offset), self.next_offset)


def encode_meta(meta: LogMeta) -> bytes:
    body = _META.pack(
        META_VERSION,
        meta.log_start_offset,
        meta.next_offset,
        meta.last_applied,
        meta.size_bytes,
        meta.batch_count,
        meta.expired_producers,
        -1 if meta.first_unstable_offset is None else meta.first_unstable_offset,
    )
    return body + _CRC.pack(crc32c.crc32c(body))


def decode_meta(data: bytes, *, where: str) -> tuple[LogMeta, bool]:
    """Inverse of ``encode_meta``; raises ``StorageCorruptionError`` naming ``where``.

    Also reads version 1, which predates transactions; the second value says
    whether ``first_unstable_offset`` was recorded (False for version 1: the
    caller derives it from the producer entries).
    """
    layout = {_META_V1.size + _CRC.size: _META_V1, _META.size + _CRC.size: _META}.get(len(data))
    if layout is None:
        raise StorageCorruptionError(f"{where}: meta has {len(data)} bytes, expected {_META.size + _CRC.size}")
    (crc,) = _CRC.unpack_from(data, layout.size)
    if crc32c.crc32c(data[: layout.size]) != crc:
        raise StorageCorruptionError(f"{where}: meta CRC mismatch")
    version, *fields = layout.unpack_from(data, 0)
    if (version, layout) not in ((1, _META_V1), (META_VERSION, _META)):
        raise StorageCorruptionError(f"{where}: unknown meta version {version} ({len(data)} bytes)")
    if layout is _META:
        fields[-1] = None if fields[-1] == -1 else fields[-1]
    meta = LogMeta(*fields)
    fu = meta.first_unstable_offset
    if not (
        0 <= meta.log_start_offset <= meta.next_offset
        and meta.last_applied >= 0
        and meta.size_bytes >= 0
        and meta.batch_count >= 0
        and (meta.size_bytes == 0) == (meta.batch_count == 0)
        and meta.expired_producers >= 0
        and (fu is None or 0 <= fu < meta.next_offset)
    ):
        raise StorageCorruptionError(f"{where}: inconsistent meta {meta}")
    return meta, layout is _META


# --------------------------------------------------------------------------
# Stored batches
# --------------------------------------------------------------------------

#: Stored header version per batch format (the first byte of a stored batch; persisted: never change).
STORED_VERSIONS: dict[BatchFormat, int] = {BatchFormat.TXBROKER: 1, BatchFormat.KAFKA: 2}
_FORMATS = {version: fmt for fmt, version in STORED_VERSIONS.items()}
_STORED_HEAD = struct.Struct(">Bqq")
STORED_HEADER_SIZE = _STORED_HEAD.size + _CRC.size


def encode_stored_batch_header(
    base_offset: int, log_append_time: int, batch_format: BatchFormat = BatchFormat.TXBROKER
) -> bytes:
    """The 21 bytes that precede the producer's batch (of ``batch_format``) in a stored value."""
    head = _STORED_HEAD.pack(STORED_VERSIONS[batch_format], base_offset, log_append_time)
    return head + _CRC.pack(crc32c.crc32c(head))


def decode_stored_batch(value: bytes, *, base_offset: int, where: str) -> StoredBatch:
    """Check and decode a stored batch whose key says ``base_offset``.

    Verifies the stored header's CRC, the key/value offset agreement and the
    batch's own header and CRC (not the records, which were checked before the
    batch was proposed). Raises ``StorageCorruptionError``.
    """
    if len(value) < STORED_HEADER_SIZE:
        raise StorageCorruptionError(f"{where}: stored batch truncated ({len(value)} bytes)")
    (crc,) = _CRC.unpack_from(value, _STORED_HEAD.size)
    if crc32c.crc32c(value[: _STORED_HEAD.size]) != crc:
        raise StorageCorruptionError(f"{where}: stored batch header CRC mismatch")
    version, stored_base, append_time = _STORED_HEAD.unpack_from(value, 0)
    batch_format = _FORMATS.get(version)
    if batch_format is None:
        raise StorageCorruptionError(f"{where}: unknown stored batch version {version}")
    if stored_base != base_offset:
        raise StorageCorruptionError(f"{where}: stored batch says base offset {stored_base}, key says {base_offset}")
    data = value[STORED_HEADER_SIZE:]
    try:
        if batch_format is BatchFormat.KAFKA:
            header = parse_kafka_batch(data, verify=False)
        else:
            header = parse_batch(data, verify=False)
    except BrokerError as exc:
        raise StorageCorruptionError(f"{where}: {exc.message}") from exc
    return StoredBatch(base_offset, append_time, data, header, batch_format)
