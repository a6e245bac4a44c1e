"""The coordinator's marker drivers are per Raft term (``cluster.txn.markers.MarkerDriver.ensure_driver``).

A node paused and resumed starts elections, and the coordinator's partition can go to a new term on the
same node while the old term's driver still waits on a marker to the paused node. The new term must get
a driver of its own: the old one writes the marker, sees the term change and stops before CompleteTxn,
and without a new driver the transaction would stay in PrepareCommit. These tests drive the driver
bookkeeping with small fakes of its seams (the real flow is ``tests/fault/test_txn_faults.py``), so the
interleaving is exact.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from clients.protocol import ControlType
from cluster.metrics import TxnOutcome
from cluster.txn.completions import CompletionCounter
from cluster.txn.markers import MarkerDriver
from coordinator.commands import CompleteTxn
from coordinator.metadata import MarkerPlan, TopicPartition
from coordinator.results import CompleteTxnResult
from coordinator.states import TransactionState

TP = TopicPartition("orders", 0)
PLAN = MarkerPlan("job-1", 7, 3, True, (TP,), 1)


class FakeGroup:
    def __init__(self) -> None:
        self.current_term = 1

    def term(self) -> int:
        return self.current_term

    def is_leader(self) -> bool:
        return True


class FakeLog:
    """Proposals are recorded and answered as applied CompleteTxn results."""

    def __init__(self) -> None:
        self.proposals: list[tuple[type, dict[str, Any]]] = []

    def local_partition(self, partition: int) -> Any:
        return None

    async def propose(self, part: Any, command: type, **fields: Any) -> Any:
        self.proposals.append((command, fields))
        return CompleteTxnResult(
            fields["transactional_id"], TransactionState.COMPLETE_COMMIT, fields["producer_id"],
            fields["producer_epoch"], already_complete=False,
        )  # fmt: skip


class BlockedMarkers:
    """A marker writer whose calls wait for ``release`` (a paused partition leader); records coordinator epochs."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.epochs: list[int] = []

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
        self.epochs.append(cepoch)
        await self.release.wait()

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


def make_driver() -> tuple[MarkerDriver, Any, FakeLog, BlockedMarkers]:
    log, markers, metrics = FakeLog(), BlockedMarkers(), Metrics()
    driver = MarkerDriver(log, markers, metrics, CompletionCounter(metrics), Clock(), 30.0, 1.0)  # type: ignore[arg-type]
    part = SimpleNamespace(partition=0, group=FakeGroup(), sm=SimpleNamespace(get=lambda tid: None))
    return driver, part, log, markers


async def until(pred: Any) -> None:
    """Let the loop run until ``pred()`` holds (at most 5 s)."""
    async with asyncio.timeout(5):
        while not pred():  # noqa: ASYNC110 - polls a fake's plain list, nothing to await
            await asyncio.sleep(0)


def test_a_new_term_gets_its_own_driver_while_the_old_one_is_still_blocked() -> None:
    async def main() -> None:
        driver, part, log, markers = make_driver()
        old = driver.ensure_driver(part, PLAN)
        await until(lambda: markers.epochs == [1])  # the term-1 driver waits on its marker
        assert driver.ensure_driver(part, PLAN) is old  # same term: shared
        part.group.current_term = 3  # deposed and elected again while the marker is pending
        new = driver.ensure_driver(part, PLAN)
        assert new is not old
        await until(lambda: markers.epochs == [1, 3])
        markers.release.set()  # the paused node answers both
        await asyncio.wait_for(asyncio.gather(old, new), 5)
        # Only the current term's driver completes the transaction, exactly once.
        assert [c for c, _ in log.proposals] == [CompleteTxn]
        assert log.proposals[0][1]["transactional_id"] == "job-1"
        assert driver._drivers == {}  # both ended; the entry of the newer one is removed, not the older's

    asyncio.run(main())


def test_a_deposed_driver_ending_does_not_drop_the_current_one() -> None:
    async def main() -> None:
        driver, part, log, markers = make_driver()
        old = driver.ensure_driver(part, PLAN)
        await until(lambda: markers.epochs == [1])
        part.group.current_term = 2
        new = driver.ensure_driver(part, PLAN)
        old.cancel()  # the old driver goes away first
        await asyncio.gather(old, return_exceptions=True)
        assert driver._drivers[("job-1", 7, 3)][1] is new
        markers.release.set()
        await asyncio.wait_for(new, 5)
        assert [c for c, _ in log.proposals] == [CompleteTxn]

    asyncio.run(main())


def test_a_finished_plan_leaves_no_run_behind() -> None:
    async def main() -> None:
        driver, part, _log, markers = make_driver()
        markers.release.set()
        task = driver.ensure_driver(part, PLAN)
        assert driver.marker_written(PLAN, TP) is not None
        await asyncio.wait_for(task, 5)
        await asyncio.sleep(0)  # the done-callback runs
        assert driver._drivers == {} and driver._runs == {}

    asyncio.run(main())
