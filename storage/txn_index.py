"""The aborted-transaction index of a partition (Kafka's ``TransactionIndex``, kafka_txn.md §7.3).

Terms:

* **AbortedTxn**: one aborted transaction that wrote data here: its producer
  id, the offset of its first batch (``first_offset``), the offset of its
  ABORT marker (``last_offset``) and the partition's last stable offset just
  after the marker was applied (``last_stable_offset``).
* Entries are keyed by ``last_offset`` (u64 big-endian after the tag), so key
  order is marker order and last offsets are strictly increasing by
  construction: each marker takes the next offset of the log.

``collect_aborted`` answers what a read_committed fetch needs: every entry
with ``last_offset >= fetch_offset`` and ``first_offset < upper_bound``. It
stops early at the first entry whose ``last_stable_offset >= upper_bound``:
every later entry belongs to a transaction that was still open when that one
ended (so it started at or after that LSO) or started after it, so none of
them can start below ``upper_bound``.

Encoding of one entry (the value; CRC-32C over everything before it)::

    version u8 (1) | producer_id i64 | first_offset i64 | last_offset i64
    | last_stable_offset i64 | crc u32

Pure; safe from any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

import crc32c

from storage.errors import StorageCorruptionError

__all__ = [
    "AbortedTxn",
    "collect_aborted",
    "decode_aborted_txn",
    "encode_aborted_txn",
    "next_aborted_txn",
]

ABORTED_VERSION = 1
_ENTRY = struct.Struct(">Bqqqq")
_CRC = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One aborted transaction of a partition (see the module docstring)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def next_aborted_txn(previous_last_offset: int | None, entry: AbortedTxn) -> AbortedTxn:
    """``entry`` if it may follow an index whose newest entry ends at ``previous_last_offset``.

    Raises ``ValueError`` when ``last_offset`` does not strictly increase or the
    entry's offsets are out of order (Kafka's ``testLastOffsetMustIncrease``).
    """
    if previous_last_offset is not None and entry.last_offset <= previous_last_offset:
        raise ValueError(f"aborted txn last offset {entry.last_offset} does not follow {previous_last_offset}")
    if not 0 <= entry.first_offset <= entry.last_offset or entry.last_stable_offset > entry.last_offset + 1:
        raise ValueError(f"inconsistent aborted txn {entry}")
    return entry


def encode_aborted_txn(entry: AbortedTxn) -> bytes:
    body = _ENTRY.pack(
        ABORTED_VERSION, entry.producer_id, entry.first_offset, entry.last_offset, entry.last_stable_offset
    )
    return body + _CRC.pack(crc32c.crc32c(body))


def decode_aborted_txn(data: bytes, *, last_offset: int, where: str) -> AbortedTxn:
    """Check and decode an entry whose key says ``last_offset``; raises ``StorageCorruptionError``."""
    if len(data) != _ENTRY.size + _CRC.size:
        raise StorageCorruptionError(f"{where}: aborted txn entry has {len(data)} bytes")
    (crc,) = _CRC.unpack_from(data, _ENTRY.size)
    if crc32c.crc32c(data[: _ENTRY.size]) != crc:
        raise StorageCorruptionError(f"{where}: aborted txn entry CRC mismatch")
    version, pid, first, last, lso = _ENTRY.unpack_from(data, 0)
    if version != ABORTED_VERSION:
        raise StorageCorruptionError(f"{where}: unknown aborted txn entry version {version}")
    if last != last_offset:
        raise StorageCorruptionError(f"{where}: entry says last offset {last}, key says {last_offset}")
    entry = AbortedTxn(pid, first, last, lso)
    if pid < 0 or not 0 <= first <= last or lso > last + 1:
        raise StorageCorruptionError(f"{where}: inconsistent aborted txn {entry}")
    return entry


def collect_aborted(entries: Iterable[AbortedTxn], fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
    """Entries overlapping ``[fetch_offset, upper_bound)``.

    ``entries`` must be in ``last_offset`` order and may start anywhere at or
    before the first entry with ``last_offset >= fetch_offset``; iteration
    stops early (see the module docstring), so a lazy iterator is read only as
    far as needed.
    """
    out: list[AbortedTxn] = []
    for entry in entries:
        if entry.last_offset < fetch_offset:
            continue
        if entry.first_offset < upper_bound:
            out.append(entry)
        if entry.last_stable_offset >= upper_bound:
            break
    return out
