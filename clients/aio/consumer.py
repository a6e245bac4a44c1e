"""``AsyncConsumer``: kafka-python's ``KafkaConsumer`` API for asyncio, over txbroker's HTTP fetch.

Partitions are assigned manually (``assign``); each assigned partition is
fetched by its own task in ``Fetcher`` (see there for prefetching, leader
changes and ``OFFSET_OUT_OF_RANGE``). ``poll`` returns records in offset order
per partition and never returns a record twice or skips one unless the
application seeks; the position only moves past a record once ``poll`` has
returned it.

Fetches go to the partition leader: a node that no longer leads answers
``NOT_LEADER_OR_FOLLOWER`` with the new leader's URL, and the next fetch goes
there. ``read_replica="any"`` opts in to follower reads (KIP-392): a replica
among the bootstrap URLs serves its own committed copy, a little behind the
leader. The metadata is re-read every ``metadata_max_age_ms`` (5 s, not
Kafka's 5 min).

Consumer groups: with ``group_id``, ``subscribe`` makes the consumer a group
member (``_group.ConsumerCoordinator``); ``poll`` drives the membership --
rebalance listener, join, and the positions of newly assigned partitions,
read from the committed offsets (stable ones only under read_committed,
KIP-447), else ``auto_offset_reset``. ``assign`` stays manual (no
membership); ``commit``/``committed`` work in both modes when a ``group_id``
is set. ``enable_auto_commit`` defaults to kafka-python's True when a
``group_id`` is given (and means nothing without one): positions are then
committed every ``auto_commit_interval_ms`` from ``poll``, before a
rebalance revokes partitions, and on ``close``. A transactional
consume-transform-produce application sets it to False and commits through
``Producer.send_offsets_to_transaction(offsets, consumer.group_metadata())``.

Use it from one task at a time; it is not thread-safe (the sync ``Consumer``
runs it on its own loop thread).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Unpack

from .._fetch_decode import ISOLATION_LEVELS, READ_COMMITTED, Deserializer
from ..protocol import BrokerError, ErrorCode
from ..records import ConsumerGroupMetadata, ConsumerRecord, OffsetAndMetadata, TopicPartition
from ..security import ClientSecurity, SecurityOptions
from ._fetcher import READ_REPLICAS, FetchConfig, Fetcher, OffsetResetStrategy, PartitionState
from ._group import ConsumerCoordinator, ConsumerRebalanceListener, GroupConfig, MemberState
from ._metadata import MetadataCache, parse_bootstrap
from ._session import HttpSession

__all__ = ["AsyncConsumer", "ConsumerRebalanceListener", "normalize_offsets", "normalize_partitions"]

log = logging.getLogger(__name__)


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


def normalize_offsets(offsets: Mapping[Any, Any]) -> dict[TopicPartition, OffsetAndMetadata]:
    """``{tp: offset}``, ``{tp: OffsetAndMetadata}`` or kafka-python's ``(offset, metadata[, ...])`` tuples."""
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for tp, value in offsets.items():
        (key,) = normalize_partitions([tp])
        if isinstance(value, OffsetAndMetadata):
            om = value
        elif isinstance(value, int) and not isinstance(value, bool):
            om = OffsetAndMetadata(value)
        elif isinstance(value, tuple) and value and isinstance(value[0], int) and not isinstance(value[0], bool):
            meta = value[1] if len(value) > 1 and isinstance(value[1], str) else ""
            om = OffsetAndMetadata(value[0], meta)
        else:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"offset of {key[0]}-{key[1]} must be an int, not {value!r}")
        if om.offset < 0:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"offset of {key[0]}-{key[1]} must be >= 0, not {om.offset}")
        out[key] = om
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
        enable_auto_commit: bool | None = None,
        auto_commit_interval_ms: int = 5_000,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        max_poll_interval_ms: int = 300_000,
        partition_assignment_strategy: str | Sequence[str] = "range",
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
        read_replica: str = "leader",
        **security: Unpack[SecurityOptions],
    ) -> None:
        if read_replica not in READ_REPLICAS:
            raise BrokerError(
                ErrorCode.INVALID_CONFIG, f"read_replica must be one of {READ_REPLICAS}, not {read_replica!r}"
            )
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
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise BrokerError(ErrorCode.INVALID_CONFIG, f"group_id must be a non-empty string, not {group_id!r}")
        if auto_commit_interval_ms < 1:
            raise BrokerError(ErrorCode.INVALID_CONFIG, "auto_commit_interval_ms must be positive")
        self.group_id = group_id
        # kafka-python's default (True) applies to group consumers only: without a group there is nowhere to commit.
        self.enable_auto_commit = group_id is not None and (enable_auto_commit is None or enable_auto_commit)
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.client_id = client_id
        self.isolation_level = isolation_level
        self.max_poll_records = max_poll_records
        self.request_timeout_ms = request_timeout_ms
        self.consumer_timeout_ms = consumer_timeout_ms
        # Every assigned partition parks one long poll on a connection: a small pool would queue them.
        sec = ClientSecurity.from_options(parse_bootstrap(bootstrap), **security)
        self._session = HttpSession(request_timeout_ms=request_timeout_ms, max_connections=256, security=sec)
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
                read_replica=read_replica,
            ),
        )
        self._coordinator: ConsumerCoordinator | None = None
        if group_id is not None:
            strategy = partition_assignment_strategy
            protocol = strategy if isinstance(strategy, str) else next(iter(strategy), "range")
            self._coordinator = ConsumerCoordinator(
                self._session,
                self._metadata,
                GroupConfig(
                    group_id=group_id,
                    session_timeout_ms=session_timeout_ms,
                    heartbeat_interval_ms=heartbeat_interval_ms,
                    max_poll_interval_ms=max_poll_interval_ms,
                    protocol=protocol,
                    request_timeout_ms=request_timeout_ms,
                    retry_backoff_ms=retry_backoff_ms,
                ),
                wake=self._fetcher.data_ready.set,
            )
        self._listener: Any = None
        self._awaiting: set[TopicPartition] = set()  # assigned, position to be read from the committed offsets
        self._next_auto_commit = 0.0
        self._auto_commit_task: asyncio.Task[None] | None = None
        self._assignment: list[TopicPartition] = []
        self._next_drain = 0
        self._closed = False

    # ---- assignment ----------------------------------------------------------------------------

    def assign(self, partitions: Iterable[Any]) -> None:
        """Read exactly these partitions (replaces the previous assignment; kept ones keep their position)."""
        self._check_open()
        if self._subscribed:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "assign() on a subscribed consumer: unsubscribe() first")
        tps = normalize_partitions(partitions)
        self._assignment = tps
        self._fetcher.set_assignment(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    @property
    def _subscribed(self) -> bool:
        return self._coordinator is not None and bool(self._coordinator.subscription)

    def subscribe(
        self, topics: Iterable[str] = (), pattern: str | None = None, listener: ConsumerRebalanceListener | None = None
    ) -> None:
        """Join ``group_id`` for these topics; the next ``poll`` joins and gets partitions assigned.

        ``listener`` (a ``ConsumerRebalanceListener``) is told about revoked,
        assigned and lost partitions. Subscribing again with other topics
        rebalances. Pattern subscriptions are not supported.
        """
        self._check_open()
        coord = self._coordinator
        if coord is None:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "subscribe() needs a group_id (or use assign())")
        if pattern is not None:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "pattern subscriptions are not supported: list the topics")
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names or not all(isinstance(t, str) and t for t in names):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"subscribe() needs topic names, not {topics!r}")
        if self._assignment and not self._subscribed:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "subscribe() after assign(): unsubscribe() first")
        subscription = tuple(sorted(set(names)))
        if self._subscribed and subscription != coord.subscription and coord.state is MemberState.STABLE:
            coord.request_rejoin("the subscription changed")
        coord.subscription = subscription
        self._listener = listener

    def subscription(self) -> set[str]:
        return set(self._coordinator.subscription) if self._coordinator is not None else set()

    async def unsubscribe(self) -> None:
        """Leave the group (revoking and, with auto-commit, committing first), or drop a manual assignment."""
        self._check_open()
        if self._subscribed:
            await self._leave_group()
        self.assign([])

    async def _leave_group(self) -> None:
        coord = self._coordinator
        assert coord is not None
        try:
            if coord.state is MemberState.STABLE:
                await self._revoke(lost=coord.partitions_lost)
        finally:
            self._drop_assignment()
            coord.subscription = ()
            await coord.leave()

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member's group identity, for ``Producer.send_offsets_to_transaction`` (KIP-447 fencing)."""
        return self._require_group("group_metadata()").group_metadata()

    def enforce_rebalance(self) -> None:
        """Rejoin the group on the next ``poll`` (Kafka's ``enforceRebalance``), e.g. after a fenced commit."""
        coord = self._require_group("enforce_rebalance()")
        if self._subscribed and coord.state is MemberState.STABLE:
            coord.request_rejoin("enforce_rebalance()")

    def _require_group(self, what: str) -> ConsumerCoordinator:
        if self._coordinator is None:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"{what} needs a group_id")
        return self._coordinator

    # ---- offsets ---------------------------------------------------------------------------------

    def _consumed(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Current positions of the assigned partitions that have one (Kafka's ``allConsumed``)."""
        states = self._fetcher.states.items()
        return {tp: OffsetAndMetadata(st.position) for tp, st in states if st.position is not None}

    async def commit(self, offsets: Mapping[Any, Any] | None = None) -> None:
        """Commit ``offsets`` (default: the current positions) synchronously, as a group member if subscribed.

        A stale member gets ``ILLEGAL_GENERATION`` / ``UNKNOWN_MEMBER_ID`` /
        ``REBALANCE_IN_PROGRESS`` (Kafka's ``CommitFailedException``): the
        partitions may already belong to another member; the next ``poll`` rejoins.
        """
        self._check_open()
        coord = self._require_group("commit()")
        wanted = self._consumed() if offsets is None else normalize_offsets(offsets)
        await coord.commit(wanted, self.request_timeout_ms / 1000)

    async def committed_offsets(
        self, partitions: Iterable[Any], timeout_ms: float | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The committed offsets of several partitions in one request (Java's ``committed(Set, Duration)``).

        Under read_committed only stable offsets: ``UNSTABLE_OFFSET_COMMIT``
        is retried until ``timeout_ms`` (default ``request_timeout_ms``), then raised.
        """
        self._check_open()
        coord = self._require_group("committed_offsets()")
        timeout = (self.request_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        return await coord.fetch_committed(
            normalize_partitions(partitions), require_stable=self.isolation_level == READ_COMMITTED, timeout_s=timeout
        )

    async def committed(self, partition: Any, metadata: bool = False) -> int | OffsetAndMetadata | None:
        """The group's committed offset of ``partition`` (None if none); ``metadata=True``: ``OffsetAndMetadata``.

        Under read_committed only a stable offset is returned: while a
        transactional commit for it is undecided this waits (up to
        ``request_timeout_ms``, then ``UNSTABLE_OFFSET_COMMIT``).
        """
        (tp,) = normalize_partitions([partition])
        om = (await self.committed_offsets([tp])).get(tp)
        if om is None or metadata:
            return om
        return om.offset

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
        tp = self._state(partition).tp
        self._awaiting.discard(tp)
        self._fetcher.seek(tp, offset)

    def seek_to_beginning(self, *partitions: Any) -> None:
        """Reset to the log start offset, resolved lazily (on ``position`` or the next fetch), as in Kafka."""
        for st in self._states_or_all(partitions):
            self._awaiting.discard(st.tp)
            self._fetcher.seek(st.tp, None, OffsetResetStrategy.EARLIEST)

    def seek_to_end(self, *partitions: Any) -> None:
        """Reset to the high watermark (last stable offset under read_committed), resolved lazily."""
        for st in self._states_or_all(partitions):
            self._awaiting.discard(st.tp)
            self._fetcher.seek(st.tp, None, OffsetResetStrategy.LATEST)

    def _states_or_all(self, partitions: Sequence[Any]) -> list[PartitionState]:
        if not partitions:
            return list(self._fetcher.states.values())
        return [self._state(p) for p in partitions]

    async def position(self, partition: Any, timeout_ms: float | None = None) -> int:
        """Offset of the next record ``poll`` returns for ``partition``; resolves a pending reset first."""
        self._check_open()
        timeout = (self.request_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        st = self._state(partition)
        if st.tp in self._awaiting:
            loop = asyncio.get_running_loop()
            started = loop.time()
            if not await self._init_positions(started + timeout):
                raise BrokerError(
                    ErrorCode.REQUEST_TIMED_OUT, f"no committed offset for {st.tp[0]}-{st.tp[1]} within {timeout}s"
                )
            timeout = max(0.0, timeout - (loop.time() - started))
        return await self._fetcher.position(st, timeout)

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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_ms) / 1000
        if self._coordinator is not None:
            self._coordinator.note_poll(loop.time())
            self._maybe_auto_commit(loop.time())
        # Yield once even when records are buffered: an application that polls and processes in a tight
        # loop would otherwise starve the fetch and heartbeat tasks (and lose its group session).
        await asyncio.sleep(0)
        while True:
            fetcher.data_ready.clear()
            if self._subscribed and not await self._ensure_group(deadline):
                return []
            fetcher.start(exclude=self._awaiting)
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

    # ---- group membership, driven by poll ------------------------------------------------------------

    async def _ensure_group(self, deadline: float) -> bool:
        """Do the rebalance work that is due; True once the member is stable with every position known.

        Returns False when ``deadline`` passes first (the join or the offset
        fetch goes on; the next ``poll`` continues it).
        """
        coord = self._coordinator
        assert coord is not None
        loop = asyncio.get_running_loop()
        if coord.state is MemberState.STABLE and coord.rejoin_needed:
            try:
                await self._revoke(lost=coord.partitions_lost)
            finally:  # a failing listener is reported by this poll, but the member rejoins all the same
                self._drop_assignment()
                coord.start_join()
        elif coord.state is MemberState.UNJOINED:
            coord.start_join()
        if coord.state is MemberState.REBALANCING:
            gen = await coord.wait_join(deadline - loop.time())
            if gen is None:
                return False
            self._assignment = list(gen.assignment)
            self._fetcher.set_assignment(self._assignment)
            self._awaiting = set(self._assignment)
            await self._call_listener("on_partitions_assigned", set(self._assignment))
        if self._awaiting:
            return await self._init_positions(deadline)
        return True

    async def _revoke(self, *, lost: bool) -> None:
        """Before giving the partitions up: auto-commit (unless lost) and tell the listener."""
        revoked = set(self._assignment)
        if not lost and self.enable_auto_commit:
            await self._commit_quietly("before rebalance")
        await self._call_listener("on_partitions_lost" if lost else "on_partitions_revoked", revoked)

    def _drop_assignment(self) -> None:
        self._assignment = []
        self._awaiting.clear()
        self._fetcher.set_assignment([])

    async def _call_listener(self, method: str, partitions: set[TopicPartition]) -> None:
        listener = self._listener
        if listener is None:
            return
        fn: Callable[[set[TopicPartition]], Any] | None = getattr(listener, method, None)
        if fn is None and method == "on_partitions_lost":  # a duck-typed listener without it: Kafka's default
            fn = getattr(listener, "on_partitions_revoked", None)
        if fn is None:
            return
        result = fn(partitions)
        if inspect.isawaitable(result):
            await result

    async def _init_positions(self, deadline: float) -> bool:
        """Positions of newly assigned partitions from the committed offsets (none: ``auto_offset_reset``).

        Under read_committed only stable offsets count: a partition whose last
        owner's transactional commit is undecided waits for the decision
        (``UNSTABLE_OFFSET_COMMIT``), or it could re-copy what that
        transaction is about to commit (KIP-447). False if ``deadline`` passes first.
        """
        coord = self._coordinator
        assert coord is not None
        tps = sorted(self._awaiting)
        loop = asyncio.get_running_loop()
        try:
            found = await coord.fetch_committed(
                tps, require_stable=self.isolation_level == READ_COMMITTED, timeout_s=max(0.0, deadline - loop.time())
            )
        except BrokerError as exc:
            if exc.retriable:
                return False
            raise
        for tp, om in found.items():
            if tp in self._awaiting and tp in self._fetcher.states:
                if om is not None:
                    self._fetcher.seek(tp, om.offset)
                self._awaiting.discard(tp)
        return not self._awaiting

    def _maybe_auto_commit(self, now: float) -> None:
        """Every ``auto_commit_interval_ms``: commit the positions in the background (Kafka's async auto-commit)."""
        if not self.enable_auto_commit or now < self._next_auto_commit:
            return
        if self._auto_commit_task is not None and not self._auto_commit_task.done():
            return
        self._next_auto_commit = now + self.auto_commit_interval_ms / 1000
        coord = self._coordinator
        if coord is None or (self._subscribed and (coord.state is not MemberState.STABLE or coord.rejoin_needed)):
            return
        offsets = self._consumed()
        if offsets:
            self._auto_commit_task = asyncio.get_running_loop().create_task(self._auto_commit(offsets))

    async def _auto_commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        coord = self._coordinator
        assert coord is not None
        try:
            await coord.commit(offsets, self.request_timeout_ms / 1000)
        except BrokerError as exc:
            log.warning("group %s: auto-commit of %d offset(s) failed: %s", self.group_id, len(offsets), exc)

    async def _commit_quietly(self, why: str) -> None:
        coord = self._coordinator
        assert coord is not None
        if self._auto_commit_task is not None and not self._auto_commit_task.done():
            await asyncio.gather(self._auto_commit_task, return_exceptions=True)
        try:
            await coord.commit(self._consumed(), self.request_timeout_ms / 1000)
        except BrokerError as exc:
            log.warning("group %s: auto-commit %s failed: %s", self.group_id, why, exc)

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

    async def close(self, autocommit: bool = True) -> None:
        """Leave the group (auto-committing first, unless ``autocommit=False``) and stop fetching."""
        if self._closed:
            return
        coord = self._coordinator
        try:
            if coord is not None:
                if not autocommit:
                    self.enable_auto_commit = False
                if self._subscribed:
                    await self._leave_group()
                elif self.enable_auto_commit:
                    await self._commit_quietly("on close")
        finally:
            self._closed = True
            if self._auto_commit_task is not None:
                await asyncio.gather(self._auto_commit_task, return_exceptions=True)
            if coord is not None:
                await coord.close()
            await self._fetcher.close()
            await self._session.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
