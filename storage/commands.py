"""Commands a data partition's Raft group replicates, and what applying them returns.

A command is bytes; the first byte is its type. ``0x00`` is the Raft NOOP
barrier (``raft.state_machine.NOOP_COMMAND``). Every time value a command needs
is inside it, taken from the *leader's* clock when the leader built it, so
``apply`` is deterministic on every replica (DESIGN.md rule 1).

Layouts (big-endian)::

    APPEND          0x01 | log_append_time i64 | record batch (as the producer sent it)
    RETENTION       0x02 | now_ms i64 | retention_ms i64 | retention_bytes i64
                         | producer_expiration_ms i64
    DELETE_RECORDS  0x03 | before_offset i64   (-1 = the high watermark)
    TXN_MARKER      0x04 | producer_id i64 | producer_epoch i16 | coordinator_epoch i32
                         | control_type u8 (COMMIT 0, ABORT 1; bit 0x80: classic) | timestamp_ms i64
    CARRIED_APPEND  0x05 | the TXN_MARKER fields | record batch
    REVOKE_MARKER   0x06 | the TXN_MARKER fields
    KAFKA_APPEND    0x07 | log_append_time i64 | Kafka record batch v2 (as the producer sent it)

TXN_MARKER is Kafka's WriteTxnMarkers for one partition: it closes the
producer's open transaction here with a COMMIT/ABORT control batch.
CARRIED_APPEND is a marker and the producer's next transactional batch in one
entry (its ``timestamp_ms`` is also the batch's log append time); REVOKE_MARKER
is a marker that also revokes the reservation of its epoch here
(docs/carried-markers.md). APPEND carries a txbroker batch
(``clients.protocol``), KAFKA_APPEND a Kafka producer's batch
(``storage.kafka_batch``); both decode to ``AppendCommand``, whose ``format``
tells them apart. A carried marker travels with txbroker batches only.

A *classic* marker (bit 0x80 of the control type byte; Kafka's WriteTxnMarkers
with transaction version 1) ends a transaction of the classic protocol, whose
coordinator does not bump the epoch at EndTxn: its epoch may equal the one of
the open transaction it closes (``storage.producer_state``, "Markers").
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from clients.protocol import BatchFormat, BrokerError, ControlType, ErrorCode

__all__ = [
    "AppendCommand",
    "AppendResult",
    "CarriedAppendCommand",
    "CommandType",
    "DeleteRecordsCommand",
    "NoopCommand",
    "RetentionCommand",
    "RetentionResult",
    "RevokeMarkerCommand",
    "RevokeResult",
    "TxnMarkerCommand",
    "TxnMarkerResult",
    "decode_command",
    "encode_append",
    "encode_carried_append",
    "encode_delete_records",
    "encode_retention",
    "encode_revoke_marker",
    "encode_txn_marker",
]


class CommandType(enum.IntEnum):
    """First byte of a command. Persisted in the Raft log: values never change."""

    NOOP = 0x00
    APPEND = 0x01
    RETENTION = 0x02
    DELETE_RECORDS = 0x03
    TXN_MARKER = 0x04
    CARRIED_APPEND = 0x05
    REVOKE_MARKER = 0x06
    KAFKA_APPEND = 0x07


_I64 = struct.Struct(">q")
_RETENTION = struct.Struct(">qqqq")
_TXN_MARKER = struct.Struct(">qhiBq")
_MAX_EPOCH = 2**15 - 1
_MAX_COORDINATOR_EPOCH = 2**31 - 1
_CLASSIC = 0x80


@dataclass(frozen=True, slots=True)
class AppendResult:
    """A batch in the log: offsets assigned at apply, or the original ones for a duplicate."""

    base_offset: int
    last_offset: int
    log_append_time: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class RetentionResult:
    """Outcome of a RETENTION or DELETE_RECORDS command.

    ``expired_producers`` counts producer entries removed for being idle past
    ``producer_expiration_ms`` (always 0 for DELETE_RECORDS).
    """

    log_start_offset: int
    deleted_batches: int
    deleted_bytes: int
    expired_producers: int = 0


@dataclass(frozen=True, slots=True)
class TxnMarkerResult:
    """Outcome of an applied TXN_MARKER.

    ``offset`` is where the control batch landed, or None when the producer
    had no open transaction on this partition (a retried or redundant marker:
    nothing was appended, the epochs were still recorded).
    ``txn_first_offset`` is the first offset of the transaction it closed.
    """

    control_type: ControlType
    offset: int | None
    txn_first_offset: int | None
    log_append_time: int


@dataclass(frozen=True, slots=True)
class RevokeResult:
    """Outcome of an applied REVOKE_MARKER.

    ``used``: the producer's transaction of the marker's epoch is already open
    here (a carried marker or a verified batch opened it), so nothing was
    written and the partition belongs to that transaction. Otherwise
    ``marker`` is what the marker did, and the reservation is revoked.
    """

    used: bool
    marker: TxnMarkerResult | None


@dataclass(frozen=True, slots=True)
class NoopCommand:
    """The Raft barrier a new leader commits before serving."""


@dataclass(frozen=True, slots=True)
class AppendCommand:
    """Append one record batch of ``format``; ``batch`` is a view into the command bytes (no copy)."""

    log_append_time: int
    batch: memoryview
    format: BatchFormat = BatchFormat.TXBROKER


@dataclass(frozen=True, slots=True)
class RetentionCommand:
    """Apply retention as of ``now_ms``; -1 disables a rule (Kafka's convention)."""

    now_ms: int
    retention_ms: int
    retention_bytes: int
    producer_expiration_ms: int


@dataclass(frozen=True, slots=True)
class DeleteRecordsCommand:
    """Kafka DeleteRecords: advance the log start offset to ``before_offset`` (-1 = HW)."""

    before_offset: int


@dataclass(frozen=True, slots=True)
class TxnMarkerCommand:
    """Kafka's WriteTxnMarkers entry for this partition (kafka_txn.md §4.3, §7.1)."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    control_type: ControlType
    timestamp_ms: int
    classic: bool = False


@dataclass(frozen=True, slots=True)
class CarriedAppendCommand:
    """A marker and the same producer's first batch of its next transaction (epoch = the marker's)."""

    marker: TxnMarkerCommand
    batch: memoryview


@dataclass(frozen=True, slots=True)
class RevokeMarkerCommand:
    """A marker that also revokes the reservation of its epoch (unless that transaction is open here)."""

    marker: TxnMarkerCommand


Command = (
    NoopCommand
    | AppendCommand
    | RetentionCommand
    | DeleteRecordsCommand
    | TxnMarkerCommand
    | CarriedAppendCommand
    | RevokeMarkerCommand
)


_APPEND_TYPES = {BatchFormat.TXBROKER: CommandType.APPEND, BatchFormat.KAFKA: CommandType.KAFKA_APPEND}


def encode_append(batch: bytes, timestamp_ms: int, batch_format: BatchFormat = BatchFormat.TXBROKER) -> bytes:
    """APPEND (KAFKA_APPEND for a Kafka batch) ``batch`` with ``timestamp_ms`` (the leader's clock) as its
    log append time."""
    return b"".join((bytes((_APPEND_TYPES[batch_format],)), _I64.pack(timestamp_ms), batch))


def encode_retention(now_ms: int, retention_ms: int, retention_bytes: int, producer_expiration_ms: int) -> bytes:
    """RETENTION as of ``now_ms`` (the leader's clock)."""
    return bytes((CommandType.RETENTION,)) + _RETENTION.pack(
        now_ms, retention_ms, retention_bytes, producer_expiration_ms
    )


def encode_delete_records(before_offset: int) -> bytes:
    """DELETE_RECORDS: make ``before_offset`` the log start offset (-1 = the high watermark)."""
    return bytes((CommandType.DELETE_RECORDS,)) + _I64.pack(before_offset)


def encode_txn_marker(
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    control_type: ControlType,
    timestamp_ms: int,
    classic: bool = False,
) -> bytes:
    """TXN_MARKER: end ``producer_id``'s transaction here; ``timestamp_ms`` is the leader's clock.

    ``classic``: the marker of a classic-protocol transaction (its epoch may be the transaction's own).
    Raises ``ValueError`` for fields no partition could accept (the caller's bug).
    """
    cmd = TxnMarkerCommand(
        producer_id, producer_epoch, coordinator_epoch, ControlType(control_type), timestamp_ms, classic
    )
    return _encode_marker(CommandType.TXN_MARKER, cmd)


def encode_carried_append(marker: TxnMarkerCommand, batch: bytes) -> bytes:
    """CARRIED_APPEND: ``marker``, then ``batch`` with the marker's timestamp as its log append time.

    Raises ``ValueError`` for marker fields no partition could accept (the caller's bug).
    """
    return _encode_marker(CommandType.CARRIED_APPEND, marker) + batch


def encode_revoke_marker(marker: TxnMarkerCommand) -> bytes:
    """REVOKE_MARKER: ``marker``, revoking the reservation of its epoch here."""
    return _encode_marker(CommandType.REVOKE_MARKER, marker)


def _encode_marker(kind: CommandType, cmd: TxnMarkerCommand) -> bytes:
    problem = _marker_problem(cmd)
    if problem is not None:
        raise ValueError(problem)
    if cmd.classic and kind is not CommandType.TXN_MARKER:
        raise ValueError("only a TXN_MARKER may be classic (carried markers are TV2's)")
    control = int(cmd.control_type) | (_CLASSIC if cmd.classic else 0)
    return bytes((kind,)) + _TXN_MARKER.pack(
        cmd.producer_id, cmd.producer_epoch, cmd.coordinator_epoch, control, cmd.timestamp_ms
    )


def _marker_problem(cmd: TxnMarkerCommand) -> str | None:
    if cmd.producer_id < 0:
        return f"bad producer id {cmd.producer_id}"
    if not 0 <= cmd.producer_epoch <= _MAX_EPOCH:
        return f"bad producer epoch {cmd.producer_epoch}"
    if not 0 <= cmd.coordinator_epoch <= _MAX_COORDINATOR_EPOCH:
        return f"bad coordinator epoch {cmd.coordinator_epoch}"
    return None


def _decode_txn_marker(mv: memoryview, *, exact: bool = True, classic_allowed: bool = False) -> TxnMarkerCommand:
    if len(mv) < 1 + _TXN_MARKER.size or (exact and len(mv) != 1 + _TXN_MARKER.size):
        raise BrokerError(ErrorCode.INVALID_REQUEST, "bad TXN_MARKER command length")
    pid, epoch, coordinator_epoch, ctype, ts = _TXN_MARKER.unpack_from(mv, 1)
    classic = bool(ctype & _CLASSIC)
    if classic and not classic_allowed:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "only a TXN_MARKER may be classic")
    try:
        control_type = ControlType(ctype & ~_CLASSIC)
    except ValueError as exc:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"unknown control type {ctype}") from exc
    cmd = TxnMarkerCommand(pid, epoch, coordinator_epoch, control_type, ts, classic)
    problem = _marker_problem(cmd)
    if problem is not None:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"TXN_MARKER: {problem}")
    return cmd


def decode_command(command: bytes) -> Command:
    """Decode a command. Raises ``BrokerError(INVALID_REQUEST)`` for anything malformed."""
    if not command:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "empty command")
    kind = command[0]
    mv = memoryview(command)
    try:
        if kind == CommandType.NOOP:
            return NoopCommand()
        if kind == CommandType.APPEND:
            (ts,) = _I64.unpack_from(mv, 1)
            return AppendCommand(ts, mv[1 + _I64.size :])
        if kind == CommandType.KAFKA_APPEND:
            (ts,) = _I64.unpack_from(mv, 1)
            return AppendCommand(ts, mv[1 + _I64.size :], BatchFormat.KAFKA)
        if kind == CommandType.RETENTION:
            if len(mv) != 1 + _RETENTION.size:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "bad RETENTION command length")
            return RetentionCommand(*_RETENTION.unpack_from(mv, 1))
        if kind == CommandType.DELETE_RECORDS:
            if len(mv) != 1 + _I64.size:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "bad DELETE_RECORDS command length")
            return DeleteRecordsCommand(_I64.unpack_from(mv, 1)[0])
        if kind == CommandType.TXN_MARKER:
            return _decode_txn_marker(mv, classic_allowed=True)
        if kind == CommandType.CARRIED_APPEND:
            return CarriedAppendCommand(_decode_txn_marker(mv, exact=False), mv[1 + _TXN_MARKER.size :])
        if kind == CommandType.REVOKE_MARKER:
            return RevokeMarkerCommand(_decode_txn_marker(mv))
    except struct.error as exc:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"truncated command of type {kind}") from exc
    raise BrokerError(ErrorCode.INVALID_REQUEST, f"unknown command type {kind:#04x}")
