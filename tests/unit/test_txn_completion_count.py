"""A transaction's completion is counted once (cluster/txn_service.py ``_count_completed``).

With carried markers two paths complete a transaction: the next EndTxn's fold, and the plan's driver when its
reservation timer fires. If the timer fires while that EndTxn is in flight, both see the transaction complete (the
driver's CompleteTxn is applied first, the EndTxn then only adds partitions); the metric must count it once.
"""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

from cluster.metrics import TxnOutcome
from cluster.txn_service import TransactionService
from coordinator.metadata import MarkerPlan, TopicPartition

TP = TopicPartition("orders", 0)


def _service() -> tuple[TransactionService, list[tuple[Any, float]]]:
    svc = TransactionService.__new__(TransactionService)
    counted: list[tuple[Any, float]] = []
    svc.broker = SimpleNamespace(  # type: ignore[assignment]
        metrics=SimpleNamespace(txn_completed=lambda outcome, duration: counted.append((outcome, duration)))
    )
    svc._counted = OrderedDict()
    svc._abort_reason = {}
    return svc, counted


def test_the_fold_and_the_driver_count_one_transaction_once() -> None:
    svc, counted = _service()
    plan = MarkerPlan("job-1", 7, 3, True, (TP,), 1)
    svc._count_completed(plan, 0.25)  # the driver's CompleteTxn
    svc._count_completed(plan, 0.30)  # the fold of the next EndTxn, racing it
    assert counted == [(TxnOutcome.COMMITTED, 0.25)]
    # The next transaction (a new epoch under TV2) is another plan: counted again.
    svc._count_completed(MarkerPlan("job-1", 7, 4, True, (TP,), 1), 0.1)
    assert len(counted) == 2


def test_an_abort_keeps_its_reason_and_the_reason_is_used_once() -> None:
    svc, counted = _service()
    plan = MarkerPlan("job-2", 9, 0, False, (TP,), 1)
    svc._abort_reason["job-2"] = TxnOutcome.TIMED_OUT
    svc._count_completed(plan, 5.0)
    svc._count_completed(plan, 5.0)
    assert counted == [(TxnOutcome.TIMED_OUT, 5.0)]
    svc._count_completed(MarkerPlan("job-2", 9, 1, False, (TP,), 1), 0.2)
    assert counted[-1] == (TxnOutcome.ABORTED, 0.2)
