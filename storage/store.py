"""The node's one RocksDB database.

Every Raft group on a node writes into this single database under its own key
prefix (DESIGN.md "Storage layout"). Prefixes must be *prefix-free*: no prefix
may be a prefix of another, or ``delete_prefix``/``iter_prefix`` of one group
would reach into another. cluster/ uses fixed-length prefixes
(``b"P" + topic_id u32 + partition u32``), which are prefix-free by construction.

Durability: every write comes from a Raft group applying a committed entry,
and the group's Raft journal already holds that entry. So the store writes
*without* RocksDB's write-ahead log: the journal is the write-ahead log. After a
process crash RocksDB reopens at its last memtable flush, a consistent prefix of
all writes (one column family), and each group replays its journal from its
last dump; entries at or below the state index it finds are skipped.
``make_durable`` flushes the memtables; a group calls it (on its compaction
thread) before it writes a dump that lets it drop journal entries. An
acknowledged write therefore survives a process crash, but not the loss of the
machine's page cache (the journal is not fsynced either); Raft replication
covers a minority of machine losses (DESIGN.md rule 7).
``NodeStore(path, sync=True)`` instead writes the WAL and fsyncs every write.

Why not the WAL: rocksdict holds the GIL while RocksDB writes, and under write
pressure a WAL append could block for most of a second, which stopped every
thread of the node (measured: 0.6-0.7 s stalls of the Raft tickers). It also
wrote every record a third time.

Every write of a group must go through ``write``/``put`` (one kind of write
options): a WAL write of a key that later gets a WAL-less write would resurface
after a crash with the older value. The one exception is ``delete_prefix``,
which keeps the WAL: it only ever removes a group's whole state, so what
survives a crash is "deleted", never an older value.

A write that fails for the disk's sake (RocksDB's "IO error" or "Corruption":
disk full, a failed flush, a bad sector) ends the process
(``fatal_storage_error``, exit status 74). Writes come from Raft groups applying
committed entries. A group that skipped one on this replica, while the other
replicas applied it, would diverge from them silently. Kafka halts a broker whose
only log directory fails, for the same reason. On restart the journal replays
the entry; the node stays down until the disk is fixed.

Flushes and compactions write with ``O_DIRECT`` where the filesystem allows it
(``direct_io``, probed at open: ``supports_direct_io``). The data is in the
Raft journal already, and readers of recent offsets find it in the memtables,
so a flushed blob file gains nothing from the page cache. Through it, every byte
cost a copy into the cache and a dirty page for writeback. Measured on the
2-core bench machine (3 nodes, full produce load): RocksDB's flush threads
used about a core for 2 s of every 5 with 256 MiB memtables, mostly in the
kernel's copy into the page cache; throughput swung between about 15k and
55k records/s with every flush. With direct I/O, node CPU per record fell by
a fifth. Reads stay buffered.

Thread-safety: RocksDB is safe for concurrent readers and writers; this class
adds no locks. ``close`` must not race other calls (call it at shutdown).
"""

from __future__ import annotations

import logging
import mmap
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import cast

from rocksdict import (
    DBCompressionType,
    Options,
    Rdict,
    RdictIter,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

__all__ = [
    "EXIT_STORAGE_ERROR",
    "NodeStore",
    "StoreView",
    "fatal_storage_error",
    "is_storage_failure",
    "prefix_upper_bound",
    "stop_on_storage_failure",
    "supports_direct_io",
]

logger = logging.getLogger(__name__)

EXIT_STORAGE_ERROR = 74  # sysexits.h EX_IOERR


def _fatal_storage_error(path: str, exc: BaseException) -> None:
    """Fail-stop: a committed entry this replica could not apply must not be skipped (module doc).

    Tests replace this hook.
    """
    logger.critical("store %s: write failed (%s); exiting with status %d", path, exc, EXIT_STORAGE_ERROR)
    logging.shutdown()
    os._exit(EXIT_STORAGE_ERROR)


fatal_storage_error: Callable[[str, BaseException], None] = _fatal_storage_error


def is_storage_failure(exc: BaseException) -> bool:
    """The disk failed us (not a bad argument, which every replica would meet alike).

    rocksdict raises a plain ``Exception`` carrying RocksDB's status text.
    """
    text = str(exc.args[0]) if exc.args else ""
    return isinstance(exc, OSError) or text.startswith(("IO error", "Corruption"))


def stop_on_storage_failure(exc: BaseException, where: str) -> None:
    """``fatal_storage_error`` if ``exc`` is the disk's fault; otherwise return, for the caller to handle it."""
    if is_storage_failure(exc):
        fatal_storage_error(where, exc)


_MIN_BLOB_BYTES = 4096
_DIRECT_IO_PROBE = ".direct-io-probe"


def supports_direct_io(directory: pathlib.Path) -> bool:
    """Whether files in ``directory`` take ``O_DIRECT`` writes (not every filesystem does: older tmpfs, some FUSE).

    Writes one aligned page to a probe file and removes it.
    """
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    path = directory / _DIRECT_IO_PROBE
    page = mmap.mmap(-1, mmap.PAGESIZE)  # anonymous maps are page-aligned, as O_DIRECT wants
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o600)
        try:
            return os.write(fd, page) == mmap.PAGESIZE
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        page.close()
        path.unlink(missing_ok=True)


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key that starts with ``prefix``.

    ``None`` when no such key exists (the prefix is empty or all 0xff).
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class NodeStore:
    """The node's one RocksDB (rocksdict ``Rdict``, raw mode: bytes keys and values, no pickle)."""

    def __init__(self, path: pathlib.Path, *, sync: bool = False, direct_io: bool = True) -> None:
        """``direct_io``: flush and compact with ``O_DIRECT`` if the filesystem takes it (module doc)."""
        self.path = pathlib.Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.direct_io = direct_io and supports_direct_io(self.path)
        if direct_io and not self.direct_io:
            logger.info("store %s: the filesystem refuses O_DIRECT; flushes go through the page cache", self.path)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        # Record batches (values of KiBs) go to blob files, written once and never
        # rewritten by compaction, and uncompressed: compressing what producers send
        # (often already compressed or random) cost ~40% more CPU per byte stored
        # (measured, incompressible 64 KiB batches), and CPU is what a node runs out
        # of first. The LSM keeps keys and small values (meta, producer state), LZ4.
        opts.set_compression_type(DBCompressionType.lz4())
        opts.set_enable_blob_files(True)
        opts.set_min_blob_size(_MIN_BLOB_BYTES)
        opts.set_blob_file_size(256 * 1024 * 1024)
        opts.set_blob_compression_type(DBCompressionType.none())
        # No blob GC: it relocates every *live* blob of the oldest blob files whenever a compaction passes
        # them, i.e. rewrites the log for nothing. Measured: up to half a core per 3 nodes in RocksDB's
        # compaction threads after ~1 GB written, and node CPU per record up 30-70 %. Retention deletes a
        # partition from its oldest offsets on, so blob files empty out whole and RocksDB drops a blob file
        # once no SST refers to it (checked: 969 MB of blob files -> 456 MB live after deletes and
        # compaction). A file that still holds one live batch of a topic with longer retention stays.
        opts.set_enable_blob_gc(False)
        opts.set_write_buffer_size(64 * 1024 * 1024)
        opts.set_max_write_buffer_number(4)
        opts.set_max_background_jobs(4)
        # Start writing SST and blob files out every MiB instead of leaving it to the kernel. Left alone, the nodes'
        # dirty pages (~250 MB/s for 3 nodes at full produce load) piled up to the kernel's threshold and went out
        # in bursts of 1-2 GB, and meanwhile every fsync and rename on the machine, the Raft tickers' included, took
        # up to a second (measured). Incremental, asynchronous: no durability is claimed from it. (The WAL carries
        # only range deletes, or fsyncs every write with sync=True: nothing to smooth there.)
        opts.set_bytes_per_sync(1 << 20)
        opts.set_use_direct_io_for_flush_and_compaction(self.direct_io)
        self.db: Rdict = Rdict(str(self.path), opts)
        self._sync = sync
        self._write_opts = WriteOptions()
        self._write_opts.sync = sync
        self._write_opts.disable_wal = not sync  # type: ignore[method-assign,assignment]  # a property (stub: method)
        # Range deletes of whole groups (a deleted partition, an installed snapshot's old state) keep the WAL:
        # rare, and a lost one would leave a dead group's keys behind.
        self._wal_opts = WriteOptions()
        self._wal_opts.sync = sync
        self._closed = False

    # -- writes ---------------------------------------------------------------

    def new_batch(self) -> WriteBatch:
        """An empty raw-mode WriteBatch for this database."""
        return WriteBatch(raw_mode=True)

    def write(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically (all of it or none of it survives a crash).

        A storage failure ends the process (module doc).
        """
        self._write(batch, self._write_opts)

    def _write(self, batch: WriteBatch, opts: WriteOptions) -> None:
        try:
            self.db.write(batch, opts)
        except Exception as exc:
            stop_on_storage_failure(exc, str(self.path))
            raise

    def put(self, key: bytes, value: bytes) -> None:
        """One key, written like ``write``."""
        batch = self.new_batch()
        batch.put(key, value)
        self.write(batch)

    def make_durable(self) -> None:
        """Make every write so far survive a machine crash: flush the memtables (fsynced SST and blob files).

        Blocks for the flush (up to a second under load); call it off latency-critical threads.
        rocksdict releases the GIL while it waits (measured).
        """
        if self._sync:
            return  # every write was fsynced through the WAL
        self.db.flush(True)

    def delete_prefix(self, prefix: bytes) -> None:
        """Delete every key that starts with ``prefix`` (one range tombstone)."""
        if not prefix:
            raise ValueError("refusing to delete the whole database")
        end = prefix_upper_bound(prefix)
        batch = self.new_batch()
        if end is not None:
            batch.delete_range(prefix, end)
        else:
            for key, _value in self.iter_prefix(prefix):
                batch.delete(key)
        self._write(batch, self._wal_opts)

    # -- reads ----------------------------------------------------------------

    def view(self, upper: bytes | None = None) -> StoreView:
        """A point-in-time view of the database for several range reads that must agree.

        ``upper`` (exclusive) lets RocksDB stop early; every range read from
        the view must lie below it.
        """
        ro = ReadOptions()
        if upper is not None:
            ro.set_iterate_upper_bound(upper)
        return StoreView(self.db.iter(ro), upper)

    def iter_range(
        self,
        lower: bytes,
        upper: bytes | None,
        *,
        backwards: bool = False,
        floor: bytes | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """``StoreView.range`` on a fresh view (see there)."""
        view = self.view(None if backwards else upper)
        return view.range(lower, upper, backwards=backwards, floor=floor)

    def iter_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(key, value)`` whose key starts with ``prefix``, in key order."""
        for key, value in self.iter_range(prefix, prefix_upper_bound(prefix)):
            if not key.startswith(prefix):  # only reachable for all-0xff prefixes
                break
            yield key, value

    def close(self) -> None:
        """Flush memtables and close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.db.flush()
        finally:
            self.db.close()


class StoreView:
    """A point-in-time view of the database: one RocksDB iterator.

    RocksDB pins the data an iterator sees when it is created, so every range
    read from one view sees the same state, whatever writes happen meanwhile
    (rocksdict's ``Snapshot.iter`` does not honour its snapshot, hence this).
    Read one range at a time: starting a range re-positions the iterator
    under any range still being consumed.
    """

    def __init__(self, it: RdictIter, upper: bytes | None) -> None:
        self._it = it
        self._upper = upper

    def last_key_below(self, upper: bytes) -> bytes | None:
        """The greatest key ``< upper`` (None when there is none); re-positions the view."""
        it = self._it
        it.seek_for_prev(upper)
        if it.valid() and cast(bytes, it.key()) >= upper:
            it.prev()
        return cast(bytes, it.key()) if it.valid() else None

    def range(
        self,
        lower: bytes,
        upper: bytes | None,
        *,
        backwards: bool = False,
        floor: bytes | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs with ``lower <= key < upper`` (``upper`` None: unbounded).

        Forward by default, starting at ``lower``; with ``floor``, starting at
        the greatest key ``<= floor`` in the range (or the first key in the
        range if there is none). ``backwards`` walks from the last key down.
        The bounds are checked here: rocksdict does not honour the lower
        bound of a backward iterator.
        """
        if self._upper is not None and (upper is None or upper > self._upper):
            raise ValueError("range reaches past the view's upper bound")
        it = self._it
        if backwards:
            if upper is None:
                it.seek_to_last()
            else:
                it.seek_for_prev(upper)
                if it.valid() and cast(bytes, it.key()) >= upper:
                    it.prev()
            while it.valid():
                key = cast(bytes, it.key())
                if key < lower:
                    return
                yield key, cast(bytes, it.value())
                it.prev()
            return
        if floor is not None:
            it.seek_for_prev(floor)
            if not it.valid() or cast(bytes, it.key()) < lower:
                it.seek(lower)
        else:
            it.seek(lower)
        while it.valid():
            key = cast(bytes, it.key())
            if upper is not None and key >= upper:
                return
            yield key, cast(bytes, it.value())
            it.next()
