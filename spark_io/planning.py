"""Offset planning shared by the batch and the streaming reader.

* ``resolve``: turn an ``OffsetSpec`` (earliest / latest / JSON / timestamps)
  into one offset per partition, using offsets read from the partition leaders.
* ``checked_ranges``: [start, end) per partition with Kafka's data-loss checks
  (``failOnDataLoss``).
* ``split``: at least ``minPartitions`` Spark tasks (pieces proportional to
  range size, like Kafka's ``KafkaOffsetRangeCalculator``).
* ``rate_limit``: ``maxOffsetsPerTrigger`` spread over partitions in
  proportion to their backlog (Kafka's ``rateLimit``).

Counts are in offsets, not records: under read_committed a range holds
transaction markers and aborted records too, so a range may yield fewer rows
than its size (Kafka's "non-consecutive offsets"); that is not data loss.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from clients.protocol import BrokerError, ErrorCode

from .broker import PartitionState
from .options import EARLIEST, LATEST, OffsetSpec

log = logging.getLogger("spark_io")
TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    @property
    def size(self) -> int:
        return self.end - self.start


class TimestampLookup(Protocol):
    def offset_for_timestamp(self, tp: TP, timestamp_ms: int, isolation: str) -> int | None: ...


def resolve(
    spec: OffsetSpec,
    states: Mapping[TP, PartitionState],
    isolation: str,
    lookup: TimestampLookup,
    what: str,
) -> dict[TP, int]:
    """One offset per partition of ``states`` (``what``: "startingOffsets" or "endingOffsets", for errors)."""
    out: dict[TP, int] = {}
    if spec.kind == "offsets" or spec.kind == "timestamps":
        unknown = set(spec.offsets) - set(states)
        if unknown:
            raise BrokerError(ErrorCode.INVALID_CONFIG, f"{what} names partitions not read: {sorted(unknown)}")
        missing = set(states) - set(spec.offsets)
        if missing:
            raise BrokerError(ErrorCode.INVALID_CONFIG,
                              f"{what} must give every partition read; missing {sorted(missing)}")  # fmt: skip
    for tp, st in states.items():
        end = st.end(isolation)
        if spec.kind == "earliest":
            out[tp] = st.log_start_offset
        elif spec.kind == "latest":
            out[tp] = end
        elif spec.kind == "offsets":
            v = spec.offsets[tp]
            out[tp] = st.log_start_offset if v == EARLIEST else end if v == LATEST else v
        else:
            ts = spec.timestamp if spec.kind == "timestamp" else spec.offsets[tp]
            assert ts is not None
            found = lookup.offset_for_timestamp(tp, ts, isolation)
            if found is None:
                if spec.missing == "error":
                    raise BrokerError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                      f"{what}: {tp[0]}-{tp[1]} has no record at or after timestamp {ts}")  # fmt: skip
                found = end
            out[tp] = found
    return out


def checked_ranges(
    start: Mapping[TP, int], end: Mapping[TP, int], states: Mapping[TP, PartitionState], fail_on_data_loss: bool
) -> list[OffsetRange]:
    """[start, end) per partition; an offset below the log start is data loss (retention deleted it)."""
    out = []
    for tp in sorted(end):
        s, e = start.get(tp, states[tp].log_start_offset), end[tp]
        log_start = states[tp].log_start_offset
        if s < log_start:
            msg = f"{tp[0]}-{tp[1]}: offsets {s}..{log_start - 1} were deleted (log start is {log_start})"
            if fail_on_data_loss:
                raise BrokerError(ErrorCode.OFFSET_OUT_OF_RANGE, msg + "; set failOnDataLoss=false to skip them")
            log.warning("%s; skipping them (failOnDataLoss=false)", msg)
            s = log_start
        if e < s:
            msg = f"{tp[0]}-{tp[1]}: ending offset {e} is before starting offset {s}"
            if fail_on_data_loss:
                raise BrokerError(ErrorCode.OFFSET_OUT_OF_RANGE, msg)
            log.warning("%s; reading nothing from it (failOnDataLoss=false)", msg)
            e = s
        out.append(OffsetRange(tp[0], tp[1], s, e))
    return out


def split(ranges: Iterable[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Non-empty ranges, cut into at least ``min_partitions`` pieces (when they hold that many offsets).

    Pieces per range are proportional to its size (largest remainders get the
    leftover pieces), so tasks get similar amounts of work, as Kafka's
    ``minPartitions`` intends.
    """
    parts = [r for r in ranges if r.size > 0]
    if not min_partitions or min_partitions <= len(parts):
        return parts
    total = sum(r.size for r in parts)
    shares = [r.size / total * min_partitions for r in parts]
    pieces = [max(1, min(r.size, math.floor(share))) for r, share in zip(parts, shares, strict=True)]
    by_remainder = sorted(range(len(parts)), key=lambda i: shares[i] - math.floor(shares[i]), reverse=True)
    while sum(pieces) < min_partitions:
        grown = False
        for i in by_remainder:
            if sum(pieces) >= min_partitions:
                break
            if pieces[i] < parts[i].size:
                pieces[i] += 1
                grown = True
        if not grown:
            break
    out: list[OffsetRange] = []
    for r, k in zip(parts, pieces, strict=True):
        for i in range(k):
            out.append(OffsetRange(r.topic, r.partition, r.start + r.size * i // k, r.start + r.size * (i + 1) // k))
    return out


def rate_limit(limit: int, start: Mapping[TP, int], end: Mapping[TP, int]) -> dict[TP, int]:
    """End offsets that admit at most about ``limit`` offsets, shared in proportion to each backlog.

    As Kafka's source: a share below one offset rounds up (a small partition
    still moves), others round down.
    """
    sizes = {tp: end[tp] - start.get(tp, end[tp]) for tp in end}
    total = sum(s for s in sizes.values() if s > 0)
    if total <= limit:
        return dict(end)
    out = {}
    for tp, e in end.items():
        s = start.get(tp, e)
        size = sizes[tp]
        if size <= 0:
            out[tp] = e
            continue
        share = limit * size / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(e, s + step)
    return out
