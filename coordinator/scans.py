"""Read-only questions a coordinator leader asks of its transactions (pure functions over metadata).

None of these change anything; the leader turns their answers into commands
(FenceAndAbort, ExpireTransactionalId, CompleteTxn after markers, group
resolution) and proposes them through Raft, where ``apply`` re-checks them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from clients.protocol import BrokerError, ErrorCode
from coordinator.metadata import MarkerPlan, TopicPartition, TransactionMetadata
from coordinator.states import OPEN_STATES, TransactionState
from coordinator.transitions import classify, is_expired_id, pipelined_add_allowed

__all__ = [
    "DEFAULT_MAX_PREPARED_MS",
    "expired_transactional_ids",
    "expired_transactions",
    "partition_in_txn",
    "pending_completions",
    "producer_id_needed",
    "transactions_matching_prefix",
]

#: How long a Prepared transaction is exempt from aborting (txbroker's setting; KIP-939 has no limit).
DEFAULT_MAX_PREPARED_MS = 86_400_000


def partition_in_txn(
    meta: TransactionMetadata | None, producer_id: int, producer_epoch: int, tp: TopicPartition
) -> BrokerError | None:
    """KIP-890 part 1 verification for the partition leader: None when ``tp`` is in the open transaction.

    The answers are produce-path errors: an older epoch is INVALID_PRODUCER_EPOCH
    (abortable, §3.1 rule 2), a partition not in an ongoing transaction is
    INVALID_TXN_STATE ("not part of an ongoing transaction"). While the previous
    transaction completes, the client's next identity is checked against the
    partitions its next transaction added ahead (pipelined adds); the caller
    still waits for the previous marker on ``tp`` before writing.
    """
    if meta is not None and pipelined_add_allowed(meta, classify(meta, producer_id, producer_epoch)):
        if tp in meta.next_partitions:
            return None
        return BrokerError(ErrorCode.INVALID_TXN_STATE, f"{tp} is not part of the next transaction yet")
    if meta is None or producer_id != meta.producer_id:
        return BrokerError(ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"producer {producer_id} has no transaction here")
    if producer_epoch != meta.producer_epoch:
        return BrokerError(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"epoch {producer_epoch} is not the current epoch {meta.producer_epoch} of producer {producer_id}",
        )
    if meta.state is not TransactionState.ONGOING or tp not in meta.partitions:
        return BrokerError(ErrorCode.INVALID_TXN_STATE, f"{tp} is not part of an ongoing transaction")
    return None


def expired_transactions(
    txns: Iterable[TransactionMetadata], now_ms: int, max_prepared_ms: int = DEFAULT_MAX_PREPARED_MS
) -> list[TransactionMetadata]:
    """Ongoing past ``start + timeout`` (§5) and Prepared past ``prepared + max_prepared_ms``.

    For each, the leader proposes FenceAndAbort with the listed identity -- or,
    for a Prepared bound to a commit group, resolves it through the group
    (``coordinator.group_commit``, step 4).
    """
    return sorted((m for m in txns if _past_deadline(m, now_ms, max_prepared_ms)), key=lambda m: m.transactional_id)


def _past_deadline(m: TransactionMetadata, now_ms: int, max_prepared_ms: int) -> bool:
    if m.state is TransactionState.ONGOING:
        return m.txn_start_time_ms + m.timeout_ms < now_ms
    return m.prepared is not None and m.prepared.prepared_ms + max_prepared_ms < now_ms


def expired_transactional_ids(
    txns: Iterable[TransactionMetadata], now_ms: int, expiration_ms: int
) -> list[TransactionMetadata]:
    """Ids idle in Empty/Complete* longer than transactional.id.expiration.ms (§5), for ExpireTransactionalId."""
    return sorted((m for m in txns if is_expired_id(m, now_ms, expiration_ms)), key=lambda m: m.transactional_id)


def transactions_matching_prefix(
    txns: Iterable[TransactionMetadata], prefix: str, states: Collection[TransactionState] = OPEN_STATES
) -> list[TransactionMetadata]:
    """Abort-by-prefix: the transactions (Ongoing or Prepared by default) whose id starts with ``prefix``."""
    return sorted(
        (m for m in txns if m.transactional_id.startswith(prefix) and m.state in states),
        key=lambda m: m.transactional_id,
    )


def pending_completions(txns: Iterable[TransactionMetadata]) -> list[MarkerPlan]:
    """Transactions in PrepareCommit/PrepareAbort: a new leader writes their markers, then CompleteTxn."""
    plans = (m.marker_plan() for m in txns)
    return sorted((p for p in plans if p is not None), key=lambda p: p.transactional_id)


def producer_id_needed(meta: TransactionMetadata | None) -> bool:
    """Whether the leader should put a fresh producer id in InitProducerId/EndTxn/ResolvePrepared.

    True for a new transactional id and an exhausted epoch (rotation); an unused
    candidate is simply never issued (ids are 64-bit and blocks are cheap).
    """
    return meta is None or meta.epoch_exhausted
