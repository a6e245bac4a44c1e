"""Wire types shared by the broker and its Python clients.

This module is the single source of truth for:

* ``ErrorCode`` -- Kafka's error names with their numeric code, the HTTP status
  txbroker answers with, and whether a client may retry.
* ``BrokerError`` -- the exception that carries an ``ErrorCode`` across every
  boundary (HTTP handler -> JSON body -> client exception).
* The record-batch encoding. A *record batch* is what one producer sends to one
  partition in one request: a fixed 40-byte header followed by its records.
  The broker stores the batch bytes exactly as received (plus the offset it
  assigned), so a fetch ships bytes without re-encoding.
* The binary produce request and binary fetch response used by the Python
  client (``application/x-txbroker-produce`` / ``...-batches``).

Batch layout (big-endian)::

    magic u8 (=2) | crc u32 | attributes u8 | producer_id i64 | producer_epoch i16
    | base_sequence i32 | record_count i32 | first_timestamp i64 | max_timestamp i64
    | records...

``crc`` is CRC-32C of every byte after the crc field. ``attributes`` bit 0 =
transactional, bit 1 = control. A record is::

    timestamp i64 | key_len i32 (-1 = null) | key | value_len i32 (-1 = null) | value
    | header_count i16 | (hkey_len i16 | hkey utf-8 | hval_len i32 | hval)*

Control batches (transaction markers) hold one record whose key is
``version i16 (0) | type i16`` (COMMIT = 0, ABORT = 1) and whose value is
``version i16 (0) | coordinator_epoch i32``, as in Kafka.

This module is pure: no I/O, no threads. It is safe to use from any thread.
"""

from __future__ import annotations

import base64
import binascii
import enum
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import crc32c

__all__ = [
    "BATCH_HEADER",
    "BATCH_MAGIC",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "BatchFormat",
    "BatchHeader",
    "BrokerError",
    "ControlType",
    "ErrorCode",
    "ProducePartition",
    "ProduceRequest",
    "Record",
    "StoredBatch",
    "decode_fetch_batches",
    "decode_produce_request",
    "decode_records",
    "encode_batch",
    "encode_control_batch",
    "encode_fetch_batches",
    "encode_produce_request",
    "parse_batch",
]


class ErrorCode(enum.Enum):
    """Kafka error names. Value: (Kafka numeric code, HTTP status, retriable).

    Names and numeric codes follow Kafka's ``Errors`` and never change; the
    HTTP status is txbroker's mapping (API.md: 400 bad input, 404 unknown,
    409 conflict/fenced/sequence, 413 too large, 421 not leader/coordinator,
    429 throttled, 503 unavailable/loading, 504 timed out).
    """

    NONE = (0, 200, False)
    UNKNOWN_SERVER_ERROR = (-1, 500, False)
    OFFSET_OUT_OF_RANGE = (1, 400, False)
    CORRUPT_MESSAGE = (2, 400, False)
    UNKNOWN_TOPIC_OR_PARTITION = (3, 404, False)
    LEADER_NOT_AVAILABLE = (5, 503, True)
    NOT_LEADER_OR_FOLLOWER = (6, 421, True)
    REQUEST_TIMED_OUT = (7, 504, True)
    MESSAGE_TOO_LARGE = (10, 413, False)
    # Not a Kafka error: a single record above max.message.bytes (API.md lists it).
    RECORD_TOO_LARGE = (10_010, 413, False)
    OFFSET_METADATA_TOO_LARGE = (12, 400, False)
    NETWORK_EXCEPTION = (13, 503, True)
    COORDINATOR_LOAD_IN_PROGRESS = (14, 503, True)
    COORDINATOR_NOT_AVAILABLE = (15, 503, True)
    NOT_COORDINATOR = (16, 421, True)
    # API.md names it INVALID_TOPIC; Kafka's INVALID_TOPIC_EXCEPTION is an alias.
    INVALID_TOPIC = (17, 400, False)
    INVALID_TOPIC_EXCEPTION = (17, 400, False)
    RECORD_LIST_TOO_LARGE = (18, 413, False)
    NOT_ENOUGH_REPLICAS = (19, 503, True)
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (20, 503, True)
    INVALID_REQUIRED_ACKS = (21, 400, False)
    ILLEGAL_GENERATION = (22, 409, False)
    INCONSISTENT_GROUP_PROTOCOL = (23, 409, False)
    INVALID_GROUP_ID = (24, 400, False)
    UNKNOWN_MEMBER_ID = (25, 409, False)
    INVALID_SESSION_TIMEOUT = (26, 400, False)
    REBALANCE_IN_PROGRESS = (27, 409, False)
    TOPIC_AUTHORIZATION_FAILED = (29, 403, False)
    GROUP_AUTHORIZATION_FAILED = (30, 403, False)
    CLUSTER_AUTHORIZATION_FAILED = (31, 403, False)
    INVALID_TIMESTAMP = (32, 400, False)
    UNSUPPORTED_SASL_MECHANISM = (33, 400, False)
    ILLEGAL_SASL_STATE = (34, 400, False)
    UNSUPPORTED_VERSION = (35, 400, False)
    TOPIC_ALREADY_EXISTS = (36, 409, False)
    INVALID_PARTITIONS = (37, 400, False)
    INVALID_REPLICATION_FACTOR = (38, 400, False)
    INVALID_REPLICA_ASSIGNMENT = (39, 400, False)
    INVALID_CONFIG = (40, 400, False)
    NOT_CONTROLLER = (41, 421, True)
    INVALID_REQUEST = (42, 400, False)
    UNSUPPORTED_FOR_MESSAGE_FORMAT = (43, 400, False)
    POLICY_VIOLATION = (44, 400, False)
    OUT_OF_ORDER_SEQUENCE_NUMBER = (45, 409, False)
    DUPLICATE_SEQUENCE_NUMBER = (46, 409, False)
    INVALID_PRODUCER_EPOCH = (47, 409, False)
    INVALID_TXN_STATE = (48, 409, False)
    INVALID_PRODUCER_ID_MAPPING = (49, 409, False)
    INVALID_TRANSACTION_TIMEOUT = (50, 400, False)
    CONCURRENT_TRANSACTIONS = (51, 409, True)
    TRANSACTION_COORDINATOR_FENCED = (52, 409, False)
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (53, 403, False)
    SECURITY_DISABLED = (54, 400, False)
    OPERATION_NOT_ATTEMPTED = (55, 409, False)
    KAFKA_STORAGE_ERROR = (56, 503, True)
    SASL_AUTHENTICATION_FAILED = (58, 401, False)
    UNKNOWN_PRODUCER_ID = (59, 409, False)
    REASSIGNMENT_IN_PROGRESS = (60, 409, False)
    NON_EMPTY_GROUP = (68, 409, False)
    GROUP_ID_NOT_FOUND = (69, 404, False)
    MEMBER_ID_REQUIRED = (79, 409, False)
    NO_REASSIGNMENT_IN_PROGRESS = (85, 409, False)
    GROUP_SUBSCRIBED_TO_TOPIC = (86, 409, False)
    UNSUPPORTED_COMPRESSION_TYPE = (76, 400, False)
    UNSTABLE_OFFSET_COMMIT = (88, 503, True)
    THROTTLING_QUOTA_EXCEEDED = (89, 429, True)
    PRODUCER_FENCED = (90, 409, False)
    RESOURCE_NOT_FOUND = (91, 404, False)
    UNKNOWN_TOPIC_ID = (100, 404, False)
    DUPLICATE_BROKER_REGISTRATION = (101, 409, False)
    BROKER_ID_NOT_REGISTERED = (102, 404, False)
    TRANSACTIONAL_ID_NOT_FOUND = (105, 404, False)
    TRANSACTION_ABORTABLE = (120, 409, False)
    # Not a Kafka error: a carried marker's reservation was revoked on this partition
    # (docs/carried-markers.md); the producer resends the batch without it, through verification.
    TRANSACTION_RESERVATION_REVOKED = (10_011, 409, True)

    @property
    def code(self) -> int:
        return self.value[0]

    @property
    def http_status(self) -> int:
        return self.value[1]

    @property
    def retriable(self) -> bool:
        return self.value[2]

    @classmethod
    def from_name(cls, name: str) -> ErrorCode:
        try:
            return cls[name]
        except KeyError:
            return cls.UNKNOWN_SERVER_ERROR


class BrokerError(Exception):
    """An error with a Kafka error code; the root of every error txbroker answers.

    ``extra`` carries fields that go into the JSON error body next to
    ``error_code``/``message``/``retriable`` (``leader_url`` for example).
    """

    def __init__(self, error_code: ErrorCode, message: str = "", **extra: Any) -> None:
        super().__init__(f"{error_code.name}: {message}" if message else error_code.name)
        self.error_code = error_code
        self.message = message or error_code.name
        self.extra = extra

    @property
    def retriable(self) -> bool:
        return self.error_code.retriable

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "error_code": self.error_code.name,
            "message": self.message,
            "retriable": self.error_code.retriable,
        }
        body.update(self.extra)
        return body


# --------------------------------------------------------------------------
# Record batches
# --------------------------------------------------------------------------

BATCH_MAGIC = 2
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
ATTR_TRANSACTIONAL = 0x01
ATTR_CONTROL = 0x02

# magic, crc, attributes, producer_id, producer_epoch, base_sequence,
# record_count, first_timestamp, max_timestamp
BATCH_HEADER = struct.Struct(">BIBqhiiqq")
_CRC_START = 5  # bytes before this (magic + crc) are not covered by the CRC
_REC_FIXED = struct.Struct(">qi")  # timestamp, key_len
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_HDR_KEY = struct.Struct(">h")
MAX_INT32 = 2**31 - 1


class ControlType(enum.IntEnum):
    COMMIT = 0
    ABORT = 1


class BatchFormat(enum.Enum):
    """How a batch's bytes are laid out.

    ``TXBROKER``: this module's batch (the HTTP doors and every Python client).
    ``KAFKA``: Kafka's RecordBatch v2 exactly as a Kafka producer sent it
    (``storage.kafka_batch``; only the broker handles these). Either way a
    ``BatchHeader`` reads the same.
    """

    TXBROKER = "txbroker"
    KAFKA = "kafka"


@dataclass(frozen=True, slots=True)
class Record:
    """One record as the producer sent it. ``headers`` values may be None."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp: int = 0


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The parsed fixed header of a record batch.

    ``last_sequence`` wraps at 2**31-1 like Kafka's. A batch with
    ``producer_id == -1`` is a plain (non-idempotent) write.
    """

    crc: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    first_timestamp: int
    max_timestamp: int

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def is_idempotent(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.record_count - 1) % (MAX_INT32 + 1)


def _put_bytes(out: list[bytes], data: bytes | None) -> None:
    if data is None:
        out.append(_I32.pack(-1))
    else:
        out.append(_I32.pack(len(data)))
        out.append(data)


def encode_batch(
    records: Sequence[Record],
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """Encode ``records`` as one batch (with CRC). ``records`` must not be empty."""
    if not records:
        raise ValueError("a batch holds at least one record")
    body: list[bytes] = []
    first_ts = records[0].timestamp
    max_ts = first_ts
    for r in records:
        ts = r.timestamp
        max_ts = max(max_ts, ts)
        body.append(struct.pack(">q", ts))
        _put_bytes(body, r.key)
        _put_bytes(body, r.value)
        body.append(_I16.pack(len(r.headers)))
        for hk, hv in r.headers:
            kb = hk.encode("utf-8")
            body.append(_HDR_KEY.pack(len(kb)))
            body.append(kb)
            _put_bytes(body, hv)
    attributes = (ATTR_TRANSACTIONAL if transactional else 0) | (ATTR_CONTROL if control else 0)
    head = BATCH_HEADER.pack(
        BATCH_MAGIC,
        0,
        attributes,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
        first_ts,
        max_ts,
    )
    buf = bytearray(head)
    buf += b"".join(body)
    struct.pack_into(">I", buf, 1, crc32c.crc32c(memoryview(buf)[_CRC_START:]))
    return bytes(buf)


def encode_control_batch(
    control_type: ControlType,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
) -> bytes:
    """A COMMIT/ABORT marker batch (transactional + control, one record)."""
    key = struct.pack(">hh", 0, int(control_type))
    value = struct.pack(">hi", 0, coordinator_epoch)
    return encode_batch(
        [Record(value=value, key=key, timestamp=timestamp)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        transactional=True,
        control=True,
    )


def parse_batch(data: bytes | bytearray | memoryview, *, verify: bool = True) -> BatchHeader:
    """Parse and validate a batch: magic, CRC and (when ``verify``) the record framing.

    Raises ``BrokerError(CORRUPT_MESSAGE)`` for anything malformed, so hostile
    bytes can never reach the log.
    """
    mv = memoryview(data)
    if len(mv) < BATCH_HEADER.size:
        raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "batch shorter than its header")
    magic, crc, attrs, pid, epoch, seq, count, first_ts, max_ts = BATCH_HEADER.unpack_from(mv, 0)
    if magic != BATCH_MAGIC:
        raise BrokerError(ErrorCode.CORRUPT_MESSAGE, f"unknown batch magic {magic}")
    if crc32c.crc32c(mv[_CRC_START:]) != crc:
        raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "batch CRC mismatch")
    if count < 1:
        raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "batch has no records")
    if attrs & ~(ATTR_TRANSACTIONAL | ATTR_CONTROL):
        raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "unknown batch attributes")
    header = BatchHeader(crc, attrs, pid, epoch, seq, count, first_ts, max_ts)
    if verify:
        end = _walk_records(mv, count)
        if end != len(mv):
            raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "trailing bytes after the last record")
    return header


def _walk_records(mv: memoryview, count: int) -> int:
    """Check the framing of ``count`` records; return the end position."""
    pos = BATCH_HEADER.size
    n = len(mv)
    try:
        for _ in range(count):
            _ts, klen = _REC_FIXED.unpack_from(mv, pos)
            pos += 12
            if klen > 0:
                pos += klen
            elif klen < -1:
                raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "negative key length")
            (vlen,) = _I32.unpack_from(mv, pos)
            pos += 4
            if vlen > 0:
                pos += vlen
            elif vlen < -1:
                raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "negative value length")
            (hcount,) = _I16.unpack_from(mv, pos)
            pos += 2
            if hcount < 0:
                raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "negative header count")
            for _h in range(hcount):
                (hklen,) = _HDR_KEY.unpack_from(mv, pos)
                if hklen < 0:
                    raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "negative header key length")
                pos += 2
                try:
                    bytes(mv[pos : pos + hklen]).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "header key is not UTF-8") from exc
                pos += hklen
                (hvlen,) = _I32.unpack_from(mv, pos)
                pos += 4
                if hvlen > 0:
                    pos += hvlen
                elif hvlen < -1:
                    raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "negative header value length")
            if pos > n:
                raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "record runs past the batch end")
    except struct.error as exc:
        raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "truncated record") from exc
    return pos


def _get_bytes(mv: memoryview, pos: int) -> tuple[bytes | None, int]:
    (n,) = _I32.unpack_from(mv, pos)
    pos += 4
    if n < 0:
        return None, pos
    return bytes(mv[pos : pos + n]), pos + n


def decode_records(data: bytes | bytearray | memoryview) -> Iterator[Record]:
    """Yield the records of a batch whose framing was already validated."""
    mv = memoryview(data)
    (count,) = _I32.unpack_from(mv, 20)
    pos = BATCH_HEADER.size
    for _ in range(count):
        (ts,) = struct.unpack_from(">q", mv, pos)
        key, pos = _get_bytes(mv, pos + 8)
        value, pos = _get_bytes(mv, pos)
        (hcount,) = _I16.unpack_from(mv, pos)
        pos += 2
        headers: list[tuple[str, bytes | None]] = []
        for _h in range(hcount):
            (hklen,) = _HDR_KEY.unpack_from(mv, pos)
            pos += 2
            hk = bytes(mv[pos : pos + hklen]).decode("utf-8")
            pos += hklen
            hv, pos = _get_bytes(mv, pos)
            headers.append((hk, hv))
        yield Record(value=value, key=key, headers=tuple(headers), timestamp=ts)


def control_type_of(data: bytes | bytearray | memoryview) -> ControlType | None:
    """The marker type of a control batch, or None for an unknown type (ignored, as Kafka does)."""
    rec = next(decode_records(data))
    if rec.key is None or len(rec.key) < 4:
        return None
    _version, ctype = struct.unpack_from(">hh", rec.key, 0)
    try:
        return ControlType(ctype)
    except ValueError:
        return None


# --------------------------------------------------------------------------
# Binary produce request / fetch response (the Python client's fast path)
# --------------------------------------------------------------------------

PRODUCE_CONTENT_TYPE = "application/x-txbroker-produce"
BATCHES_CONTENT_TYPE = "application/x-txbroker-batches"
_PRODUCE_MAGIC = b"TXP1"
# TXP2: each partition's batch is followed by i16 token_len (-1 = none) and the token (carried markers).
_PRODUCE_MAGIC_TOKENS = b"TXP2"
_PRODUCE_HEAD = struct.Struct(">4siih")  # magic, timeout_ms, acks, txn_id_len (-1 = null)
_PART_HEAD = struct.Struct(">hii")  # topic_len (then topic), partition, batch_len
_MAX_TOKEN_BYTES = 256


def encode_token(raw: bytes) -> str:
    """A carried marker's token or receipt as JSON carries it: URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_token(text: str, what: str) -> bytes:
    """Inverse of ``encode_token``; ``INVALID_REQUEST`` naming ``what`` if ``text`` is not URL-safe base64."""
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"{what} is not URL-safe base64") from exc


@dataclass(frozen=True, slots=True)
class ProducePartition:
    """``txn_token``: a carried marker's token for a transactional batch (docs/carried-markers.md).

    ``format``: the layout of ``batch``. The binary produce form carries txbroker batches only; a
    Kafka-format batch comes from the broker's Kafka listener.
    """

    topic: str
    partition: int
    batch: bytes
    txn_token: bytes | None = None
    format: BatchFormat = BatchFormat.TXBROKER


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    """A produce request: one batch per (topic, partition). ``acks``: -1 (all) or 0."""

    partitions: tuple[ProducePartition, ...]
    acks: int = -1
    timeout_ms: int = 30000
    transactional_id: str | None = None


def encode_produce_request(req: ProduceRequest) -> bytes:
    """The binary form: TXP1, or TXP2 when a partition carries a token (brokers read both)."""
    out: list[bytes] = []
    tid = req.transactional_id.encode("utf-8") if req.transactional_id is not None else None
    tokens = any(p.txn_token is not None for p in req.partitions)
    magic = _PRODUCE_MAGIC_TOKENS if tokens else _PRODUCE_MAGIC
    out.append(_PRODUCE_HEAD.pack(magic, req.timeout_ms, req.acks, -1 if tid is None else len(tid)))
    if tid is not None:
        out.append(tid)
    out.append(_I32.pack(len(req.partitions)))
    for p in req.partitions:
        if p.format is not BatchFormat.TXBROKER:
            raise ValueError(f"the binary produce form carries txbroker batches, not {p.format.value} ones")
        tb = p.topic.encode("utf-8")
        out.append(_I16.pack(len(tb)))
        out.append(tb)
        out.append(struct.pack(">ii", p.partition, len(p.batch)))
        out.append(p.batch)
        if tokens:
            out.append(_I16.pack(-1 if p.txn_token is None else len(p.txn_token)))
            out.append(p.txn_token or b"")
    return b"".join(out)


def decode_produce_request(data: bytes) -> ProduceRequest:
    """Decode the binary produce form. Raises ``BrokerError(INVALID_REQUEST)`` on bad framing.

    Batches are sliced, not validated: the broker validates each batch with
    ``parse_batch`` before it proposes it.
    """
    mv = memoryview(data)
    try:
        magic, timeout_ms, acks, tlen = _PRODUCE_HEAD.unpack_from(mv, 0)
        if magic not in (_PRODUCE_MAGIC, _PRODUCE_MAGIC_TOKENS):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "not a txbroker binary produce request")
        with_tokens = magic == _PRODUCE_MAGIC_TOKENS
        pos = _PRODUCE_HEAD.size
        tid: str | None = None
        if tlen >= 0:
            tid = bytes(mv[pos : pos + tlen]).decode("utf-8")
            pos += tlen
        elif tlen != -1:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "bad transactional id length")
        (count,) = _I32.unpack_from(mv, pos)
        pos += 4
        if count < 0 or count > 100_000:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "bad partition count")
        parts: list[ProducePartition] = []
        for _ in range(count):
            (tl,) = _I16.unpack_from(mv, pos)
            pos += 2
            if tl <= 0:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "bad topic length")
            topic = bytes(mv[pos : pos + tl]).decode("utf-8")
            pos += tl
            partition, blen = struct.unpack_from(">ii", mv, pos)
            pos += 8
            if blen < 0 or pos + blen > len(mv):
                raise BrokerError(ErrorCode.INVALID_REQUEST, "batch runs past the request end")
            batch = bytes(mv[pos : pos + blen])
            pos += blen
            token: bytes | None = None
            if with_tokens:
                (klen,) = _I16.unpack_from(mv, pos)
                pos += 2
                if klen > _MAX_TOKEN_BYTES or klen < -1 or pos + max(klen, 0) > len(mv):
                    raise BrokerError(ErrorCode.INVALID_REQUEST, "bad transaction token length")
                if klen >= 0:
                    token = bytes(mv[pos : pos + klen])
                    pos += klen
            parts.append(ProducePartition(topic, partition, batch, token))
        if pos != len(mv):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "trailing bytes in produce request")
    except (struct.error, UnicodeDecodeError) as exc:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "malformed binary produce request") from exc
    return ProduceRequest(tuple(parts), acks=acks, timeout_ms=timeout_ms, transactional_id=tid)


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A batch as the log holds it: the producer's bytes plus what the leader assigned.

    ``format`` says how ``data`` is laid out; ``header`` reads the same for both (``BatchFormat``).
    A fetch response of the binary form carries txbroker batches only.
    """

    base_offset: int
    log_append_time: int
    data: bytes
    header: BatchHeader = field(compare=False)
    format: BatchFormat = BatchFormat.TXBROKER

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.header.record_count - 1


_FETCH_HEAD = struct.Struct(">4sqqqi")  # magic, high_watermark, last_stable_offset, log_start_offset, n
_FETCH_MAGIC = b"TXF1"
_ENTRY_HEAD = struct.Struct(">qqi")  # base_offset, log_append_time, batch_len


def encode_fetch_batches(
    high_watermark: int,
    last_stable_offset: int,
    log_start_offset: int,
    batches: Sequence[tuple[int, int, bytes]],
    aborted: Sequence[tuple[int, int]] = (),
) -> bytes:
    """Binary fetch response: header, ``(base_offset, append_time, batch)``s, aborted txns."""
    out = [_FETCH_HEAD.pack(_FETCH_MAGIC, high_watermark, last_stable_offset, log_start_offset, len(batches))]
    for base, append_time, data in batches:
        out.append(_ENTRY_HEAD.pack(base, append_time, len(data)))
        out.append(data)
    out.append(_I32.pack(len(aborted)))
    for pid, first in aborted:
        out.append(struct.pack(">qq", pid, first))
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class FetchBatches:
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    batches: tuple[StoredBatch, ...]
    aborted_transactions: tuple[tuple[int, int], ...]


def decode_fetch_batches(data: bytes) -> FetchBatches:
    mv = memoryview(data)
    try:
        magic, hw, lso, lstart, n = _FETCH_HEAD.unpack_from(mv, 0)
        if magic != _FETCH_MAGIC:
            raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "not a txbroker fetch response")
        pos = _FETCH_HEAD.size
        batches: list[StoredBatch] = []
        for _ in range(n):
            base, append_time, blen = _ENTRY_HEAD.unpack_from(mv, pos)
            pos += _ENTRY_HEAD.size
            raw = bytes(mv[pos : pos + blen])
            pos += blen
            batches.append(StoredBatch(base, append_time, raw, parse_batch(raw, verify=False)))
        (na,) = _I32.unpack_from(mv, pos)
        pos += 4
        aborted = []
        for _ in range(na):
            aborted.append(struct.unpack_from(">qq", mv, pos))
            pos += 16
    except struct.error as exc:
        raise BrokerError(ErrorCode.CORRUPT_MESSAGE, "truncated fetch response") from exc
    return FetchBatches(hw, lso, lstart, tuple(batches), tuple((int(a), int(b)) for a, b in aborted))
