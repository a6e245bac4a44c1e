"""``BatchReports``: what waits for the accumulator to report batches (``buffer_memory`` and ``flush``).

A batch is **reported** once its futures are completed, acknowledged or
failed (``RecordAccumulator.on_report``). Two waits end on reports:

* **buffer memory** (Kafka's ``BufferPool`` wait): ``send`` suspends, at
  most ``max_block_ms``, while its record does not fit in ``buffer_memory``
  beside the bytes still buffered. A record always fits into an empty
  buffer, so one record larger than what is free never waits forever.
* **flush** (Kafka's ``awaitFlushCompletion``): waits for a fixed set of
  batches, those unreported when it started, while the accumulator's
  ``flushing`` count makes their lingering batches sendable at once.

Every report also gives the batch's bytes back to ``on_release`` (the sync
facade's own ``buffer_memory`` count). Event-loop only; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..protocol import BrokerError, ErrorCode
from ._accumulator import RecordAccumulator
from ._batch import BATCH_OVERHEAD, ProducerBatch

__all__ = ["BatchReports"]

log = logging.getLogger("clients.producer")


class BatchReports:
    """The waits on batch reports of one producer; ``reported`` is the accumulator's ``on_report``.

    ``wake`` makes the sender look at the accumulator again: a waiter changes
    what it may send (``memory_waiters`` and ``flushing`` end lingering).
    """

    def __init__(
        self,
        acc: RecordAccumulator,
        *,
        buffer_memory: int,
        max_block_s: float,
        wake: Callable[[], None],
        on_release: Callable[[int], None] | None,
    ) -> None:
        self._acc = acc
        self._buffer_memory = buffer_memory
        self._max_block_s = max_block_s
        self._wake = wake
        self._on_release = on_release
        self._memory_freed = asyncio.Event()
        self._flush_waiters: list[tuple[set[ProducerBatch], asyncio.Future[None]]] = []

    def reported(self, batch: ProducerBatch) -> None:
        if batch.failure is not None:
            log.warning(
                "%d record(s) to %s-%d failed: %s", batch.record_count, batch.topic, batch.partition, batch.failure
            )
        self._memory_freed.set()
        for pending, fut in self._flush_waiters:
            pending.discard(batch)
            if not pending and not fut.done():
                fut.set_result(None)
        if self._on_release is not None:
            self._on_release(batch.size - BATCH_OVERHEAD)

    def lacks_room(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more would overflow ``buffer_memory`` (never when nothing is buffered)."""
        buffered = self._acc.buffered_bytes
        return buffered + nbytes > self._buffer_memory and buffered > 0

    async def wait_for_room(self, nbytes: int, check_open: Callable[[], None]) -> None:
        """Until ``nbytes`` fit; ``check_open`` runs after every report (the producer may have failed meanwhile)."""
        acc = self._acc
        acc.memory_waiters += 1
        self._wake()
        try:
            async with asyncio.timeout(self._max_block_s):
                while self.lacks_room(nbytes):
                    self._memory_freed.clear()
                    await self._memory_freed.wait()
                    check_open()
        except TimeoutError as exc:
            raise BrokerError(
                ErrorCode.REQUEST_TIMED_OUT, f"buffer_memory={self._buffer_memory} still full after max_block_ms"
            ) from exc
        finally:
            acc.memory_waiters -= 1

    async def flush(self, timeout: float | None, *, held: bool = True) -> None:
        """Until every batch unreported now is reported; ``held=False`` leaves out a pipelined commit's next
        transaction's batches. Raises ``REQUEST_TIMED_OUT`` after ``timeout`` seconds."""
        pending = set(self._acc.unreported(held=held))
        if not pending:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (pending, fut)
        self._flush_waiters.append(waiter)
        self._acc.flushing += 1
        self._wake()
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError as exc:
            raise BrokerError(
                ErrorCode.REQUEST_TIMED_OUT, f"flush: {len(pending)} batch(es) not done within {timeout}s"
            ) from exc
        finally:
            self._acc.flushing -= 1
            self._flush_waiters.remove(waiter)
