"""Full snapshots of a store-backed group, built on demand for followers that need one installed.

A ``DurableStateMachine`` compacts its Raft log with a light snapshot (no
state copied). When the leader must install a snapshot on a follower (one
that was down past the log start, or lost its disk), PySyncObj asks for the
snapshot file to stream: this builder answers "not yet" (None), copies the
state from one consistent view on a background thread, and from then on
hands out the full file -- until the next compaction writes a new light
snapshot, which makes the full one stale (its Raft metadata must be the
current compaction point, where the leader's log now starts). The full file
is a copy of the group's state: it is removed when the next one is built, when
the group closes, and at start (one left by a previous process is never handed
out); it is not fsynced, since nothing trusts it after a crash.

The full container carries the light one's Raft metadata and the state
index of the view it copied, which may be later: the follower restores the
state at that index and skips the entries up to it (``StateMachine.apply``
is idempotent across the boundary), exactly as after a journal replay.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from raft import snapshot
from raft.pysyncobj_patches import start_writeback
from raft.state_machine import DurableStateMachine
from raft.thread_names import name_os_thread

__all__ = ["FullSnapshotBuilder", "Pacer"]

logger = logging.getLogger(__name__)

_STEP_BYTES = 1 << 20


class Pacer:
    """Called after each write of a copy (``snapshot.write_snapshot``'s ``on_write``): every MiB written, it starts
    writing that MiB out to disk (``start_writeback``: dirty pages leave steadily instead of piling up, which
    stalls every fsync of the machine when they go out at once) and, with ``max_bytes_per_s`` above 0, sleeps
    as long as the copy is ahead of that rate (releasing the GIL to the node's other threads)."""

    def __init__(self, max_bytes_per_s: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:  # fmt: skip
        self.max_bytes_per_s = max_bytes_per_s
        self._clock, self._sleep = clock, sleep
        self._start = clock()
        self._done = 0  # bytes handed to writeback so far
        self.slept = 0.0

    def __call__(self, fd: int, written: int) -> None:
        if written - self._done < _STEP_BYTES:
            return
        start_writeback(fd, self._done, written - self._done)
        self._done = written
        if self.max_bytes_per_s > 0:
            ahead = self._start + written / self.max_bytes_per_s - self._clock()
            if ahead > 0:
                self._sleep(ahead)
                self.slept += ahead


class FullSnapshotBuilder:
    """One group's on-demand full snapshot; ``path_for_transmission`` runs on the ticker thread."""

    def __init__(self, group_id: str, dump_path: str, sm: DurableStateMachine, max_bytes_per_s: int = 0) -> None:
        """``max_bytes_per_s``: the pace of a build (0: as fast as it goes; ``Pacer``)."""
        self.group_id = group_id
        self.max_bytes_per_s = max_bytes_per_s
        self.dump_path = dump_path
        self.full_path = dump_path + ".full"
        self._sm = sm
        self._lock = threading.Lock()
        self._ready_for: tuple[int, int] | None = None  # identity of the light dump the full file matches
        self._building_for: tuple[int, int] | None = None
        self._closed = False
        self.builds = 0
        self._discard()  # a previous process's file: its identity is unknown, so it is never handed out

    def _discard(self) -> None:
        """Remove the full file and its temporary (an open transmission keeps reading an unlinked file)."""
        for path in (self.full_path, self.full_path + ".tmp"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.dump_path)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_ino

    def path_for_transmission(self) -> str | None:
        """The file to stream to a follower, or None while it is being built (PySyncObj retries)."""
        ident = self._identity()
        if ident is None:
            return None
        with self._lock:  # asked at every AppendEntries while a follower waits: answer without reading files
            if self._ready_for == ident:
                return self.full_path
            if self._building_for is not None or self._closed:
                return None
        try:
            reader = snapshot.SnapshotReader(self.dump_path)
        except Exception:
            logger.exception("group %r: snapshot %s unreadable for transmission", self.group_id, self.dump_path)
            return None
        if not reader.light:
            return self.dump_path  # a full container already (written before the machine was store-backed)
        with self._lock:
            if self._building_for is None and not self._closed:
                self._building_for = ident
                state_index, write_body = self._sm.consistent_snapshot()  # the view is taken here, on the ticker
                if self._ready_for is not None:  # stale now: free its space before the next copy is written
                    self._ready_for = None
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.full_path)
                logger.info("group %r: building a full snapshot at state index %d for a follower", self.group_id,
                            state_index)  # fmt: skip
                threading.Thread(
                    target=self._build,
                    args=(ident, reader.raft_data, state_index, write_body),
                    name=f"snapshot-{self.group_id}",
                    daemon=True,
                ).start()
        return None

    def _build(
        self, ident: tuple[int, int], raft_data: Any, state_index: int, write_body: Callable[[BinaryIO], None]
    ) -> None:
        name_os_thread("snapshot-build")  # its CPU, apart from the node's other threads (``top -H``, benches)
        tmp = self.full_path + ".tmp"
        ok = False
        started = time.monotonic()
        pacer = Pacer(self.max_bytes_per_s)
        try:
            snapshot.write_snapshot(tmp, raft_data, state_index, write_body, sync=False, on_write=pacer)
            os.replace(tmp, self.full_path)
            ok = True
            self.builds += 1
            logger.info(
                "group %r: full snapshot at state index %d built for a follower (%.1f MiB in %.1f s, %.1f s paced)",
                self.group_id,
                state_index,
                os.path.getsize(self.full_path) / (1 << 20),
                time.monotonic() - started,
                pacer.slept,
            )
        except Exception:
            logger.exception("group %r: building a full snapshot failed (retried on the next request)", self.group_id)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        with self._lock:
            self._building_for = None
            if ok and not self._closed:
                self._ready_for = ident

    def close(self) -> None:
        """Stop building; the full file goes (a build still running leaves its file to the next start)."""
        with self._lock:
            self._closed = True
            self._ready_for = None
            self._discard()
