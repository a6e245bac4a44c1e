"""Helpers for tests that drive ``raft.node_host`` processes: who leads what, and polling with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable

from raft.node_host import HostProcess


def ready_leaders(procs: dict[int, HostProcess]) -> dict[str, int]:
    """Group id -> the one process that reports it leads the group, ready (groups two claim are left out)."""
    owners: dict[str, list[int]] = {}
    for i, p in procs.items():
        for g in p.request({"op": "leaders"})["ready"]:
            owners.setdefault(g, []).append(i)
    return {g: v[0] for g, v in owners.items() if len(v) == 1}


def wait_until(cond: Callable[[], object], timeout: float, what: str) -> float:
    """Poll ``cond`` every 50 ms until it is true; the seconds that took. AssertionError after ``timeout``."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start
