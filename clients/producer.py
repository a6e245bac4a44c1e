"""``Producer``: the thread-friendly face of ``clients.aio.AsyncProducer`` (kafka-python's ``KafkaProducer``).

One ``AsyncProducer`` runs on a private event-loop thread (``LoopThread``);
this class only moves records to it. ``send`` serializes and checks the record
in the caller's thread, reserves ``buffer_memory`` (blocking at most
``max_block_ms`` when it is used up, as Kafka's ``send`` does), and appends it
to a hand-off queue that the loop thread drains in order; one wake-up covers
every record queued before the loop gets to run, so a burst of ``send`` calls
costs no cross-thread call per record.

``send`` returns a ``concurrent.futures.Future`` of ``RecordMetadata``;
``callback(metadata, exception)`` runs on the producer's loop thread (as a
Java producer callback runs on its I/O thread): keep it short and do not call
``flush``/``close`` from it.

Transactions: ``init_transactions``, ``begin_transaction``,
``commit_transaction``, ``commit_and_begin``, ``abort_transaction``,
``send_offsets_to_transaction`` and ``prepare_transaction`` run on the loop thread, each after every record
handed off before it is in the accumulator (a record sent before
``commit_transaction`` belongs to the committed transaction).

Thread-safety: ``send``, ``flush`` and ``close`` may be called from any
thread; the transactional methods from one thread at a time. Lock order:
only ``_cond`` (memory accounting), never held while calling into the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from ._loop_thread import LoopThread
from .aio._batch import BATCH_OVERHEAD, DeliveryTimeoutError, add_callback
from .aio._pipelined_commit import copy_outcome
from .aio.batch_builder import BatchBuilder
from .aio.producer import AsyncProducer, Callback
from .protocol import BrokerError, ErrorCode
from .records import ConsumerGroupMetadata, OffsetAndMetadata, PreparedTransaction, RecordMetadata, TopicPartition

__all__ = ["Producer"]

log = logging.getLogger("clients.producer")

T = TypeVar("T")

_Item = tuple[
    str, int | None, bytes | None, bytes | None, bytes, int, int | None, "concurrent.futures.Future[RecordMetadata]"
]


class Producer:
    """Kafka-style producer for threaded code; every option is ``AsyncProducer``'s."""

    def __init__(self, bootstrap: str | Sequence[str], **config: Any) -> None:
        self._buffer_memory = int(config.get("buffer_memory", 32 * 1024 * 1024))
        self._max_block_s = int(config.get("max_block_ms", 60_000)) / 1000
        self._cond = threading.Condition()
        self._pending_bytes = 0  # reserved by send(), released when the record's batch is reported
        self._handoff: deque[_Item] = deque()
        self._wakeup_pending = False
        self._pump_task: asyncio.Task[None] | None = None
        self._closed = False
        self._producer = AsyncProducer(bootstrap, _on_release=self._release, **config)
        self._lt = LoopThread("txbroker-producer")

    # ---- public API ----------------------------------------------------------------------------

    @property
    def producer_id(self) -> int:
        return self._producer.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._producer.producer_epoch

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        timestamp_ms: int | None = None,
        callback: Callback | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; the future resolves to its ``RecordMetadata`` once acknowledged."""
        if self._closed:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "send() after close()")
        kb, vb, hb, nbytes = self._producer.serialize(key, value, headers)
        self._reserve(nbytes)
        fut: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        fut.set_running_or_notify_cancel()  # the record is on its way: it can no longer be cancelled
        if callback is not None:
            add_callback(fut, callback, log.error)
        self._handoff.append((topic, partition, kb, vb, hb, nbytes, timestamp_ms, fut))
        if not self._wakeup_pending:
            self._wakeup_pending = True
            self._lt.call_soon(self._start_pump)
        return fut

    def create_batch(self) -> BatchBuilder:
        """An empty ``BatchBuilder`` for ``send_batch`` (see ``clients.aio.batch_builder``)."""
        return self._producer.create_batch()

    def send_batch(
        self, batch: BatchBuilder, topic: str, *, partition: int
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue ``batch`` after every record sent before it; the future resolves to its first record's metadata.

        Blocks like ``send`` while ``buffer_memory`` is used up; errors in the
        request itself (closed producer, unknown partition) raise here.
        """
        if self._closed:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "send_batch() after close()")
        nbytes = batch.size() - BATCH_OVERHEAD
        self._reserve(nbytes)
        out: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        out.set_running_or_notify_cancel()
        try:
            self._lt.run(self._after_handoff(self._send_batch(batch, topic, partition, out), None))
        except BaseException:
            self._release(nbytes)
            raise
        return out

    def partitions_for(self, topic: str) -> set[int]:
        return self._lt.run(self._producer.partitions_for(topic))

    def flush(self, timeout: float | None = None) -> None:
        """Block until every record sent so far is acknowledged or failed (``REQUEST_TIMED_OUT`` after timeout)."""
        self._lt.run(self._flush(timeout))

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued (at most ``timeout`` s, else fail the rest) and stop the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._close(timeout))
        finally:
            self._lt.stop()

    def metrics(self) -> dict[str, Any]:
        return self._lt.run(self._metrics())

    # ---- transactions (semantics: AsyncProducer) ----------------------------------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        self._lt.run(self._producer.init_transactions(timeout))

    def begin_transaction(self) -> None:
        self._lt.run(self._begin())

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._lt.run(self._after_handoff(self._producer.commit_transaction(timeout), timeout))

    def commit_and_begin(self, timeout: float | None = None) -> concurrent.futures.Future[None]:
        """``AsyncProducer.commit_and_begin``: records sent before it are committed, records sent after it
        belong to the next transaction; returns at once with the commit's outcome as a future."""
        out: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._lt.run(self._commit_and_begin(timeout, out))
        return out

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._lt.run(self._after_handoff(self._producer.abort_transaction(timeout), timeout))

    def prepare_transaction(self, group_id: str | None = None, timeout: float | None = None) -> PreparedTransaction:
        return self._lt.run(self._after_handoff(self._producer.prepare_transaction(group_id, timeout), timeout))

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        group_id: str | ConsumerGroupMetadata,
        timeout: float | None = None,
    ) -> None:
        self._lt.run(self._producer.send_offsets_to_transaction(offsets, group_id, timeout))

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ---- memory --------------------------------------------------------------------------------

    def _reserve(self, nbytes: int) -> None:
        with self._cond:
            if self._pending_bytes + nbytes > self._buffer_memory and self._pending_bytes > 0:
                deadline = time.monotonic() + self._max_block_s
                while self._pending_bytes + nbytes > self._buffer_memory and self._pending_bytes > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BrokerError(
                            ErrorCode.REQUEST_TIMED_OUT,
                            f"buffer_memory={self._buffer_memory} still full after max_block_ms",
                        )
                    self._cond.wait(left)
            self._pending_bytes += nbytes

    def _release(self, nbytes: int) -> None:
        with self._cond:
            self._pending_bytes -= nbytes
            self._cond.notify_all()

    # ---- loop thread -----------------------------------------------------------------------------

    def _start_pump(self) -> None:
        if self._pump_task is None or self._pump_task.done():
            self._pump_task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        """Move handed-off records into the accumulator, in send order."""
        p = self._producer
        p.ensure_started()
        handoff = self._handoff
        while True:
            while handoff:
                topic, partition, kb, vb, hb, nbytes, ts, fut = handoff.popleft()
                try:
                    n = p.cached_partition_count(topic) or 0
                    if not n or (partition is not None and partition >= n):  # a partition it may just have gained
                        n = await p.wait_for_topic(topic, partition)
                    if p.append(topic, partition, kb, vb, hb, nbytes, ts, fut, n):
                        await asyncio.sleep(0)  # a batch filled up: let the sender ship it
                except BrokerError as exc:
                    self._fail(fut, nbytes, exc)
                except asyncio.CancelledError:
                    self._fail(fut, nbytes, DeliveryTimeoutError("producer closed", maybe_written=False))
                    raise
            # Reset before the last look: a send() after this line sees False and schedules a new pump.
            self._wakeup_pending = False
            if not handoff:
                return

    def _fail(self, fut: concurrent.futures.Future[RecordMetadata], nbytes: int, exc: BrokerError) -> None:
        if not fut.done():
            fut.set_exception(exc)
        self._release(nbytes)

    async def _drain_handoff(self, timeout: float | None) -> None:
        """Wait until every handed-off record is in the accumulator (at most ``timeout`` s)."""
        async with asyncio.timeout(timeout):
            while self._handoff or (self._pump_task is not None and not self._pump_task.done()):
                if self._pump_task is None or self._pump_task.done():
                    self._start_pump()
                assert self._pump_task is not None
                await asyncio.shield(self._pump_task)

    async def _flush(self, timeout: float | None) -> None:
        start = time.monotonic()
        try:
            await self._drain_handoff(timeout)
        except TimeoutError as exc:
            raise BrokerError(
                ErrorCode.REQUEST_TIMED_OUT, f"flush: records still waiting for metadata after {timeout}s"
            ) from exc
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        await self._producer.flush(left)

    async def _close(self, timeout: float | None) -> None:
        start = time.monotonic()
        try:
            await self._drain_handoff(timeout)
        except TimeoutError:
            if self._pump_task is not None:
                self._pump_task.cancel()
                await asyncio.gather(self._pump_task, return_exceptions=True)
            while self._handoff:
                *_, nbytes, _, fut = self._handoff.popleft()
                self._fail(fut, nbytes, DeliveryTimeoutError("producer closed", maybe_written=False))
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        await self._producer.close(left)

    async def _send_batch(
        self, batch: BatchBuilder, topic: str, partition: int, out: concurrent.futures.Future[RecordMetadata]
    ) -> None:
        fut = await self._producer.send_batch(batch, topic, partition=partition)

        def done(f: asyncio.Future[RecordMetadata]) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(f.result())

        fut.add_done_callback(done)

    async def _commit_and_begin(self, timeout: float | None, out: concurrent.futures.Future[None]) -> None:
        outcome = await self._after_handoff(self._producer.commit_and_begin(timeout), timeout)
        outcome.add_done_callback(functools.partial(copy_outcome, dst=out))

    async def _metrics(self) -> dict[str, Any]:
        return self._producer.metrics()

    async def _begin(self) -> None:
        self._producer.begin_transaction()

    async def _after_handoff(self, op: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run ``op`` once every record handed off so far is in the accumulator (or failed)."""
        try:
            await self._drain_handoff(timeout)
        except TimeoutError as exc:
            op.close()
            raise BrokerError(
                ErrorCode.REQUEST_TIMED_OUT, f"records still waiting for metadata after {timeout}s"
            ) from exc
        return await op
