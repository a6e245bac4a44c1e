"""``AsyncConsumer``: kafka-python's ``KafkaConsumer`` API for asyncio, over txbroker's HTTP fetch.

Partitions are assigned manually (``assign``); each assigned partition is
fetched by its own task in ``Fetcher`` (see there for prefetching, leader
changes and ``OFFSET_OUT_OF_RANGE``). ``poll`` returns records in offset order
per partition and never returns a record twice or skips one unless the
application seeks; the position only moves past a record once ``poll`` has
returned it.

Followers serve fetches too (committed data only, a little behind the
leader), so a leader that moves away is not reported by the fetch; the
metadata is re-read every ``metadata_max_age_ms`` (5 s, not Kafka's 5 min)
so reads return to the current leader soon after a leadership transfer.

Consumer groups (``subscribe``, ``commit``, ``committed``) need the group
coordinator, which this broker does not serve yet: those methods raise
``BrokerError(INVALID_REQUEST)`` instead of pretending to commit.

Use it from one task at a time; it is not thread-safe (the sync ``Consumer``
runs it on its own loop thread).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from .._fetch_decode import ISOLATION_LEVELS, Deserializer
from ..protocol import BrokerError, ErrorCode
from ..records import ConsumerRecord, TopicPartition
from ._fetcher import FetchConfig, Fetcher, OffsetResetStrategy, PartitionState
from ._metadata import MetadataCache
from ._session import HttpSession

__all__ = ["AsyncConsumer", "normalize_partitions"]

_NO_GROUPS = (
    "consumer groups are not served by this broker yet (no group coordinator): "
    "use assign() and seek() and keep positions yourself"
)


def normalize_partitions(tps: Iterable[Any]) -> list[TopicPartition]:
    """``("t", 0)``, kafka-python's ``TopicPartition`` or any ``(topic, partition)`` pair -> tuples."""
    out: list[TopicPartition] = []
    for tp in tps:
        try:
            topic, partition = tp
        except (TypeError, ValueError):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"not a (topic, partition) pair: {tp!r}") from None
        if not isinstance(topic, str) or isinstance(partition, bool) or not isinstance(partition, int):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"not a (topic, partition) pair: {tp!r}")
        if (topic, partition) not in out:
            out.append((topic, partition))
    return out


class AsyncConsumer:
    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        group_id: str | None = None,
        client_id: str | None = None,
        isolation_level: str = "read_uncommitted",
        auto_offset_reset: str = "latest",
        enable_auto_commit: bool = False,
        fetch_max_bytes: int = 52_428_800,
        max_partition_fetch_bytes: int = 1_048_576,
        fetch_max_wait_ms: int = 500,
        max_poll_records: int = 500,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        metadata_max_age_ms: int = 5_000,
        consumer_timeout_ms: float | None = None,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
    ) -> None:
        if isolation_level not in ISOLATION_LEVELS:
            raise BrokerError(
                ErrorCode.INVALID_CONFIG, f"isolation_level must be one of {ISOLATION_LEVELS}, not {isolation_level!r}"
            )
        for name, value in (
            ("fetch_max_bytes", fetch_max_bytes),
            ("max_partition_fetch_bytes", max_partition_fetch_bytes),
            ("max_poll_records", max_poll_records),
            ("request_timeout_ms", request_timeout_ms),
        ):
            if value < 1:
                raise BrokerError(ErrorCode.INVALID_CONFIG, f"{name} must be positive, not {value}")
        if fetch_max_wait_ms < 0 or retry_backoff_ms < 0:
            raise BrokerError(ErrorCode.INVALID_CONFIG, "fetch_max_wait_ms and retry_backoff_ms must be >= 0")
        if enable_auto_commit and group_id is not None:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "enable_auto_commit: " + _NO_GROUPS)
        self.group_id = group_id
        self.client_id = client_id
        self.isolation_level = isolation_level
        self.max_poll_records = max_poll_records
        self.request_timeout_ms = request_timeout_ms
        self.consumer_timeout_ms = consumer_timeout_ms
        # Every assigned partition parks one long poll on a connection: a small pool would queue them.
        self._session = HttpSession(request_timeout_ms=request_timeout_ms, max_connections=256)
        self._metadata = MetadataCache(self._session, bootstrap, metadata_max_age_ms=metadata_max_age_ms)
        self._fetcher = Fetcher(
            self._session,
            self._metadata,
            FetchConfig(
                isolation_level=isolation_level,
                auto_offset_reset=OffsetResetStrategy.parse(auto_offset_reset),
                fetch_max_bytes=fetch_max_bytes,
                max_partition_fetch_bytes=max_partition_fetch_bytes,
                fetch_max_wait_ms=fetch_max_wait_ms,
                request_timeout_ms=request_timeout_ms,
                retry_backoff_ms=retry_backoff_ms,
                key_deserializer=key_deserializer,
                value_deserializer=value_deserializer,
            ),
        )
        self._assignment: list[TopicPartition] = []
        self._next_drain = 0
        self._closed = False

    # ---- assignment --------------------------------------------------------------------------

    def assign(self, partitions: Iterable[Any]) -> None:
        """Read exactly these partitions (replaces the previous assignment; kept ones keep their position)."""
        self._check_open()
        tps = normalize_partitions(partitions)
        self._assignment = tps
        self._fetcher.set_assignment(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None, listener: Any = None) -> None:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "subscribe(): " + _NO_GROUPS)

    def unsubscribe(self) -> None:
        """Drop every assigned partition (kafka-python clears a manual assignment this way too)."""
        self.assign([])

    async def commit(self, offsets: dict[TopicPartition, Any] | None = None) -> None:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "commit(): " + _NO_GROUPS)

    async def committed(self, partition: TopicPartition) -> int | None:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "committed(): " + _NO_GROUPS)

    async def partitions_for_topic(self, topic: str) -> set[int]:
        """The topic's partition ids (``UNKNOWN_TOPIC_OR_PARTITION`` if it does not exist)."""
        return set(range(await self._metadata.partition_count(topic)))

    # ---- positions ------------------------------------------------------------------------------

    def _state(self, partition: Any) -> PartitionState:
        (tp,) = normalize_partitions([partition])
        st = self._fetcher.states.get(tp)
        if st is None:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"{tp[0]}-{tp[1]} is not assigned to this consumer")
        return st

    def seek(self, partition: Any, offset: int) -> None:
        """Make the next ``poll`` start at ``offset`` (validated by the broker on the next fetch)."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"offset must be a non-negative integer, not {offset!r}")
        self._fetcher.seek(self._state(partition).tp, offset)

    def seek_to_beginning(self, *partitions: Any) -> None:
        """Reset to the log start offset, resolved lazily (on ``position`` or the next fetch), as in Kafka."""
        for st in self._states_or_all(partitions):
            self._fetcher.seek(st.tp, None, OffsetResetStrategy.EARLIEST)

    def seek_to_end(self, *partitions: Any) -> None:
        """Reset to the high watermark (last stable offset under read_committed), resolved lazily."""
        for st in self._states_or_all(partitions):
            self._fetcher.seek(st.tp, None, OffsetResetStrategy.LATEST)

    def _states_or_all(self, partitions: Sequence[Any]) -> list[PartitionState]:
        if not partitions:
            return list(self._fetcher.states.values())
        return [self._state(p) for p in partitions]

    async def position(self, partition: Any, timeout_ms: float | None = None) -> int:
        """Offset of the next record ``poll`` returns for ``partition``; resolves a pending reset first."""
        self._check_open()
        timeout = (self.request_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        return await self._fetcher.position(self._state(partition), timeout)

    async def beginning_offsets(self, partitions: Iterable[Any]) -> dict[TopicPartition, int]:
        return await self._list_offsets(partitions, OffsetResetStrategy.EARLIEST)

    async def end_offsets(self, partitions: Iterable[Any]) -> dict[TopicPartition, int]:
        """High watermarks (last stable offsets under read_committed), as kafka-python's ``end_offsets``."""
        return await self._list_offsets(partitions, OffsetResetStrategy.LATEST)

    async def _list_offsets(
        self, partitions: Iterable[Any], strategy: OffsetResetStrategy
    ) -> dict[TopicPartition, int]:
        tps = normalize_partitions(partitions)
        sts = [self._fetcher.states.get(tp) or PartitionState(tp) for tp in tps]
        timeout = self.request_timeout_ms / 1000
        lookup = self._fetcher.reset_offset
        found = await asyncio.gather(
            *(self._fetcher.retrying(functools.partial(lookup, st, strategy), timeout) for st in sts)
        )
        return dict(zip(tps, found, strict=True))

    # ---- poll --------------------------------------------------------------------------------------

    async def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records fetched since the last poll, waiting up to ``timeout_ms`` for the first one.

        Returns at most ``max_records`` (default ``max_poll_records``), in offset
        order within each partition; partitions are visited round-robin so
        one busy partition cannot starve the others.
        """
        self._check_open()
        limit = self.max_poll_records if max_records is None else max_records
        if limit < 1:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"max_records must be positive, not {limit}")
        fetcher = self._fetcher
        fetcher.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_ms) / 1000
        while True:
            fetcher.data_ready.clear()
            states = list(fetcher.states.values())
            if states:
                k = self._next_drain % len(states)
                self._next_drain = k + 1
                records = fetcher.drain(states[k:] + states[:k], limit)
                if records:
                    return records
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            try:
                async with asyncio.timeout(remaining):
                    await fetcher.data_ready.wait()
            except TimeoutError:
                pass

    async def poll_by_partition(
        self, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """kafka-python's ``poll`` shape: the same records grouped by partition."""
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for r in await self.poll(timeout_ms, max_records):
            out.setdefault((r.topic, r.partition), []).append(r)
        return out

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ConsumerRecord]:
        """Records one by one; stops after ``consumer_timeout_ms`` without one (never, when None)."""
        timeout = self.consumer_timeout_ms
        while not self._closed:
            records = await self.poll(1000.0 if timeout is None else timeout)
            if not records and timeout is not None:
                return
            for r in records:
                yield r

    # ---- lifecycle ---------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "the consumer is closed")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._fetcher.close()
        await self._session.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
