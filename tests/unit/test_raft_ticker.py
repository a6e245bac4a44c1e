"""raft/ticker.py: timed ticks (``tick_at``) join the dirty set when due, in time order."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from raft import ticker
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


class _FakeLoop:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.calls.append((fn, *args))


def test_completions_posted_in_one_pass_wake_the_loop_once(shard: TickerShard, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, ran = _FakeLoop(), []
    monkeypatch.setattr(shard, "in_thread", lambda: True)
    for i in range(3):
        shard.post(loop, lambda i=i: ran.append(i))  # type: ignore[arg-type,misc]
    assert loop.calls == []
    shard._flush_outbox()
    assert len(loop.calls) == 1
    fn, batch = loop.calls[0]
    fn(batch)
    assert ran == [0, 1, 2]
    shard._flush_outbox()
    assert len(loop.calls) == 1  # nothing new: no wake-up


def test_post_from_another_thread_goes_straight_to_the_loop(shard: TickerShard) -> None:
    loop, ran = _FakeLoop(), []
    shard.post(loop, lambda: ran.append(1))  # type: ignore[arg-type]
    assert len(loop.calls) == 1


def test_notifications_from_other_threads_write_one_wake_up_per_drain(shard: TickerShard) -> None:
    for gid in ("a", "b", "a"):
        shard.notify(gid)
    assert os.read(shard._wake_r, 100) == b"w"  # one byte for the whole burst
    assert shard.dirty == set()  # marked by the shard thread, not by the caller
    shard._run_tasks()
    assert shard.dirty == {"a", "b"}
    shard.notify("c")  # after a drain, the next notification wakes the shard again
    assert os.read(shard._wake_r, 100) == b"w"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Group:
    """A group whose tick takes ``seconds`` on ``clock``."""

    def __init__(self, group_id: str, clock: _Clock, seconds: float) -> None:
        self.group_id = group_id
        self.clock = clock
        self.seconds = seconds
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1
        self.clock.now += self.seconds


def test_a_slow_tick_is_counted_and_logged_with_its_group(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    shard = TickerShard(0, 0.05, clock)  # never started: the test runs its tick step
    try:
        slow = _Group("slow-g", clock, ticker.SLOW_STEP_S + 0.05)
        quick = _Group("quick-g", clock, ticker.SLOW_STEP_S / 10)
        before = ticker.slow_steps()
        shard._tick_groups([slow])
        assert slow.ticks == 1
        assert ticker.slow_steps() == before + 1
        assert any("'slow-g'" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
        caplog.clear()
        shard._tick_groups([quick, quick, quick])
        assert quick.ticks == 3
        assert ticker.slow_steps() == before + 1  # quick ticks are not stalls
        assert caplog.records == []
    finally:
        os.close(shard._wake_r)
        os.close(shard._wake_w)
