"""The transaction coordinator of a node, and the carried-marker tokens its partitions check.

``coordinator.TransactionCoordinator`` is the API (InitProducerId,
AddPartitions, EndTxn, Prepare, commit groups, KIP-890 verification);
``state_manager`` routes and proposes to the ``__transaction_state`` Raft
groups; ``markers`` drives each decided transaction's markers to completion;
``add_partitions`` and ``verification`` add partitions ahead of the previous
transaction's markers; ``commit_groups`` decides prepared transactions
together; ``adds`` and ``tokens`` are the pure parts (partition hints, adds in
flight; the MACs of carried markers).
"""

from .coordinator import EndTxnAnswer, TransactionCoordinator
from .state_manager import TXN_STATE_KIND
from .tokens import CarriedMarker, TxnTokens

__all__ = ["TXN_STATE_KIND", "CarriedMarker", "EndTxnAnswer", "TransactionCoordinator", "TxnTokens"]
