"""The consumer's fetch pipeline: one fetch task per assigned partition, prefetching into a buffer.

Like Kafka's ``Fetcher``: every assigned partition keeps one fetch in flight
(its own long-poll against the partition leader, so partitions on different
brokers are read in parallel) and the responses queue up as *completed
fetches* that ``poll()`` drains. A partition stops fetching while it has
``MAX_BUFFERED_FETCHES`` completed fetches waiting or the whole buffer holds
``fetch_max_bytes``; that bound is what lets the consumer read ahead while the
application processes the previous ``poll()``.

Terms (per partition): the *position* is the offset of the next record
``poll()`` returns; the *fetch offset* is where the fetch task reads next,
at or ahead of the position by what is buffered. ``seek`` moves the position,
drops the buffer and restarts the task (its *generation* changes, so a result
of the old task can never be delivered).

Where: the partition leader by default (a node that does not lead the
partition answers ``NOT_LEADER_OR_FOLLOWER`` with the leader's URL, which the
next fetch follows). With ``read_replica="any"`` (a follower read) the fetch
goes to a replica among the bootstrap URLs (the first listed that holds one:
the local node), else to the leader; after a failed follower read the
partition reads from its leader for ``REPLICA_RETRY_S``.

Errors: retriable ones (leader moved, node down, timeouts) refresh metadata
and retry after ``retry_backoff_ms``, invisibly to the caller.
``OFFSET_OUT_OF_RANGE`` applies ``auto_offset_reset``, except when the fetch
offset is at or below a high watermark this consumer has already seen: then
the answering replica is a new leader still applying committed entries, and
the fetch is retried. Other errors are queued behind the records fetched
before them and raised by ``poll()``.

All state is owned by the event loop the consumer runs on; nothing here is
thread-safe.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from urllib.parse import quote

from .._fetch_decode import READ_COMMITTED, DecodedFetch, Deserializer, decode_fetch
from ..protocol import BATCHES_CONTENT_TYPE, BrokerError, ErrorCode, decode_fetch_batches
from ..records import ConsumerRecord, TopicPartition
from ._metadata import MetadataCache
from ._session import HttpSession

log = logging.getLogger(__name__)

MAX_BUFFERED_FETCHES = 2
READ_REPLICAS = ("leader", "any")
REPLICA_RETRY_S = 5.0  # how long a partition reads from its leader after a failed follower read


class OffsetResetStrategy(enum.Enum):
    """Where a partition without a valid position starts (Kafka's ``auto.offset.reset``)."""

    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"

    @classmethod
    def parse(cls, value: str) -> OffsetResetStrategy:
        aliases = {"smallest": "earliest", "largest": "latest"}  # kafka-python's legacy names
        try:
            return cls(aliases.get(value, value))
        except ValueError:
            raise BrokerError(
                ErrorCode.INVALID_CONFIG, f"auto_offset_reset must be earliest, latest or none, not {value!r}"
            ) from None


@dataclass(slots=True)
class CompletedFetch:
    records: list[ConsumerRecord]
    next_offset: int
    size_bytes: int
    drained: int = 0


@dataclass(slots=True)
class PartitionState:
    """One assigned partition: its position, pending reset, buffer and fetch task."""

    tp: TopicPartition
    position: int | None = None
    reset: OffsetResetStrategy | None = None
    buffer: deque[CompletedFetch | BrokerError] = field(default_factory=deque)
    max_seen_hw: int = -1
    generation: int = 0
    task: asyncio.Task[None] | None = None
    space: asyncio.Event = field(default_factory=asyncio.Event)
    resolving: asyncio.Lock = field(default_factory=asyncio.Lock)
    leader_only_until: float = 0.0  # read_replica="any": read from the leader until then (loop time)


@dataclass(frozen=True, slots=True)
class FetchConfig:
    isolation_level: str
    auto_offset_reset: OffsetResetStrategy
    fetch_max_bytes: int
    max_partition_fetch_bytes: int
    fetch_max_wait_ms: int
    request_timeout_ms: int
    retry_backoff_ms: int
    key_deserializer: Deserializer | None
    value_deserializer: Deserializer | None
    read_replica: str = "leader"


class Fetcher:
    def __init__(self, session: HttpSession, metadata: MetadataCache, config: FetchConfig) -> None:
        self._session = session
        self._metadata = metadata
        self._config = config
        self.states: dict[TopicPartition, PartitionState] = {}
        self.data_ready = asyncio.Event()
        self.buffered_bytes = 0

    # ---- assignment and positions (called by the consumer) ---------------------------------

    def set_assignment(self, tps: list[TopicPartition]) -> None:
        keep = set(tps)
        for tp in [t for t in self.states if t not in keep]:
            self._stop(self.states.pop(tp))
        for tp in tps:
            if tp not in self.states:
                self.states[tp] = PartitionState(tp)

    def seek(self, tp: TopicPartition, offset: int | None, reset: OffsetResetStrategy | None = None) -> None:
        """Move the position (or mark it for a reset): drop the buffer and restart the fetch task."""
        st = self.states[tp]
        self._stop(st)
        st.position, st.reset = offset, reset

    def start(self, exclude: Collection[TopicPartition] = ()) -> None:
        """Start a fetch task for every assigned partition that has none running.

        ``exclude``: partitions whose position is not known yet and must not
        fall back to ``auto_offset_reset`` (a group member waiting for its
        committed offsets). A task only ends by cancellation; one that died of
        a bug is reported (as a ``BrokerError``) and restarted by the next call.
        """
        for st in self.states.values():
            if st.tp in exclude:
                continue
            crashed = st.task is not None and st.task.done() and not st.task.cancelled() and st.task.exception()
            if st.task is None or st.task.done():
                st.task = asyncio.get_running_loop().create_task(self._run(st, st.generation))
            if crashed:
                raise BrokerError(
                    ErrorCode.UNKNOWN_SERVER_ERROR, f"fetching {st.tp[0]}-{st.tp[1]} failed: {crashed!r}"
                ) from crashed

    async def close(self) -> None:
        tasks = [st.task for st in self.states.values() if st.task is not None]
        for st in self.states.values():
            self._stop(st)
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop(self, st: PartitionState) -> None:
        st.generation += 1
        if st.task is not None:
            st.task.cancel()
            st.task = None
        self.buffered_bytes -= sum(f.size_bytes for f in st.buffer if isinstance(f, CompletedFetch))
        st.buffer.clear()

    async def position(self, st: PartitionState, timeout_s: float | None) -> int:
        """The partition's position, resolving a pending reset (``auto_offset_reset`` by default).

        Waits at most ``timeout_s`` (None: until resolved), also for a resolution
        the partition's fetch task already started; then ``REQUEST_TIMED_OUT``.
        """
        if st.position is not None:
            return st.position
        try:
            async with asyncio.timeout(timeout_s), st.resolving:
                if st.position is not None:
                    return st.position
                generation = st.generation
                strategy = st.reset or self._config.auto_offset_reset
                if strategy is OffsetResetStrategy.NONE:
                    raise BrokerError(
                        ErrorCode.OFFSET_OUT_OF_RANGE,
                        f"{st.tp[0]}-{st.tp[1]} has no position and auto_offset_reset is 'none'; seek first",
                    )
                offset = await self.retrying(lambda: self.reset_offset(st, strategy), None)
                if generation == st.generation and st.position is None:  # a seek meanwhile wins
                    st.position, st.reset = offset, None
                return st.position if st.position is not None else offset
        except TimeoutError as exc:
            raise BrokerError(
                ErrorCode.REQUEST_TIMED_OUT, f"no position for {st.tp[0]}-{st.tp[1]} within {timeout_s}s"
            ) from exc

    async def reset_offset(self, st: PartitionState, strategy: OffsetResetStrategy) -> int:
        """The earliest or latest offset per the partition leader (Kafka's ListOffsets).

        Latest is the high watermark, or the last stable offset under read_committed.
        """
        topic, partition = st.tp
        url = await self._metadata.leader_url(topic, partition)
        body = await self._session.request_json("GET", f"{url}/v1/topics/{quote(topic, safe='')}")
        parts = {int(p["partition"]): p for p in body.get("partitions", [])}
        if partition not in parts:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
        p = parts[partition]
        hw = int(p["high_watermark"])
        if hw < 0:  # the answering node holds no replica and knows no value: ask again
            self._metadata.invalidate(topic, partition)
            raise BrokerError(ErrorCode.LEADER_NOT_AVAILABLE, f"no offsets for {topic}-{partition} yet")
        st.max_seen_hw = max(st.max_seen_hw, hw)
        if strategy is OffsetResetStrategy.EARLIEST:
            return int(p["log_start_offset"])
        return int(p["last_stable_offset"]) if self._config.isolation_level == READ_COMMITTED else hw

    # ---- draining (called by poll) ---------------------------------------------------------------

    def drain(self, order: list[PartitionState], max_records: int) -> list[ConsumerRecord]:
        """Take up to ``max_records`` buffered records, visiting partitions in ``order``.

        A queued error is raised once the records fetched before it have been
        returned (by this call or an earlier one).
        """
        out: list[ConsumerRecord] = []
        for st in order:
            while st.buffer and len(out) < max_records:
                head = st.buffer[0]
                if isinstance(head, BrokerError):
                    if out:
                        return out
                    st.buffer.popleft()
                    self._wake()
                    raise head
                take = head.records[head.drained : head.drained + max_records - len(out)]
                out.extend(take)
                head.drained += len(take)
                if take:
                    st.position = take[-1].offset + 1
                if head.drained >= len(head.records):
                    st.buffer.popleft()
                    st.position = head.next_offset
                    self.buffered_bytes -= head.size_bytes
                    self._wake()
            if len(out) >= max_records:
                break
        return out

    def _wake(self) -> None:
        for st in self.states.values():
            st.space.set()

    def _has_space(self, st: PartitionState) -> bool:
        return len(st.buffer) < MAX_BUFFERED_FETCHES and self.buffered_bytes < self._config.fetch_max_bytes

    def _enqueue(self, st: PartitionState, item: CompletedFetch | BrokerError) -> None:
        st.buffer.append(item)
        if isinstance(item, CompletedFetch):
            self.buffered_bytes += item.size_bytes
        self.data_ready.set()

    # ---- the per-partition fetch task -----------------------------------------------------------

    async def _run(self, st: PartitionState, generation: int) -> None:
        backoff = self._config.retry_backoff_ms / 1000
        while True:
            try:
                offset = await self.position(st, None)
                break
            except BrokerError as exc:
                if exc.retriable:
                    await asyncio.sleep(backoff)
                    continue
                await self._raise_to_poll(st, exc)
        while generation == st.generation:
            while not self._has_space(st):
                st.space.clear()
                await st.space.wait()
            try:
                fetched = await self._fetch(st, offset)
            except BrokerError as exc:
                offset = await self._on_error(st, offset, exc)
                continue
            if fetched.records or fetched.next_offset != offset:
                self._enqueue(st, CompletedFetch(fetched.records, fetched.next_offset, fetched.size_bytes))
            offset = fetched.next_offset
            if fetched.error is not None:
                await self._raise_to_poll(st, fetched.error)

    async def _fetch(self, st: PartitionState, offset: int) -> DecodedFetch:
        cfg = self._config
        topic, partition = st.tp
        url = await self._fetch_url(st)
        query = (
            f"offset={offset}&max_bytes={cfg.max_partition_fetch_bytes}&max_wait_ms={cfg.fetch_max_wait_ms}"
            f"&isolation={cfg.isolation_level}&format=binary"
        )
        if cfg.read_replica == "any":
            query += "&read_replica=any"
        path = f"/v1/topics/{quote(topic, safe='')}/partitions/{partition}/records?{query}"
        timeout = (cfg.request_timeout_ms + cfg.fetch_max_wait_ms) / 1000
        ctype, raw = await self._session.request("GET", url + path, timeout=timeout)
        if ctype != BATCHES_CONTENT_TYPE:
            raise BrokerError(ErrorCode.CORRUPT_MESSAGE, f"fetch from {url} answered {ctype}, not binary batches")
        try:
            batches = decode_fetch_batches(raw)
            fetched = decode_fetch(
                topic, partition, offset, batches, cfg.isolation_level, cfg.key_deserializer, cfg.value_deserializer
            )
        except (struct.error, UnicodeDecodeError, IndexError, ValueError) as exc:
            # Batch CRCs are checked; this is a record framing error inside a batch.
            raise BrokerError(ErrorCode.CORRUPT_MESSAGE, f"undecodable fetch answer from {url}: {exc!r}") from exc
        st.max_seen_hw = max(st.max_seen_hw, batches.high_watermark)
        return fetched

    async def _fetch_url(self, st: PartitionState) -> str:
        """The partition leader's URL; a replica's among the bootstrap URLs for a follower read."""
        topic, partition = st.tp
        if self._config.read_replica == "any" and asyncio.get_running_loop().time() >= st.leader_only_until:
            info = await self._metadata.partition(topic, partition)
            urls = {self._metadata.node_url(r) for r in info.replicas}
            for url in self._metadata.bootstrap:
                if url in urls:
                    return url
        return await self._metadata.leader_url(topic, partition)

    async def _on_error(self, st: PartitionState, offset: int, exc: BrokerError) -> int:
        """Handle a failed fetch at ``offset``; return the offset to fetch next."""
        topic, partition = st.tp
        backoff = self._config.retry_backoff_ms / 1000
        code = exc.error_code
        if self._config.read_replica == "any" and (exc.retriable or code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
            st.leader_only_until = asyncio.get_running_loop().time() + REPLICA_RETRY_S
        if code is ErrorCode.OFFSET_OUT_OF_RANGE:
            hw = exc.extra.get("high_watermark")
            if isinstance(hw, int) and hw < offset <= st.max_seen_hw:
                # A replica behind what we already read: a new leader still applying committed entries.
                self._metadata.invalidate(topic, partition)
                await asyncio.sleep(backoff)
                return offset
            strategy = self._config.auto_offset_reset
            if strategy is OffsetResetStrategy.NONE:
                await self._raise_to_poll(st, exc)
                return offset
            new = await self.retrying(lambda: self.reset_offset(st, strategy), None)
            log.warning("%s-%d: fetch offset %d out of range, reset to %s offset %d",
                        topic, partition, offset, strategy.value, new)  # fmt: skip
            self.buffered_bytes -= sum(f.size_bytes for f in st.buffer if isinstance(f, CompletedFetch))
            st.buffer.clear()
            st.position = new
            return new
        if code is ErrorCode.NOT_LEADER_OR_FOLLOWER:
            hint = exc.extra.get("leader_url")
            self._metadata.invalidate(topic, partition, hint if isinstance(hint, str) else None)
        elif exc.retriable or code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            # Unknown partition too: a just-created topic may not have reached this node's metadata.
            self._metadata.invalidate(topic, partition)
        else:
            await self._raise_to_poll(st, exc)
        await asyncio.sleep(backoff)
        return offset

    async def _raise_to_poll(self, st: PartitionState, exc: BrokerError) -> None:
        """Queue ``exc`` for ``poll()`` and wait until it was raised, then back off before retrying."""
        self._enqueue(st, exc)
        while exc in st.buffer:
            st.space.clear()
            await st.space.wait()
        await asyncio.sleep(self._config.retry_backoff_ms / 1000)

    async def retrying(self, fn: Callable[[], Awaitable[int]], timeout_s: float | None) -> int:
        """Retry ``fn`` on retriable errors with backoff until ``timeout_s`` (None: forever).

        With a deadline an unknown topic is retried too, as the fetch path does: a node that restarted or
        lags the controller answers it for a topic that exists (Kafka retries it as stale metadata).
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            try:
                return await fn()
            except BrokerError as exc:
                retry = exc.retriable or (
                    deadline is not None and exc.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                )
                if not retry or (deadline is not None and loop.time() >= deadline):
                    raise
            await asyncio.sleep(self._config.retry_backoff_ms / 1000)
