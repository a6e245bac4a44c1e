"""The leader's submit sequencer: a producer's batches reach Raft in sequence order (cluster/sequencer.py).

The async tests run on virtual time (``tests.support.virtual_time``): a
bounded wait takes exactly its bound, and ``until_idle`` lets every other
task run until it waits.
"""

from __future__ import annotations

import asyncio

import pytest

from cluster.sequencer import SubmitSequencer
from tests.support.virtual_time import run_on_virtual_time, until_idle

KEY = ("t", 0, 7)


async def _submit_in_turn(seq: SubmitSequencer, order: list[int], base: int, n: int = 10, epoch: int = 0) -> None:
    await seq.wait_turn(KEY, epoch, base, timeout=5.0)
    seq.submitted(KEY, epoch, base, n)
    order.append(base)


@run_on_virtual_time
async def test_a_batch_ahead_of_its_predecessor_waits_for_it() -> None:
    outcomes: list[str] = []
    seq = SubmitSequencer(max_wait_s=5.0, on_wait=outcomes.append)
    seq.submitted(KEY, 0, 0, 10)  # batch 0-9 went to Raft: 10 is next
    order: list[int] = []
    # 30, 20 and 40 arrive before 10: each must wait for the batch before it.
    tasks = [asyncio.create_task(_submit_in_turn(seq, order, b)) for b in (30, 20, 40)]
    await until_idle()
    assert order == []
    await _submit_in_turn(seq, order, 10)
    await asyncio.gather(*tasks)
    assert order == [10, 20, 30, 40]
    assert outcomes == ["in_order"] * 3


@run_on_virtual_time
async def test_in_order_batches_and_retries_never_wait() -> None:
    outcomes: list[str] = []
    seq = SubmitSequencer(max_wait_s=5.0, on_wait=outcomes.append)
    order: list[int] = []
    await _submit_in_turn(seq, order, 0)  # unknown producer: no wait
    await _submit_in_turn(seq, order, 10)
    await _submit_in_turn(seq, order, 0)  # a retry of an earlier batch goes at once (the log dedups it)
    assert order == [0, 10, 0] and outcomes == []
    assert not seq.must_wait(KEY, 0, 20)


@run_on_virtual_time
async def test_a_missing_predecessor_costs_one_bounded_wait() -> None:
    outcomes: list[str] = []
    seq = SubmitSequencer(max_wait_s=0.05, on_wait=outcomes.append)
    seq.submitted(KEY, 0, 0, 10)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await seq.wait_turn(KEY, 0, 50, timeout=5.0)  # 10..49 never arrive
    assert loop.time() - started == pytest.approx(0.05)
    assert outcomes == ["timed_out"]
    # The request's own timeout bounds the wait too.
    started = loop.time()
    await seq.wait_turn(KEY, 0, 50, timeout=0.001)
    assert loop.time() - started == pytest.approx(0.001)
    assert outcomes == ["timed_out", "timed_out"]


@run_on_virtual_time
async def test_a_new_epoch_or_another_producer_is_not_held_up() -> None:
    seq = SubmitSequencer(max_wait_s=5.0)
    seq.submitted(KEY, 0, 0, 10)
    assert not seq.must_wait(KEY, 1, 50)  # epoch bumped: sequences start over, the log judges
    assert not seq.must_wait(("t", 0, 8), 0, 50)
    assert not seq.must_wait(("t", 1, 7), 0, 50)
    # A waiter of the old epoch is released when the producer moves on to a new epoch.
    waiter = asyncio.create_task(seq.wait_turn(KEY, 0, 50, timeout=5.0))
    await until_idle()
    assert not waiter.done()
    seq.submitted(KEY, 1, 0, 10)
    await asyncio.wait_for(waiter, 1.0)


@pytest.mark.parametrize(
    ("nxt", "base", "waits"), [(2**31 - 5, 5, True), (2**31 - 5, 2**31 - 10, False), (5, 2**31 - 5, False)]
)
def test_sequences_wrap_like_kafkas(nxt: int, base: int, waits: bool) -> None:
    seq = SubmitSequencer()
    seq.submitted(KEY, 0, nxt - 1, 1)
    assert seq.must_wait(KEY, 0, base) is waits


@run_on_virtual_time
async def test_cancelled_waiter_leaves_nothing_behind() -> None:
    seq = SubmitSequencer(max_wait_s=5.0)
    seq.submitted(KEY, 0, 0, 10)
    waiter = asyncio.create_task(seq.wait_turn(KEY, 0, 50, timeout=5.0))
    await until_idle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert seq._waiters == {}


def test_producers_beyond_the_bound_are_forgotten_oldest_first() -> None:
    seq = SubmitSequencer(max_producers=2)
    for pid in (1, 2, 3):
        seq.submitted(("t", 0, pid), 0, 0, 10)
    assert not seq.must_wait(("t", 0, 1), 0, 50)  # evicted: no longer held
    assert seq.must_wait(("t", 0, 3), 0, 50)


@run_on_virtual_time
async def test_a_producer_new_to_this_leader_starts_from_the_applied_state() -> None:
    seq = SubmitSequencer(max_wait_s=5.0)
    order: list[int] = []
    # Nothing submitted here yet; the partition's applied state expects sequence 0 (a new producer).
    second = asyncio.create_task(seq.wait_turn(KEY, 0, 10, timeout=5.0, applied_next=lambda: 0))
    await until_idle()
    assert not second.done()
    await seq.wait_turn(KEY, 0, 0, timeout=5.0, applied_next=lambda: 0)
    seq.submitted(KEY, 0, 0, 10)
    order.append(0)
    await asyncio.wait_for(second, 1.0)
    # When the applied state cannot tell (None), nothing waits.
    other = ("t", 0, 99)
    await asyncio.wait_for(seq.wait_turn(other, 0, 10, timeout=5.0, applied_next=lambda: None), 1.0)


@run_on_virtual_time
async def test_after_a_rejected_batch_the_next_arrival_starts_from_the_log_again() -> None:
    seq = SubmitSequencer(max_wait_s=5.0)
    seq.submitted(KEY, 0, 0, 10)
    seq.submitted(KEY, 0, 10, 10)  # went to Raft and was rejected there: the log still expects 10
    seq.forget(KEY)
    waiter = asyncio.create_task(seq.wait_turn(KEY, 0, 20, timeout=5.0, applied_next=lambda: 10))
    await until_idle()
    assert not waiter.done(), "the resend of 10 must go first"
    await seq.wait_turn(KEY, 0, 10, timeout=5.0, applied_next=lambda: 10)
    seq.submitted(KEY, 0, 10, 10)
    await asyncio.wait_for(waiter, 1.0)
