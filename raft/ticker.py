"""Ticker shards: a few threads drive every SyncObj of the node (``autoTick=False``).

Each shard owns one real poller and a set of groups. A group's SyncObj gets
a ``ProxyPoller`` (installed through ``pysyncobj_patches.constructing_with_poller``):
subscriptions go to the shard's poller, wrapped so that an event marks the
group *dirty*; ``poll()`` is a no-op because the shard polls once for all.

Loop: run control tasks (create/destroy groups, adopt sockets, transfers),
tick every group when the tick interval has elapsed and otherwise only the
dirty ones and those whose ``tick_at`` time has come (an idle node does one
pass per interval, not one per received heartbeat), run the flush hooks (the
node links send what the pass queued: ``raft.links``), then one real ``poll``
(and the flush hooks again, for the answers sent from its callbacks).
A *quiet* group (``set_quiet``: a quiescent Raft group, ``raft.quiescence``)
is left out of the full passes: it is ticked on its socket events, its
``tick_at`` times and its ``tick_slowly`` time, which the full passes check
without waking the loop for it.

Threading: SyncObj is not thread-safe, so every SyncObj is constructed,
ticked, fed and destroyed on its shard's thread. ``call()`` is the only way in
from other threads (a lock-free queue plus a wake-up pipe).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import os
import queue
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol, TypeVar

from pysyncobj.poller import POLL_EVENT_TYPE

from .thread_names import name_os_thread

logger = logging.getLogger(__name__)

T = TypeVar("T")

# One step of a shard's loop that takes this long held up every group of the shard (heartbeats included).
SLOW_STEP_S = 0.5
# A pass over the groups longer than this reads and writes the sockets in between (``_pulse``): the node links'
# heartbeats go out, and the peers' come in, on time even while thousands of groups elect leaders at once.
PULSE_S = 0.1
_slow_steps = 0
_slow_steps_lock = threading.Lock()


def slow_steps() -> int:
    """How many ticker steps of this process took ``SLOW_STEP_S`` or more (``txbroker_raft_ticker_stalls_total``)."""
    return _slow_steps


def _warn_if_slow(started: float, ended: float, what: str, arg: object) -> None:
    global _slow_steps
    took = ended - started
    if took >= SLOW_STEP_S:
        with _slow_steps_lock:
            _slow_steps += 1
        logger.warning("raft ticker: %s took %.2f s; every group of this ticker waited", what % (arg,), took)


class Tickable(Protocol):
    group_id: str

    def tick(self) -> None: ...


class ProxyPoller:
    """The poller a SyncObj sees: forwards to the shard, marks its group dirty."""

    def __init__(self, shard: TickerShard, group_id: str) -> None:
        self._shard = shard
        self._group_id = group_id

    def subscribe(self, descr: int, callback: Callable[[int, int], None], event_mask: int) -> None:
        group_id = self._group_id
        shard = self._shard

        def on_event(d: int, e: int) -> None:
            shard.dirty.add(group_id)
            callback(d, e)

        shard.poller.subscribe(descr, on_event, event_mask)

    def unsubscribe(self, descr: int) -> None:
        self._shard.poller.unsubscribe(descr)

    def poll(self, timeout: float) -> None:
        """No-op: the shard polls once for all its groups."""

    def notify(self) -> None:
        """A command was queued for this group (any thread): tick it soon."""
        self._shard.notify(self._group_id)


class _SafePoller:
    """PySyncObj's poller interface on epoll; a callback that raises cannot abort the others.

    epoll costs the kernel a visit per ready descriptor, not per subscribed one, whatever
    the number of mostly silent sockets a shard holds.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._callbacks: dict[int, Callable[[int, int], None]] = {}

    def subscribe(self, descr: int, callback: Callable[[int, int], None], event_mask: int) -> None:
        mask = 0
        if event_mask & POLL_EVENT_TYPE.READ:
            mask |= select.EPOLLIN
        if event_mask & POLL_EVENT_TYPE.WRITE:
            mask |= select.EPOLLOUT
        if event_mask & POLL_EVENT_TYPE.ERROR:
            mask |= select.EPOLLERR
        self._callbacks[descr] = callback
        try:
            self._epoll.modify(descr, mask)
        except FileNotFoundError:  # not registered (or its file closed, which unregisters it): add it
            self._epoll.register(descr, mask)

    def unsubscribe(self, descr: int) -> None:
        # Also forget the callback, so that a stale event for a closed
        # descriptor is never delivered to its old owner.
        self._callbacks.pop(descr, None)
        with contextlib.suppress(OSError):  # never registered, or already closed
            self._epoll.unregister(descr)

    def close(self) -> None:
        self._epoll.close()

    def poll(self, timeout: float) -> None:
        events = self._epoll.poll(timeout)
        callbacks = self._callbacks
        for descr, event in events:
            mask = 0
            if event & select.EPOLLIN:
                mask |= POLL_EVENT_TYPE.READ
            if event & select.EPOLLOUT:
                mask |= POLL_EVENT_TYPE.WRITE
            if event & (select.EPOLLERR | select.EPOLLHUP):
                mask |= POLL_EVENT_TYPE.ERROR
            cb = callbacks.get(descr)
            if cb is None:
                continue  # unsubscribed earlier in this batch
            started = time.monotonic()
            try:
                cb(descr, mask)
            except Exception:
                logger.exception("raft poll callback failed (fd %d)", descr)
            _warn_if_slow(started, time.monotonic(), "handling a raft socket event (fd %d)", descr)


class _Registry(dict[str, Tickable]):
    """The shard's groups by id; ``version`` changes with every addition or removal."""

    version = 0

    def __setitem__(self, key: str, value: Tickable) -> None:
        self.version += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.version += 1
        super().__delitem__(key)

    def pop(self, key: str, *default: Tickable | None) -> Tickable | None:  # type: ignore[override]
        self.version += 1
        return super().pop(key, *default)


class TickerShard:
    """One ticker thread and the groups it owns (see module doc).

    ``clock`` (monotonic seconds) times the shard's steps and schedules its
    ticks; ``tick_at`` times are on it.
    """

    def __init__(self, index: int, tick_interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.index = index
        self.tick_interval = tick_interval
        self._clock = clock
        self.poller = _SafePoller()
        self.dirty: set[str] = set()
        self.groups = _Registry()
        self._timers: list[tuple[float, str]] = []  # heap of (monotonic time, group id)
        self.quiet: set[str] = set()  # groups the full passes leave out
        self._quiet_version = 0
        # The groups a full pass ticks (not quiet), for (groups.version, _quiet_version): rebuilt only when
        # a group comes, goes, quiets or wakes, not on every pass over thousands of quiet groups.
        self._loud: list[Tickable] = []
        self._loud_for = (-1, -1)
        self._slow: list[tuple[float, str]] = []  # heap of (monotonic time, group id), checked by full passes
        self._outbox: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}
        self._flush_hooks: list[Callable[[], None]] = []
        self._pulse_hooks: list[Callable[[], None]] = []
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # True while a wake-up byte is in the pipe or about to be: later
        # enqueuers skip the write (cleared by the shard before it drains).
        self._wake_pending = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.poller.subscribe(self._wake_r, self._on_wake, POLL_EVENT_TYPE.READ)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"raft-ticker-{index}", daemon=True)
        self.ticks = 0

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def in_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def start(self) -> None:
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the shard thread; the future holds its result or exception."""
        fut: Future[T] = Future()

        def task() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

        if self.in_thread():
            task()
            return fut
        if self._stopping:
            fut.set_exception(RuntimeError("ticker shard stopped"))
            return fut
        self._enqueue(task)
        return fut

    def notify(self, group_id: str) -> None:
        """Tick ``group_id`` soon (any thread; replaces PySyncObj's per-group notification pipe)."""
        if self.in_thread():
            self.dirty.add(group_id)
        else:
            self._enqueue(functools.partial(self.dirty.add, group_id))

    def _enqueue(self, task: Callable[[], None]) -> None:
        # Put before testing the flag: if the flag is still set, the shard has
        # not drained yet (it clears the flag first), so it will run ``task``.
        self._tasks.put(task)
        if not self._wake_pending:
            self._wake_pending = True
            self.wake()

    def post(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
        """Run ``fn`` on ``loop``; from the shard thread, batched: one loop wake-up per shard pass.

        Many commands commit in one pass under load; waking the event loop
        once for all of them saves a self-pipe write and a thread switch each.
        """
        if not self.in_thread():
            with contextlib.suppress(RuntimeError):  # loop closed: nobody listens any more
                loop.call_soon_threadsafe(fn)
            return
        pending = self._outbox.get(loop)
        if pending is None:
            self._outbox[loop] = [fn]
        else:
            pending.append(fn)

    def add_flush_hook(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` at the end of every pass and after every poll (shard thread): the node links send
        what the groups queued meanwhile, one frame per peer (``raft.links``)."""
        self._flush_hooks.append(fn)

    def add_pulse_hook(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` every ``PULSE_S`` in the middle of a long pass (shard thread), after reading the sockets: the
        node links send their heartbeats and what is queued (``raft.links``)."""
        self._pulse_hooks.append(fn)

    def _flush_outbox(self) -> None:
        for hook in self._flush_hooks:
            try:
                hook()
            except Exception:
                logger.exception("raft ticker: flush hook failed")
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, {}
        for loop, fns in outbox.items():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_run_all, fns)

    def tick_at(self, group_id: str, when: float) -> None:
        """Tick ``group_id`` at (monotonic) time ``when`` at the latest (shard thread only)."""
        heapq.heappush(self._timers, (when, group_id))

    def set_quiet(self, group_id: str, quiet: bool) -> None:
        """Leave ``group_id`` out of the full passes, or take it back (shard thread only)."""
        if quiet == (group_id in self.quiet):
            return
        self._quiet_version += 1
        if quiet:
            self.quiet.add(group_id)
        else:
            self.quiet.discard(group_id)

    def quiet_version(self) -> tuple[int, int]:
        """Changes whenever a group comes, goes, quiets or wakes (any thread)."""
        return (self.groups.version, self._quiet_version)

    def loud_group_ids(self) -> set[str]:
        """The groups that are not quiet (any thread: each copy is made in one step under the GIL)."""
        return set(self.groups) - set(self.quiet)

    def tick_slowly(self, group_id: str, when: float) -> None:
        """Tick ``group_id`` at the first full pass at or after ``when`` (shard thread only)."""
        heapq.heappush(self._slow, (when, group_id))

    def _due_slow(self, now: float) -> list[Tickable]:
        slow, due = self._slow, []
        while slow and slow[0][0] <= now:
            group = self.groups.get(heapq.heappop(slow)[1])
            if group is not None:
                due.append(group)
        return due

    def _due_timers(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            self.dirty.add(heapq.heappop(timers)[1])

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"w")
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is already pending
        except OSError:
            pass  # closed during stop

    def _on_wake(self, descr: int, mask: int) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def stop(self, finalize: Callable[[], None]) -> None:
        """Run ``finalize`` on the shard thread, then end the thread and wait for it."""
        if self._stopping:
            return
        done = self.call(finalize)
        self._stopping = True
        self.wake()
        if self._thread.is_alive():
            self._thread.join(30.0)
            done.result(0)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.poller.close()

    def _run_tasks(self) -> None:
        self._wake_pending = False
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            task()

    def _run(self) -> None:
        name_os_thread()
        next_full = 0.0
        while True:
            self._run_tasks()
            if self._stopping:
                self._run_tasks()
                self._flush_outbox()
                return
            now = self._clock()
            self._due_timers(now)
            if now >= next_full:
                quiet = self.quiet
                if quiet:
                    targets = self._loud_groups()
                    targets += [g for gid in self.dirty if gid in quiet and (g := self.groups.get(gid)) is not None]
                    targets += [g for g in self._due_slow(now) if g.group_id in quiet]
                else:
                    targets = list(self.groups.values())
                next_full = now + self.tick_interval
            else:
                targets = [g for gid in self.dirty if (g := self.groups.get(gid)) is not None]
            self.dirty.clear()
            self._tick_groups(targets)
            self.ticks += 1
            self._flush_outbox()
            wake_at = min(next_full, self._timers[0][0]) if self._timers else next_full
            # (a pulse may have drained the wake-up pipe of a call() whose task is still queued)
            timeout = 0.0 if self.dirty or not self._tasks.empty() else max(0.0, wake_at - self._clock())
            try:
                self.poller.poll(timeout)
            except Exception:
                logger.exception("raft poller failed in shard %d", self.index)
                time.sleep(0.01)
            self._flush_outbox()

    def _loud_groups(self) -> list[Tickable]:
        """A new list of the groups that are not quiet."""
        key = (self.groups.version, self._quiet_version)
        if key != self._loud_for:
            quiet = self.quiet
            self._loud = [g for gid, g in self.groups.items() if gid not in quiet]
            self._loud_for = key
        return list(self._loud)

    def _tick_groups(self, targets: list[Tickable]) -> None:
        """Tick each group; a tick that takes ``SLOW_STEP_S`` or more is counted and logged with its group. A pass
        that runs longer than ``PULSE_S`` pulses in between."""
        next_pulse = self._clock() + PULSE_S
        for group in targets:
            started = self._clock()
            try:
                group.tick()
            except Exception:
                logger.exception("raft tick failed for group %r", group.group_id)
            ended = self._clock()
            _warn_if_slow(started, ended, "ticking group %r", group.group_id)
            if ended >= next_pulse:
                self._pulse()
                next_pulse = self._clock() + PULSE_S

    def _pulse(self) -> None:
        """Read what the sockets have (messages reach their groups, which the next pass ticks), then run the
        pulse hooks (shard thread, between two groups' ticks)."""
        try:
            self.poller.poll(0.0)
        except Exception:
            logger.exception("raft poller failed in shard %d", self.index)
        for hook in self._pulse_hooks:
            try:
                hook()
            except Exception:
                logger.exception("raft ticker: pulse hook failed")


def _run_all(fns: list[Callable[[], None]]) -> None:
    for fn in fns:
        try:
            fn()
        except Exception:
            logger.exception("raft completion callback failed")
