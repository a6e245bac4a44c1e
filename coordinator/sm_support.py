"""What the coordinators' Raft state machines share: the apply envelope and the snapshot frame.

Both ``TransactionStateMachine`` and ``OffsetsStateMachine`` replicate JSON
commands that carry the proposer's coordinator epoch (its Raft term), persist
the last applied index in the same WriteBatch as the change (DESIGN.md rule 3)
and never raise from ``apply`` (a raise wedges the group on every replica).
Their snapshots are ``magic | version | last_applied | coordinator epoch |
count | entries | crc32c``; only the entries differ.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Any, Protocol

import crc32c

from clients.protocol import BrokerError, ErrorCode
from coordinator.errors import CommandDecodeError, CoordinatorCorruptionError
from raft.state_machine import NOOP_COMMAND

log = logging.getLogger(__name__)

SNAPSHOT_HEAD = struct.Struct(">4sBqqI")  # magic, version, last_applied, coordinator epoch, entry count
_CRC = struct.Struct(">I")


class EpochCommand(Protocol):
    @property
    def coordinator_epoch(self) -> int: ...


def guarded_apply(
    name: str,
    index: int,
    command: bytes,
    *,
    last_applied: int,
    coordinator_epoch: int,
    decode: Callable[[bytes], EpochCommand],
    record: Callable[[int], None],
    run: Callable[[int, Any], Any],
) -> Any:
    """Apply ``command`` at ``index``: skip replays, record barriers, fence stale epochs, never raise.

    ``record(index)`` persists the index with nothing else changed (a barrier, a
    rejected command, a failed apply); ``run(index, cmd)`` applies a decoded
    command from a current coordinator and returns its result.
    """
    if index <= last_applied:
        return None
    try:
        if command[:1] == NOOP_COMMAND:
            record(index)
            return None
        try:
            cmd = decode(command)
        except CommandDecodeError as exc:
            record(index)
            return BrokerError(ErrorCode.INVALID_REQUEST, f"{name}: {exc}")
        if cmd.coordinator_epoch < coordinator_epoch:
            record(index)
            return BrokerError(
                ErrorCode.NOT_COORDINATOR,
                f"{name}: coordinator epoch {cmd.coordinator_epoch} is older than {coordinator_epoch}",
            )
        return run(index, cmd)
    except Exception as exc:  # a raise here would wedge the group on every replica
        log.exception("%s: apply failed at index %d", name, index)
        try:
            record(index)
        except Exception:
            log.exception("%s: could not record index %d", name, index)
        return BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{name}: apply failed: {exc}")


def seal_snapshot(magic: bytes, version: int, last_applied: int, coordinator_epoch: int, entries: list[bytes]) -> bytes:
    """The snapshot bytes: header, the already-encoded ``entries``, crc32c of all of it."""
    body = b"".join([SNAPSHOT_HEAD.pack(magic, version, last_applied, coordinator_epoch, len(entries)), *entries])
    return body + _CRC.pack(crc32c.crc32c(body))


def open_snapshot(raw: bytes, magic: bytes, version: int, where: str) -> tuple[bytes, int, int]:
    """Check a sealed snapshot; ``(body, coordinator_epoch, entry count)``, entries from ``SNAPSHOT_HEAD.size``."""
    if len(raw) < SNAPSHOT_HEAD.size + _CRC.size:
        raise CoordinatorCorruptionError(f"{where}: truncated")
    body, (crc,) = raw[: -_CRC.size], _CRC.unpack(raw[-_CRC.size :])
    if crc32c.crc32c(body) != crc:
        raise CoordinatorCorruptionError(f"{where}: checksum mismatch")
    found, found_version, _snap_applied, cepoch, count = SNAPSHOT_HEAD.unpack_from(body, 0)
    if found != magic or found_version != version:
        raise CoordinatorCorruptionError(f"{where}: not a {magic.decode()} snapshot (version {found_version})")
    return body, cepoch, count
