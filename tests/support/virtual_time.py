"""An asyncio event loop on virtual time, for unit tests that must not wait on the wall clock.

``VirtualTimeLoop.time()`` is a counter that moves only when the loop is
idle -- every task is waiting and nothing is ready to run: it then jumps to
the next timer, so ``asyncio.sleep(5)`` or ``asyncio.timeout(0.05)`` take
exactly that much virtual time and no real time. A test simulates work that
blocks the loop by advancing ``clock.now`` itself, from synchronous code.
``until_idle()`` returns once every other task is waiting, without moving
the clock. Not for real I/O: waiting for a socket looks idle too, so the
clock would run ahead of it.
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["VirtualTimeLoop", "run_on_virtual_time", "until_idle"]


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0


class _VirtualSelector(selectors.DefaultSelector):
    """The loop asks it to wait ``timeout`` seconds only when idle: the clock jumps instead."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock
        self.idle_waiters: list[asyncio.Future[None]] = []

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout != 0:  # nothing is ready: every task waits (for a timer, or for ever when None)
            if self.idle_waiters:
                waiters, self.idle_waiters = self.idle_waiters, []
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)
            elif timeout is None:
                raise RuntimeError("every task waits and no timer is set: the test would hang")
            else:
                self._clock.now += timeout
        result: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        return result


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.clock = VirtualClock()
        self._virtual_selector = _VirtualSelector(self.clock)
        super().__init__(self._virtual_selector)

    def time(self) -> float:
        return self.clock.now

    async def until_idle(self) -> None:
        """Return once every other task waits for a timer or a future; the clock does not move."""
        fut = self.create_future()
        self._virtual_selector.idle_waiters.append(fut)
        await fut


async def until_idle() -> None:
    """``VirtualTimeLoop.until_idle`` of the running loop."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop), "run the test with run_on_virtual_time"
    await loop.until_idle()


def run_on_virtual_time(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Decorator: run an async test on a fresh ``VirtualTimeLoop`` (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run() -> None:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(test())

    return run
