"""``txbroker bench produce --profile DIR``: py-spy every node during the produce window, and fold the stacks."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def start_profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return None
    cmd = [str(spy), "record", "-d", str(int(seconds)), "-p", str(pid), "-o", str(out), "--format", "raw", "-n"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


_IDLE_LEAVES = ("epoll_wait", "poll", "select", "select_epoll_poll_impl", "pthread_cond_wait", "sem_wait",
                "pthread_cond_timedwait", "sem_timedwait", "nanosleep", "clock_nanosleep", "time_sleep",
                "acquire_timed", "lock_PyThread_acquire_lock", "PyThread_acquire_lock_timed")  # fmt: skip
_NOISE = ("threading.py", "libpython", "libc.so", "runpy", "<module>", "thread_run")


def summarize_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """Busy-sample shares of a py-spy collapsed-stack file: by leaf frame (self) and by frame (inclusive).

    Samples whose leaf is a wait (epoll_wait, cond wait, ...) count as idle; unresolved libc leaves stay in.
    """
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    busy = idle = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = []
        for f in stack.split(";"):
            name, _, loc = f.partition(" (")
            frames.append(f"{name} ({'/'.join(loc.rstrip(')').split(':')[0].split('/')[-2:])})")
        resolved = [f for f in frames if not f.startswith("0x")] or frames
        if any(resolved[-1].startswith(w + " ") for w in _IDLE_LEAVES):
            idle += int(n)
            continue
        busy += int(n)
        self_c[frames[-1]] += int(n)
        for f in set(frames):
            if not any(x in f for x in _NOISE):
                incl[f] += int(n)

    def share(c: Counter[str]) -> list[str]:
        return [f"{100 * v / max(1, busy):5.1f}% {k}" for k, v in c.most_common(top)]

    return {"busy_samples": busy, "idle_samples": idle, "self": share(self_c), "inclusive": share(incl)}
