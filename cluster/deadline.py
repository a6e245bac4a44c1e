"""Deadlines of the calls one node makes to another, and retrying such a call where the leader went.

A request that reaches a node has a deadline: the client's ``timeout_ms``
where the request carries one, else the node's ``request_timeout_ms``,
measured from its arrival. Every call the node makes on the request's behalf
(a forward to the controller, a partition leader, a coordinator; a fan-out;
a verification) gets what is left of it, never a fixed timeout. The HTTP
layer opens a ``deadline_scope`` per request; ``PeerHttpClient`` and the
``Forwarder`` read it with ``current_deadline``. Background work (the
marker driver) runs outside any request's scope and opens one per attempt.

``call_at_leader`` is the retry policy of such a call: it sends to the node
``resolve()`` names now; on an answer that says the node does not lead (any
more), on a connection failure, or when ``resolve()`` names another node
while the attempt is still waiting, it looks again and sends there, with a
small backoff, until the deadline.

``Deadline`` is a value on the event loop's clock (``loop.time()``), so the
policy runs on virtual time in unit tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from clients.protocol import BrokerError, ErrorCode

__all__ = [
    "MOVED",
    "RETRY_BACKOFF_S",
    "WATCH_INTERVAL_S",
    "Deadline",
    "abandon_if_moved",
    "background_task",
    "call_at_leader",
    "current_deadline",
    "deadline_scope",
    "loop_now",
    "timeout_for",
]

T = TypeVar("T")
R = TypeVar("R")

#: Backoff between attempts (seconds, by attempt number; the last one repeats): small, never zero.
RETRY_BACKOFF_S = (0.02, 0.05, 0.1, 0.2)
#: How often an attempt that has no answer yet looks whether the leader moved.
WATCH_INTERVAL_S = 0.1

#: Answers that prove the target did not serve the call (or could not be reached): retried at the leader.
MOVED = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.NETWORK_EXCEPTION,
    }
)


@dataclass(frozen=True, slots=True, order=True)
class Deadline:
    """A point in time on the event loop's clock (seconds), by which a call must be answered."""

    at: float

    @staticmethod
    def after(now: float, seconds: float) -> Deadline:
        return Deadline(now + max(0.0, seconds))

    def remaining(self, now: float) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.at - now)

    def expired(self, now: float) -> bool:
        return now >= self.at

    def earliest(self, other: Deadline | None) -> Deadline:
        return self if other is None or self.at <= other.at else other


_CURRENT: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("txbroker_deadline", default=None)


def loop_now() -> float:
    return asyncio.get_running_loop().time()


def current_deadline() -> Deadline | None:
    """The deadline of the request (or attempt) this code runs for, if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def deadline_scope(deadline: Deadline) -> Iterator[Deadline]:
    """Run the block under ``deadline`` (or the enclosing one, when that is earlier); yields the one in force."""
    effective = deadline.earliest(_CURRENT.get())
    token = _CURRENT.set(effective)
    try:
        yield effective
    finally:
        _CURRENT.reset(token)


def background_task(coro: Coroutine[Any, Any, R]) -> asyncio.Task[R]:
    """Run ``coro`` as a task outside any request's deadline (work that outlives the request that began it)."""
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())


def timeout_for(default_s: float, now: float | None = None) -> float:
    """How long a call may take now: what is left of the current deadline, else ``default_s``.

    Raises ``REQUEST_TIMED_OUT`` when the deadline has passed (the call is not sent).
    """
    deadline = _CURRENT.get()
    if deadline is None:
        return default_s
    left = deadline.remaining(loop_now() if now is None else now)
    if left <= 0:
        raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, "the request's deadline passed before the call")
    return left


def _backoff(attempt: int) -> float:
    return RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]


async def call_at_leader(
    resolve: Callable[[BrokerError | None], T | None],
    attempt: Callable[[T], Awaitable[R]],
    deadline: Deadline,
    *,
    what: str,
    retriable: frozenset[ErrorCode] = MOVED,
    watch_s: float = WATCH_INTERVAL_S,
) -> R:
    """``attempt(target)`` at the target ``resolve(last_error)`` names, retried where the leader went.

    Each attempt runs under ``deadline`` (``deadline_scope``: a ``PeerClient`` call in it times out with
    the deadline). An answer whose code is in ``retriable`` makes the policy resolve again (the error's
    hint may name the new leader) and retry after a small backoff. While an attempt has no answer, every
    ``watch_s`` it asks ``resolve(None)`` again: a different target means the leader moved, and the
    attempt is abandoned (cancelled) for the new one. When the deadline passes the last error is raised,
    or ``REQUEST_TIMED_OUT``. Other errors are raised at once.
    """
    loop = asyncio.get_running_loop()
    last: BrokerError | None = None
    tries = 0
    while True:
        target = resolve(last)
        if target is not None:
            task = loop.create_task(_scoped(attempt(target), deadline))
            task.add_done_callback(_retrieve)
            try:
                moved = await _watch(task, target, resolve, deadline, watch_s)
            except BrokerError as exc:
                if exc.error_code not in retriable:
                    raise
                last = exc
            else:
                if moved is None:
                    return task.result()
                last = BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{what}: the leader moved from {target}")
        elif last is None:
            last = BrokerError(ErrorCode.LEADER_NOT_AVAILABLE, f"{what}: no leader known")
        now = loop.time()
        pause = _backoff(tries)
        tries += 1
        if deadline.expired(now + pause):
            if last.error_code in retriable or last.error_code is ErrorCode.REQUEST_TIMED_OUT:
                raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"{what} not answered in time (last: {last})")
            raise last
        await asyncio.sleep(pause)


async def abandon_if_moved(
    aw: Awaitable[R],
    where: Callable[[], T | None],
    deadline: Deadline,
    *,
    what: str,
    watch_s: float = WATCH_INTERVAL_S,
) -> R:
    """Await ``aw`` under ``deadline``; abandon it with NOT_LEADER_OR_FOLLOWER once ``where()`` names another node.

    One attempt of a call whose callee resolves the leader itself (a marker write): while it has no
    answer, every ``watch_s`` the leader as this node knows it is compared with the one at the start.
    ``REQUEST_TIMED_OUT`` when the deadline passes first.
    """
    target = where()
    task = asyncio.get_running_loop().create_task(_scoped(aw, deadline))
    task.add_done_callback(_retrieve)
    moved = await _watch(task, target, lambda _last: where(), deadline, watch_s)
    if moved is None:
        return task.result()
    raise BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{what}: the leader moved from {target} to {moved}")


def _retrieve(task: asyncio.Task[object]) -> None:
    """An abandoned attempt's late error is nobody's: mark it retrieved."""
    if not task.cancelled():
        task.exception()


async def _scoped(aw: Awaitable[R], deadline: Deadline) -> R:
    with deadline_scope(deadline):
        return await aw


async def _watch(
    task: asyncio.Task[R],
    target: T,
    resolve: Callable[[BrokerError | None], T | None],
    deadline: Deadline,
    watch_s: float,
) -> T | None:
    """Wait for ``task``; None once it answered (its error raised), or the new target it was abandoned for."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            left = deadline.remaining(loop.time())
            if left <= 0:
                task.cancel()
                raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, "no answer before the deadline")
            done, _ = await asyncio.wait({task}, timeout=min(watch_s, left))
            if done:
                task.result()  # raises the attempt's error
                return None
            now_target = resolve(None)
            if now_target is not None and now_target != target:
                task.cancel()
                return now_target
    except BaseException:  # cancelled, or ``resolve`` raised: the attempt is nobody's any more
        task.cancel()
        raise
