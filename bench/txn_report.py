"""The report of ``txbroker bench txn``'s produce part: each mode's windows against the idempotent producer's.

A window (``bench.txn_produce``) counts the records acknowledged in its
measured time, the client's and the nodes' CPU seconds (the nodes' also by
thread kind), the producer's requests and batches, how long each commit (or
flush) took, and the nodes' counters over the whole window. From these come,
per mode: records/s, CPU per record (client, nodes, nodes without RocksDB's
background threads, nodes by thread), requests, batches and Raft messages per
1,000 records, the nodes' busy cores, and against the idempotent producer
the ratio of totals and the CPU ratio, each with a 95 % bootstrap interval
over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

from .measure import bootstrap_95, quantile

Window = dict[str, Any]  # one window of ``bench.txn_produce``: one producer, ``--window`` seconds
Windows = list[Window]
PairStat = Callable[[Windows, Windows], float]  # (windows of a mode, the idempotent windows) -> a ratio


def rate(ws: Windows) -> float:
    """Records/s over the windows' measured time."""
    return sum(float(w["records"]) for w in ws) / sum(float(w["seconds"]) for w in ws)


def per_records(
    ws: Windows, value: Callable[[Window], float], scale: float, digits: int = 2, records: str = "records"
) -> float:
    """``scale`` x the windows' summed ``value`` per record (``records``: the windows' count to divide by)."""
    return round(scale * sum(value(w) for w in ws) / max(1, sum(int(w[records]) for w in ws)), digits)


def cpu_per_record(ws: Windows, key: str = "client_cpu_s") -> float:
    """Microseconds of CPU (``key``: the client's or ``nodes_cpu_s``) per acknowledged record."""
    return per_records(ws, lambda w: float(w[key]), 1e6)


def nodes_cpu_by_thread(ws: Windows) -> dict[str, float]:
    """The nodes' CPU microseconds per record by thread kind (``bench.measure.threads_cpu_by_kind``)."""

    def cpu_of(kind: str) -> Callable[[Window], float]:
        return lambda w: float(w["nodes_cpu_by_thread_s"].get(kind, 0.0))

    kinds = sorted({k for w in ws for k in w["nodes_cpu_by_thread_s"]})
    return {k: per_records(ws, cpu_of(k), 1e6) for k in kinds}


def nodes_python_cpu_per_record(ws: Windows) -> float:
    """The nodes' CPU microseconds per record without RocksDB's background threads."""
    return per_records(ws, lambda w: float(w["nodes_cpu_s"]) - float(w["nodes_cpu_by_thread_s"].get("rocksdb", 0.0)),
                       1e6)  # fmt: skip


def raft_messages_per_1k(ws: Windows) -> float:
    """Raft frames the nodes sent per 1,000 records, over whole windows."""
    return per_records(ws, lambda w: float(w["counters"].get("raft_messages", 0.0)), 1000, 1, "window_records")


def per_1k(ws: Windows, key: str) -> float:
    """The producer's ``key`` (requests, batches) per 1,000 acknowledged records."""
    return per_records(ws, lambda w: int(w[key]), 1000)


def busy_cores(ws: Windows) -> float:
    """Cores the nodes kept busy on average over the measured time."""
    return round(sum(float(w["nodes_cpu_s"]) for w in ws) / sum(float(w["seconds"]) for w in ws), 3)


def cpu_cost(ws: Windows) -> float:
    """The nodes' CPU seconds per acknowledged record."""
    return sum(float(w["nodes_cpu_s"]) for w in ws) / max(1, sum(int(w["records"]) for w in ws))


def cpu_ratio(a: Windows, b: Windows) -> float:
    """Idempotent CPU per record over ``a``'s: the throughput ratio the nodes' cost alone implies."""
    return cpu_cost(b) / cpu_cost(a) if cpu_cost(a) > 0 else 0.0


def python_cpu_ratio(a: Windows, b: Windows) -> float:
    """``cpu_ratio`` without RocksDB's background threads (``nodes_python_cpu_us_per_record``)."""
    cost_a, cost_b = nodes_python_cpu_per_record(a), nodes_python_cpu_per_record(b)
    return cost_b / cost_a if cost_a > 0 else 0.0


def commit_times(ws: Windows) -> list[float]:
    """How long each commit (or flush) of the windows took, in ms, sorted."""
    return sorted(c for w in ws for c in w["commit_ms"])


class VersusIdempotent:
    """Every mode's windows, each compared with the idempotent producer's windows of the same rounds."""

    def __init__(self, windows: dict[str, Windows]) -> None:
        self.windows = windows
        self.idempotent = windows["idempotent"]

    def interval(self, m: str, stat: PairStat | None = None) -> list[float]:
        """95 % bootstrap interval of ``stat(m's windows, idempotent windows)`` over resampled rounds.

        The default statistic is the ratio of totals (records/s).
        """
        pair_stat = stat or (lambda a, b: rate(a) / rate(b))
        pairs = list(zip(self.windows[m], self.idempotent, strict=True))
        return bootstrap_95(pairs, lambda rs: pair_stat([a for a, _ in rs], [b for _, b in rs]))

    def per_window(self, m: str) -> list[float]:
        """Each round's records/s of mode ``m`` over the idempotent producer's."""
        return [round(a["records"] / a["seconds"] / (b["records"] / b["seconds"]), 3)
                for a, b in zip(self.windows[m], self.idempotent, strict=True)]  # fmt: skip

    def per_commit_ms(self, m: str) -> float:
        """The nodes' CPU a commit (or flush) costs beyond the idempotent records it carries, in ms."""
        ws = self.windows[m]
        n = sum(len(w["commit_ms"]) for w in ws)
        records = sum(int(w["records"]) for w in ws)
        return round(1000 * (cpu_cost(ws) - cpu_cost(self.idempotent)) * records / max(1, n), 2)

    def ratios(self, m: str) -> dict[str, Any]:
        """Mode ``m`` against the idempotent producer: throughput and CPU ratios, each with its interval."""
        return {
            "ratio_of_totals": round(rate(self.windows[m]) / rate(self.idempotent), 3),
            "ratio_95pct_interval": self.interval(m),
            "cpu_ratio": round(cpu_ratio(self.windows[m], self.idempotent), 3),
            "cpu_ratio_95pct_interval": self.interval(m, cpu_ratio),
        }


def produce_report(windows: dict[str, Windows], opts: argparse.Namespace) -> dict[str, Any]:
    """The produce part's report from its windows by mode: idempotent, transactional and the controls that ran."""
    modes = list(windows)
    vs = VersusIdempotent(windows)
    txn, idem = windows["transactional"], windows["idempotent"]
    ratio = rate(txn) / rate(idem)
    commits = commit_times(txn)
    secs = sum(w["seconds"] for w in txn)
    out: dict[str, Any] = {
        "overhead_pct": round(100 * (1 - ratio), 1),
        "ratio_of_totals": round(ratio, 3),
        "ratio_95pct_interval": vs.interval("transactional"),
        "target_overhead_le_2pct": 1 - ratio <= 0.02,
        "idempotent_records_per_s": round(rate(idem)),
        "transactional_records_per_s": round(rate(txn)),
        "ratio_per_window_pair": vs.per_window("transactional"),
        "ratio_median_pair": statistics.median(vs.per_window("transactional")),
        "commits": len(commits),
        # How the partition leaders admitted each transaction's first batch per partition, per commit (whole
        # windows): a steady carried-marker pipeline shows ~1 token per partition and no coordinator checks.
        "partition_checks_per_commit": {
            k: round(sum(float(w["counters"].get(f"{k}_checks", 0.0)) for w in txn)
                     / max(1, sum(int(w["window_commits"]) for w in txn)), 2)
            for k in ("coordinator", "token")
        },
        "commit_ms_p50": quantile(commits, 0.5, 1),
        "commit_ms_p99": quantile(commits, 0.99, 1),
        "commit_share_of_time": round(sum(commits) / 1000 / secs, 3),
        "client_cpu_us_per_record": {m: cpu_per_record(windows[m]) for m in modes},
        # Produce requests and batches per 1,000 acknowledged records: a commit's part-full batches show here.
        "requests_per_1k_records": {m: per_1k(windows[m], "requests") for m in modes},
        "batches_per_1k_records": {m: per_1k(windows[m], "batches") for m in modes},
        # Raft frames the nodes sent per 1,000 records, over whole windows (warm-up and final drain included).
        "raft_messages_per_1k_records": {m: raft_messages_per_1k(windows[m]) for m in modes},
        "nodes_cpu_us_per_record": {m: cpu_per_record(windows[m], "nodes_cpu_s") for m in modes},
        # Without RocksDB's background threads, whose work one window leaves to the next: the broker's own
        # (Python) CPU per record, a steadier comparison of the modes.
        "nodes_python_cpu_us_per_record": {m: nodes_python_cpu_per_record(windows[m]) for m in modes},
        "nodes_busy_cores": {m: busy_cores(windows[m]) for m in modes},
        # Where the nodes' CPU goes, by thread: the event loop (HTTP, coordinators), the Raft tickers, RocksDB.
        "nodes_cpu_us_per_record_by_thread": {m: nodes_cpu_by_thread(windows[m]) for m in modes},
        # The same comparison from the nodes' CPU per record: steadier than records/s on a shared machine,
        # and what sets throughput when the nodes are the bottleneck (busy cores equal in both modes).
        "cpu_ratio": round(cpu_ratio(txn, idem), 3),
        "cpu_ratio_95pct_interval": vs.interval("transactional", cpu_ratio),
        "python_cpu_ratio": round(python_cpu_ratio(txn, idem), 3),
        "python_cpu_ratio_95pct_interval": vs.interval("transactional", python_cpu_ratio),
        "config": {"record_size": opts.record_size, "commit_interval_ms": opts.commit_interval_ms,
                   "linger_ms": opts.linger_ms, "partitions": opts.partitions, "windows": opts.produce_windows,
                   "window_s": opts.window, "window_warmup_s": opts.window_warmup},
    }  # fmt: skip

    # The overhead as a cost per commit: comparable across commit intervals (a shorter interval
    # magnifies the per-commit cost above the machine's noise: --commit-interval-ms 25).
    out["nodes_cpu_ms_per_commit"] = vs.per_commit_ms("transactional")
    out["records_per_commit"] = round(sum(int(w["records"]) for w in txn) / max(1, len(commits)))

    if "one_write" in windows:
        out["one_write_floor"] = {
            "nodes_cpu_ms_per_commit": vs.per_commit_ms("one_write"),
            **vs.ratios("one_write"),
            "commit_ms_p50": quantile(commit_times(windows["one_write"]), 0.5, 1),
        }
    # The flush every commit does, without the transaction: an idempotent producer that flushes every
    # commit interval. What it loses is the share of the overhead a commit's flush causes by itself
    # (the pipeline drains; each partition's last batch goes out part-full).
    out["flush_only"] = {
        "nodes_cpu_ms_per_flush": vs.per_commit_ms("flushing"),
        **vs.ratios("flushing"),
        "transactional_vs_flushing": round(rate(txn) / rate(windows["flushing"]), 3),
        "flush_ms_p50": quantile(commit_times(windows["flushing"]), 0.5, 1),
    }
    if "pipelined" in windows:
        piped = windows["pipelined"]
        out["pipelined"] = {
            **vs.ratios("pipelined"),
            "target_overhead_le_2pct": rate(piped) / rate(idem) >= 0.98,
            "pipelined_vs_transactional": round(rate(piped) / rate(txn), 3),
            "ratio_per_window_pair": vs.per_window("pipelined"),
            "commit_ms_p50": quantile(commit_times(piped), 0.5, 1),
            "commit_ms_p99": quantile(commit_times(piped), 0.99, 1),
            "nodes_cpu_ms_per_commit": vs.per_commit_ms("pipelined"),
        }
    if "control" in windows:
        out["aa_control"] = {**vs.ratios("control"), "ratio_per_window_pair": vs.per_window("control")}
        # Both idempotent producers are the same baseline: pooling them halves the baseline's share of the noise.
        rounds = list(zip(txn, idem, windows["control"], strict=True))

        def pooled(rs: list[tuple[Window, Window, Window]]) -> float:
            return rate([r[0] for r in rs]) / rate([w for r in rs for w in r[1:]])

        out["vs_both_idempotent"] = {
            "ratio_of_totals": round(pooled(rounds), 3),
            "ratio_95pct_interval": bootstrap_95(rounds, pooled),
        }
    return out
