"""Streaming read (micro-batches) with Spark 4.2 admission control.

The offset of a micro-batch is Kafka's JSON, ``{"topic": {"0": 42}}`` (Spark
stores it in ``checkpoint/offsets/N``; keys come back as strings). Each batch
reads [previous end, new end) per partition, where the new end never passes
the partition's end for the isolation level (the last stable offset under
read_committed), so a replayed batch reads exactly the same records.

Admission control: ``maxOffsetsPerTrigger`` is the default read limit
(``ReadMaxRows``), spread over partitions in proportion to their backlog;
``minOffsetsPerTrigger`` (``ReadMinRows``) skips a trigger until enough
offsets are there or ``maxTriggerDelay`` has passed. Spark cannot express
both limits at once through the Python API, so with both set the reader
reports ``ReadMinRows`` and applies the maximum itself (except under a
``ReadAllAvailable`` limit, which means "ignore your own limits").
``Trigger.AvailableNow`` is native: ``prepareForTriggerAvailableNow`` fixes the
target offsets and no batch goes past them, in as many rate-limited batches
as the limits make.

This object lives in one long-lived driver process per query run
(``python_streaming_source_runner``); ``read()`` runs in executors on a
different instance, so partitions carry everything they need.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from clients.protocol import BrokerError, ErrorCode

from . import _http
from .broker import BrokerClient, PartitionState
from .options import ReaderOptions
from .planning import checked_ranges, rate_limit, resolve, split
from .reader import RangePartition, ReadSettings, arrow_schema, read_range, subscribed_partitions

log = logging.getLogger("spark_io")
TP = tuple[str, int]
Offsets = dict[str, dict[str, int]]


def to_json(offsets: Mapping[TP, int]) -> Offsets:
    out: Offsets = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def from_json(doc: Mapping[str, Any]) -> dict[TP, int]:
    return {(t, int(p)): int(off) for t, parts in doc.items() for p, off in parts.items()}


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReaderOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.client = BrokerClient(
            options.bootstrap, request_timeout_s=options.request_timeout_ms / 1000, credentials=options.credentials
        )
        self._target: dict[TP, int] | None = None  # AvailableNow: never read past these
        self._latest: dict[TP, int] = {}
        self._last_trigger = time.monotonic()
        self._group_commits = True

    # ---- offsets -----------------------------------------------------------------------------------

    def _states(self) -> dict[TP, PartitionState]:
        tps = subscribed_partitions(self.client, self.options)
        return self.client.partition_states(tps) if tps else {}

    def _available(self, states: Mapping[TP, PartitionState]) -> dict[TP, int]:
        return {tp: st.end(self.options.isolation) for tp, st in states.items()}

    def initialOffset(self) -> Offsets:
        states = self._states()
        o = self.options
        return to_json(resolve(o.starting, states, o.isolation, self.client, "startingOffsets"))

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._available(self._states())
        log.info("Trigger.AvailableNow: reading up to %s", self._target)

    def latestOffset(self, start: Offsets | None = None, limit: ReadLimit | None = None) -> Offsets:
        states = self._states()
        available = self._available(states)
        self._latest = dict(available)
        begin = from_json(start) if start else {}
        for tp, st in states.items():  # partitions that appeared since: read them from their start
            begin.setdefault(tp, st.log_start_offset)
        end = dict(available)
        if self._target is not None:
            end = {tp: min(e, self._target.get(tp, begin[tp])) for tp, e in end.items()}
        for tp, e in end.items():
            if e < begin[tp]:  # the log went back (topic re-created?): offsets never move backwards
                msg = f"{tp[0]}-{tp[1]}: end offset {e} is before the query's offset {begin[tp]}"
                if self.options.fail_on_data_loss:
                    raise BrokerError(ErrorCode.OFFSET_OUT_OF_RANGE, msg + "; data may be lost")
                log.warning("%s; waiting for it to catch up (failOnDataLoss=false)", msg)
                end[tp] = begin[tp]
        o = self.options
        if limit is None or isinstance(limit, ReadAllAvailable):
            return to_json(end)
        backlog = sum(max(0, end[tp] - begin[tp]) for tp in end)
        if isinstance(limit, ReadMinRows) and self._target is None:
            waited_ms = (time.monotonic() - self._last_trigger) * 1000
            if backlog < limit.min_rows and waited_ms < o.max_trigger_delay_ms:
                return to_json({tp: begin[tp] for tp in end})
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else o.max_offsets_per_trigger
        if cap is not None:
            end = rate_limit(cap, begin, end)
        if any(end[tp] != begin[tp] for tp in end):
            self._last_trigger = time.monotonic()
        return to_json(end)

    def reportLatestOffset(self) -> Offsets | None:
        return to_json(self._latest) if self._latest else None

    # ---- planning and reading ------------------------------------------------------------------------

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        begin, stop = from_json(start), from_json(end)
        if begin == stop:
            return []
        states = self.client.partition_states(list(stop))
        for tp, st in states.items():  # a partition new in this batch starts at its log start
            begin.setdefault(tp, st.log_start_offset)
        ranges = split(checked_ranges(begin, stop, states, self.options.fail_on_data_loss), self.options.min_partitions)
        settings = ReadSettings.of(self.options)
        return [RangePartition(i, r, settings) for i, r in enumerate(ranges)]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return iter(())
        return read_range(partition.range, partition.settings, arrow_schema(self.schema))

    def commit(self, end: Offsets) -> None:
        """Spark is done with offsets below ``end``: record them as the group's offsets (lag monitoring only)."""
        if not self._group_commits:
            return
        group = self.group_id()
        body = {"offsets": [{"topic": t, "partition": int(p), "offset": int(off), "metadata": "spark"}
                            for t, parts in end.items() for p, off in parts.items()]}  # fmt: skip
        try:
            self.client.coordinator_call(f"/v1/groups/{quote(group, safe='')}/offsets", body, "commit group offsets",
                                         deadline_s=5)  # fmt: skip
        except BrokerError as exc:
            if exc.error_code in (ErrorCode.UNKNOWN_SERVER_ERROR, ErrorCode.INVALID_REQUEST):
                self._group_commits = False  # this broker has no group offsets yet: stop trying
            log.info("consumer-group offsets for lag monitoring not committed (%s)", exc)

    def group_id(self) -> str:
        """``groupId`` if given, else a stable id derived from what is read (for lag dashboards)."""
        if self.options.group_id:
            return self.options.group_id
        o = self.options
        what = repr((o.subscribe, o.pattern, o.assign, o.bootstrap))
        return "spark-txbroker-" + hashlib.sha1(what.encode()).hexdigest()[:12]

    def stop(self) -> None:
        _http.close_all()
