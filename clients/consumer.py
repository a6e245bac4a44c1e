"""``Consumer``: the blocking twin of ``clients.aio.AsyncConsumer`` (kafka-python's ``KafkaConsumer`` names).

A thin facade: the ``AsyncConsumer`` runs on a private event-loop thread
(``LoopThread``) and every method here waits for its coroutine there. The fetch
tasks keep running on that thread between calls, so records for the next
``poll`` are prefetched while the application processes the last one.
One ``Consumer`` must be used from one thread at a time, like kafka-python's.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from ._loop_thread import LoopThread
from .aio.consumer import AsyncConsumer
from .protocol import BrokerError, ErrorCode
from .records import ConsumerRecord, TopicPartition

__all__ = ["Consumer"]

T = TypeVar("T")


class Consumer:
    """See ``AsyncConsumer`` for the arguments and semantics."""

    def __init__(self, bootstrap: str | Sequence[str], **config: Any) -> None:
        self._loop = LoopThread("txbroker-consumer")
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
        if self._closed:
            coro.close()
            raise BrokerError(ErrorCode.INVALID_REQUEST, "the consumer is closed")
        return self._loop.run(coro)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain AsyncConsumer method on the loop thread: it touches loop-owned state."""

        async def call() -> T:
            return fn(*args)

        return self._run(call())

    # ---- assignment and positions ---------------------------------------------------------

    def assign(self, partitions: Iterable[Any]) -> None:
        self._call(self._consumer.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._call(self._consumer.assignment)

    def unsubscribe(self) -> None:
        self._call(self._consumer.unsubscribe)

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None, listener: Any = None) -> None:
        self._call(self._consumer.subscribe, topics, pattern, listener)

    def commit(self, offsets: dict[TopicPartition, Any] | None = None) -> None:
        self._run(self._consumer.commit(offsets))

    def committed(self, partition: TopicPartition) -> int | None:
        return self._run(self._consumer.committed(partition))

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self._run(self._consumer.partitions_for_topic(topic))

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

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._loop.run(self._consumer.close())
        finally:
            self._closed = True
            self._loop.stop()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
