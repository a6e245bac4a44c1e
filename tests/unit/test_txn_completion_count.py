"""A transaction's completion is counted once (``cluster.txn.completions.CompletionCounter``).

With carried markers two paths complete a transaction: the next EndTxn's fold, and the plan's driver when its
reservation timer fires. If the timer fires while that EndTxn is in flight, both see the transaction complete (the
driver's CompleteTxn is applied first, the EndTxn then only adds partitions); the metric must count it once.
"""

from __future__ import annotations

from cluster.metrics import TxnOutcome
from cluster.txn.completions import CompletionCounter
from coordinator.metadata import MarkerPlan, TopicPartition

TP = TopicPartition("orders", 0)


class FakeMetrics:
    def __init__(self) -> None:
        self.counted: list[tuple[TxnOutcome, float]] = []

    def txn_completed(self, outcome: TxnOutcome, duration_s: float) -> None:
        self.counted.append((outcome, duration_s))


def _service(kept: int = 10_000) -> tuple[CompletionCounter, list[tuple[TxnOutcome, float]]]:
    metrics = FakeMetrics()
    return CompletionCounter(metrics, kept), metrics.counted


def test_the_fold_and_the_driver_count_one_transaction_once() -> None:
    svc, counted = _service()
    plan = MarkerPlan("job-1", 7, 3, True, (TP,), 1)
    svc.completed(plan, 0.25)  # the driver's CompleteTxn
    svc.completed(plan, 0.30)  # the fold of the next EndTxn, racing it
    assert counted == [(TxnOutcome.COMMITTED, 0.25)]
    # The next transaction (a new epoch under TV2) is another plan: counted again.
    svc.completed(MarkerPlan("job-1", 7, 4, True, (TP,), 1), 0.1)
    assert len(counted) == 2


def test_an_abort_keeps_its_reason_and_the_reason_is_used_once() -> None:
    svc, counted = _service()
    plan = MarkerPlan("job-2", 9, 0, False, (TP,), 1)
    svc.abort_reason("job-2", TxnOutcome.TIMED_OUT)
    svc.completed(plan, 5.0)
    svc.completed(plan, 5.0)
    assert counted == [(TxnOutcome.TIMED_OUT, 5.0)]
    svc.completed(MarkerPlan("job-2", 9, 1, False, (TP,), 1), 0.2)
    assert counted[-1] == (TxnOutcome.ABORTED, 0.2)


def test_the_memory_of_counted_plans_is_bounded_oldest_first() -> None:
    svc, counted = _service(kept=2)
    plans = [MarkerPlan("job-3", 1, epoch, True, (TP,), 1) for epoch in range(3)]
    for plan in plans:
        svc.completed(plan, 0.1)
    svc.completed(plans[2], 0.1)  # still remembered: not counted again
    assert len(counted) == 3
    svc.completed(plans[0], 0.1)  # forgotten (oldest of three with room for two): counted again
    assert len(counted) == 4
