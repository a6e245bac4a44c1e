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

Type bytes 0x04.. are reserved for the transactions work (markers).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from clients.protocol import BrokerError, ErrorCode

__all__ = [
    "AppendCommand",
    "AppendResult",
    "CommandType",
    "DeleteRecordsCommand",
    "NoopCommand",
    "RetentionCommand",
    "RetentionResult",
    "decode_command",
    "encode_append",
    "encode_delete_records",
    "encode_retention",
]


class CommandType(enum.IntEnum):
    """First byte of a command. Persisted in the Raft log: values never change."""

    NOOP = 0x00
    APPEND = 0x01
    RETENTION = 0x02
    DELETE_RECORDS = 0x03


_I64 = struct.Struct(">q")
_RETENTION = struct.Struct(">qqqq")


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
class NoopCommand:
    """The Raft barrier a new leader commits before serving."""


@dataclass(frozen=True, slots=True)
class AppendCommand:
    """Append one record batch; ``batch`` is a view into the command bytes (no copy)."""

    log_append_time: int
    batch: memoryview


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


Command = NoopCommand | AppendCommand | RetentionCommand | DeleteRecordsCommand


def encode_append(batch: bytes, timestamp_ms: int) -> bytes:
    """APPEND ``batch`` with ``timestamp_ms`` (the leader's clock) as its log append time."""
    return b"".join((bytes((CommandType.APPEND,)), _I64.pack(timestamp_ms), batch))


def encode_retention(now_ms: int, retention_ms: int, retention_bytes: int, producer_expiration_ms: int) -> bytes:
    """RETENTION as of ``now_ms`` (the leader's clock)."""
    return bytes((CommandType.RETENTION,)) + _RETENTION.pack(
        now_ms, retention_ms, retention_bytes, producer_expiration_ms
    )


def encode_delete_records(before_offset: int) -> bytes:
    """DELETE_RECORDS: make ``before_offset`` the log start offset (-1 = the high watermark)."""
    return bytes((CommandType.DELETE_RECORDS,)) + _I64.pack(before_offset)


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
        if kind == CommandType.RETENTION:
            if len(mv) != 1 + _RETENTION.size:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "bad RETENTION command length")
            return RetentionCommand(*_RETENTION.unpack_from(mv, 1))
        if kind == CommandType.DELETE_RECORDS:
            if len(mv) != 1 + _I64.size:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "bad DELETE_RECORDS command length")
            return DeleteRecordsCommand(_I64.unpack_from(mv, 1)[0])
    except struct.error as exc:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"truncated command of type {kind}") from exc
    raise BrokerError(ErrorCode.INVALID_REQUEST, f"unknown command type {kind:#04x}")
