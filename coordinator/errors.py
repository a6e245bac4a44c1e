"""The coordinator package's own exceptions.

``CoordinatorError`` is the root of every exception this package raises on its
own account. Answers to clients are ``clients.protocol.BrokerError`` *values*
returned by the pure transition functions and by ``apply`` (which never raises).
"""

from __future__ import annotations

__all__ = ["CommandDecodeError", "CoordinatorCorruptionError", "CoordinatorError", "IllegalTransitionError"]


class CoordinatorError(Exception):
    """Root of the coordinator package's own exceptions."""


class IllegalTransitionError(CoordinatorError):
    """A state change the transition table (kafka_txn.md §4.1) forbids.

    The transition functions check every request before they change a state,
    so this is raised only for a programming error; ``apply`` turns it into an
    ``UNKNOWN_SERVER_ERROR`` answer and leaves the state unchanged.
    """

    def __init__(self, transactional_id: str, old: object, new: object) -> None:
        super().__init__(f"transactional id {transactional_id!r}: illegal transition {old} -> {new}")
        self.transactional_id = transactional_id
        self.old = old
        self.new = new


class CoordinatorCorruptionError(CoordinatorError):
    """Persisted coordinator bytes (a key, a value or a snapshot) fail their checksum, version or shape check."""


class CommandDecodeError(CoordinatorError):
    """A replicated command is not a well-formed coordinator command (answered as ``INVALID_REQUEST``)."""
