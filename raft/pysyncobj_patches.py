"""Every monkeypatch and private-attribute access of PySyncObj, in one place.

PySyncObj 0.3.17 is pinned. ``audit()`` asserts that every internal touched
here still exists, and ``tests/unit/test_raft_patches.py`` runs it, so an
upgrade that moves them fails loudly instead of silently losing a fix.

Patches (``apply()``, idempotent, run before any SyncObj is built):

* pickle protocol 2 -> 4 (``pysyncobj.pickle.__protocol``): protocol 2 pickles
  ``bytes`` as latin-1 text, ~40x slower for binary payloads. All nodes run it.
* ``pysyncobj.syncobj.createPoller`` returns the ticker shard's proxy poller
  while a shard is constructing a group (thread-local), else the original.
* ``pysyncobj.syncobj.PipeNotifier``: for a group on a ticker shard, the
  "command queued" notification goes to the shard (one shared wake-up pipe,
  written once per burst) instead of a pipe per group written per command.
* ``FileJournal.setRaftCommitIndex`` only marks the meta dirty when the
  index changed (otherwise every idle group rewrites its .meta each second),
  and at most every ``COMMIT_INDEX_STORE_PERIOD_S`` (each store is a file
  write and a rename on the ticker thread; the commit index is volatile in
  Raft, a stale one only makes a restarted node wait for its leader before
  applying the rest). ``store_commit_index`` stores it now (clean shutdown).
* ``FileJournal.add`` / ``ResizableFile.write`` write entries with
  ``pwritev`` instead of storing them through the journal's mmap: faulting
  in fresh file pages costs ~3x the time of a write() of the same 64 KB, and
  the record's header, command and trailer go out as they are, without
  being concatenated first. Same bytes on disk, same order (record, then
  last-record offset).
* ``MetaStorer.getMeta`` closes its file and fails on an unreadable meta
  file instead of silently forgetting the persisted term and vote.
* ``MetaStorer.storeMeta`` overwrites the meta file in place (one ``pwrite``
  at offset 0 of a pickle under ``META_IN_PLACE_MAX_BYTES``, one disk sector,
  so never torn; an older, longer pickle's tail after it is ignored by
  unpickling) instead of writing a new file and renaming it over the old
  one: every term change of every group stores it, and a new file renamed per
  store costs the survivors of a dead node a third of their CPU while they
  elect leaders for thousands of groups (BENCHMARKS.md).
* ``Serializer`` closes the snapshot files it streams to followers (it
  leaked one file handle per snapshot transfer).
* ``Serializer.serialize``, when a ``serializeChecker`` is configured, hands
  the dump's final path to the serializer and leaves writing *and* renaming it
  to the group (``raft.compaction``): the serializer may finish on another
  thread, and the checker renames the dump on the ticker thread. Stock
  PySyncObj renamed the temporary file as soon as the serializer returned.
* ``CoalescedAppendEntries`` (a SyncObj mixin): in non-batch mode PySyncObj
  sends one AppendEntries per command it takes off the submit queue; the
  mixin sends once after the queue is drained, so a burst of N queued
  commands becomes one message per follower (split at
  ``appendEntriesBatchSizeBytes``), while a lone command still goes out in
  the same tick it was queued. It also delays the commit-index-only
  AppendEntries PySyncObj sends right after every apply on the leader by
  ``commit_notify_delay`` (see the class).
* a logging filter demotes the "truncating already-applied log entries"
  CRITICAL (raised by PySyncObj's duplicate retransmission, reference 4.4) to
  a WARNING and counts it in ``TRUNCATION_WARNINGS``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import pysyncobj.journal as _psc_journal
import pysyncobj.pickle as _psc_pickle
import pysyncobj.serializer as _psc_serializer
import pysyncobj.syncobj as _psc_syncobj
import pysyncobj.transport as _psc_transport
from pysyncobj.poller import createPoller as _original_create_poller

from .libc import LIBC
from .snapshot_transmission import ORIGINAL_GET_TRANSMISSION_DATA, cancel_transmission, get_transmission_data

PICKLE_PROTOCOL = 4
COMMIT_INDEX_STORE_PERIOD_S = 5.0
JOURNAL_WRITEBACK_BYTES = 4 << 20
_LEADER = 2  # pysyncobj.syncobj._RAFT_STATE.LEADER

logger = logging.getLogger(__name__)
_lock = threading.Lock()
_applied = False
_construct_ctx = threading.local()


class _Counter:
    """A thread-safe monotonically increasing counter."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    def inc(self) -> None:
        with self._lock:
            self._value += 1

    @property
    def value(self) -> int:
        return self._value


TRUNCATION_WARNINGS = _Counter()


class _TruncationFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.CRITICAL and str(record.msg).startswith("truncating already-applied log entries"):
            record.levelno = logging.WARNING
            record.levelname = "WARNING"
            TRUNCATION_WARNINGS.inc()
        return True


def _create_poller(poller_type: str) -> Any:
    proxy = getattr(_construct_ctx, "poller", None)
    if proxy is not None:
        return proxy
    return _original_create_poller(poller_type)


_original_pipe_notifier: Callable[..., Any] = _psc_syncobj.PipeNotifier


class _PollerNotifier:
    """PySyncObj's PipeNotifier interface, delegating to the poller's ``notify``."""

    __slots__ = ("notify",)

    def __init__(self, notify: Callable[[], None]) -> None:
        self.notify = notify


def _pipe_notifier(poller: Any, callback: Callable[[], None] | None = None) -> Any:
    notify = getattr(poller, "notify", None)
    if notify is not None and callback is None:
        return _PollerNotifier(notify)
    return _original_pipe_notifier(poller, callback)


_SMALL_WRITE = 4096
_RECORD_HEAD = struct.Struct("<IQQ")  # record size, index, term (FileJournal's layout)
_RECORD_TAIL = struct.Struct("<I")


def _ensure_file_size(rf: Any, end: int) -> None:
    """Grow a ResizableFile (and its mmap) to at least ``end`` bytes, as its own write() does."""
    while end > len(rf._ResizableFile__mm):
        current = len(rf._ResizableFile__mm)
        new_size = max(int(current * rf._ResizableFile__resizeFactor), end)
        try:
            rf._ResizableFile__mm.resize(new_size)
        except (SystemError, OSError):
            rf._ResizableFile__extand(new_size - current)


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    fn = getattr(LIBC, "sync_file_range", None)  # None without a C library, or one without the call
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fn)


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``[offset, offset + length)`` of ``fd`` to disk now, without waiting.

    Like RocksDB's ``bytes_per_sync``: dirty pages leave steadily instead of piling
    up to the kernel's dirty threshold, where every writer of the machine (the
    ticker's journal writes, fsyncs, renames) stalls while gigabytes go out at once.
    Not a durability guarantee. A no-op where ``sync_file_range`` is unavailable.
    """
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def _pwritev_all(fd: int, parts: list[bytes], offset: int) -> None:
    written = os.pwritev(fd, parts, offset)
    total = sum(len(p) for p in parts)
    if written < total:  # short write (disk full, signal): finish it byte-exactly
        rest = b"".join(parts)[written:]
        while rest:
            n = os.pwrite(fd, rest, offset + written)
            written += n
            rest = rest[n:]


def _resizable_write(self: Any, offset: int, values: bytes) -> None:
    # len(mmap) is the mapped size (ResizableFile asks fstat via mmap.size() on every write).
    end = offset + len(values)
    _ensure_file_size(self, end)
    if len(values) < _SMALL_WRITE:
        self._ResizableFile__mm[offset:end] = values  # resident header page: no syscall
    else:
        _pwritev_all(self._ResizableFile__f.fileno(), [values], offset)


EXIT_JOURNAL_ERROR = 74  # sysexits.h EX_IOERR


def _fatal_journal_error(path: str, exc: BaseException) -> None:
    """Fail-stop on a journal write the disk refused (disk full, I/O error).

    The entry is already in the in-memory journal, and PySyncObj would go on
    as if it were stored: a follower would acknowledge it and a leader count
    it towards a majority, so a later restart could lose a committed entry.
    Tests replace this hook.
    """
    logger.critical("raft journal %s: write failed (%s); exiting with status %d", path, exc, EXIT_JOURNAL_ERROR)
    logging.shutdown()
    os._exit(EXIT_JOURNAL_ERROR)


fatal_journal_error: Callable[[str, BaseException], None] = _fatal_journal_error


def _journal_add(self: Any, command: Any, idx: int, term: int) -> None:
    self._FileJournal__journal.append((command, idx, term))
    payload = command if isinstance(command, bytes) else _psc_journal.to_bytes(command)
    size = 16 + len(payload)
    journal_file = self._FileJournal__journalFile
    offset = self._FileJournal__currentOffset
    end = offset + size + 8
    try:
        _ensure_file_size(journal_file, end)
        fd = journal_file._ResizableFile__f.fileno()
        _pwritev_all(fd, [_RECORD_HEAD.pack(size, idx, term), payload, _RECORD_TAIL.pack(size)], offset)
    except OSError as exc:
        fatal_journal_error(str(journal_file._ResizableFile__fileName), exc)
        raise
    self._FileJournal__currentOffset = end
    self._FileJournal__setLastRecordOffset(end)
    start = self.__dict__.get("_txb_writeback_from", 0)
    if end < start:  # compaction rewrote the journal from its first record
        start = self.__dict__["_txb_writeback_from"] = 0
    if end - start >= JOURNAL_WRITEBACK_BYTES:
        start_writeback(fd, start, end - start)
        self.__dict__["_txb_writeback_from"] = end


_original_set_commit = _psc_journal.FileJournal.setRaftCommitIndex
_original_journal_add = _psc_journal.FileJournal.add
_original_resizable_write = _psc_journal.ResizableFile.write


def _set_raft_commit_index(self: Any, raft_commit_index: int) -> None:
    # PySyncObj marks the meta dirty on every AppendEntries, even when the
    # commit index did not move, so every idle group rewrote its .meta file
    # (open + write + rename) once per second.
    meta = self._FileJournal__meta
    if meta.get("raftCommitIndex") == raft_commit_index:
        return
    now = time.monotonic()
    if now < self.__dict__.get("_txb_next_commit_store", 0.0):
        meta["raftCommitIndex"] = raft_commit_index  # stored with the next store
        return
    self.__dict__["_txb_next_commit_store"] = now + COMMIT_INDEX_STORE_PERIOD_S
    _original_set_commit(self, raft_commit_index)


def syncobj_clock() -> float:
    """PySyncObj's clock (``CLOCK_MONOTONIC_RAW`` where the platform has it), which its deadlines are on.

    Not ``time.monotonic()``: the two run apart (0.25 s measured on the dev VM), so a deadline taken from one
    must travel to the other as a delay, never as a time.
    """
    return float(_psc_syncobj.monotonicTime())


def store_commit_index(so: Any) -> None:
    """Store the journal meta (commit index included) now, if it is a file journal."""
    journal = raft_log(so)
    if isinstance(journal, _psc_journal.FileJournal):
        journal._FileJournal__metaSaved = False
        journal.onOneSecondTimer()


META_IN_PLACE_MAX_BYTES = 512
_original_store_meta = _psc_journal.MetaStorer.storeMeta


def _store_meta(self: Any, meta: dict[str, Any]) -> None:
    data = _psc_pickle.dumps(meta)
    if len(data) > META_IN_PLACE_MAX_BYTES:
        _original_store_meta(self, meta)
        return
    fd = os.open(self._MetaStorer__path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if os.pwrite(fd, data, 0) != len(data):
            raise OSError(f"short write of the raft journal meta {self._MetaStorer__path}")
    finally:
        os.close(fd)


def _get_meta(self: Any) -> dict[str, Any]:
    # PySyncObj leaks the file handle and silently returns {} for an
    # unreadable file, forgetting the persisted term and vote (a node could
    # then vote twice in one term). Missing file: fresh group; unreadable: fail.
    path = self._MetaStorer__path
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    try:
        meta = _psc_pickle.loads(raw)
    except Exception as e:
        raise RuntimeError(f"raft journal meta {path} is unreadable: {e}") from e
    if not isinstance(meta, dict):
        raise RuntimeError(f"raft journal meta {path} is not a dict")
    return meta


_original_serialize = _psc_serializer.Serializer.serialize
_DEFERRED_PID = -3  # busy (not 0) until the checker reports SUCCESS or FAILED, which resets it to 0


def _serialize(self: Any, data: Any, serialize_id: Any) -> None:
    serializer = self._Serializer__serializer
    if self._Serializer__serializeChecker is None or serializer is None or self._Serializer__fileName is None:
        _original_serialize(self, data, serialize_id)
        return
    if self._Serializer__pid != 0:
        return
    self._Serializer__currentID = serialize_id
    self._Serializer__pid = _DEFERRED_PID
    serializer(self._Serializer__fileName, data[1:])


class CoalescedAppendEntries:
    """SyncObj mixin: fewer AppendEntries rounds under load (see module doc).

    *Commit notification*: in non-batch mode a leader that applied entries
    sends an AppendEntries right away only to tell followers the new commit
    index, and each follower acknowledges it, doubling the Raft messages per
    write. When more AppendEntries are coming anyway (later entries are
    still uncommitted, so their commit will be announced, or commands are
    queued, so this very tick sends them) the leader skips it; those carry
    the commit index. ``commit_notify_delay`` bounds the wait (``_wake_at``
    asks the ticker for a tick then). When nothing else is in flight it
    notifies at once, as PySyncObj does, so an idle group's followers are
    never behind -- unless ``lazy_commit_notify`` is set: then an idle
    group's followers learn the commit index from the next heartbeat (at most
    ``appendEntriesPeriod`` later). For a group that sees a write now and then
    (a coordinator's), that halves the messages of each write: no
    AppendEntries round that carries nothing but the commit index. Or, with
    ``delay_idle_commit_notify``, an idle group waits ``commit_notify_delay``
    too: a group written in a steady trickle (a partition below full load,
    a partition just after its producer flushed) announces each commit with
    the next write's AppendEntries, which a sooner write sends anyway
    (PySyncObj pushes the next heartbeat back whenever it sends). Below full
    load that halves the messages per write; without it every write cost a
    second round, AppendEntries and reply, to each follower. Only
    followers' apply can be delayed; the leader's commit and apply, hence
    write latency, never are.

    List it before ``SyncObj`` in the bases. Ticker thread only.
    """

    _coalesce_depth = 0
    _coalesced_pending = 0
    _txb_snapshot_held: dict[Any, int] | None = None
    commit_notify_delay = 0.0
    lazy_commit_notify = False
    delay_idle_commit_notify = False
    # Flush at least this often while draining, so a long drain cannot delay
    # replication of the commands already appended.
    COALESCE_MAX_ENTRIES = 64

    def _checkCommandsToApply(self) -> None:
        self._coalesce_depth += 1
        try:
            super()._checkCommandsToApply()  # type: ignore[misc]  # SyncObj provides it
        finally:
            self._coalesce_depth -= 1
        if self._coalesce_depth == 0 and self._coalesced_pending:
            self._flush_append_entries()

    def _SyncObj__sendAppendEntries(self) -> None:  # overrides the name-mangled SyncObj.__sendAppendEntries
        if self._coalesce_depth:
            self._coalesced_pending += 1
            if self._coalesced_pending < self.COALESCE_MAX_ENTRIES:
                return
        self._flush_append_entries()

    def _flush_append_entries(self) -> None:
        self._coalesced_pending = 0
        held: dict[Any, int] = {}
        self._txb_snapshot_held = held  # followers whose snapshot has nothing to send this round (_hold_snapshot_round)
        try:
            _psc_syncobj.SyncObj._SyncObj__sendAppendEntries(self)
        finally:
            self._txb_snapshot_held = None
            next_index = self._SyncObj__raftNextIndex  # type: ignore[attr-defined]  # SyncObj provides it
            for node, index in held.items():
                if node in next_index:
                    next_index[node] = index

    def _SyncObj__applyLogEntries(self) -> bool:  # overrides the name-mangled SyncObj.__applyLogEntries
        need_send: bool = _psc_syncobj.SyncObj._SyncObj__applyLogEntries(self)
        delay = self.commit_notify_delay
        if not need_send or self.__dict__.get("_SyncObj__raftState") != _LEADER:
            return need_send
        more_coming = (
            _psc_syncobj.SyncObj._SyncObj__getCurrentLogIndex(self) > self.__dict__["_SyncObj__raftCommitIndex"]
            or len(self.__dict__["_SyncObj__commandsQueue"]._FastQueue__queue) > 0
        )
        if not more_coming and self.lazy_commit_notify:
            return False  # the next heartbeat carries the commit index
        if not more_coming and not self.delay_idle_commit_notify:
            return True
        if delay <= 0:
            return need_send
        due = _psc_syncobj.monotonicTime() + delay
        if due < self.__dict__["_SyncObj__newAppendEntriesTime"]:
            self.__dict__["_SyncObj__newAppendEntriesTime"] = due
            self._wake_at(due)
        return False

    def _wake_at(self, when: float) -> None:
        """Hook: make sure the SyncObj is ticked at time ``when`` of PySyncObj's clock (``syncobj_clock``)."""


def apply() -> None:
    """Install all patches (idempotent, thread-safe)."""
    global _applied
    with _lock:
        if _applied:
            return
        audit()
        _psc_pickle.__dict__["__protocol"] = PICKLE_PROTOCOL
        _psc_syncobj.createPoller = _create_poller
        _psc_syncobj.PipeNotifier = _pipe_notifier
        _psc_journal.FileJournal.setRaftCommitIndex = _set_raft_commit_index
        _psc_journal.FileJournal.add = _journal_add
        _psc_journal.ResizableFile.write = _resizable_write
        _psc_journal.MetaStorer.getMeta = _get_meta
        _psc_journal.MetaStorer.storeMeta = _store_meta
        _psc_serializer.Serializer.getTransmissionData = get_transmission_data
        _psc_serializer.Serializer.cancelTransmisstion = cancel_transmission
        _psc_serializer.Serializer.serialize = _serialize
        logging.getLogger(_psc_syncobj.__name__).addFilter(_TruncationFilter())
        _applied = True


def apply_pickle_protocol_only() -> None:
    """Only the protocol-4 patch (for the stock-PySyncObj comparison benchmark)."""
    _psc_pickle.__dict__["__protocol"] = PICKLE_PROTOCOL


@contextmanager
def constructing_with_poller(poller: Any) -> Iterator[None]:
    """Within this block, SyncObj.__init__ on this thread uses ``poller``."""
    _construct_ctx.poller = poller
    try:
        yield
    finally:
        _construct_ctx.poller = None


# --- private attribute access (all name-mangled SyncObj internals) ---------


def raft_next_index(so: Any) -> dict[Any, int]:
    result: dict[Any, int] = so._SyncObj__raftNextIndex
    return result


def raft_match_index(so: Any) -> dict[Any, int]:
    result: dict[Any, int] = so._SyncObj__raftMatchIndex
    return result


def raft_state(so: Any) -> int:
    return int(so._SyncObj__raftState)


def connected_nodes(so: Any) -> set[Any]:
    result: set[Any] = so._SyncObj__connectedNodes
    return result


def transport_of(so: Any) -> Any:
    return so._SyncObj__transport


def raft_log(so: Any) -> Any:
    return so._SyncObj__raftLog


def election_deadline(so: Any) -> float:
    return float(so._SyncObj__raftElectionDeadline)


def set_election_deadline(so: Any, when: float) -> None:
    """Move the follower's election deadline (PySyncObj's clock, ``syncobj_clock``)."""
    so._SyncObj__raftElectionDeadline = when


def random_election_timeout(so: Any) -> float:
    return float(so._SyncObj__generateRaftTimeout())


def transfer_in_progress(so: Any) -> bool:
    return bool(so._SyncObj__transferInProgress)


def has_self_node(so: Any) -> bool:
    return so._SyncObj__selfNode is not None


def other_nodes(so: Any) -> set[Any]:
    result: set[Any] = so._SyncObj__otherNodes
    return result


def raft_leader_node(so: Any) -> Any:
    return so._SyncObj__raftLeader


def last_log_position(so: Any) -> tuple[int, int]:
    """(term, index) of the last entry of the group's log."""
    return int(so._SyncObj__getCurrentLogTerm()), int(so._SyncObj__getCurrentLogIndex())


def last_response_times(so: Any) -> dict[Any, float]:
    """A leader's view: when each follower last answered an AppendEntries (PySyncObj's clock)."""
    result: dict[Any, float] = so._SyncObj__lastResponseTime
    return result


def step_down(so: Any) -> None:
    """Leader -> follower with no known leader, as PySyncObj's own leader fallback does."""
    so._SyncObj__setState(0)  # _RAFT_STATE.FOLLOWER
    so._SyncObj__raftLeader = None


def take_commands_waiting_commit(so: Any) -> list[tuple[int, Any]]:
    """Remove and return every ``(index, callback)`` waiting for its entry to commit, in log order."""
    waiting = so._SyncObj__commandsWaitingCommit
    held = [(idx, cb) for idx in sorted(waiting) for _term, cb in waiting[idx]]
    waiting.clear()
    return held


def count_commands_waiting_commit(so: Any) -> int:
    return sum(len(v) for v in so._SyncObj__commandsWaitingCommit.values())


def self_node(so: Any) -> Any:
    return so._SyncObj__selfNode


def readonly_nodes(so: Any) -> set[Any]:
    """A leader replicates to these beside its voters, without counting them (PySyncObj's readonly nodes)."""
    result: set[Any] = so._SyncObj__readonlyNodes
    return result


def new_node(so: Any, address: str) -> Any:
    """A node object of the group's node class for ``address``."""
    return so._SyncObj__nodeClass(address)


def raft_commit_index(so: Any) -> int:
    return int(so._SyncObj__raftCommitIndex)


def raft_last_applied(so: Any) -> int:
    return int(so._SyncObj__raftLastApplied)


def leader_noop_index(so: Any) -> int | None:
    """Index of the no-op this node appended when it last became leader (None: never led)."""
    index = so._SyncObj__noopIDx
    return None if index is None else int(index)


def take_dump_load_pending(so: Any) -> bool:
    """True (once) while PySyncObj has not yet loaded the dump file at its first tick; clears the flag."""
    pending = bool(so.__dict__.get("_SyncObj__needLoadDumpFile"))
    so._SyncObj__needLoadDumpFile = False
    return pending


def load_dump_file(so: Any) -> None:
    """PySyncObj's own dump load (restart), with ``clearJournal=False``."""
    so._SyncObj__loadDumpFile(False)


def update_cluster_configuration(so: Any, others: list[str]) -> None:
    """Make ``others`` the group's voters beside this node (PySyncObj's own, as after a snapshot)."""
    so._SyncObj__updateClusterConfiguration(others)


def close_pipe_notifier(so: Any) -> None:
    """Close the PipeNotifier's pipe (PySyncObj never closes it: 2 fds leak per group)."""
    notifier = so.__dict__.get("_SyncObj__pipeNotifier")
    if notifier is None:
        return
    for attr in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
        fd = getattr(notifier, attr, None)
        if fd is not None:
            try:
                so._poller.unsubscribe(fd)
                os.close(fd)
            except OSError:
                pass


def audit() -> None:
    """Assert the PySyncObj internals this package relies on still exist."""
    import pysyncobj.pipe_notifier as pn
    import pysyncobj.version as ver

    problems: list[str] = []
    if ver.VERSION != "0.3.17":
        problems.append(f"pysyncobj version {ver.VERSION} != audited 0.3.17")
    if "__protocol" not in _psc_pickle.__dict__:
        problems.append("pysyncobj.pickle.__protocol missing")
    for name in ("createPoller", "PipeNotifier", "SyncObj", "replicated"):
        if not hasattr(_psc_syncobj, name):
            problems.append(f"pysyncobj.syncobj.{name} missing")
    so_cls = _psc_syncobj.SyncObj
    for name in (
        "_SyncObj__sendAppendEntries",
        "_SyncObj__applyLogEntries",
        "_checkCommandsToApply",
        "_SyncObj__onMessageReceived",
        "_SyncObj__loadDumpFile",
        "doTick",
        "_isLeader",
        "_getLeader",
        "transferLeadership",
        "raftLastApplied",
        "raftCommitIndex",
        "raftCurrentTerm",
        "hasQuorum",
        "_onTick",
        "_SyncObj__generateRaftTimeout",
        "_SyncObj__getCurrentLogTerm",
        "_SyncObj__setState",
        "_SyncObj__changeCluster",
        "_SyncObj__doChangeCluster",
        "_SyncObj__doApplyCommand",
        "_SyncObj__updateClusterConfiguration",
        "addNodeToCluster",
        "removeNodeFromCluster",
    ):
        if not hasattr(so_cls, name):
            problems.append(f"SyncObj.{name} missing")
    tt = _psc_transport.TCPTransport
    for name in (
        "_createServer",
        "_maybeBind",
        "_onNewIncomingConnection",
        "_onIncomingMessageReceived",
        "_onMessageReceived",
        "addNode",
        "_connToNode",
    ):
        if not hasattr(tt, name):
            problems.append(f"TCPTransport.{name} missing")
    fj = _psc_journal.FileJournal
    for name in ("setRaftCommitIndex", "onOneSecondTimer", "getRaftCommitIndex", "flush"):
        if not hasattr(fj, name):
            problems.append(f"FileJournal.{name} missing")
    rf_names = set(_original_resizable_write.__code__.co_names)
    if not {"_ResizableFile__mm", "_ResizableFile__resizeFactor", "_ResizableFile__extand"} <= rf_names:
        problems.append("ResizableFile internals changed")
    add_names = set(_original_journal_add.__code__.co_names)
    wanted = {"_FileJournal__journal", "_FileJournal__journalFile", "_FileJournal__currentOffset"}
    if not wanted | {"_FileJournal__setLastRecordOffset", "to_bytes"} <= add_names:
        problems.append("FileJournal.add internals changed")
    if "_ResizableFile__f" not in _psc_journal.ResizableFile.__init__.__code__.co_names:
        problems.append("ResizableFile no longer keeps __f")
    if "_MetaStorer__path" not in _original_store_meta.__code__.co_names:
        problems.append("MetaStorer.storeMeta no longer writes _MetaStorer__path")
    if not hasattr(_psc_journal, "MetaStorer") or not hasattr(_psc_journal.MetaStorer, "getMeta"):
        problems.append("journal.MetaStorer.getMeta missing")
    ser = _psc_serializer.Serializer
    for name in ("getTransmissionData", "cancelTransmisstion", "setTransmissionData"):
        if not hasattr(ser, name):
            problems.append(f"Serializer.{name} missing")
    names = ORIGINAL_GET_TRANSMISSION_DATA.__code__.co_names
    if "_Serializer__transmissions" not in names:
        problems.append("Serializer no longer keeps __transmissions")
    wanted_ser = {"_Serializer__pid", "_Serializer__currentID", "_Serializer__serializer", "_Serializer__fileName"}
    if not wanted_ser <= set(_original_serialize.__code__.co_names):
        problems.append("Serializer.serialize internals changed")
    if "_Serializer__serializeChecker" not in ser.checkSerializing.__code__.co_names:
        problems.append("Serializer.checkSerializing no longer consults the serializeChecker")
    if not {"_FileJournal__meta", "_FileJournal__metaSaved"} <= set(_original_set_commit.__code__.co_names):
        problems.append("FileJournal no longer keeps __meta / __metaSaved")
    if not hasattr(pn.PipeNotifier, "_PipeNotifier__onNewNotification"):
        problems.append("PipeNotifier internals changed")
    if getattr(_psc_syncobj, "_RAFT_STATE", None) is None or _psc_syncobj._RAFT_STATE.LEADER != _LEADER:
        problems.append("pysyncobj.syncobj._RAFT_STATE.LEADER changed")
    if not hasattr(_psc_syncobj, "monotonicTime"):
        problems.append("pysyncobj.syncobj.monotonicTime missing")
    if not hasattr(so_cls, "_SyncObj__getCurrentLogIndex"):
        problems.append("SyncObj.__getCurrentLogIndex missing")
    import pysyncobj.fast_queue as fq

    if "_FastQueue__queue" not in fq.FastQueue.__init__.__code__.co_names:
        problems.append("FastQueue no longer keeps __queue")
    if not getattr(_psc_syncobj, "PIPE_NOTIFIER_ENABLED", False):
        problems.append("pysyncobj.syncobj.PIPE_NOTIFIER_ENABLED is off")
    if "notify" not in vars(pn.PipeNotifier):
        problems.append("PipeNotifier.notify missing")
    src = _psc_syncobj.SyncObj.__init__.__code__.co_names
    for name in ("createPoller", "PipeNotifier"):
        if name not in src:
            problems.append(f"SyncObj.__init__ no longer calls {name}")
    init_names = set(_psc_syncobj.SyncObj.__init__.__code__.co_names)
    wanted_init = {
        "_SyncObj__raftElectionDeadline",
        "_SyncObj__transferInProgress",
        "_SyncObj__selfNode",
        "_SyncObj__otherNodes",
        "_SyncObj__raftLeader",
        "_SyncObj__commandsWaitingCommit",
        "_SyncObj__lastResponseTime",
        "_SyncObj__readonlyNodes",
        "_SyncObj__nodeClass",
        "_SyncObj__noopIDx",
        "_SyncObj__needLoadDumpFile",
        "_SyncObj__raftCommitIndex",
        "_SyncObj__raftLastApplied",
    }
    if not wanted_init <= init_names:
        problems.append(f"SyncObj.__init__ no longer sets {sorted(wanted_init - init_names)}")
    tick_names = set(_psc_syncobj.SyncObj._onTick.__code__.co_names)
    if not {"_SyncObj__raftElectionDeadline", "_SyncObj__transferInProgress", "leaderFallbackTimeout"} <= tick_names:
        problems.append("SyncObj._onTick no longer campaigns on the election deadline / falls back on quorum loss")
    membership_calls = (
        (so_cls._checkCommandsToApply, "_SyncObj__changeCluster"),
        (so_cls._SyncObj__applyLogEntries, "_SyncObj__doApplyCommand"),
        (so_cls._SyncObj__onMessageReceived, "_SyncObj__doChangeCluster"),
        (so_cls._SyncObj__loadDumpFile, "_SyncObj__updateClusterConfiguration"),
    )
    for caller, callee in membership_calls:
        if callee not in caller.__code__.co_names:
            problems.append(f"SyncObj.{caller.__name__} no longer calls {callee} (raft.membership_log)")
    if problems:
        raise RuntimeError("PySyncObj internals changed: " + "; ".join(problems))
