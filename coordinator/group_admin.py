"""Consumer-group administration as pure functions: lag, the describe rows, and offset resets.

Kafka's ``kafka-consumer-groups.sh`` semantics:

* **lag** of a partition: its log end offset (the high watermark) minus the
  group's committed offset, never below 0; unknown (None) when the group has
  no committed offset there or the high watermark is unknown. A
  read_committed group's lag is also reported against the high watermark
  (Kafka's tool uses the LSO for those; the group's isolation level is a
  property of its consumers, which the coordinator does not know).
* **describe rows**: one per partition the group has a committed offset for
  or that a member is assigned; an assigned partition without a committed
  offset shows offset -1 and lag None, as the tool shows ``-``.
* **reset targets** (``--to-earliest``, ``--to-latest``, ``--to-offset``,
  ``--to-datetime``): the log start offset; the high watermark; N clamped to
  [log start, high watermark]; the first offset whose record timestamp is >=
  the given time, or the high watermark when no record is that new.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from clients.protocol import BrokerError, ErrorCode
from coordinator.group_metadata import CommittedOffset
from coordinator.metadata import TopicPartition

__all__ = [
    "NO_OFFSET",
    "LogOffsets",
    "ResetTo",
    "lag",
    "offset_rows",
    "parse_reset_to",
    "reset_rows",
    "reset_target",
]

#: The committed offset shown for a partition the group has none for (Kafka's tool prints ``-``).
NO_OFFSET = -1
_INT64_MAX = 2**63 - 1

ResetKind = Literal["earliest", "latest", "offset", "timestamp"]


@dataclass(frozen=True, slots=True)
class ResetTo:
    """Where a reset moves a group's offsets; ``value`` is the offset or the timestamp (ms)."""

    kind: ResetKind
    value: int | None = None

    def to_json(self) -> Any:
        if self.kind in ("earliest", "latest"):
            return self.kind
        return {self.kind: self.value}


@dataclass(frozen=True, slots=True)
class LogOffsets:
    """A partition's offsets as its leader answers ListOffsets; ``timestamp_offset`` only when asked for."""

    log_start_offset: int
    high_watermark: int
    timestamp_offset: int | None = None


def _int(raw: Any, what: str, lo: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not lo <= raw <= _INT64_MAX:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"{what} must be an integer >= {lo}")
    return raw


def parse_reset_to(raw: Any) -> ResetTo:
    """``"earliest"``, ``"latest"``, ``{"offset": N}`` or ``{"timestamp": ms}``; else ``INVALID_REQUEST``."""
    if raw in ("earliest", "latest"):
        return ResetTo(raw)
    if isinstance(raw, dict) and len(raw) == 1:
        ((key, value),) = raw.items()
        if key == "offset":
            return ResetTo("offset", _int(value, "to.offset", 0))
        if key == "timestamp":
            return ResetTo("timestamp", _int(value, "to.timestamp", 0))
    raise BrokerError(ErrorCode.INVALID_REQUEST, 'to must be "earliest", "latest", {"offset": N} or {"timestamp": ms}')


def reset_target(to: ResetTo, log: LogOffsets) -> int:
    """The offset a reset moves a partition to (module docstring); always within [log start, HW]."""
    start, end = log.log_start_offset, max(log.log_start_offset, log.high_watermark)
    if to.kind == "earliest":
        return start
    if to.kind == "latest":
        return end
    if to.kind == "offset":
        assert to.value is not None
        return min(max(to.value, start), end)
    found = log.timestamp_offset
    return end if found is None else min(max(found, start), end)


def lag(committed: int | None, high_watermark: int | None) -> int | None:
    if committed is None or committed < 0 or high_watermark is None or high_watermark < 0:
        return None
    return max(0, high_watermark - committed)


def offset_rows(
    committed: Mapping[TopicPartition, CommittedOffset],
    assigned: Mapping[TopicPartition, str],
    high_watermark: Callable[[str, int], int | None],
) -> list[dict[str, Any]]:
    """One row per committed or assigned partition, sorted: offset, log end, lag, the owning member."""
    rows = []
    for tp in sorted(set(committed) | set(assigned)):
        c = committed.get(tp)
        hw = high_watermark(tp.topic, tp.partition)
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "offset": c.offset if c is not None else NO_OFFSET,
                "metadata": c.metadata if c is not None else "",
                "commit_timestamp_ms": c.commit_timestamp_ms if c is not None else None,
                "high_watermark": hw,
                "log_end_offset": hw,
                "lag": lag(c.offset if c is not None else None, hw),
                "member_id": assigned.get(tp),
            }
        )
    return rows


def reset_rows(
    topic: str,
    partitions: Iterable[int],
    to: ResetTo,
    logs: Mapping[int, LogOffsets],
    committed: Mapping[TopicPartition, CommittedOffset],
) -> list[dict[str, Any]]:
    """The reset plan: per partition its current committed offset (-1: none) and its new offset."""
    out = []
    for p in sorted(partitions):
        c = committed.get(TopicPartition(topic, p))
        out.append(
            {
                "topic": topic,
                "partition": p,
                "current_offset": c.offset if c is not None else NO_OFFSET,
                "new_offset": reset_target(to, logs[p]),
            }
        )
    return out
