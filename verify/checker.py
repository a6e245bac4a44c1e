"""Jepsen's Kafka anomaly classes, checked over a verify history. Pure: no I/O, no clock.

``check(ops)`` makes one pass over the history (an iterable, so a file can be streamed) that fills
dicts keyed by ``(topic, value)`` and ``(topic, partition, offset)``, then one pass over those
dicts; the cost is linear in the history apart from a sort of the read offsets per partition.
The anomaly classes (docs/verify.md has the definitions):

* ``lost-write``: an acknowledged write (an idempotent send acked ``ok``, or a record of a transaction
  committed ``ok``) no consumer ever read, although reads of its partition went past its offset (or
  the final drain covered it);
* ``duplicate``: one value read at more than one offset;
* ``aborted-read``: a read_committed consumer read a record of an aborted transaction (``txn-abort``
  with any outcome, or ``txn-commit`` that definitely failed);
* ``partial-transaction``: a consumer read some records of a committed transaction (or of one whose
  commit is unknown but that some consumer saw) but not the others, although it read past them;
* ``inconsistent-offsets``: two reads of one topic-partition-offset returned different values, two
  acknowledgements named the same offset, or an acknowledged offset holds another value;
* ``non-monotonic-poll``: a consumer's successive reads of a partition went backwards, returned an
  offset twice, or skipped an offset that a read_committed read elsewhere shows holds a record --
  without an ``assign`` (seek) in between;
* ``producer-order``: one producer's acknowledged records to one partition sit in a different offset
  order than they were sent;
* ``phantom-read``: a read returned a value that no operation wrote to that topic, or one whose
  write definitely failed;
* ``copy-lost`` / ``copy-duplicate``: with the copier, a source record missing from the finished copy,
  or present in it more than once.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .availability import Availability, compute_availability
from .history import Op

__all__ = ["ANOMALY_KINDS", "Anomaly", "CheckResult", "check"]

ANOMALY_KINDS = (
    "lost-write",
    "duplicate",
    "aborted-read",
    "partial-transaction",
    "inconsistent-offsets",
    "non-monotonic-poll",
    "producer-order",
    "phantom-read",
    "copy-lost",
    "copy-duplicate",
)

#: Details kept per class (every anomaly is counted; a broken run must not exhaust memory on details).
MAX_DETAILS = 200

TV = tuple[str, str]  # (topic, value)
TPO = tuple[str, int, int]  # (topic, partition, offset)
TP = tuple[str, int]


@dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, **self.data}


@dataclass
class CheckResult:
    anomalies: list[Anomaly]
    counts_by_kind: dict[str, int]
    counts: dict[str, int]
    availability: Availability
    notes: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not any(self.counts_by_kind.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "anomaly_counts": {k: self.counts_by_kind.get(k, 0) for k in ANOMALY_KINDS},
            "anomalies": [a.to_json() for a in self.anomalies],
            "counts": dict(sorted(self.counts.items())),
            "availability": self.availability.to_json(),
            "notes": self.notes,
        }


@dataclass(slots=True)
class _Write:
    process: str
    outcome: str  # the op's outcome; for a transaction's record, the transaction's
    partition: int | None
    offset: int | None
    order: tuple[int, ...]  # send order within the process
    txn: int | None  # index into _State.txns, None for a plain send


@dataclass(slots=True)
class _Txn:
    process: str
    txn: int
    commit: bool
    outcome: str
    records: list[tuple[str, int | None, str, int | None]]
    invoke: float
    complete: float

    @property
    def aborted(self) -> bool:
        return not self.commit or self.outcome == "fail"


@dataclass
class _State:
    anomalies: list[Anomaly] = field(default_factory=list)
    by_kind: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    writes: dict[TV, _Write] = field(default_factory=dict)
    txns: list[_Txn] = field(default_factory=list)
    acks: dict[TPO, str] = field(default_factory=dict)
    at_offset: dict[TPO, str] = field(default_factory=dict)
    read_at: dict[TV, tuple[int, int]] = field(default_factory=dict)  # first (partition, offset) a value was read at
    more_locations: dict[TV, set[tuple[int, int]]] = field(default_factory=dict)
    readers: dict[TV, int] = field(default_factory=dict)  # bitmask of read_committed processes that read it
    processes: dict[str, int] = field(default_factory=dict)
    frontier: dict[TP, int] = field(default_factory=dict)  # max offset read (any process) + 1
    proc_frontier: dict[tuple[int, str, int], int] = field(default_factory=dict)
    drained: dict[tuple[int, str, int], int] = field(default_factory=dict)  # (proc, t, p) -> end offset covered
    drained_any: dict[TP, int] = field(default_factory=dict)
    last_read: dict[tuple[str, str, int], int] = field(default_factory=dict)
    gaps: list[tuple[str, str, int, int, int, float]] = field(default_factory=list)
    rc_offsets: dict[TP, list[int]] = field(default_factory=lambda: defaultdict(list))
    reported_offsets: set[TPO] = field(default_factory=set)
    commit_times: list[float] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    faults: list[tuple[str, str, list[int], float]] = field(default_factory=list)
    leadership: list[tuple[float, int]] = field(default_factory=list)  # (heal time, groups changed after it)
    copies: list[tuple[str, str]] = field(default_factory=list)
    copier_caught_up: bool | None = None
    run_start: float | None = None
    run_end: float | None = None
    first_time: float | None = None
    last_time: float | None = None

    def anomaly(self, kind: str, detail: str, **data: Any) -> None:
        self.by_kind[kind] += 1
        if self.by_kind[kind] <= MAX_DETAILS:
            self.anomalies.append(Anomaly(kind, detail, data))

    def proc(self, name: str) -> int:
        i = self.processes.get(name)
        if i is None:
            i = self.processes[name] = len(self.processes)
        return i

    def seen_time(self, *times: Any) -> None:
        for t in times:
            if isinstance(t, int | float):
                self.first_time = t if self.first_time is None else min(self.first_time, t)
                self.last_time = t if self.last_time is None else max(self.last_time, t)


# ---- the pass over the history ------------------------------------------------------------------------


def _add_write(s: _State, topic: str, value: str, w: _Write) -> None:
    key = (topic, value)
    if key in s.writes:
        s.anomaly("duplicate", f"value {value!r} written twice to {topic}", topic=topic, value=value)
        return
    s.writes[key] = w
    if w.offset is not None and w.partition is not None:
        tpo = (topic, w.partition, w.offset)
        other = s.acks.get(tpo)
        if other is not None and other != value:
            s.anomaly(
                "inconsistent-offsets",
                f"{topic}-{w.partition}@{w.offset} acknowledged for both {other!r} and {value!r}",
                topic=topic, partition=w.partition, offset=w.offset, values=[other, value],
            )  # fmt: skip
        else:
            s.acks[tpo] = value


def _on_send(s: _State, op: Op) -> None:
    s.counts[f"send:{op['outcome']}"] += 1
    acked = op["outcome"] == "ok" and op.get("offset") is not None
    w = _Write(op["process"], op["outcome"], op.get("partition"), op.get("offset") if acked else None,
               (int(op.get("seq", 0)),), None)  # fmt: skip
    _add_write(s, op["topic"], op["value"], w)
    if op["outcome"] == "ok":
        s.ack_times.append(float(op["complete"]))


def _on_txn(s: _State, op: Op) -> None:
    commit = op["type"] == "txn-commit"
    s.counts[f"{op['type']}:{op['outcome']}"] += 1
    records = [(str(r[0]), r[1], str(r[2]), r[3] if len(r) > 3 else None) for r in op.get("records", [])]
    t = _Txn(op["process"], int(op.get("txn", 0)), commit, op["outcome"], records, op["invoke"], op["complete"])
    s.txns.append(t)
    index = len(s.txns) - 1
    for i, (topic, partition, value, offset) in enumerate(records):
        _add_write(s, topic, value, _Write(t.process, t.outcome, partition, offset, (t.txn, i), index))
    if commit and op["outcome"] == "ok":
        s.commit_times.append(float(op["complete"]))


def _on_assign(s: _State, op: Op) -> None:
    s.counts["assign"] += 1
    for topic, partition, position in op.get("positions", []):
        s.last_read[(op["process"], topic, partition)] = int(position) - 1


def _on_poll(s: _State, op: Op) -> None:
    s.counts[f"poll:{op['outcome']}"] += 1
    proc_name = op["process"]
    committed = op.get("isolation", "read_committed") == "read_committed"
    bit = 1 << s.proc(proc_name)
    pid = s.proc(proc_name)
    for topic, partition, offset, value in op.get("records", []):
        s.counts["records-read"] += 1
        tpo = (topic, partition, offset)
        prior = s.at_offset.get(tpo)
        if prior is None:
            s.at_offset[tpo] = value
            if committed:
                s.rc_offsets[(topic, partition)].append(offset)
        elif prior != value and tpo not in s.reported_offsets:
            s.reported_offsets.add(tpo)
            s.anomaly(
                "inconsistent-offsets",
                f"{topic}-{partition}@{offset} read as {prior!r} and as {value!r} ({proc_name})",
                topic=topic, partition=partition, offset=offset, values=[prior, value], process=proc_name,
            )  # fmt: skip
        tv = (topic, value)
        loc = (partition, offset)
        first = s.read_at.get(tv)
        if first is None:
            s.read_at[tv] = loc
        elif first != loc:
            s.more_locations.setdefault(tv, set()).add(loc)
        if committed:
            s.readers[tv] = s.readers.get(tv, 0) | bit
        tp = (topic, partition)
        s.frontier[tp] = max(s.frontier.get(tp, 0), offset + 1)
        key = (pid, topic, partition)
        s.proc_frontier[key] = max(s.proc_frontier.get(key, 0), offset + 1)
        _monotonic(s, op, topic, partition, offset, value)


def _monotonic(s: _State, op: Op, topic: str, partition: int, offset: int, value: str) -> None:
    key = (op["process"], topic, partition)
    prev = s.last_read.get(key, -1)
    if offset <= prev:
        what = "the same offset again" if offset == prev else "backwards"
        s.anomaly(
            "non-monotonic-poll", f"{op['process']} read {topic}-{partition}@{offset} after @{prev}: {what}",
            process=op["process"], topic=topic, partition=partition, offset=offset, previous=prev, value=value,
            time=op["complete"],
        )  # fmt: skip
    elif offset > prev + 1:
        s.gaps.append((op["process"], topic, partition, prev, offset, float(op["complete"])))
    s.last_read[key] = max(prev, offset)


def _on_drain(s: _State, op: Op) -> None:
    if not op.get("complete"):
        return
    tp = (op["topic"], int(op["partition"]))
    end = int(op["end_offset"])
    s.drained[(s.proc(op["process"]), *tp)] = end
    s.drained_any[tp] = max(s.drained_any.get(tp, 0), end)


def _consume(s: _State, op: Op) -> None:
    kind = op["type"]
    s.seen_time(op.get("invoke"), op.get("complete"), op.get("time"))
    if kind == "send":
        _on_send(s, op)
    elif kind in ("txn-commit", "txn-abort"):
        _on_txn(s, op)
    elif kind == "poll":
        _on_poll(s, op)
    elif kind == "assign":
        _on_assign(s, op)
    elif kind == "drain":
        _on_drain(s, op)
    elif kind == "fault":
        s.faults.append((str(op["kind"]), str(op["fault"]), list(op.get("nodes", [])), float(op["time"])))
    elif kind == "leadership":
        s.leadership.append((float(op["time"]), len(op.get("changed", []))))
    elif kind == "run":
        if op.get("kind") == "start":
            s.run_start = float(op["time"])
        elif op.get("kind") == "end":
            s.run_end = float(op["time"])
    elif kind == "meta":
        copy = op.get("copy")
        if isinstance(copy, dict) and copy.get("from") and copy.get("to"):
            s.copies.append((str(copy["from"]), str(copy["to"])))
    elif kind == "copier" and op.get("kind") == "done":
        s.copier_caught_up = bool(op.get("caught_up"))


# ---- the analyses over the indexes ------------------------------------------------------------------


def _covered(s: _State, topic: str, partition: int | None, offset: int | None) -> bool:
    """Did reads of the partition go past ``offset`` (or a complete drain cover the partition)?"""
    if partition is None:
        return False
    tp = (topic, partition)
    if offset is None:
        return tp in s.drained_any
    return s.frontier.get(tp, 0) > offset or s.drained_any.get(tp, -1) > offset


def _proc_covered(s: _State, pid: int, topic: str, partition: int | None, offset: int | None) -> bool:
    if partition is None:
        return False
    drained = s.drained.get((pid, topic, partition))
    if offset is None:
        return drained is not None
    return s.proc_frontier.get((pid, topic, partition), 0) > offset or (drained is not None and drained > offset)


def _check_offsets(s: _State) -> None:
    for (topic, partition, offset), value in s.acks.items():
        held = s.at_offset.get((topic, partition, offset))
        if held is not None and held != value:
            s.anomaly(
                "inconsistent-offsets", f"{topic}-{partition}@{offset} acknowledged for {value!r} but holds {held!r}",
                topic=topic, partition=partition, offset=offset, acknowledged=value, read=held,
            )  # fmt: skip
            continue
        loc = s.read_at.get((topic, value))
        if held is None and loc is not None and loc != (partition, offset):
            s.anomaly(
                "inconsistent-offsets",
                f"{value!r} acknowledged at {topic}-{partition}@{offset} but read at {topic}-{loc[0]}@{loc[1]}",
                topic=topic, value=value, acknowledged=[partition, offset], read=list(loc),
            )  # fmt: skip


def _check_locations(s: _State, copy_targets: set[str]) -> None:
    for (topic, value), extra in s.more_locations.items():
        locs = sorted({s.read_at[(topic, value)], *extra})
        kind = "copy-duplicate" if topic in copy_targets else "duplicate"
        where = ", ".join(f"{topic}-{p}@{o}" for p, o in locs)
        s.anomaly(kind, f"{value!r} read at {len(locs)} offsets: {where}", topic=topic, value=value,
                  locations=[list(x) for x in locs])  # fmt: skip


def _check_reads(s: _State, copy_sources: dict[str, str]) -> None:
    """Phantom and aborted reads: every value read is checked against its write."""
    for tv in s.read_at:
        topic, value = tv
        source = copy_sources.get(topic)
        if source is not None:
            if (source, value) not in s.read_at:
                s.anomaly("phantom-read", f"{value!r} in the copy {topic} is no record of {source}",
                          topic=topic, value=value)  # fmt: skip
            continue
        w = s.writes.get(tv)
        if w is None:
            s.anomaly("phantom-read", f"{value!r} read from {topic}, which no operation wrote there",
                      topic=topic, value=value, location=list(s.read_at[tv]))  # fmt: skip
        elif w.txn is None and w.outcome == "fail":
            s.anomaly("phantom-read", f"{value!r} read from {topic}, whose send definitely failed",
                      topic=topic, value=value, process=w.process)  # fmt: skip
        elif w.txn is not None and s.readers.get(tv) and s.txns[w.txn].aborted:
            t = s.txns[w.txn]
            what = "aborted" if not t.commit else "failed to commit"
            s.anomaly(
                "aborted-read", f"{value!r} of {t.process} txn {t.txn} ({what}) read at {topic}-"
                f"{s.read_at[tv][0]}@{s.read_at[tv][1]}", topic=topic, value=value, process=t.process, txn=t.txn,
                outcome=t.outcome, readers=_names(s, s.readers[tv]),
            )  # fmt: skip


def _names(s: _State, mask: int) -> list[str]:
    return [name for name, i in s.processes.items() if mask >> i & 1]


def _check_lost(s: _State) -> None:
    for (topic, value), w in s.writes.items():
        acked = w.outcome == "ok" and (w.txn is None or s.txns[w.txn].commit)
        if not acked or (topic, value) in s.read_at:
            continue
        if w.txn is None and w.offset is None:
            continue  # an ok send without an offset (acks=0) cannot be placed
        if not _covered(s, topic, w.partition, w.offset):
            s.counts["unverified-writes"] += 1
            continue
        how = "transaction" if w.txn is not None else "send"
        s.anomaly(
            "lost-write", f"{value!r} ({how} of {w.process}, acknowledged at {topic}-{w.partition}@{w.offset}) "
            "was never read although reads went past it", topic=topic, partition=w.partition, offset=w.offset,
            value=value, process=w.process,
        )  # fmt: skip


def _check_partial(s: _State) -> None:
    for t in s.txns:
        if not t.commit or t.outcome == "fail" or not t.records:
            continue
        masks = [s.readers.get((topic, value), 0) for topic, _p, value, _o in t.records]
        union = 0
        for m in masks:
            union |= m
        if t.outcome == "ok":
            s.counts["txns-committed"] += 1
        if not union:
            continue
        for name, pid in s.processes.items():
            bit = 1 << pid
            if not union & bit:
                continue
            missing = [r for r, m in zip(t.records, masks, strict=True) if not m & bit]
            if missing and all(_proc_covered(s, pid, topic, p, o) for topic, p, _v, o in missing):
                s.anomaly(
                    "partial-transaction",
                    f"{name} read {len(t.records) - len(missing)} of the {len(t.records)} records of "
                    f"{t.process} txn {t.txn} ({t.outcome}); missing {[r[2] for r in missing]}",
                    process=name, writer=t.process, txn=t.txn, outcome=t.outcome,
                    missing=[list(r) for r in missing],
                )  # fmt: skip


def _check_order(s: _State) -> None:
    by_producer: dict[tuple[str, str, int], list[tuple[tuple[int, ...], int, str]]] = defaultdict(list)
    for (topic, value), w in s.writes.items():
        if w.outcome != "ok" or w.partition is None or (w.txn is not None and not s.txns[w.txn].commit):
            continue
        loc = s.read_at.get((topic, value))
        offset = loc[1] if loc is not None and loc[0] == w.partition else w.offset
        if offset is not None:
            by_producer[(w.process, topic, w.partition)].append((w.order, offset, value))
    for (process, topic, partition), writes in by_producer.items():
        writes.sort()
        for (_o1, off1, v1), (_o2, off2, v2) in itertools.pairwise(writes):
            if off2 <= off1:
                s.anomaly(
                    "producer-order",
                    f"{process} sent {v1!r} before {v2!r} to {topic}-{partition}, but they sit at @{off1} and @{off2}",
                    process=process, topic=topic, partition=partition, first=[v1, off1], second=[v2, off2],
                )  # fmt: skip


def _check_skips(s: _State) -> None:
    offsets = {tp: sorted(set(v)) for tp, v in s.rc_offsets.items()}
    for process, topic, partition, prev, cur, t in s.gaps:
        seen = offsets.get((topic, partition), [])
        i = bisect.bisect_right(seen, prev)
        if i < len(seen) and seen[i] < cur:
            skipped = seen[i]
            s.anomaly(
                "non-monotonic-poll",
                f"{process} read {topic}-{partition}@{cur} after @{prev}, skipping @{skipped} "
                f"({s.at_offset[(topic, partition, skipped)]!r})",
                process=process, topic=topic, partition=partition, offset=cur, previous=prev, skipped=skipped,
                time=t,
            )  # fmt: skip


def _check_copies(s: _State) -> None:
    for source, target in s.copies:
        sources = [v for (topic, v) in s.read_at if topic == source]
        s.counts["copy-source-records"] += len(sources)
        s.counts["copy-records"] += sum(1 for (topic, _v) in s.read_at if topic == target)
        finished = s.copier_caught_up is True and any(tp[0] == target for tp in s.drained_any)
        if not finished:
            s.counts["copy-unverified"] += sum(1 for v in sources if (target, v) not in s.read_at)
            continue
        for v in sources:
            if (target, v) not in s.read_at:
                s.anomaly("copy-lost", f"{v!r} of {source} is missing from the copy {target}",
                          topic=source, copy=target, value=v)  # fmt: skip


def check(ops: Iterable[Op]) -> CheckResult:
    """Every anomaly of the history plus counts and per-fault availability."""
    s = _State()
    for op in ops:
        _consume(s, op)
    copy_sources = {target: source for source, target in s.copies}
    _check_offsets(s)
    _check_locations(s, set(copy_sources))
    _check_reads(s, copy_sources)
    _check_lost(s)
    _check_partial(s)
    _check_order(s)
    _check_skips(s)
    _check_copies(s)
    s.counts["values-read"] = len(s.read_at)
    s.counts["txns-aborted"] = sum(1 for t in s.txns if t.aborted and t.outcome != "info")
    s.counts["acked-sends"] = s.counts["send:ok"]
    notes: list[str] = []
    if s.counts["unverified-writes"]:
        n = s.counts["unverified-writes"]
        notes.append(f"{n} acknowledged writes lie beyond every read (not checked for loss)")
    if s.counts["copy-unverified"]:
        notes.append("the copier did not finish: missing copies are not counted as anomalies")
    run_start = s.run_start if s.run_start is not None else (s.first_time or 0.0)
    run_end = s.run_end if s.run_end is not None else (s.last_time or run_start)
    availability = compute_availability(s.commit_times, s.ack_times, s.faults, run_start, run_end, s.leadership)
    return CheckResult(s.anomalies, {k: s.by_kind.get(k, 0) for k in ANOMALY_KINDS}, dict(s.counts), availability,
                       notes)  # fmt: skip
