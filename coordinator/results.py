"""What applying a transaction command answers (errors are ``clients.protocol.BrokerError`` values)."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.metadata import MarkerPlan, TopicPartition
from coordinator.states import TransactionState

__all__ = [
    "AddPartitionsResult",
    "CompleteTxnResult",
    "EndTxnResult",
    "ExpireResult",
    "InitProducerIdResult",
    "PrepareResult",
]


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class AddPartitionsResult:
    """``added`` is empty when every partition was already in the transaction (nothing was written)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    added: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class EndTxnResult:
    """The decision is durable. ``producer_id``/``producer_epoch``: the identity for the next transaction
    (TV2; a new producer id with epoch 0 after a rotation). ``markers``: what the coordinator must now write
    (None when the transaction had no partitions and so completed at once, or for an answered retry).
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    retry: bool
    markers: MarkerPlan | None


@dataclass(frozen=True, slots=True)
class CompleteTxnResult:
    """``already_complete``: a retried CompleteTxn found the transaction complete already."""

    transactional_id: str
    state: TransactionState
    producer_id: int
    producer_epoch: int
    already_complete: bool


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """The transaction is ``PREPARED``; (transactional id, producer id, epoch) completes it later."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    prepared_ms: int
    group_id: str | None
    retry: bool


@dataclass(frozen=True, slots=True)
class ExpireResult:
    transactional_id: str
    producer_id: int
