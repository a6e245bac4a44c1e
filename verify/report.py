"""The summary of a checked history: a text table for people, a JSON document for scripts, an exit code."""

from __future__ import annotations

import json
from typing import Any

from .availability import WindowAvailability
from .checker import ANOMALY_KINDS, CheckResult

__all__ = ["EXIT_ANOMALY", "EXIT_OK", "EXIT_SLOW", "exit_code", "render_json", "render_text", "summary"]

EXIT_OK = 0
EXIT_ANOMALY = 1  # at least one anomaly
EXIT_SLOW = 3  # no anomaly, but a single-node fault stopped commits longer than --max-commit-gap

#: How many anomaly details the text report prints per class (the JSON summary has them all, up to MAX_DETAILS).
SHOWN_PER_KIND = 5


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.2f}s"


def commit_gap_exceeded(result: CheckResult, max_commit_gap: float | None) -> bool:
    if max_commit_gap is None:
        return False
    worst = result.availability.max_single_node_commit_gap()
    return worst is not None and worst > max_commit_gap


def exit_code(result: CheckResult, max_commit_gap: float | None = None) -> int:
    if not result.valid:
        return EXIT_ANOMALY
    return EXIT_SLOW if commit_gap_exceeded(result, max_commit_gap) else EXIT_OK


def summary(result: CheckResult, max_commit_gap: float | None = None, **extra: Any) -> dict[str, Any]:
    out = result.to_json()
    out["max_commit_gap"] = max_commit_gap
    out["commit_gap_exceeded"] = commit_gap_exceeded(result, max_commit_gap)
    out["exit_code"] = exit_code(result, max_commit_gap)
    out.update(extra)
    return out


def render_json(result: CheckResult, max_commit_gap: float | None = None, **extra: Any) -> str:
    return json.dumps(summary(result, max_commit_gap, **extra), indent=2, sort_keys=True)


def _window_row(w: WindowAvailability) -> str:
    nodes = ",".join(str(n) for n in w.window.nodes) or "-"
    heal = f"{w.window.heal:.1f}" if w.window.heal is not None else "-"
    return (
        f"{w.window.fault:<22} {nodes:<6} {w.window.start:>7.1f} {heal:>7} {w.commits:>7} {w.acks:>7} "
        f"{_s(w.longest_commit_gap):>10} {_s(w.longest_ack_gap):>10} {_s(w.commit_recovery):>10} "
        f"{_s(w.ack_recovery):>10} {_n(w.leader_changes_after_heal):>9}"
    )


def _pair(stat: dict[str, float | None], digits: int = 2) -> str:
    def one(x: float | None) -> str:
        return "-" if x is None else f"{x:.{digits}f}"

    return f"{one(stat['median'])} / {one(stat['max'])}"


def _n(x: int | None) -> str:
    return "-" if x is None else str(x)


def render_text(result: CheckResult, max_commit_gap: float | None = None) -> str:
    c = result.counts
    lines = ["anomalies"]
    for kind in ANOMALY_KINDS:
        lines.append(f"  {kind:<22} {result.counts_by_kind.get(kind, 0):>8}")
    lines.append("")
    lines.append("operations")
    for key in sorted(k for k in c if ":" in k):
        lines.append(f"  {key:<22} {c[key]:>8}")
    for key in ("assign", "txns-committed", "txns-aborted", "acked-sends", "records-read", "values-read",
                "unverified-writes", "copy-source-records", "copy-records"):  # fmt: skip
        if key in c:
            lines.append(f"  {key:<22} {c[key]:>8}")
    a = result.availability
    lines.append("")
    lines.append(f"availability (run {a.run_start:.1f}s .. {a.run_end:.1f}s, {a.commits} commits, {a.acks} acks)")
    head = (f"{'fault':<22} {'nodes':<6} {'start':>7} {'heal':>7} {'commits':>7} {'acks':>7} {'commit gap':>10} "
            f"{'ack gap':>10} {'commit rec':>10} {'ack rec':>10} {'ldr chg':>9}")  # fmt: skip
    lines.append("  " + head)
    lines.extend("  " + _window_row(w) for w in a.windows)
    lines.append(
        f"  {'outside faults':<22} {'-':<6} {a.outside_seconds:>6.1f}s {'':>7} {'':>7} {'':>7} "
        f"{_s(a.outside_longest_commit_gap):>10} {_s(a.outside_longest_ack_gap):>10}"
    )
    per_class = a.by_fault()
    if any(stats["windows"] > 1 for stats in per_class.values()):
        lines.append("")
        lines.append("per fault class (median / max over its windows)")
        lines.append(
            f"  {'fault':<22} {'windows':>7} {'commit gap':>15} {'ack gap':>15} {'commit rec':>15} {'ldr chg':>9}"
        )
        for fault, st in per_class.items():
            lines.append(
                f"  {fault:<22} {st['windows']:>7} {_pair(st['longest_commit_gap']):>15} "
                f"{_pair(st['longest_ack_gap']):>15} {_pair(st['commit_recovery']):>15} "
                f"{_pair(st['leader_changes_after_heal'], 0):>9}"
            )
    if max_commit_gap is not None:
        worst = a.max_single_node_commit_gap()
        verdict = "exceeded" if commit_gap_exceeded(result, max_commit_gap) else "ok"
        lines.append(f"  single-node fault commit gap {_s(worst)} (limit {max_commit_gap:.2f}s): {verdict}")
    shown: dict[str, int] = {}
    details = []
    for an in result.anomalies:
        shown[an.kind] = shown.get(an.kind, 0) + 1
        if shown[an.kind] <= SHOWN_PER_KIND:
            details.append(f"  {an.kind}: {an.detail}")
    if details:
        lines.append("")
        lines.append("anomaly details (first few per class; --json lists them all)")
        lines.extend(details)
    for note in result.notes:
        lines.append(f"note: {note}")
    lines.append("")
    lines.append("VALID: no anomalies" if result.valid else f"INVALID: {sum(result.counts_by_kind.values())} anomalies")
    return "\n".join(lines)
