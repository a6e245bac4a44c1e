"""Leadership moves under the marker driver (``cluster.txn.markers``), on virtual time with fakes of its seams.

A marker to a partition whose leader hangs (SIGSTOP) goes to the new leader as soon as this node learns
of it, not after a request timeout; a coordinator that loses its ``__transaction_state`` partition stops
that partition's drivers, and what waited on them answers NOT_COORDINATOR at once.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from clients.protocol import BrokerError, ControlType, ErrorCode
from cluster.deadline import WATCH_INTERVAL_S
from cluster.metrics import TxnOutcome
from cluster.txn.completions import CompletionCounter
from cluster.txn.markers import MARKER_ATTEMPT_S, MARKER_BACKOFF_S, MarkerDriver
from coordinator.commands import CompleteTxn
from coordinator.metadata import MarkerPlan, TopicPartition
from coordinator.results import CompleteTxnResult
from coordinator.states import TransactionState
from tests.support.virtual_time import run_on_virtual_time

TP = TopicPartition("orders", 0)
PLAN = MarkerPlan("job-1", 7, 3, True, (TP,), 1)
REQUEST_TIMEOUT_S = 30.0


def now() -> float:
    return asyncio.get_running_loop().time()


class FakeGroup:
    def __init__(self) -> None:
        self.leader = True

    def term(self) -> int:
        return 1

    def is_leader(self) -> bool:
        return self.leader


class FakeLog:
    def __init__(self) -> None:
        self.proposals: list[tuple[type, dict[str, Any]]] = []

    def local_partition(self, partition: int) -> Any:
        return None

    def not_coordinator(self, partition: int) -> BrokerError:
        return BrokerError(ErrorCode.NOT_COORDINATOR, f"__transaction_state-{partition} moved")

    async def propose(self, part: Any, command: type, **fields: Any) -> Any:
        self.proposals.append((command, fields))
        return CompleteTxnResult(
            fields["transactional_id"], TransactionState.COMPLETE_COMMIT, fields["producer_id"],
            fields["producer_epoch"], already_complete=False,
        )  # fmt: skip


class Partitions:
    """The target partition's leader as this node knows it; a hung leader never answers (SIGSTOP)."""

    def __init__(self, leader: int) -> None:
        self.leader = leader
        self.hung: set[int] = set()
        self.sent: list[tuple[int, float]] = []

    def marker_leader(self, topic: str, partition: int) -> int | None:
        return self.leader

    async def write_txn_marker(
        self,
        topic: str,
        partition: int,
        pid: int,
        epoch: int,
        cepoch: int,
        control: ControlType,
        classic: bool = False,
    ) -> None:
        target = self.leader
        self.sent.append((target, now()))
        if target in self.hung:
            await asyncio.sleep(3600)

    async def revoke_txn_marker(self, *args: Any) -> Any:
        raise AssertionError("no carried markers in these plans")


class Metrics:
    def txn_marker_written(self, topic: str, commit: bool) -> None:
        pass

    def txn_completed(self, outcome: TxnOutcome, duration_s: float) -> None:
        pass


class Clock:
    def now_ms(self) -> int:
        return 0


def make(parts: Partitions) -> tuple[MarkerDriver, Any, FakeLog]:
    log, metrics = FakeLog(), Metrics()
    completions = CompletionCounter(metrics)  # type: ignore[arg-type]
    driver = MarkerDriver(log, parts, metrics, completions, Clock(), REQUEST_TIMEOUT_S, 1.0, parts)  # type: ignore[arg-type]
    meta = SimpleNamespace(marker_plan=lambda: PLAN, txn_start_time_ms=-1)
    part = SimpleNamespace(partition=0, group=FakeGroup(), sm=SimpleNamespace(get=lambda tid: meta))
    return driver, part, log


@run_on_virtual_time
async def test_a_marker_to_a_hung_leader_goes_to_the_new_leader_once_it_is_known() -> None:
    parts = Partitions(leader=2)
    parts.hung.add(2)
    driver, part, log = make(parts)

    async def elect() -> None:
        await asyncio.sleep(1.2)  # an election timeout later, node 3 leads the partition
        parts.leader = 3

    asyncio.get_running_loop().create_task(elect())
    started = now()
    await asyncio.wait_for(driver.ensure_driver(part, PLAN), REQUEST_TIMEOUT_S)
    took = now() - started
    assert [n for n, _ in parts.sent] == [2, 3]
    assert took <= 1.2 + WATCH_INTERVAL_S + MARKER_BACKOFF_S[0] + 1e-6  # about an election, not 30 s
    assert [c for c, _ in log.proposals] == [CompleteTxn]


@run_on_virtual_time
async def test_a_marker_without_a_leader_change_waits_out_its_attempt_deadline_then_retries() -> None:
    parts = Partitions(leader=2)
    parts.hung.add(2)
    driver, part, _log = make(parts)
    task = driver.ensure_driver(part, PLAN)
    attempt_s = min(MARKER_ATTEMPT_S, REQUEST_TIMEOUT_S)
    await asyncio.sleep(attempt_s + MARKER_BACKOFF_S[0] + 0.001)
    assert [n for n, _ in parts.sent] == [2, 2]  # one attempt per attempt deadline, then again
    part.group.leader = False
    driver.deposed(0)
    await asyncio.gather(task, return_exceptions=True)


@run_on_virtual_time
async def test_a_deposed_coordinator_answers_waiting_requests_not_coordinator_at_once() -> None:
    parts = Partitions(leader=2)
    parts.hung.add(2)  # the marker hangs: the previous transaction is not complete
    driver, part, _log = make(parts)
    waiter = asyncio.get_running_loop().create_task(driver.await_markers(part, PLAN, (TP,)))
    previous = asyncio.get_running_loop().create_task(driver.await_previous(part, "job-1"))
    await asyncio.sleep(2.0)
    assert not waiter.done() and not previous.done()
    lost = now()
    part.group.leader = False  # the leadership event: this node no longer leads __transaction_state-0
    driver.deposed(0)
    with pytest.raises(BrokerError) as err:
        await waiter
    assert err.value.error_code is ErrorCode.NOT_COORDINATOR
    await previous  # returns: the caller's proposal then answers NOT_COORDINATOR
    assert now() == pytest.approx(lost)  # at once, not at the request timeout
    assert driver._drivers == {}
