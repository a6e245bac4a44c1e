"""Counting completed transactions once (``txbroker_transactions_completed_total``).

With carried markers two paths complete a transaction: the next EndTxn's fold
and the plan's driver when its reservation timer fires. If the timer fires
while that EndTxn is in flight, both see the transaction complete (the
driver's CompleteTxn is applied first; the EndTxn then only adds partitions),
so completions are counted per plan, once.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from coordinator.metadata import MarkerPlan

from ..metrics import TxnOutcome

__all__ = ["CompletionCounter", "CompletionMetrics", "plan_key"]

PlanKey = tuple[str, int, int]  # transactional id, producer id, producer epoch
_COUNTED_KEPT = 10_000  # plans remembered as counted (a fold and a driver may both see one complete)


def plan_key(plan: MarkerPlan) -> PlanKey:
    return plan.transactional_id, plan.producer_id, plan.producer_epoch


class CompletionMetrics(Protocol):
    def txn_completed(self, outcome: TxnOutcome, duration_s: float) -> None: ...


class CompletionCounter:
    """Counts each plan's completion once; an abort keeps the reason it was started for (a timeout)."""

    def __init__(self, metrics: CompletionMetrics, kept: int = _COUNTED_KEPT) -> None:
        self._metrics = metrics
        self._kept = kept
        self._counted: OrderedDict[PlanKey, None] = OrderedDict()  # newest last, bounded
        self._abort_reason: dict[str, TxnOutcome] = {}

    def abort_reason(self, transactional_id: str, reason: TxnOutcome) -> None:
        """The next abort of ``transactional_id`` to complete is counted as ``reason``."""
        self._abort_reason[transactional_id] = reason

    def completed(self, plan: MarkerPlan, duration_s: float) -> None:
        key = plan_key(plan)
        if key in self._counted:
            return
        self._counted[key] = None
        while len(self._counted) > self._kept:
            self._counted.popitem(last=False)
        if plan.commit:
            outcome = TxnOutcome.COMMITTED
        else:
            outcome = self._abort_reason.pop(plan.transactional_id, TxnOutcome.ABORTED)
        self._metrics.txn_completed(outcome, duration_s)
