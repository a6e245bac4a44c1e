"""The snapshot stream of a partition log: every key under its prefix, written out and restored.

Layout::

    b"TXPL" | version u8 | last_applied i64
    (key_len u32 | value_len u32 | key | value)*
    0xFFFFFFFF

Keys are stored without the partition's prefix, so a snapshot restores under
any prefix. A restore first marks the partition (``RESTORE_TAG``) and clears
it, and removes the mark in the WriteBatch that writes the meta: a partition
whose restore was interrupted still carries the mark, and loading it fails
(``PartitionLog``). These functions touch only RocksDB; the caller resets and
reloads its in-memory state.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import BinaryIO

from storage.errors import StorageCorruptionError
from storage.log_format import (
    ABORTED_TAG,
    BATCH_TAG,
    META_TAG,
    PRODUCER_TAG,
    LogMeta,
    PartitionKeys,
    decode_meta,
    encode_meta,
)
from storage.producer_state import decode_entry
from storage.store import NodeStore

__all__ = ["check_snapshot_header", "consistent_snapshot", "restore_snapshot", "write_snapshot"]

_SNAPSHOT_MAGIC = b"TXPL"
_SNAPSHOT_VERSION = 1
_SNAPSHOT_HEAD = struct.Struct(">4sBq")  # magic, version, last_applied
_PAIR_HEAD = struct.Struct(">II")  # key suffix length, value length
_END_OF_PAIRS = 0xFFFFFFFF
_RESTORE_BATCH_BYTES = 4 * 1024 * 1024


def write_snapshot(out: BinaryIO, keys: PartitionKeys, last_applied: int, pairs: Iterator[tuple[bytes, bytes]]) -> None:
    """Write the stream of ``pairs`` (this partition's keys, in key order) stating ``last_applied``."""
    out.write(_SNAPSHOT_HEAD.pack(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, last_applied))
    plen = len(keys.prefix)
    for key, value in pairs:
        suffix = key[plen:]
        out.write(_PAIR_HEAD.pack(len(suffix), len(value)))
        out.write(suffix)
        out.write(value)
    out.write(struct.pack(">I", _END_OF_PAIRS))


def consistent_snapshot(store: NodeStore, keys: PartitionKeys) -> tuple[int, Callable[[BinaryIO], None]]:
    """``write_snapshot`` of one RocksDB view, safe to run on another thread while apply goes on.

    The state index is the view's own ``last_applied`` (read from the meta
    key through the same view), so header and pairs agree.
    """
    view = store.view(keys.end)
    last_applied = 0
    for _key, value in view.range(keys.meta, keys.meta + b"\x00"):
        last_applied = decode_meta(value, where=f"{keys.name} meta")[0].last_applied
    pairs = view.range(keys.prefix, keys.end)

    def write(out: BinaryIO) -> None:
        write_snapshot(out, keys, last_applied, pairs)

    return last_applied, write


def check_snapshot_header(inp: BinaryIO, name: str) -> None:
    """Read the stream's header; raises ``StorageCorruptionError`` unless it is a partition snapshot."""
    magic, version, _snap_applied = _SNAPSHOT_HEAD.unpack(_read_exact(inp, _SNAPSHOT_HEAD.size, name))
    if magic != _SNAPSHOT_MAGIC or version != _SNAPSHOT_VERSION:
        raise StorageCorruptionError(f"{name}: not a partition snapshot (v{version})")


def restore_snapshot(store: NodeStore, keys: PartitionKeys, inp: BinaryIO, last_applied: int) -> None:
    """Replace the partition's keys with the pairs of ``inp`` (after ``check_snapshot_header``).

    The meta written states ``last_applied``. Raises ``StorageCorruptionError``
    for a malformed stream, leaving the restore mark in place.
    """
    name = keys.name
    wb = store.new_batch()
    wb.delete_range(keys.prefix, keys.end)
    wb.put(keys.restore, b"")
    store.write(wb)
    wb = store.new_batch()
    pending = 0
    meta_value: bytes | None = None
    open_firsts: list[int] = []
    while True:
        (klen,) = struct.unpack(">I", _read_exact(inp, 4, name))
        if klen == _END_OF_PAIRS:
            break
        (vlen,) = struct.unpack(">I", _read_exact(inp, 4, name))
        suffix = _read_exact(inp, klen, name)
        value = _read_exact(inp, vlen, name)
        if suffix == META_TAG:
            meta_value = value
            continue
        if suffix[:1] not in (BATCH_TAG, PRODUCER_TAG, ABORTED_TAG):
            raise StorageCorruptionError(f"{name}: snapshot holds unknown key {suffix!r}")
        if suffix[:1] == PRODUCER_TAG:
            txn_first = decode_entry(value, where=f"{name} snapshot entry").current_txn_first_offset
            if txn_first is not None:
                open_firsts.append(txn_first)
        wb.put(keys.prefix + suffix, value)
        pending += klen + vlen
        if pending >= _RESTORE_BATCH_BYTES:
            store.write(wb)
            wb, pending = store.new_batch(), 0
    meta, recorded = LogMeta(), True
    if meta_value is not None:
        meta, recorded = decode_meta(meta_value, where=f"{name} snapshot meta")
    if not recorded:  # a version-1 meta: derive what it predates (the load checks it)
        meta = replace(meta, first_unstable_offset=min(open_firsts, default=None))
    wb.put(keys.meta, encode_meta(replace(meta, last_applied=last_applied)))
    wb.delete(keys.restore)
    store.write(wb)


def _read_exact(inp: BinaryIO, n: int, name: str) -> bytes:
    data = inp.read(n)
    if len(data) != n:
        raise StorageCorruptionError(f"{name}: snapshot truncated")
    return data
