"""What the transaction handlers of the Kafka listener share: identities, ids and the fencing error per version.

The transaction APIs run on the transactional id's coordinator (the client asks
FindCoordinator first); elsewhere the coordinator service answers
NOT_COORDINATOR and the client looks again. Kafka clients speak the classic
protocol (EndTxn below version 5): see docs/kafka-listener.md "Transactions".

KIP-588 gave a fenced producer its own code, PRODUCER_FENCED; a client that
sends an older version of the request than the one that introduced it expects
INVALID_PRODUCER_EPOCH instead (Kafka's broker rewrites it the same way).
"""

from __future__ import annotations

from clients.protocol import BrokerError, ErrorCode

from ..http import parsing
from .api import error_code

__all__ = ["coded", "identifier", "producer_identity"]

_MAX_EPOCH = 2**15 - 1


def coded(exc: BaseException | ErrorCode | None, api_version: int, fenced_since: int) -> int:
    """``error_code(exc)``, with PRODUCER_FENCED as INVALID_PRODUCER_EPOCH below version ``fenced_since``."""
    code = error_code(exc)
    if code == ErrorCode.PRODUCER_FENCED.code and api_version < fenced_since:
        return ErrorCode.INVALID_PRODUCER_EPOCH.code
    return code


def identifier(raw: str | None, what: str) -> str:
    """A transactional or group id as the HTTP API accepts it; INVALID_REQUEST otherwise."""
    if raw is None:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"{what} must not be null")
    return parsing.identifier(raw, what)


def producer_identity(producer_id: int, producer_epoch: int) -> tuple[int, int]:
    """A transactional request's (producer id, epoch); INVALID_REQUEST for values no producer has."""
    if producer_id < 0 or not 0 <= producer_epoch <= _MAX_EPOCH:
        raise BrokerError(
            ErrorCode.INVALID_REQUEST, f"producer id {producer_id} epoch {producer_epoch} names no producer"
        )
    return producer_id, producer_epoch
