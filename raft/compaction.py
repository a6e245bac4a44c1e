"""Log compaction of one group, with the slow part off the ticker thread.

PySyncObj compacts a group's Raft log every ``log_compaction_min_entries``
entries: it asks the group for a dump, and once the dump is in place it drops
the log entries the dump covers. For a store-backed group the dump is light
(Raft metadata and the state index), but it is only true once the store is
crash-proof up to that index, so it costs making the store durable (a flush
of RocksDB's memtables: ``storage.store``) and an fsync of the dump file.

Measured under full produce load on the 2-core bench machine (when the store
fsynced its write-ahead log here instead): 0.1-0.9 s per compaction, every few
seconds per node. Every replica compacts a group at the
same index, so at about the same moment. On the ticker thread that stalled
every Raft group of all three nodes at once; a stall near the election timeout
moved leaders.

So a store-backed group's compaction runs on the node's compaction thread
(``start``), and PySyncObj learns when it is done by polling ``check`` (its
``serializeChecker`` hook, on the ticker thread). ``check`` renames the new
dump into place on the ticker thread, so a snapshot the leader installed in the
meantime (``invalidate``) is never overwritten by an older one. Groups whose
state lives in memory still dump synchronously: their state must be copied
before the next apply changes it.

``pysyncobj_patches`` makes PySyncObj's ``Serializer`` leave the rename to
``check`` when a checker is configured.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, BinaryIO

from pysyncobj.config import SERIALIZER_STATE

from raft import snapshot

__all__ = ["Compaction"]

logger = logging.getLogger(__name__)


class Compaction:
    """At most one compaction of one group in flight; ``start``/``check``/``invalidate`` on the ticker thread."""

    def __init__(self, group_id: str, executor: Executor | None) -> None:
        self.group_id = group_id
        self._executor = executor
        self._job: Future[None] | None = None
        self._tmp_path = ""
        self._final_path = ""
        self._generation = 0  # bumped by every state install; a job of an older one is stale
        self._job_generation = 0
        self.completed = 0

    def start(
        self,
        final_path: str,
        raft_data: Any,
        state_index: int,
        make_durable: Callable[[], None] | None,
        write_body: Callable[[BinaryIO], None] | None,
    ) -> None:
        """Write the dump of ``state_index`` (after ``make_durable``) to a temporary file.

        ``write_body`` None: a light dump, written on the compaction thread.
        Otherwise the body is copied now, on the ticker thread.
        """
        tmp_path = final_path + ".tmp"

        def work() -> None:
            if make_durable is not None:
                make_durable()
            snapshot.write_snapshot(tmp_path, raft_data, state_index, write_body)

        self._tmp_path, self._final_path = tmp_path, final_path
        self._job_generation = self._generation
        if write_body is None and self._executor is not None:
            try:
                self._job = self._executor.submit(work)
                return
            except RuntimeError as e:  # the node is stopping: the executor is shut down
                self._job = _failed(e)
                return
        job: Future[None] = Future()
        try:
            work()
            job.set_result(None)
        except Exception as e:
            job.set_exception(e)
        self._job = job

    def check(self) -> int:
        """PySyncObj's ``serializeChecker``: a ``SERIALIZER_STATE``; renames a finished dump into place."""
        job = self._job
        if job is None:
            return int(SERIALIZER_STATE.NOT_SERIALIZING)
        if not job.done():
            return int(SERIALIZER_STATE.SERIALIZING)
        self._job = None
        exc = job.exception()
        if exc is not None:
            logger.error("group %r: log compaction failed: %s", self.group_id, exc, exc_info=exc)
            self._discard()
            return int(SERIALIZER_STATE.FAILED)
        if self._job_generation != self._generation:
            logger.info("group %r: a snapshot was installed during log compaction; its dump is dropped", self.group_id)
            self._discard()
            return int(SERIALIZER_STATE.FAILED)
        os.replace(self._tmp_path, self._final_path)
        self.completed += 1
        return int(SERIALIZER_STATE.SUCCESS)

    def invalidate(self) -> None:
        """The group's state was replaced (a snapshot was loaded): a compaction in flight is stale."""
        self._generation += 1

    def wait(self, timeout: float) -> None:
        """Let a compaction in flight end (before the group's store or files go away)."""
        job = self._job
        if job is None:
            return
        with contextlib.suppress(Exception):
            job.result(timeout)
        self._job = None
        self._discard()

    def _discard(self) -> None:
        with contextlib.suppress(OSError):
            os.remove(self._tmp_path)


def _failed(exc: BaseException) -> Future[None]:
    job: Future[None] = Future()
    job.set_exception(exc)
    return job
