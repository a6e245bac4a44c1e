"""Deadlines of node-to-node calls and the retry policy at a moved leader (``cluster.deadline``), on virtual time.

A forward answers within its caller's deadline, never a fixed timeout; an answer that says the target
does not lead, a connection failure, or the leader moving while an attempt waits sends it again to the
leader as then known, with a small backoff (never a busy loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from clients.protocol import BrokerError, ErrorCode
from cluster.deadline import (
    RETRY_BACKOFF_S,
    WATCH_INTERVAL_S,
    Deadline,
    abandon_if_moved,
    background_task,
    call_at_leader,
    current_deadline,
    deadline_scope,
    timeout_for,
)
from tests.support.virtual_time import run_on_virtual_time


def now() -> float:
    return asyncio.get_running_loop().time()


# ---- the value type ----------------------------------------------------------------------------


def test_a_deadline_counts_down_and_never_below_zero() -> None:
    d = Deadline.after(10.0, 3.0)
    assert d.at == 13.0
    assert d.remaining(11.0) == 2.0
    assert not d.expired(12.999)
    assert d.expired(13.0)
    assert d.remaining(20.0) == 0.0
    assert Deadline.after(5.0, -1.0) == Deadline(5.0)


def test_the_earliest_of_two_deadlines_wins() -> None:
    a, b = Deadline(1.0), Deadline(2.0)
    assert a.earliest(b) == a
    assert b.earliest(a) == a
    assert a.earliest(None) == a


@run_on_virtual_time
async def test_a_scope_narrows_and_is_restored() -> None:
    assert current_deadline() is None
    assert timeout_for(30.0) == 30.0  # outside any request: the node's request timeout
    with deadline_scope(Deadline.after(now(), 3.0)) as outer:
        assert timeout_for(30.0) == pytest.approx(3.0)
        with deadline_scope(Deadline.after(now(), 10.0)) as inner:
            assert inner == outer  # an inner scope never extends the request's deadline
        with deadline_scope(Deadline.after(now(), 1.0)):
            assert timeout_for(30.0) == pytest.approx(1.0)
        assert current_deadline() == outer
        await asyncio.sleep(3.0)
        with pytest.raises(BrokerError) as err:
            timeout_for(30.0)  # passed: the call is not sent
        assert err.value.error_code is ErrorCode.REQUEST_TIMED_OUT
    assert current_deadline() is None


@run_on_virtual_time
async def test_background_work_runs_outside_the_request_deadline() -> None:
    seen: list[Deadline | None] = []

    async def work() -> None:
        seen.append(current_deadline())

    with deadline_scope(Deadline.after(now(), 1.0)):
        await background_task(work())
        await asyncio.get_running_loop().create_task(work())
    assert seen[0] is None  # a marker driver started by a request outlives it
    assert seen[1] is not None


# ---- the retry policy ----------------------------------------------------------------------------


class Cluster:
    """Who leads, as the calling node knows it; each node answers from a script, or hangs (SIGSTOP)."""

    def __init__(self, leader: int | None) -> None:
        self.leader = leader
        self.hung: set[int] = set()
        self.errors: dict[int, list[BrokerError]] = {}
        self.calls: list[tuple[int, float]] = []
        self.deadlines: list[Deadline | None] = []

    def resolve(self, last: BrokerError | None) -> int | None:
        hint = last.extra.get("leader_id") if last is not None else None
        return int(hint) if hint is not None else self.leader

    async def call(self, node: int) -> str:
        self.calls.append((node, now()))
        self.deadlines.append(current_deadline())
        if node in self.hung:
            await asyncio.sleep(3600)
        script = self.errors.get(node)
        if script:
            raise script.pop(0)
        return f"answer from {node}"


def not_leader(hint: int | None = None) -> BrokerError:
    extra: dict[str, Any] = {"leader_id": hint} if hint is not None else {}
    return BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "not the leader", **extra)


async def at_leader(c: Cluster, seconds: float, **kw: Any) -> str:
    return await call_at_leader(c.resolve, c.call, Deadline.after(now(), seconds), what="test call", **kw)


@run_on_virtual_time
async def test_an_answer_comes_from_the_leader_at_once() -> None:
    c = Cluster(leader=2)
    assert await at_leader(c, 3.0) == "answer from 2"
    assert [n for n, _ in c.calls] == [2]
    assert c.deadlines[0] is not None and c.deadlines[0].at == pytest.approx(3.0)  # the attempt runs under it


@run_on_virtual_time
async def test_not_the_leader_is_retried_at_the_hinted_leader_after_a_small_backoff() -> None:
    c = Cluster(leader=2)
    c.errors[2] = [not_leader(hint=3)]
    started = now()
    assert await at_leader(c, 3.0) == "answer from 3"
    assert [n for n, _ in c.calls] == [2, 3]
    assert c.calls[1][1] - started == pytest.approx(RETRY_BACKOFF_S[0])


@run_on_virtual_time
async def test_a_connection_failure_is_retried_with_a_growing_backoff_until_the_leader_answers() -> None:
    c = Cluster(leader=2)
    down = BrokerError(ErrorCode.NETWORK_EXCEPTION, "refused")
    c.errors[2] = [down, down, down, down, down]
    assert await at_leader(c, 3.0) == "answer from 2"
    gaps = [b[1] - a[1] for a, b in zip(c.calls, c.calls[1:], strict=False)]
    assert gaps == pytest.approx([*RETRY_BACKOFF_S, RETRY_BACKOFF_S[-1]])  # never a busy loop


@run_on_virtual_time
async def test_a_hung_leader_is_abandoned_once_the_leadership_moves() -> None:
    c = Cluster(leader=2)
    c.hung.add(2)  # SIGSTOPped: no answer, no error

    async def elect() -> None:
        await asyncio.sleep(1.5)  # an election
        c.leader = 3

    asyncio.get_running_loop().create_task(elect())
    started = now()
    assert await at_leader(c, 3.0) == "answer from 3"
    took = now() - started
    assert 1.5 <= took <= 1.5 + WATCH_INTERVAL_S + RETRY_BACKOFF_S[0] + 1e-6  # not the 3 s deadline


@run_on_virtual_time
async def test_a_hung_leader_that_stays_leader_times_out_at_the_deadline_not_later() -> None:
    c = Cluster(leader=2)
    c.hung.add(2)
    started = now()
    with pytest.raises(BrokerError) as err:
        await at_leader(c, 3.0)
    assert err.value.error_code is ErrorCode.REQUEST_TIMED_OUT
    assert now() - started == pytest.approx(3.0)
    assert [n for n, _ in c.calls] == [2]  # one attempt: the same leader is not asked twice at once


@run_on_virtual_time
async def test_no_leader_known_waits_for_one_until_the_deadline() -> None:
    c = Cluster(leader=None)

    async def elect() -> None:
        await asyncio.sleep(0.5)
        c.leader = 1

    asyncio.get_running_loop().create_task(elect())
    assert await at_leader(c, 3.0) == "answer from 1"
    assert c.calls[0][1] >= 0.5

    c2 = Cluster(leader=None)
    started = now()
    with pytest.raises(BrokerError) as err:
        await at_leader(c2, 1.0)
    assert err.value.error_code is ErrorCode.REQUEST_TIMED_OUT
    assert now() - started <= 1.0
    assert c2.calls == []


@run_on_virtual_time
async def test_an_error_that_is_not_about_the_leader_is_raised_at_once() -> None:
    c = Cluster(leader=2)
    c.errors[2] = [BrokerError(ErrorCode.INVALID_TXN_STATE, "no")]
    started = now()
    with pytest.raises(BrokerError) as err:
        await at_leader(c, 3.0)
    assert err.value.error_code is ErrorCode.INVALID_TXN_STATE
    assert now() == started


@run_on_virtual_time
async def test_a_leader_that_keeps_moving_away_ends_at_the_deadline() -> None:
    c = Cluster(leader=2)
    c.errors[2] = [not_leader() for _ in range(1000)]
    started = now()
    with pytest.raises(BrokerError) as err:
        await at_leader(c, 2.0)
    assert err.value.error_code is ErrorCode.REQUEST_TIMED_OUT
    assert "not the leader" in err.value.message
    assert now() - started <= 2.0
    assert len(c.calls) <= 2.0 / RETRY_BACKOFF_S[-1] + len(RETRY_BACKOFF_S)  # paced, not a busy loop


# ---- one attempt, abandoned when the leader moves ------------------------------------------------------


@run_on_virtual_time
async def test_an_attempt_is_abandoned_when_its_partition_leader_moves() -> None:
    leader = {"now": 2}
    gate = asyncio.Event()

    async def send() -> str:
        await gate.wait()
        return "written"

    async def move() -> None:
        await asyncio.sleep(1.0)
        leader["now"] = 3

    asyncio.get_running_loop().create_task(move())
    where: Callable[[], int | None] = lambda: leader["now"]  # noqa: E731
    started = now()
    with pytest.raises(BrokerError) as err:
        await abandon_if_moved(send(), where, Deadline.after(now(), 30.0), what="marker")
    assert err.value.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert 1.0 <= now() - started <= 1.0 + WATCH_INTERVAL_S + 1e-6

    gate.set()
    assert await abandon_if_moved(send(), where, Deadline.after(now(), 30.0), what="marker") == "written"


@run_on_virtual_time
async def test_an_attempt_whose_leader_stays_times_out_at_its_deadline() -> None:
    async def send() -> str:
        await asyncio.sleep(3600)
        return "never"

    started = now()
    with pytest.raises(BrokerError) as err:
        await abandon_if_moved(send(), lambda: 2, Deadline.after(now(), 5.0), what="marker")
    assert err.value.error_code is ErrorCode.REQUEST_TIMED_OUT
    assert now() - started == pytest.approx(5.0)
