"""raft/ticker.py: timed ticks, completions batching, slow steps, the epoll poller and the full passes' groups."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj.poller import POLL_EVENT_TYPE

from raft import ticker
from raft.ticker import TickerShard


@pytest.fixture
def shard() -> Iterator[TickerShard]:
    s = TickerShard(0, 0.1)  # never started: no thread, only its wake-up pipe
    yield s
    os.close(s._wake_r)
    os.close(s._wake_w)
    s.poller.close()


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
        shard.poller.close()


def test_a_long_pass_reads_the_sockets_and_pulses_every_pulse_interval_in_between() -> None:
    clock = _Clock()
    shard = TickerShard(0, 0.05, clock)  # never started: the test runs its pass
    r, w = socket.socketpair()
    try:
        received: list[bytes] = []
        events: list[str] = []

        def on_readable(_fd: int, _mask: int) -> None:
            received.append(r.recv(100))
            events.append("read")

        shard.poller.subscribe(r.fileno(), on_readable, POLL_EVENT_TYPE.READ)
        shard.add_pulse_hook(lambda: events.append("pulse"))
        w.sendall(b"heartbeat")  # a peer's heartbeat waiting in the socket
        step = ticker.PULSE_S / 4
        groups = [_Group(f"g{i}", clock, step) for i in range(10)]
        shard._tick_groups(groups)  # 10 ticks of a quarter pulse interval each: 2.5 intervals
        assert all(g.ticks == 1 for g in groups)
        # the socket was read in the first pulse, before its hook ran, and two pulses ran during the pass
        assert received == [b"heartbeat"] and events == ["read", "pulse", "pulse"]
        events.clear()
        shard._tick_groups(groups[:3])  # a short pass: no pulse
        assert events == []
    finally:
        r.close()
        w.close()
        os.close(shard._wake_r)
        os.close(shard._wake_w)
        shard.poller.close()


def test_poller_reports_readiness_follows_mask_changes_and_forgets_unsubscribed_descriptors(shard: TickerShard) -> None:
    poller, seen = shard.poller, []
    a, b = socket.socketpair()
    try:
        fd = a.fileno()
        poller.subscribe(fd, lambda d, m: seen.append((d, m)), POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)
        poller.poll(0)
        assert seen == []  # nothing to read, and writability was not asked for
        b.send(b"x")
        poller.poll(1.0)
        assert seen == [(fd, POLL_EVENT_TYPE.READ)]
        a.recv(1)
        seen.clear()
        # Subscribing again changes the mask of the same descriptor (PySyncObj does so to wait for writability).
        poller.subscribe(fd, lambda d, m: seen.append((d, m)), POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE)
        poller.poll(1.0)
        assert seen == [(fd, POLL_EVENT_TYPE.WRITE)]
        seen.clear()
        poller.unsubscribe(fd)
        b.send(b"y")
        poller.poll(0)
        assert seen == []
    finally:
        a.close()
        b.close()
    poller.unsubscribe(fd)  # closed and unsubscribed already: no error
    # A descriptor closed while subscribed leaves the epoll set; its number may come back for a new socket.
    c, d = socket.socketpair()
    try:
        poller.subscribe(c.fileno(), lambda d, m: seen.append(("old", m)), POLL_EVENT_TYPE.READ)
        number = c.fileno()
        c.close()
        e, f = socket.socketpair()
        try:
            assert number in (e.fileno(), f.fileno())
            poller.subscribe(number, lambda d, m: seen.append(("new", m)), POLL_EVENT_TYPE.READ)
            (f if e.fileno() == number else e).send(b"z")
            poller.poll(1.0)
            assert seen == [("new", POLL_EVENT_TYPE.READ)]
        finally:
            e.close()
            f.close()
    finally:
        d.close()


class _Named:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id

    def tick(self) -> None:
        pass


def test_full_passes_tick_the_groups_that_are_not_quiet_as_groups_come_go_quiet_and_wake(shard: TickerShard) -> None:
    def loud() -> list[str]:
        return sorted(g.group_id for g in shard._loud_groups())

    for gid in ("a", "b", "c"):
        shard.groups[gid] = _Named(gid)
    assert loud() == ["a", "b", "c"]
    shard.set_quiet("b", True)
    assert loud() == ["a", "c"]
    shard.groups["d"] = _Named("d")
    assert loud() == ["a", "c", "d"]
    shard.groups.pop("a", None)
    assert loud() == ["c", "d"]
    shard.groups.pop("a", None)  # gone already
    shard.groups["a"] = _Named("a")  # same count as before the removal, other groups
    del shard.groups["c"]
    assert loud() == ["a", "d"]
    shard.set_quiet("b", False)
    assert loud() == ["a", "b", "d"]
    shard._loud_groups().clear()  # callers get their own list
    assert loud() == ["a", "b", "d"]
