"""A Raft group's wake-up deadline crosses from PySyncObj's clock to the ticker's as a delay (raft/group.py).

PySyncObj keeps its deadlines on ``CLOCK_MONOTONIC_RAW``; the ticker's timers are on ``time.monotonic()``. The
two run apart (0.25 s on the dev VM), so passing the time itself made the ticker fire at once, before the
deadline, and a lone write's commit reached the followers only with the next heartbeat (~100 ms) instead of
after ``commit_notify_delay_s`` (20 ms).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from raft import pysyncobj_patches as patches
from raft.group import _GroupSyncObj


def _wake(when_from_now: float) -> float:
    """Ask for a tick ``when_from_now`` s ahead on PySyncObj's clock; how far ahead the ticker was asked, in s."""
    asked: list[tuple[str, float]] = []
    so: Any = _GroupSyncObj.__new__(_GroupSyncObj)
    so._owner = SimpleNamespace(group_id="orders-0", _shard=SimpleNamespace(tick_at=lambda g, t: asked.append((g, t))))
    before = time.monotonic()
    so._wake_at(patches.syncobj_clock() + when_from_now)
    ((group, at),) = asked
    assert group == "orders-0"
    return at - before


def test_the_deadline_travels_as_a_delay_on_the_tickers_clock() -> None:
    ahead = _wake(0.02)
    # 20 ms on the ticker's clock too (plus the millisecond that keeps it after PySyncObj's strict check),
    # whatever the offset between the two clocks.
    assert 0.02 < ahead < 0.02 + 0.001 + 0.05


def test_a_deadline_already_past_asks_for_a_tick_now() -> None:
    assert 0 < _wake(-5.0) < 0.05
