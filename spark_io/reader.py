"""Batch read: plan one Spark task per partition offset range, read each range as Arrow record batches.

``partitions()`` runs in a planner process on the driver: it resolves the
topics and the start/end offsets (from the partition leaders) and returns
``RangePartition``s. ``read()`` runs in an executor: it fetches the range with
binary fetches from the partition leader (following it when it moves: a node
that no longer leads answers ``NOT_LEADER_OR_FOLLOWER`` and the fetch is
retried at the new leader), or with ``readReplica=any`` from a replica among
the bootstrap URLs, and yields one ``RecordBatch`` per fetch. Everything
``read()`` needs travels inside its ``RangePartition`` (PySpark pickles the
reader before ``partitions()`` runs, so state set there never reaches
executors).

Exactly-once on the read side comes from determinism: under read_committed a
range [start, end) below the last stable offset always yields the same
records, so a retried task, a re-run job or a replayed micro-batch reads the
same rows.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from clients.protocol import BrokerError, ErrorCode, FetchBatches
from clients.txn_filter import visible_batches

from . import _http
from .arrow_records import RecordBatchBuilder
from .broker import READ_COMMITTED, BrokerClient, retry_delay
from .options import NO_CREDENTIALS, Credentials, ReaderOptions
from .planning import OffsetRange, checked_ranges, resolve, split

log = logging.getLogger("spark_io")
_LONG_POLL_MS = 500


@dataclass(frozen=True)
class ReadSettings:
    """What an executor needs besides its range (picklable, from ``ReaderOptions``)."""

    bootstrap: str
    isolation: str
    fail_on_data_loss: bool
    fetch_max_bytes: int
    poll_timeout_ms: int
    request_timeout_ms: int
    read_replica: str = "leader"
    credentials: Credentials = NO_CREDENTIALS

    @classmethod
    def of(cls, o: ReaderOptions) -> ReadSettings:
        return cls(o.bootstrap, o.isolation, o.fail_on_data_loss, o.fetch_max_bytes, o.poll_timeout_ms,
                   o.request_timeout_ms, o.read_replica, o.credentials)  # fmt: skip


class RangePartition(InputPartition):
    """One Spark task: offsets [start, end) of one topic-partition."""

    def __init__(self, index: int, rng: OffsetRange, settings: ReadSettings) -> None:
        super().__init__(index)
        self.range = rng
        self.settings = settings


def subscribed_partitions(client: BrokerClient, o: ReaderOptions) -> list[tuple[str, int]]:
    if o.assign is not None:
        return list(o.assign)
    topics = client.resolve_topics(o.subscribe, o.pattern)
    return client.topic_partitions(topics) if topics else []


def plan_batch(o: ReaderOptions) -> list[OffsetRange]:
    client = BrokerClient(o.bootstrap, request_timeout_s=o.request_timeout_ms / 1000, credentials=o.credentials)
    tps = subscribed_partitions(client, o)
    if not tps:
        return []
    states = client.partition_states(tps)
    start = resolve(o.starting, states, o.isolation, client, "startingOffsets")
    end = resolve(o.ending, states, o.isolation, client, "endingOffsets")
    for tp, e in end.items():  # never past what a reader may see now
        end[tp] = min(e, states[tp].end(o.isolation))
    return split(checked_ranges(start, end, states, o.fail_on_data_loss), o.min_partitions)


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


class _Prefetcher:
    """Fetches the next response while the task decodes the current one.

    The next fetch offset follows from the answer's batch headers alone, so
    one thread walks the range and hands over decoded responses through a
    queue of two; socket reads and the broker's work overlap the decoding.
    """

    def __init__(self, client: BrokerClient, rng: OffsetRange, s: ReadSettings) -> None:
        self.client, self.rng, self.s = client, rng, s
        self.out: queue.Queue[tuple[int, FetchBatches] | BaseException | None] = queue.Queue(maxsize=2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"fetch-{rng.topic}-{rng.partition}", daemon=True)
        self.thread.start()

    def _put(self, item: tuple[int, FetchBatches] | BaseException | None) -> None:
        while not self.stop.is_set():
            try:
                self.out.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        try:
            pos = self.rng.start
            while pos < self.rng.end and not self.stop.is_set():
                pos_before = pos
                fetched, pos = self._next(pos)
                if fetched is not None:
                    self._put((pos_before, fetched))
            self._put(None)
        except BaseException as exc:  # handed to the task thread, which raises it
            self._put(exc)
        finally:
            _http.close_all()  # this thread's keep-alive connections end with it

    def _next(self, pos: int) -> tuple[FetchBatches | None, int]:
        """One fetch at ``pos`` with retries; returns the answer and the next fetch offset."""
        s, tp = self.s, (self.rng.topic, self.rng.partition)
        deadline = time.monotonic() + s.poll_timeout_ms / 1000
        attempt = 0
        while True:
            try:
                fetched = self.client.fetch(tp, pos, max_bytes=s.fetch_max_bytes, isolation=s.isolation,
                                            max_wait_ms=_LONG_POLL_MS)  # fmt: skip
            except BrokerError as exc:
                if exc.error_code is ErrorCode.OFFSET_OUT_OF_RANGE and "log_start_offset" in exc.extra:
                    log_start = int(exc.extra["log_start_offset"])
                    if pos < log_start:
                        msg = f"{tp[0]}-{tp[1]}: offsets {pos}..{log_start - 1} were deleted while reading"
                        if s.fail_on_data_loss:
                            raise BrokerError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                              msg + "; set failOnDataLoss=false to skip them") from exc  # fmt: skip
                        log.warning("%s; skipping them", msg)
                        return None, min(log_start, self.rng.end)
                if (not exc.retriable and exc.error_code is not ErrorCode.OFFSET_OUT_OF_RANGE) or (
                    time.monotonic() > deadline
                ):
                    raise
                time.sleep(retry_delay(attempt))
                attempt += 1
                continue
            if fetched.batches:
                upper = fetched.last_stable_offset if s.isolation == READ_COMMITTED else fetched.high_watermark
                return fetched, max(pos + 1, min(fetched.batches[-1].last_offset + 1, upper))
            if time.monotonic() > deadline:
                raise BrokerError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"{tp[0]}-{tp[1]}: offsets {pos}..{self.rng.end - 1} not readable within pollTimeoutMs "
                    f"({s.poll_timeout_ms} ms); last stable offset {fetched.last_stable_offset}",
                )

    def __iter__(self) -> Iterator[tuple[int, FetchBatches]]:
        while True:
            item = self.out.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def read_range(rng: OffsetRange, s: ReadSettings, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The visible records of ``rng`` as record batches (one per fetch), in offset order."""
    if rng.end <= rng.start:
        return
    client = BrokerClient(s.bootstrap, request_timeout_s=s.request_timeout_ms / 1000, read_replica=s.read_replica,
                          credentials=s.credentials)  # fmt: skip
    prefetch = _Prefetcher(client, rng, s)
    try:
        for pos, fetched in prefetch:
            aborted = fetched.aborted_transactions if s.isolation == READ_COMMITTED else ()
            builder = RecordBatchBuilder(schema, rng.topic, rng.partition, pos, rng.end)
            for batch in visible_batches(fetched.batches, aborted):
                if batch.last_offset >= pos and batch.base_offset < rng.end:
                    builder.add(batch)
            rb = builder.build()
            if rb is not None:
                yield rb
    finally:
        prefetch.close()


class BatchReader(DataSourceReader):
    def __init__(self, options: ReaderOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        settings = ReadSettings.of(self.options)
        return [RangePartition(i, r, settings) for i, r in enumerate(plan_batch(self.options))]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):  # no ranges: Spark's single empty partition
            return iter(())
        return read_range(partition.range, partition.settings, arrow_schema(self.schema))
