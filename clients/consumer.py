"""``Consumer``: the blocking twin of ``clients.aio.AsyncConsumer`` (kafka-python's ``KafkaConsumer`` names).

A thin facade: the ``AsyncConsumer`` runs on a private event-loop thread
(``LoopThread``) and every method here waits for its coroutine there. The fetch
tasks (and a group member's heartbeats) keep running on that thread between
calls, so records for the next ``poll`` are prefetched while the application
processes the last one. One ``Consumer`` must be used from one thread at a
time, like kafka-python's.

Rebalance listener callbacks run in the thread that called ``poll`` (or
``close``/``unsubscribe``), as in kafka-python, not on the loop thread: the
coroutine waiting for a callback hands it to the calling thread, which runs
it and hands the outcome back. So a callback may call this consumer again
(``commit`` in ``on_partitions_revoked`` is the usual case) or block on
another client without stalling the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from ._loop_thread import LoopThread
from .aio._group import ConsumerRebalanceListener
from .aio.consumer import AsyncConsumer
from .protocol import BrokerError, ErrorCode
from .records import ConsumerGroupMetadata, ConsumerRecord, OffsetAndMetadata, TopicPartition

__all__ = ["Consumer", "ConsumerRebalanceListener"]

T = TypeVar("T")

# An item the loop thread hands to the calling thread: a callback to run, or None: "your call finished".
_Job = Callable[[], None] | None


class _CallerThreadListener(ConsumerRebalanceListener):
    """Runs the user's listener in the thread that is waiting in a ``Consumer`` call (module docstring)."""

    def __init__(self, consumer: Consumer, user: Any) -> None:
        self._consumer = consumer
        self._user = user

    async def _hop(self, method: str, partitions: set[TopicPartition]) -> None:
        fn: Callable[[set[TopicPartition]], Any] | None = getattr(self._user, method, None)
        if fn is None and method == "on_partitions_lost":
            fn = getattr(self._user, "on_partitions_revoked", None)
        if fn is None:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle(exc: BaseException | None) -> None:
            if done.done():
                return
            if exc is None:
                done.set_result(None)
            else:
                done.set_exception(exc)

        def job() -> None:
            try:
                fn(set(partitions))
            except BaseException as exc:
                loop.call_soon_threadsafe(settle, exc)
            else:
                loop.call_soon_threadsafe(settle, None)

        self._consumer._hand_to_caller(job)
        await done

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._hop("on_partitions_revoked", revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._hop("on_partitions_assigned", assigned)

    async def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        await self._hop("on_partitions_lost", lost)


class Consumer:
    """See ``AsyncConsumer`` for the arguments and semantics."""

    def __init__(self, bootstrap: str | Sequence[str], **config: Any) -> None:
        self._loop = LoopThread("txbroker-consumer")
        self._waiting: list[queue.SimpleQueue[_Job]] = []  # one per call in progress, innermost last
        try:
            self._consumer = self._loop.run(self._make(bootstrap, config))
        except BaseException:
            self._loop.stop()
            raise
        self._closed = False

    @staticmethod
    async def _make(bootstrap: str | Sequence[str], config: dict[str, Any]) -> AsyncConsumer:
        return AsyncConsumer(bootstrap, **config)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop thread; meanwhile run the listener callbacks it hands over, here."""
        if self._closed:
            coro.close()
            raise BrokerError(ErrorCode.INVALID_REQUEST, "the consumer is closed")
        jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._waiting.append(jobs)
        try:
            fut: concurrent.futures.Future[T] = self._loop.submit(coro)
            fut.add_done_callback(lambda _f: jobs.put(None))
            while (job := jobs.get()) is not None:
                job()
            return fut.result()
        finally:
            self._waiting.remove(jobs)

    def _hand_to_caller(self, job: Callable[[], None]) -> None:
        """Called on the loop thread: queue ``job`` for the innermost waiting call."""
        if not self._waiting:
            raise RuntimeError("a rebalance callback outside of a Consumer call")
        self._waiting[-1].put(job)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain AsyncConsumer method on the loop thread: it touches loop-owned state."""

        async def call() -> T:
            return fn(*args)

        return self._run(call())

    # ---- assignment, subscription and offsets ----------------------------------------------

    def assign(self, partitions: Iterable[Any]) -> None:
        self._call(self._consumer.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._call(self._consumer.assignment)

    def subscribe(
        self, topics: Iterable[str] = (), pattern: str | None = None, listener: ConsumerRebalanceListener | None = None
    ) -> None:
        wrapped = _CallerThreadListener(self, listener) if listener is not None else None
        names = [topics] if isinstance(topics, str) else list(topics)
        self._call(self._consumer.subscribe, names, pattern, wrapped)

    def subscription(self) -> set[str]:
        return self._call(self._consumer.subscription)

    def unsubscribe(self) -> None:
        self._run(self._consumer.unsubscribe())

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self._call(self._consumer.group_metadata)

    def enforce_rebalance(self) -> None:
        self._call(self._consumer.enforce_rebalance)

    def commit(self, offsets: Mapping[Any, Any] | None = None) -> None:
        self._run(self._consumer.commit(offsets))

    def committed_offsets(
        self, partitions: Iterable[Any], timeout_ms: float | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        return self._run(self._consumer.committed_offsets(list(partitions), timeout_ms))

    def committed(self, partition: Any, metadata: bool = False) -> int | OffsetAndMetadata | None:
        return self._run(self._consumer.committed(partition, metadata))

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self._run(self._consumer.partitions_for_topic(topic))

    # ---- positions ----------------------------------------------------------------------------

    def seek(self, partition: Any, offset: int) -> None:
        self._call(self._consumer.seek, partition, offset)

    def seek_to_beginning(self, *partitions: Any) -> None:
        self._call(self._consumer.seek_to_beginning, *partitions)

    def seek_to_end(self, *partitions: Any) -> None:
        self._call(self._consumer.seek_to_end, *partitions)

    def position(self, partition: Any, timeout_ms: float | None = None) -> int:
        return self._run(self._consumer.position(partition, timeout_ms))

    def beginning_offsets(self, partitions: Iterable[Any]) -> dict[TopicPartition, int]:
        return self._run(self._consumer.beginning_offsets(list(partitions)))

    def end_offsets(self, partitions: Iterable[Any]) -> dict[TopicPartition, int]:
        return self._run(self._consumer.end_offsets(list(partitions)))

    # ---- poll ------------------------------------------------------------------------------------

    def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        return self._run(self._consumer.poll(timeout_ms, max_records))

    def poll_by_partition(
        self, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        return self._run(self._consumer.poll_by_partition(timeout_ms, max_records))

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Records one by one; stops after ``consumer_timeout_ms`` without one (never, when None)."""
        timeout = self._consumer.consumer_timeout_ms
        while not self._closed:
            records = self.poll(1000.0 if timeout is None else timeout)
            if not records and timeout is not None:
                return
            yield from records

    # ---- lifecycle -----------------------------------------------------------------------------------

    def close(self, autocommit: bool = True) -> None:
        """Leave the group (auto-committing first unless ``autocommit=False``) and stop the loop thread."""
        if self._closed:
            return
        try:
            self._run(self._consumer.close(autocommit))
        finally:
            self._closed = True
            self._loop.stop()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
