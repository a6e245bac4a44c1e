"""raft/ticker.py: timed ticks (``tick_at``) join the dirty set when due, in time order."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from raft.ticker import TickerShard


@pytest.fixture
def shard() -> Iterator[TickerShard]:
    s = TickerShard(0, 0.1)  # never started: no thread, only its wake-up pipe
    yield s
    os.close(s._wake_r)
    os.close(s._wake_w)


def test_timed_tick_is_due_only_at_its_time(shard: TickerShard) -> None:
    shard.tick_at("b", 7.0)
    shard.tick_at("a", 5.0)
    shard._due_timers(4.99)
    assert shard.dirty == set()
    shard._due_timers(5.0)
    assert shard.dirty == {"a"}
    shard.dirty.clear()
    shard._due_timers(100.0)
    assert shard.dirty == {"b"}
    assert shard._timers == []
