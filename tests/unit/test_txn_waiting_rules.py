"""Who waits for a previous transaction's markers, and who holds its carried-marker reservations.

``coordinator.transitions.waits_for_previous`` and ``carries_reservation`` decide, as pure functions, what
the coordinator's API does while an id is in PrepareCommit/PrepareAbort: Kafka answers
CONCURRENT_TRANSACTIONS to a call that would begin the next transaction then; the coordinator waits instead,
but only for the client's CURRENT/NEXT identity (and EndTxn's RETRY identity, whose answer was lost).
"""

from __future__ import annotations

import pytest

from coordinator.metadata import TopicPartition, TransactionMetadata
from coordinator.states import TransactionState
from coordinator.transitions import carries_reservation, waits_for_previous

TP = TopicPartition("orders", 0)
TP2 = TopicPartition("orders", 1)


def prepared(
    *, carried: frozenset[TopicPartition] = frozenset(), state: TransactionState = TransactionState.PREPARE_COMMIT
) -> TransactionMetadata:
    """An id whose transaction of epoch 2 ended (TV2: the client's identity is now epoch 3)."""
    return TransactionMetadata(
        transactional_id="t", producer_id=5, producer_epoch=3, timeout_ms=60_000, state=state,
        txn_last_update_ms=0, last_producer_id=5, last_producer_epoch=2, partitions=frozenset({TP, TP2}),
        coordinator_epoch=1, carried=carried,
    )  # fmt: skip


def test_init_producer_id_always_waits() -> None:
    assert waits_for_previous(prepared(), None)


@pytest.mark.parametrize("retry", [False, True])
def test_the_current_identity_waits(retry: bool) -> None:
    assert waits_for_previous(prepared(), (5, 3), retry=retry)


def test_the_retry_identity_waits_only_for_a_retried_end_txn() -> None:
    meta = prepared()
    assert not waits_for_previous(meta, (5, 2))
    assert waits_for_previous(meta, (5, 2), retry=True)


@pytest.mark.parametrize("identity", [(5, 1), (9, 0)], ids=["stale epoch", "unknown producer id"])
def test_fenced_and_unknown_identities_do_not_wait(identity: tuple[int, int]) -> None:
    # The state machine answers them (PRODUCER_FENCED, INVALID_PRODUCER_ID_MAPPING) without delay.
    assert not waits_for_previous(prepared(), identity, retry=True)


def test_only_the_next_transaction_holds_carried_reservations() -> None:
    meta = prepared(carried=frozenset({TP}))
    assert carries_reservation(meta, 5, 3)
    assert not carries_reservation(meta, 5, 2)  # the identity that ended the transaction
    assert not carries_reservation(meta, 5, 1)


def test_no_reservation_without_carried_partitions_or_outside_a_prepare_state() -> None:
    assert not carries_reservation(prepared(), 5, 3)
    assert not carries_reservation(prepared(carried=frozenset({TP}), state=TransactionState.COMPLETE_COMMIT), 5, 3)
