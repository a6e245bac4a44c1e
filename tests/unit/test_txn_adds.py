"""The coordinator's partition hints and in-flight adds (``cluster.txn.adds``), as pure logic."""

from __future__ import annotations

import asyncio

from cluster.txn.adds import AddsInFlight, PartitionHints, starts_transaction
from coordinator.group_metadata import OFFSETS_TOPIC
from coordinator.metadata import TopicPartition, TransactionMetadata
from coordinator.states import TransactionState as S

A, B, C = (TopicPartition("t", p) for p in range(3))


def meta(state: S, **kw: object) -> TransactionMetadata:
    return TransactionMetadata("tid", 7, 3, 60_000, state, 0, **kw)  # type: ignore[arg-type]


def test_a_transaction_starts_from_idle_states_and_a_prepare_state_without_next_partitions() -> None:
    for state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.PREPARE_COMMIT, S.PREPARE_ABORT):
        assert starts_transaction(meta(state)), state
    assert not starts_transaction(meta(S.PREPARE_COMMIT, next_partitions=frozenset({A})))
    for state in (S.ONGOING, S.PREPARED, S.DEAD):
        assert not starts_transaction(meta(state)), state
    assert not starts_transaction(None)


def test_the_hint_is_what_the_ended_transaction_wrote_minus_the_partition_being_added() -> None:
    h = PartitionHints()
    for tp in (A, B, C):
        h.written("tid", 7, 3, tp)
    h.ended("tid", 7, 3)
    assert h.for_first_add(meta(S.COMPLETE_COMMIT), B) == (A, C)
    assert h.for_first_add(meta(S.PREPARE_COMMIT), A) == (B, C)
    # Not once the next transaction has partitions: only its first add carries the hint
    assert h.for_first_add(meta(S.ONGOING, partitions=frozenset({A})), B) == ()
    assert h.for_first_add(meta(S.PREPARE_COMMIT, next_partitions=frozenset({A})), B) == ()
    assert h.for_first_add(None, A) == ()


def test_only_written_partitions_are_passed_on_so_a_dropped_partition_is_hinted_once_at_most() -> None:
    h = PartitionHints()
    for tp in (A, B):
        h.written("tid", 7, 3, tp)
    h.ended("tid", 7, 3)
    # The next transaction (epoch 4) was given A and B but wrote only to A
    h.written("tid", 7, 4, A)
    h.ended("tid", 7, 4)
    assert h.for_first_add(meta(S.COMPLETE_COMMIT), A) == ()
    assert h.for_first_add(meta(S.COMPLETE_COMMIT), C) == (A,)


def test_writes_of_another_identity_and_offsets_partitions_are_not_hinted() -> None:
    h = PartitionHints()
    h.written("tid", 7, 3, A)
    h.written("tid", 7, 3, TopicPartition(OFFSETS_TOPIC, 4))
    h.written("tid", 9, 0, B)  # a new producer id took over (InitProducerId): A's writer is gone
    h.ended("tid", 9, 0)
    assert h.for_first_add(meta(S.COMPLETE_COMMIT), C) == (B,)
    h.written("tid", 9, 1, TopicPartition(OFFSETS_TOPIC, 4))
    h.ended("tid", 9, 1)  # wrote only offsets: no hint, and the previous one is dropped
    assert h.for_first_add(meta(S.COMPLETE_COMMIT), C) == ()
    h.ended("other", 1, 0)  # an EndTxn without writes hints nothing
    assert h.for_first_add(meta(S.COMPLETE_COMMIT), C) == ()


def test_hints_are_bounded_in_ids_and_partitions() -> None:
    h = PartitionHints(capacity=2, max_partitions=2)
    for tid in ("a", "b", "c"):
        h.written(tid, 1, 0, A)
        h.ended(tid, 1, 0)
    assert len(h) == 2
    for p in range(5):
        h.written("wide", 1, 0, TopicPartition("t", p))
    h.ended("wide", 1, 0)
    assert h.for_first_add(TransactionMetadata("wide", 1, 1, 1, S.COMPLETE_COMMIT, 0), A) == ()


def test_a_verification_joins_an_add_under_way_that_covers_its_partition() -> None:
    async def run() -> None:
        adds = AddsInFlight()
        ident = ("tid", 7, 3)
        fut = adds.begin(ident, (A, B))
        assert adds.covering(ident, B) is fut
        assert adds.covering(ident, C) is None
        assert adds.covering(("tid", 7, 4), A) is None  # another identity never joins
        second = adds.begin(ident, (C,))
        assert adds.covering(ident, C) is second and len(adds) == 2
        adds.end(ident, fut)
        assert fut.done() and adds.covering(ident, A) is None and len(adds) == 1
        adds.end(ident, second)
        assert len(adds) == 0
        adds.end(ident, second)  # ending twice is harmless

    asyncio.run(run())
