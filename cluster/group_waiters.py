"""What a group coordinator waits on: members' requests and its own per-group tasks.

One ``MemberWaiters`` per kind of request (joins wait for their rebalance,
syncs for the leader's assignment), keyed by (group id, member id): a member
has at most one waiting request of a kind; a newer one supersedes the older,
which fails. ``track_task`` runs a coordinator task (a rebalance being
stored, a leader's assignment being stored) as its group's entry in a map
until it ends. Runs on the event loop only (not thread-safe).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Coroutine
from typing import Any, Generic, TypeVar

from clients.protocol import BrokerError, ErrorCode

__all__ = ["MemberWaiters", "track_task"]

T = TypeVar("T")


class MemberWaiters(Generic[T]):
    def __init__(self, what: str) -> None:
        self._what = what
        self._futures: dict[tuple[str, str], asyncio.Future[T]] = {}

    def add(self, group_id: str, member_id: str) -> asyncio.Future[T]:
        """A new waiting request; an older one of the same member fails with REBALANCE_IN_PROGRESS."""
        key = (group_id, member_id)
        old = self._futures.pop(key, None)
        if old is not None and not old.done():
            old.set_exception(BrokerError(ErrorCode.REBALANCE_IN_PROGRESS, f"superseded by a newer {self._what}"))
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._futures[key] = fut
        return fut

    async def wait(self, group_id: str, member_id: str, fut: asyncio.Future[T], timeout_s: float) -> T:
        """The answer, or REBALANCE_IN_PROGRESS after ``timeout_s`` (the member rejoins)."""
        key = (group_id, member_id)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError as exc:
            raise BrokerError(ErrorCode.REBALANCE_IN_PROGRESS, f"the {self._what} did not complete in time") from exc
        finally:
            if self._futures.get(key) is fut:
                del self._futures[key]

    def resolve(self, group_id: str, member_id: str, answer: T) -> None:
        fut = self._futures.get((group_id, member_id))
        if fut is not None and not fut.done():
            fut.set_result(answer)

    def fail(self, group_id: str, member_id: str, error: BrokerError) -> None:
        fut = self._futures.pop((group_id, member_id), None)
        if fut is not None and not fut.done():
            fut.set_exception(error)

    def fail_group(self, group_id: str, error: BrokerError) -> None:
        for key in [k for k in self._futures if k[0] == group_id]:
            self.fail(*key, error)

    def fail_absent(self, group_id: str, present: Collection[str], error: BrokerError) -> None:
        """Fail the group's waiting requests of members not in ``present`` (members removed meanwhile)."""
        for key in [k for k in self._futures if k[0] == group_id and k[1] not in present]:
            self.fail(*key, error)

    def waiting(self, group_id: str) -> bool:
        return any(k[0] == group_id and not f.done() for k, f in self._futures.items())


def track_task(tasks: dict[str, asyncio.Task[None]], group_id: str, work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` as the group's entry in ``tasks`` until it ends."""
    task = asyncio.get_running_loop().create_task(work)
    tasks[group_id] = task

    def done(t: asyncio.Task[None]) -> None:
        if tasks.get(group_id) is t:
            del tasks[group_id]

    task.add_done_callback(done)
