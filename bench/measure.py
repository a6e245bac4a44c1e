"""What the benchmarks read and compute.

CPU seconds of processes, of their threads by kind and of the whole host (from
/proc), node metrics summed over scrapes, quantiles, bootstrap intervals, the
send-time stamp that latency measurements put in record values, and the
machine a report was made on.
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from cluster.health import Samples

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_Row = TypeVar("_Row")

# A record value's first 8 bytes: ``time.perf_counter_ns()`` at ``send()``. The producer and the consumer that
# reads it back share the process, so the clocks agree.
STAMP = struct.Struct(">q")


def proc_stat(pid: int) -> tuple[float, float, int]:
    """(cpu seconds user+system, RSS MB, threads) of a process from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK, int(fields[21]) * _PAGE / 1e6, int(fields[17])


def threads_cpu_by_kind(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of a process's threads, summed by kind: ``event-loop`` (a node's main thread),
    else the thread's OS name without its number (``raft-ticker``, ``raft-listener``, ``rocksdb``), or ``other``
    for threads that kept the process's name. ``<kind>:sys`` is the part of ``<kind>`` spent in the kernel."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        if tid == str(pid):
            kind = "event-loop"
        elif comm.startswith("rocksdb"):
            kind = "rocksdb"
        elif comm.startswith("python") or comm.startswith("txbroker"):
            kind = "other"
        else:
            kind = comm.rstrip("0123456789").rstrip("-:") or comm
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / _CLK_TCK
        out[f"{kind}:sys"] = out.get(f"{kind}:sys", 0.0) + int(fields[12]) / _CLK_TCK  # the kernel's part
    return out


def host_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole host (all cores) from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / _CLK_TCK, sum(v) / _CLK_TCK


def self_cpu() -> float:
    """CPU seconds (user + system) this process has used so far."""
    t = os.times()
    return t.user + t.system


def pct(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values: the one at index ``q * n`` (the last for ``q`` 1); NaN for none."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def quantile(values: Sequence[float], q: float, digits: int | None = None) -> float | None:
    """The ``q`` quantile of ``values`` (``pct`` of them sorted), rounded to ``digits`` if given; None for none."""
    if not values:
        return None
    value = pct(sorted(values), q)
    return value if digits is None else round(value, digits)


def bootstrap_95(rounds: Sequence[_Row], stat: Callable[[list[_Row]], float]) -> list[float]:
    """95 % bootstrap interval of ``stat`` over ``rounds`` resampled with replacement (2,000 draws, fixed seed)."""
    rng = random.Random(0)
    draws = sorted(stat([rounds[rng.randrange(len(rounds))] for _ in rounds]) for _ in range(2000))
    return [round(draws[50], 3), round(draws[1949], 3)]


def sum_samples(scrapes: list[Samples], name: str, **labels: str) -> float:
    """Sample ``name`` summed over ``scrapes``, over the samples carrying ``labels``."""
    return sum(v for s in scrapes for lv, v in s.get(name, []) if all(lv.get(k) == w for k, w in labels.items()))


def machine_info() -> dict[str, Any]:
    """What a report was measured on: cores, CPU model, Python and kernel versions."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(), "kernel": platform.release()}
