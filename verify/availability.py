"""Availability of a verify run per fault window: how long writes stopped, and how soon they came back. Pure.

From the history's fault events (``start``/``heal`` pairs) and the completion times of committed
transactions and acknowledged sends:

* **longest commit gap** of a window: the longest stretch inside ``[start, heal]`` with no
  transaction commit completing (the window's edges count as stretch ends, so a window with no
  commit at all has a gap of its whole length);
* **longest ack gap**: the same for acknowledged idempotent sends;
* **recovery**: from the heal to the first commit (ack) completing after it; ``None`` when none
  completed before the run ended;
* **outside faults**: the longest gaps over the parts of the run that no fault window covers;
* **leader changes after the heal** (from ``leadership`` lines, recorded by ``--nemesis``): how many
  Raft groups changed leader or term in the seconds after the heal.

A ``start`` without a matching ``heal`` (the run ended first) makes a window to the run's end.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Availability",
    "FaultWindow",
    "WindowAvailability",
    "compute_availability",
    "fault_windows",
    "first_after",
    "longest_gap",
]


@dataclass(frozen=True)
class FaultWindow:
    fault: str
    nodes: tuple[int, ...]
    start: float
    heal: float | None  # None: the run ended during the fault

    def end(self, run_end: float) -> float:
        return self.heal if self.heal is not None else max(self.start, run_end)


@dataclass(frozen=True)
class WindowAvailability:
    window: FaultWindow
    commits: int
    acks: int
    longest_commit_gap: float
    longest_ack_gap: float
    commit_recovery: float | None
    ack_recovery: float | None
    leader_changes_after_heal: int | None = None

    def to_json(self) -> dict[str, Any]:
        w = self.window
        return {
            "fault": w.fault, "nodes": list(w.nodes), "start": w.start, "heal": w.heal, "commits": self.commits,
            "acks": self.acks, "longest_commit_gap": _r(self.longest_commit_gap),
            "longest_ack_gap": _r(self.longest_ack_gap), "commit_recovery": _r(self.commit_recovery),
            "ack_recovery": _r(self.ack_recovery), "leader_changes_after_heal": self.leader_changes_after_heal,
        }  # fmt: skip


@dataclass
class Availability:
    run_start: float
    run_end: float
    commits: int
    acks: int
    windows: list[WindowAvailability] = field(default_factory=list)
    outside_longest_commit_gap: float = 0.0
    outside_longest_ack_gap: float = 0.0
    outside_seconds: float = 0.0

    def max_single_node_commit_gap(self) -> float | None:
        """The longest commit gap over windows whose fault targets one node (None: no such window).

        A bridge names one node too (the one that reaches both sides), but it cuts a link between two
        others: it is not a single-node fault."""
        gaps = [w.longest_commit_gap for w in self.windows if len(w.window.nodes) == 1 and w.window.fault != "bridge"]
        return max(gaps) if gaps else None

    def by_fault(self) -> dict[str, dict[str, Any]]:
        """Per fault class over its windows: how many, and the median and max of each measure."""
        out: dict[str, dict[str, Any]] = {}
        for fault in dict.fromkeys(w.window.fault for w in self.windows):
            ws = [w for w in self.windows if w.window.fault == fault]
            stats: dict[str, Any] = {"windows": len(ws)}
            for name in ("longest_commit_gap", "longest_ack_gap", "commit_recovery", "leader_changes_after_heal"):
                values = sorted(v for w in ws if (v := getattr(w, name)) is not None)
                stats[name] = {"median": _r(_median(values)), "max": _r(max(values) if values else None)}
            out[fault] = stats
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "run_start": self.run_start, "run_end": self.run_end, "commits": self.commits, "acks": self.acks,
            "windows": [w.to_json() for w in self.windows], "by_fault": self.by_fault(),
            "outside_faults": {"seconds": _r(self.outside_seconds), "longest_commit_gap": _r(
                self.outside_longest_commit_gap), "longest_ack_gap": _r(self.outside_longest_ack_gap)},
        }  # fmt: skip


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    mid = len(values) // 2
    return float(values[mid]) if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def fault_windows(events: Iterable[tuple[str, str, Sequence[int], float]]) -> list[FaultWindow]:
    """(kind, fault, nodes, time) events, in time order -> windows; a heal closes the oldest open window of
    its fault (with the same nodes when one matches)."""
    open_: list[tuple[str, tuple[int, ...], float]] = []
    out: list[FaultWindow] = []
    for kind, fault, nodes, t in sorted(events, key=lambda e: e[3]):
        ns = tuple(nodes)
        if kind == "start":
            open_.append((fault, ns, t))
            continue
        if kind != "heal":
            continue
        match = next((i for i, o in enumerate(open_) if o[0] == fault and o[1] == ns), None)
        if match is None:
            match = next((i for i, o in enumerate(open_) if o[0] == fault), None)
        if match is None:
            continue  # a heal of nothing (the nemesis heals on exit even when nothing is open)
        f, n, start = open_.pop(match)
        out.append(FaultWindow(f, n, start, t))
    out.extend(FaultWindow(f, n, start, None) for f, n, start in open_)
    return sorted(out, key=lambda w: w.start)


def longest_gap(times: Sequence[float], a: float, b: float) -> float:
    """Longest stretch of ``[a, b]`` without a time of ``times`` (sorted) inside it; 0 for an empty interval."""
    if b <= a:
        return 0.0
    lo = bisect.bisect_right(times, a)
    hi = bisect.bisect_left(times, b)
    prev = a
    best = 0.0
    for t in times[lo:hi]:
        best = max(best, t - prev)
        prev = t
    return max(best, b - prev)


def first_after(times: Sequence[float], t: float) -> float | None:
    """Seconds from ``t`` to the first time in ``times`` (sorted) at or after it, None when there is none."""
    i = bisect.bisect_left(times, t)
    return times[i] - t if i < len(times) else None


def _count(times: Sequence[float], a: float, b: float) -> int:
    return bisect.bisect_right(times, b) - bisect.bisect_left(times, a)


def _outside(windows: Sequence[FaultWindow], run_start: float, run_end: float) -> list[tuple[float, float]]:
    """The parts of ``[run_start, run_end]`` no window covers."""
    spans = sorted((w.start, w.end(run_end)) for w in windows)
    out: list[tuple[float, float]] = []
    cursor = run_start
    for s, e in spans:
        if s > cursor:
            out.append((cursor, min(s, run_end)))
        cursor = max(cursor, e)
    if cursor < run_end:
        out.append((cursor, run_end))
    return [(a, b) for a, b in out if b > a]


def compute_availability(
    commits: Iterable[float],
    acks: Iterable[float],
    faults: Iterable[tuple[str, str, Sequence[int], float]],
    run_start: float,
    run_end: float,
    leadership: Iterable[tuple[float, int]] = (),
) -> Availability:
    """Per-window and outside-fault availability from commit/ack completion times and fault events;
    ``leadership``: (heal time, groups that changed leader after it)."""
    changes = dict(leadership)
    c = sorted(commits)
    a = sorted(acks)
    windows = fault_windows(faults)
    out = Availability(run_start, run_end, len(c), len(a))
    for w in windows:
        end = w.end(run_end)
        out.windows.append(
            WindowAvailability(
                window=w,
                commits=_count(c, w.start, end),
                acks=_count(a, w.start, end),
                longest_commit_gap=longest_gap(c, w.start, end),
                longest_ack_gap=longest_gap(a, w.start, end),
                commit_recovery=first_after(c, w.heal) if w.heal is not None else None,
                ack_recovery=first_after(a, w.heal) if w.heal is not None else None,
                leader_changes_after_heal=changes.get(w.heal) if w.heal is not None else None,
            )
        )
    for s, e in _outside(windows, run_start, run_end):
        out.outside_seconds += e - s
        out.outside_longest_commit_gap = max(out.outside_longest_commit_gap, longest_gap(c, s, e))
        out.outside_longest_ack_gap = max(out.outside_longest_ack_gap, longest_gap(a, s, e))
    return out
