"""The coordinator's marker drivers are per Raft term (cluster/txn_service.py ``_ensure_driver``).

Found by a fault test: a node paused and resumed started elections, the coordinator's partition went
to a new term on the same node, and the resume found the old term's driver still waiting on a marker
to the paused node. It started no driver for the new term; the old one wrote the marker, saw the term
change and stopped before CompleteTxn, leaving the transaction in PrepareCommit. These tests drive
the driver bookkeeping with a fake partition and broker (the real flow is
``tests/fault/test_txn_faults.py``), so the interleaving is exact.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

from cluster.txn_service import TransactionService
from coordinator.commands import CompleteTxn
from coordinator.metadata import MarkerPlan, TopicPartition
from coordinator.results import CompleteTxnResult
from coordinator.states import TransactionState

TP = TopicPartition("orders", 0)
PLAN = MarkerPlan("job-1", 7, 3, True, (TP,), 1)


class FakeGroup:
    def __init__(self) -> None:
        self.current_term = 1
        self.leader = True

    def term(self) -> int:
        return self.current_term

    def is_leader(self) -> bool:
        return self.leader


def make_service(release: asyncio.Event, markers: list[int]) -> tuple[TransactionService, Any, list[Any]]:
    """A service with only what the drivers use; markers block until ``release`` is set."""
    svc = TransactionService.__new__(TransactionService)
    proposals: list[Any] = []

    async def write_txn_marker(topic: str, partition: int, pid: int, epoch: int, cepoch: int, control: Any) -> None:
        markers.append(cepoch)
        await release.wait()

    async def propose(part: Any, command: type, **fields: Any) -> Any:
        proposals.append((command, fields))
        return CompleteTxnResult(
            fields["transactional_id"], TransactionState.COMPLETE_COMMIT, fields["producer_id"],
            fields["producer_epoch"], already_complete=False,
        )  # fmt: skip

    svc.broker = SimpleNamespace(  # type: ignore[assignment]
        loop=asyncio.get_running_loop(),
        write_txn_marker=write_txn_marker,
        metrics=SimpleNamespace(txn_marker_written=lambda *a: None, txn_completed=lambda *a: None),
        config=SimpleNamespace(request_timeout_ms=30_000),
    )
    svc._drivers = {}
    svc._written = {}
    svc._abort_reason = {}
    svc._counted = OrderedDict()
    svc._closing = False
    svc._propose = propose  # type: ignore[method-assign]
    part = SimpleNamespace(group=FakeGroup(), sm=SimpleNamespace(get=lambda tid: None))
    return svc, part, proposals


async def until(pred: Any) -> None:
    """Let the loop run until ``pred()`` holds (at most 5 s)."""
    async with asyncio.timeout(5):
        while not pred():  # noqa: ASYNC110 - polls a fake's plain list, nothing to await
            await asyncio.sleep(0.001)


def test_a_new_term_gets_its_own_driver_while_the_old_one_is_still_blocked() -> None:
    async def main() -> None:
        release = asyncio.Event()
        markers: list[int] = []
        svc, part, proposals = make_service(release, markers)
        old = svc._ensure_driver(part, PLAN)
        await until(lambda: markers == [1])  # the term-1 driver waits on its marker
        assert svc._ensure_driver(part, PLAN) is old  # same term: shared
        part.group.current_term = 3  # deposed and elected again while the marker is pending
        new = svc._ensure_driver(part, PLAN)
        assert new is not old
        await until(lambda: markers == [1, 3])
        release.set()  # the paused node answers both
        await asyncio.wait_for(asyncio.gather(old, new), 5)
        # Only the current term's driver completes the transaction, exactly once.
        assert [c for c, _ in proposals] == [CompleteTxn]
        assert proposals[0][1]["transactional_id"] == "job-1"
        assert svc._drivers == {}  # both ended; the entry of the newer one is removed, not the older's

    asyncio.run(main())


def test_a_deposed_driver_ending_does_not_drop_the_current_one() -> None:
    async def main() -> None:
        release = asyncio.Event()
        markers: list[int] = []
        svc, part, proposals = make_service(release, markers)
        old = svc._ensure_driver(part, PLAN)
        await until(lambda: markers == [1])
        part.group.current_term = 2
        new = svc._ensure_driver(part, PLAN)
        old.cancel()  # the old driver goes away first
        await asyncio.gather(old, return_exceptions=True)
        assert svc._drivers[("job-1", 7, 3)][1] is new
        release.set()
        await asyncio.wait_for(new, 5)
        assert [c for c, _ in proposals] == [CompleteTxn]

    asyncio.run(main())
