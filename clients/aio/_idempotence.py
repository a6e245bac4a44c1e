"""Producer id, epoch and per-partition sequences of an idempotent producer (Kafka's ``TransactionManager``,
idempotent half). Pure: no I/O, no clock.

Terms (kafka_txn.md §3):

* **producer id / epoch**: from ``POST /v1/producers/init``; every idempotent
  batch carries them. Sequences are per (producer id, partition), start at 0
  and restart at 0 after every epoch bump.
* **unresolved sequence**: a batch left the client (was sequenced) and then
  ended without being acknowledged -- it expired, ran out of retries, or failed.
  Its sequence may or may not be in the log, and the broker rejects every later
  sequence on that partition if it is not. KIP-360's answer, used here: stop
  sequencing new batches, let every request still in flight finish, then bump
  the epoch locally (the broker accepts ``epoch + 1`` starting at sequence 0,
  storage/producer_state.py rule 3) and restart every partition at sequence 0.
  Any old-epoch request that reaches the broker after a new-epoch batch is
  fenced with ``INVALID_PRODUCER_EPOCH``, so nothing old can land after
  anything new: no reordering, and nothing is resent under the new epoch that
  may already be in the log: no duplicates.
* **epoch exhaustion**: at ``EPOCH_EXHAUSTED`` (Short.MAX_VALUE - 1, as Kafka) a
  bump asks for a new producer id instead.

* **transactional mode** (``transactional=True``): the coordinator owns the
  epoch, so there is no local bump. An unresolved sequence or a failed batch
  makes the open transaction abortable instead (``TxnListener``, implemented by
  ``_transactions.TransactionManager``); EndTxn hands out the identity of the
  next transaction (TV2 bumps the epoch at every EndTxn), adopted with
  ``set_producer_id`` (READY -> READY), which restarts every sequence at 0.
  New batches are sequenced only while the transaction manager allows it
  (``sending_allowed``).

State machine (an enum plus ``VALID_PREVIOUS``)::

    UNINITIALIZED --init--> READY --unresolved--> BUMP_PENDING --bump--> READY
                                                              \\--exhausted--> UNINITIALIZED
    READY --next transaction's identity (transactional)--> READY
    any --fenced/unrecoverable--> FATAL
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from ..protocol import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, BrokerError, ErrorCode

__all__ = ["EPOCH_EXHAUSTED", "IdempotenceManager", "ProducerIdAndEpoch", "ProducerIdState", "TxnListener"]

EPOCH_EXHAUSTED = 2**15 - 2
SEQUENCE_MODULUS = 2**31


class ProducerIdState(enum.Enum):
    UNINITIALIZED = "uninitialized"  # no producer id yet (or the epoch ran out)
    READY = "ready"  # new batches may be sequenced
    BUMP_PENDING = "bump_pending"  # a sequence is unresolved: drain in-flight requests, then bump
    FATAL = "fatal"  # fenced or unrecoverable: every send fails


VALID_PREVIOUS: dict[ProducerIdState, frozenset[ProducerIdState]] = {
    ProducerIdState.UNINITIALIZED: frozenset({ProducerIdState.BUMP_PENDING}),
    # READY -> READY: a transactional producer takes a new identity at every EndTxn (TV2).
    ProducerIdState.READY: frozenset(
        {ProducerIdState.UNINITIALIZED, ProducerIdState.BUMP_PENDING, ProducerIdState.READY}
    ),
    ProducerIdState.BUMP_PENDING: frozenset({ProducerIdState.READY}),
    ProducerIdState.FATAL: frozenset(
        {ProducerIdState.UNINITIALIZED, ProducerIdState.READY, ProducerIdState.BUMP_PENDING}
    ),
}


class TxnListener(Protocol):
    """What a transactional producer's transaction manager hears from the send path."""

    def on_abortable(self, reason: str) -> None:
        """A batch of the open transaction failed or its sequence is unresolved: the txn must be aborted."""

    def on_fatal(self, exc: BrokerError) -> None:
        """The producer is fenced (or otherwise unusable)."""


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int = NO_PRODUCER_ID
    epoch: int = NO_PRODUCER_EPOCH


class IdempotenceManager:
    """Owns the producer id/epoch, the sequence counters and the state above. Event-loop thread only.

    With ``enabled=False`` (``enable_idempotence=False``) batches are plain
    writes (producer id -1) and the manager is READY from the start.
    ``transactional=True`` implies ``enabled`` (see the module docstring).
    """

    def __init__(self, *, enabled: bool, transactional: bool = False) -> None:
        self.enabled = enabled or transactional
        self.transactional = transactional
        self.listener: TxnListener | None = None
        self.sending_allowed = not transactional
        self.state = ProducerIdState.UNINITIALIZED if self.enabled else ProducerIdState.READY
        self.current = ProducerIdAndEpoch()
        self.fatal_error: BrokerError | None = None
        self.bump_reason = ""
        self.epoch_bumps = 0
        self._next_seq: dict[tuple[str, int], int] = {}

    def _transition_to(self, state: ProducerIdState) -> None:
        if self.state not in VALID_PREVIOUS[state]:
            raise BrokerError(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"illegal producer state transition {self.state.name} -> {state.name}"
            )
        self.state = state

    @property
    def can_sequence(self) -> bool:
        return self.state is ProducerIdState.READY and self.sending_allowed

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        """A fresh identity (InitProducerId, or EndTxn's answer): sequences restart at 0."""
        if self.state is ProducerIdState.READY and not self.transactional:
            raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, "an idempotent producer changes its identity by a bump")
        self._transition_to(ProducerIdState.READY)
        self.current = ProducerIdAndEpoch(producer_id, epoch)
        self._next_seq.clear()

    def request_bump(self, reason: str) -> None:
        """A sequence became unresolved; no-op when a bump is already pending or the producer is fenced.

        Transactional: no local bump (the coordinator owns the epoch); the open
        transaction becomes abortable and its EndTxn brings the next epoch.
        """
        if self.transactional:
            if self.listener is not None and self.state is ProducerIdState.READY:
                self.listener.on_abortable(reason)
            return
        if self.enabled and self.state is ProducerIdState.READY:
            self._transition_to(ProducerIdState.BUMP_PENDING)
            self.bump_reason = reason

    def batch_failed(self, exc: BrokerError) -> None:
        """A batch's records were reported failed (transactional: the transaction must be aborted)."""
        if self.transactional and self.listener is not None and self.state is ProducerIdState.READY:
            self.listener.on_abortable(f"a batch failed: {exc}")

    def sequenced_partitions(self) -> set[tuple[str, int]]:
        """Partitions that got a batch under the current identity (transactional: the open txn's partitions)."""
        return set(self._next_seq)

    def bump_epoch(self) -> bool:
        """Bump the epoch locally and restart sequences (call once nothing is in flight).

        Returns False when the epoch is exhausted: the state is then
        UNINITIALIZED and the caller must fetch a new producer id.
        """
        self._next_seq.clear()
        self.epoch_bumps += 1
        if self.current.epoch >= EPOCH_EXHAUSTED:
            self._transition_to(ProducerIdState.UNINITIALIZED)
            return False
        self._transition_to(ProducerIdState.READY)
        self.current = ProducerIdAndEpoch(self.current.producer_id, self.current.epoch + 1)
        return True

    def fail_fatally(self, exc: BrokerError) -> None:
        if self.state is not ProducerIdState.FATAL:
            self._transition_to(ProducerIdState.FATAL)
            self.fatal_error = exc
            if self.listener is not None:
                self.listener.on_fatal(exc)

    def next_sequence(self, tp: tuple[str, int], record_count: int) -> int:
        """Assign the base sequence of the next batch to ``tp`` (wrapping at 2**31 like Kafka)."""
        seq = self._next_seq.get(tp, 0)
        self._next_seq[tp] = (seq + record_count) % SEQUENCE_MODULUS
        return seq

    def is_current(self, producer_id: int, epoch: int) -> bool:
        return producer_id == self.current.producer_id and epoch == self.current.epoch
