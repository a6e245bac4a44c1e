"""The coordinator's byte formats: checksummed, versioned JSON records, and strict field readers.

A *record* is ``version u8 | crc32c u32 | body`` where ``body`` is compact
UTF-8 JSON and the CRC covers the body. JSON keeps the formats readable in a
RocksDB dump and free of pickle; the CRC catches torn or flipped bytes, which
surface as ``CoordinatorCorruptionError`` naming where they were found.

The field readers check types strictly (``True`` is not an int here), so a
malformed command is refused as a whole instead of half-applied.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import crc32c

from coordinator.errors import CommandDecodeError, CoordinatorCorruptionError

__all__ = [
    "RECORD_HEAD",
    "decode_record",
    "encode_record",
    "get_bool",
    "get_int",
    "get_opt_int",
    "get_opt_str",
    "get_str",
    "json_bytes",
]

RECORD_HEAD = struct.Struct(">BI")  # version, crc32c(body)


def json_bytes(obj: object) -> bytes:
    """Deterministic compact JSON (sorted keys), so equal values encode to equal bytes."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def encode_record(body: Mapping[str, Any], version: int) -> bytes:
    raw = json_bytes(body)
    return RECORD_HEAD.pack(version, crc32c.crc32c(raw)) + raw


def decode_record(raw: bytes, *, version: int, where: str) -> dict[str, Any]:
    """The JSON object of a record written by ``encode_record``; raises ``CoordinatorCorruptionError``."""
    if len(raw) < RECORD_HEAD.size:
        raise CoordinatorCorruptionError(f"{where}: truncated ({len(raw)} bytes)")
    got_version, crc = RECORD_HEAD.unpack_from(raw, 0)
    body = raw[RECORD_HEAD.size :]
    if got_version != version:
        raise CoordinatorCorruptionError(f"{where}: unknown format version {got_version}")
    if crc32c.crc32c(body) != crc:
        raise CoordinatorCorruptionError(f"{where}: checksum mismatch")
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise CoordinatorCorruptionError(f"{where}: unreadable JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise CoordinatorCorruptionError(f"{where}: not a JSON object")
    return obj


def _missing(d: Mapping[str, Any], key: str, what: str) -> CommandDecodeError:
    if key not in d:
        return CommandDecodeError(f"field {key!r} is missing")
    return CommandDecodeError(f"field {key!r} must be {what}, got {type(d[key]).__name__}")


def get_int(d: Mapping[str, Any], key: str) -> int:
    v = d.get(key)
    if type(v) is not int:
        raise _missing(d, key, "an integer")
    return v


def get_opt_int(d: Mapping[str, Any], key: str) -> int | None:
    return None if d.get(key) is None else get_int(d, key)


def get_str(d: Mapping[str, Any], key: str) -> str:
    v = d.get(key)
    if type(v) is not str:
        raise _missing(d, key, "a string")
    try:
        v.encode()
    except UnicodeEncodeError as exc:  # JSON can carry lone surrogates; ids become UTF-8 keys
        raise CommandDecodeError(f"field {key!r} is not valid Unicode") from exc
    return v


def get_opt_str(d: Mapping[str, Any], key: str) -> str | None:
    return None if d.get(key) is None else get_str(d, key)


def get_bool(d: Mapping[str, Any], key: str) -> bool:
    v = d.get(key)
    if type(v) is not bool:
        raise _missing(d, key, "a boolean")
    return v
