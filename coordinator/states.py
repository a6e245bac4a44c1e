"""Transaction states and the table of allowed transitions (kafka_txn.md §4.1, Kafka's ``TransactionState``).

Ids 0-7 are Kafka's and are persisted; never renumber them. ``PREPARED`` (8)
is txbroker's: a transaction made durable by ``prepare`` for an external
coordinator (the KIP-939 idea) that waits, exempt from the transaction
timeout, for a later commit or abort by whoever holds its (transactional id,
producer id, epoch) -- or, when it is bound to a commit group, for that group's
decision (see ``coordinator.group_commit``).

Terms: a *prepare* state (``PREPARE_COMMIT``/``PREPARE_ABORT``) means the
outcome is decided and durable but the COMMIT/ABORT markers may not all be
written yet; a *complete* state means every marker is written.
``PREPARE_EPOCH_FENCE`` and ``DEAD`` are never persisted here: one Raft entry
applies atomically, so the fence (Ongoing -> PrepareEpochFence -> PrepareAbort)
and the expiry (Complete* -> Dead -> key deleted) each happen inside one
``apply``; both hops are still checked against the table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from coordinator.errors import IllegalTransitionError

__all__ = [
    "COMPLETE_STATES",
    "EXPIRABLE_STATES",
    "OPEN_STATES",
    "PREPARE_STATES",
    "VALID_PREVIOUS",
    "TransactionState",
    "is_valid_transition",
    "validate_transition",
]


class TransactionState(enum.Enum):
    """Value: (persisted id, Kafka's display name, transactional-id expiration allowed)."""

    EMPTY = (0, "Empty", True)
    ONGOING = (1, "Ongoing", False)
    PREPARE_COMMIT = (2, "PrepareCommit", False)
    PREPARE_ABORT = (3, "PrepareAbort", False)
    COMPLETE_COMMIT = (4, "CompleteCommit", True)
    COMPLETE_ABORT = (5, "CompleteAbort", True)
    DEAD = (6, "Dead", False)
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence", False)
    PREPARED = (8, "Prepared", False)

    @property
    def id(self) -> int:
        return self.value[0]

    @property
    def display_name(self) -> str:
        return self.value[1]

    @property
    def expiration_allowed(self) -> bool:
        return self.value[2]

    @classmethod
    def from_id(cls, state_id: int) -> TransactionState:
        for state in cls:
            if state.id == state_id:
                return state
        raise ValueError(f"unknown transaction state id {state_id}")

    @classmethod
    def from_name(cls, name: str) -> TransactionState:
        """Accepts Kafka's display name (``CompleteCommit``) or the enum name (``COMPLETE_COMMIT``)."""
        for state in cls:
            if name in (state.display_name, state.name):
                return state
        raise ValueError(f"unknown transaction state {name!r}")

    def __str__(self) -> str:
        return self.display_name


S = TransactionState

#: Allowed previous states of each state. Kafka's table (§4.1) with TV2's abort
#: from Empty/Complete*, plus txbroker's PREPARED: it is entered from an open
#: or finished transaction (an empty prepared transaction is allowed so a
#: writer with no output can still join a commit group), re-entered when it is
#: bound to a commit group, and left through PrepareCommit, PrepareAbort or
#: the epoch fence.
VALID_PREVIOUS: Mapping[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING, S.PREPARED}),
    S.PREPARE_ABORT: frozenset(
        {S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.PREPARED}
    ),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING, S.PREPARED}),
    S.PREPARED: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.PREPARED}),
}

PREPARE_STATES = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
COMPLETE_STATES = frozenset({S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
#: States in which a transactional id may expire (Kafka: Empty, CompleteCommit, CompleteAbort).
EXPIRABLE_STATES = frozenset(s for s in TransactionState if s.expiration_allowed)
#: States of a transaction that is neither decided nor finished (abort-by-prefix looks at these).
OPEN_STATES = frozenset({S.ONGOING, S.PREPARED})


def is_valid_transition(old: TransactionState, new: TransactionState) -> bool:
    return old in VALID_PREVIOUS[new]


def validate_transition(transactional_id: str, old: TransactionState, new: TransactionState) -> None:
    """Raise ``IllegalTransitionError`` naming both states unless the table allows ``old -> new``."""
    if not is_valid_transition(old, new):
        raise IllegalTransitionError(transactional_id, old, new)
