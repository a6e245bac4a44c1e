"""The coordinator's rules as pure functions: (current metadata, command) -> ``Outcome``.

Each function is Kafka's ``prepareXxx`` step: it computes the answer and the
metadata that *would* result, and changes nothing (metadata is immutable).
``TransactionStateMachine.apply`` persists the outcome after the command is
committed by Raft; a leader may call the same function on its current view to
fail fast (``TransactionStateMachine.preview``). State changes go through
``TransactionMetadata.transition_to`` and therefore through the table of
``coordinator.states``.

Request identities. A request carries (producer id, epoch); against the
metadata it is one of (``Identity``):

* CURRENT -- the identity the client must use now (never one at epoch 32767, see ``classify``);
* NEXT -- in a prepare state, the identity the client was told to use for its
  next transaction (a new producer id with epoch 0 while a rotation is
  pending; otherwise equal to CURRENT): the client is ahead of the markers and
  must retry (``CONCURRENT_TRANSACTIONS``);
* RETRY -- in a prepare or complete state, the identity that ended the last
  transaction (TV2 bumps the epoch at EndTxn, so a retried EndTxn carries
  epoch - 1, kafka_txn.md §4.3 and KIP-890);
* STALE -- a producer id this transactional id has used, any other epoch:
  ``PRODUCER_FENCED``;
* UNKNOWN_PID -- ``INVALID_PRODUCER_ID_MAPPING``.

Answers follow kafka_txn.md §4.3 (TV2 column where it differs). Where TV2
needs a choice the table does not make, the rule is stated at the function.
A classic EndTxn (Kafka clients below EndTxn version 5) follows the TV1
column instead: no bump, the retry comes with the CURRENT identity (``_end_classic``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from clients.protocol import BrokerError, ErrorCode
from coordinator.commands import (
    MAX_ID_BYTES,
    AddPartitions,
    BindPrepared,
    CompleteTxn,
    EndTxn,
    ExpireTransactionalId,
    FenceAndAbort,
    InitProducerId,
    Prepare,
    ResolvePrepared,
)
from coordinator.errors import CoordinatorError
from coordinator.group_metadata import OFFSETS_TOPIC
from coordinator.metadata import (
    EPOCH_EXHAUSTED,
    MAX_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    PreparedInfo,
    TopicPartition,
    TransactionMetadata,
)
from coordinator.results import (
    AddPartitionsResult,
    CompleteTxnResult,
    EndTxnResult,
    ExpireResult,
    InitProducerIdResult,
    PrepareResult,
)
from coordinator.states import COMPLETE_STATES, EXPIRABLE_STATES, PREPARE_STATES, TransactionState, validate_transition

__all__ = [
    "Identity",
    "Outcome",
    "TxnResult",
    "add_partitions",
    "bind_prepared",
    "carries_reservation",
    "check_id",
    "classify",
    "complete_txn",
    "end_txn",
    "expire_transactional_id",
    "fence_and_abort",
    "init_producer_id",
    "pipelined_add_allowed",
    "prepare",
    "resolve_prepared",
    "waits_for_previous",
]

S = TransactionState

TxnResult = (
    InitProducerIdResult
    | AddPartitionsResult
    | EndTxnResult
    | CompleteTxnResult
    | PrepareResult
    | ExpireResult
    | BrokerError
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """``metadata``: the value to persist (None: nothing changes); ``removed``: delete the transactional id."""

    result: TxnResult
    metadata: TransactionMetadata | None = None
    removed: bool = False


class Identity(enum.Enum):
    CURRENT = "current"
    NEXT = "next"
    RETRY = "retry"
    STALE = "stale"
    UNKNOWN_PID = "unknown_pid"


def _fail(code: ErrorCode, message: str) -> Outcome:
    return Outcome(BrokerError(code, message))


def check_id(value: str, what: str = "transactional id") -> BrokerError | None:
    """INVALID_REQUEST for an empty or oversized id (Kafka: empty transactional.id is INVALID_REQUEST)."""
    if not value:
        return BrokerError(ErrorCode.INVALID_REQUEST, f"{what} must not be empty")
    if len(value.encode()) > MAX_ID_BYTES:
        return BrokerError(ErrorCode.INVALID_REQUEST, f"{what} is longer than {MAX_ID_BYTES} bytes")
    return None


def classify(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> Identity:
    ident = (producer_id, producer_epoch)
    # Epoch 32767 is only ever a marker epoch (a fence of epoch 32766, or the last EndTxn before a
    # rotation) and is never handed to a client; accepting it would need a bump past the int16 range.
    if producer_epoch < MAX_EPOCH:
        if ident == (meta.producer_id, meta.producer_epoch):
            return Identity.CURRENT
        if meta.state in PREPARE_STATES and ident == meta.next_identity():
            return Identity.NEXT
    if (
        meta.state in PREPARE_STATES | COMPLETE_STATES
        and meta.last_producer_epoch != NO_PRODUCER_EPOCH
        and ident == (meta.last_producer_id, meta.last_producer_epoch)
    ):
        return Identity.RETRY
    known = {meta.producer_id, meta.last_producer_id, meta.next_producer_id} - {NO_PRODUCER_ID}
    return Identity.STALE if producer_id in known else Identity.UNKNOWN_PID


#: Identities whose request waits for the previous transaction's markers: the client's current and next
#: identity (the client is ahead of the markers).
WAITING_IDENTITIES = frozenset({Identity.CURRENT, Identity.NEXT})


def waits_for_previous(meta: TransactionMetadata, identity: tuple[int, int] | None, *, retry: bool = False) -> bool:
    """Whether a request from ``identity`` waits for the id's previous transaction to complete.

    Kafka answers CONCURRENT_TRANSACTIONS to a call that would begin the next transaction while the
    previous one writes its markers; the coordinator waits instead (bounded by the request timeout), but
    only for the client's CURRENT/NEXT identity. ``identity`` None (InitProducerId) always waits;
    ``retry`` (EndTxn) also waits for the RETRY identity, whose answer was lost.
    """
    if identity is None:
        return True
    ident = classify(meta, *identity)
    return ident in WAITING_IDENTITIES or (retry and ident is Identity.RETRY)


def carries_reservation(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> bool:
    """Whether (pid, epoch) holds the carried-marker reservations of the id's previous transaction.

    True while that transaction's plan has carried partitions and the request comes from the client's
    CURRENT/NEXT identity: its EndTxn then folds the previous transaction's completion into its own
    write, and it alone may release unused tokens (docs/carried-markers.md).
    """
    plan = meta.marker_plan()
    return plan is not None and bool(plan.carried) and classify(meta, producer_id, producer_epoch) in WAITING_IDENTITIES


def _fenced(meta: TransactionMetadata, pid: int, epoch: int) -> Outcome:
    return _fail(
        ErrorCode.PRODUCER_FENCED,
        f"producer {pid} epoch {epoch} is fenced; the current epoch of {meta.transactional_id!r} "
        f"is {meta.producer_epoch}",
    )


def _fenced_or_unknown(meta: TransactionMetadata, ident: Identity, pid: int, epoch: int) -> Outcome | None:
    """PRODUCER_FENCED for a STALE identity, INVALID_PRODUCER_ID_MAPPING for an unknown pid; else None."""
    if ident is Identity.UNKNOWN_PID:
        return _fail(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"producer id {pid} is not the producer of transactional id {meta.transactional_id!r}",
        )
    if ident is Identity.STALE:
        return _fenced(meta, pid, epoch)
    return None


def _identity_error(meta: TransactionMetadata, ident: Identity, pid: int, epoch: int) -> Outcome | None:
    """The answer to a request that does not come from the CURRENT identity outside a prepare state.

    In a prepare state the client's current/next identity is ahead of the
    markers: CONCURRENT_TRANSACTIONS (retriable). A RETRY identity reaching
    here is fenced: only EndTxn/ResolvePrepared accept retries.
    """
    if (bad := _fenced_or_unknown(meta, ident, pid, epoch)) is not None:
        return bad
    if meta.state in PREPARE_STATES and ident in (Identity.CURRENT, Identity.NEXT):
        return _fail(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"the previous transaction of {meta.transactional_id!r} is still completing ({meta.state})",
        )
    if ident is not Identity.CURRENT:
        return _fenced(meta, pid, epoch)
    return None


def _bumped(meta: TransactionMetadata) -> int:
    if meta.producer_epoch >= MAX_EPOCH:
        # Unreachable: no request is CURRENT at MAX_EPOCH (``classify``), so nothing opens a
        # transaction there, and EndTxn at EPOCH_EXHAUSTED rotates.
        raise CoordinatorError(f"{meta.transactional_id!r}: epoch {meta.producer_epoch} cannot be bumped")
    return meta.producer_epoch + 1


def _complete(meta: TransactionMetadata, now_ms: int) -> TransactionMetadata:
    """Prepare state -> complete state; a pending rotation takes effect (next id, epoch 0).

    When the client's next transaction already added partitions (pipelined
    adds), it opens in the same apply: Complete* -> Ongoing with them.
    """
    target = S.COMPLETE_COMMIT if meta.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
    cleared: dict[str, Any] = {
        "partitions": frozenset(),
        "next_partitions": frozenset(),
        "next_start_ms": -1,
        "carried": frozenset(),
    }
    if meta.next_producer_id != NO_PRODUCER_ID:
        cleared.update(producer_id=meta.next_producer_id, producer_epoch=0, next_producer_id=NO_PRODUCER_ID)
    done = meta.transition_to(target, now_ms, **cleared)
    if meta.next_partitions:
        done = done.transition_to(
            S.ONGOING, now_ms, partitions=meta.next_partitions, txn_start_time_ms=meta.next_start_ms
        )
    return done


def _end(
    meta: TransactionMetadata,
    *,
    commit: bool,
    bump: bool,
    now_ms: int,
    coordinator_epoch: int,
    candidate: int | None,
    carry: bool = False,
    classic: bool = False,
) -> Outcome:
    """Enter PrepareCommit/PrepareAbort (completing at once when there are no partitions, so no markers).

    ``bump`` (every EndTxn under TV2): the markers carry epoch + 1, which fences
    any late write of the ended transaction; the retry identity is recorded. An
    exhausted epoch also rotates the producer id at completion (KIP-890).
    Without ``bump`` (after a fence, which already bumped, or a classic EndTxn) no retry identity is
    recorded. ``classic``: a classic EndTxn, whose markers carry the epoch of the transaction's batches.
    ``carry``: the markers of the data partitions ride on the client's next transaction (tokens,
    docs/carried-markers.md); never with a rotation, since a carried marker is the batch's own producer's.
    """
    target = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
    rotate = bump and meta.epoch_exhausted
    if rotate and candidate is None:
        return _fail(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"the epoch of {meta.transactional_id!r} is exhausted and no new producer id was allocated; retry",
        )
    if bump:
        changes = {
            "producer_epoch": _bumped(meta),
            "last_producer_id": meta.producer_id,
            "last_producer_epoch": meta.producer_epoch,
        }
    else:
        changes = {"last_producer_id": NO_PRODUCER_ID, "last_producer_epoch": NO_PRODUCER_EPOCH}
    carried = (
        frozenset(tp for tp in meta.partitions if tp.topic != OFFSETS_TOPIC) if carry and bump and not rotate else None
    )
    new = meta.transition_to(
        target,
        now_ms,
        next_producer_id=candidate if rotate and candidate is not None else NO_PRODUCER_ID,
        prepared=None,
        coordinator_epoch=coordinator_epoch,
        carried=carried or frozenset(),
        classic=classic,
        **changes,
    )
    markers = new.marker_plan()
    if not new.partitions:
        new, markers = _complete(new, now_ms), None
    next_pid, next_epoch = new.next_identity()
    return Outcome(EndTxnResult(meta.transactional_id, next_pid, next_epoch, commit, False, markers), new)


def _end_requested(meta: TransactionMetadata, cmd: EndTxn | ResolvePrepared) -> Outcome:
    """The client's (or a group decision's) end of a transaction: TV2 bump, rotation when exhausted."""
    return _end(
        meta,
        commit=cmd.commit,
        bump=True,
        now_ms=cmd.now_ms,
        coordinator_epoch=cmd.coordinator_epoch,
        candidate=cmd.producer_id_candidate,
        carry=isinstance(cmd, EndTxn) and cmd.carry,
    )


def _settled(meta: TransactionMetadata, partitions: tuple[TopicPartition, ...], now_ms: int) -> TransactionMetadata:
    """Carried partitions the next transaction wrote to (receipts, or revoking markers that found them in use).

    In a prepare state they join the next transaction's partitions (``next_partitions``); in Ongoing its
    partitions; in Empty/Complete* they open it. Unknown to the client or not, data of that transaction is
    on them, so they must get its marker.
    """
    if not partitions:
        return meta
    tps = frozenset(partitions)
    if meta.state in PREPARE_STATES:
        start = meta.next_start_ms if meta.next_partitions else now_ms
        return meta.amended(now_ms, next_partitions=meta.next_partitions | tps, next_start_ms=start)
    if meta.state is S.ONGOING:
        return meta.amended(now_ms, partitions=meta.partitions | tps) if not tps <= meta.partitions else meta
    if meta.state in (S.EMPTY, *COMPLETE_STATES):
        return meta.transition_to(S.ONGOING, now_ms, partitions=tps, txn_start_time_ms=now_ms)
    return meta


def _fence_and_abort(meta: TransactionMetadata, now_ms: int, coordinator_epoch: int) -> Outcome:
    """Ongoing/Prepared -> PrepareEpochFence (epoch + 1) -> PrepareAbort, in one apply (§4.3, §5)."""
    fenced = meta.transition_to(
        S.PREPARE_EPOCH_FENCE,
        now_ms,
        producer_epoch=_bumped(meta),
        last_producer_id=NO_PRODUCER_ID,
        last_producer_epoch=NO_PRODUCER_EPOCH,
    )
    return _end(fenced, commit=False, bump=False, now_ms=now_ms, coordinator_epoch=coordinator_epoch, candidate=None)


# -- InitProducerId -----------------------------------------------------------


def _expected_is_valid(meta: TransactionMetadata, pid: int, epoch: int) -> bool:
    """Kafka's ``isValidProducerId`` (KIP-360), plus the id a pending rotation hands out."""
    return (
        meta.producer_epoch == NO_PRODUCER_EPOCH
        or pid == meta.producer_id
        or (pid == meta.last_producer_id and epoch >= EPOCH_EXHAUSTED)
        or (pid != NO_PRODUCER_ID and pid == meta.next_producer_id)
    )


def init_producer_id(meta: TransactionMetadata | None, cmd: InitProducerId) -> Outcome:
    """InitProducerId with a transactional id (§4.3 table; §14 items 7-10).

    * new id: the candidate producer id, epoch 0;
    * Empty/Complete*: bump the epoch (KIP-360 rules for an expected identity),
      or rotate to the candidate when the epoch is exhausted;
    * Ongoing (and an unbound Prepared, KIP-939's keepPreparedTxn=false): fence
      (epoch + 1) and abort, answer CONCURRENT_TRANSACTIONS; the client's retry
      bumps again, so it ends two epochs above the zombie;
    * PrepareCommit/PrepareAbort, and a Prepared bound to a commit group (only
      the group's decision may end it): CONCURRENT_TRANSACTIONS, no change.
    """
    tid = cmd.transactional_id
    if (err := check_id(tid)) is not None:
        return Outcome(err)
    if cmd.timeout_ms <= 0 or cmd.timeout_ms > cmd.max_timeout_ms:
        return _fail(
            ErrorCode.INVALID_TRANSACTION_TIMEOUT,
            f"transaction timeout {cmd.timeout_ms} ms is outside 1..{cmd.max_timeout_ms} (transaction.max.timeout.ms)",
        )
    expected = cmd.expected_producer_id, cmd.expected_producer_epoch
    if (expected[0] is None) != (expected[1] is None):
        return _fail(ErrorCode.INVALID_REQUEST, "expected producer id and epoch go together")
    if meta is None:
        if cmd.producer_id_candidate is None:
            return _fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"no producer id allocated for new {tid!r}; retry")
        created = TransactionMetadata(
            transactional_id=tid,
            producer_id=cmd.producer_id_candidate,
            producer_epoch=0,
            timeout_ms=cmd.timeout_ms,
            state=S.EMPTY,
            txn_last_update_ms=cmd.now_ms,
        )
        return Outcome(InitProducerIdResult(created.producer_id, 0), created)
    exp_pid, exp_epoch = expected
    if exp_pid is not None and exp_epoch is not None and not _expected_is_valid(meta, exp_pid, exp_epoch):
        return _fail(ErrorCode.PRODUCER_FENCED, f"expected producer {exp_pid} is not the producer of {tid!r}")
    state = meta.state
    if state in PREPARE_STATES:
        return _fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"the transaction of {tid!r} is completing ({state})")
    if state is S.PREPARED and meta.group_id is not None:
        return _fail(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"{tid!r} is prepared in commit group {meta.group_id!r} and waits for the group's decision",
        )
    if state in (S.ONGOING, S.PREPARED):
        fenced = _fence_and_abort(meta, cmd.now_ms, cmd.coordinator_epoch)
        return Outcome(
            BrokerError(ErrorCode.CONCURRENT_TRANSACTIONS, f"aborting the open transaction of {tid!r}; retry"),
            fenced.metadata,
        )
    if state not in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is in state {state}")
    if meta.epoch_exhausted and (exp_epoch is None or exp_epoch == meta.producer_epoch):
        if cmd.producer_id_candidate is None:
            return _fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"the epoch of {tid!r} is exhausted; retry")
        rotated = meta.transition_to(
            S.EMPTY,
            cmd.now_ms,
            producer_id=cmd.producer_id_candidate,
            producer_epoch=0,
            last_producer_id=meta.producer_id,
            last_producer_epoch=meta.producer_epoch if exp_epoch is not None else NO_PRODUCER_EPOCH,
            next_producer_id=NO_PRODUCER_ID,
            timeout_ms=cmd.timeout_ms,
            partitions=frozenset(),
            prepared=None,
        )
        return Outcome(InitProducerIdResult(rotated.producer_id, 0), rotated)
    if exp_epoch is None:
        last: tuple[int, int] = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    elif exp_epoch == meta.producer_epoch:
        last = (meta.producer_id, meta.producer_epoch)
    elif exp_epoch == meta.last_producer_epoch:
        # A retry of a bump whose answer was lost: answer it again, bump nothing.
        return Outcome(InitProducerIdResult(meta.producer_id, meta.producer_epoch))
    else:
        return _fail(ErrorCode.PRODUCER_FENCED, f"expected epoch {exp_epoch} is not current for {tid!r}")
    bumped = meta.transition_to(
        S.EMPTY,
        cmd.now_ms,
        producer_epoch=_bumped(meta),
        last_producer_id=last[0],
        last_producer_epoch=last[1],
        timeout_ms=cmd.timeout_ms,
        partitions=frozenset(),
        prepared=None,
    )
    return Outcome(InitProducerIdResult(bumped.producer_id, bumped.producer_epoch), bumped)


# -- AddPartitionsToTxn ---------------------------------------------------------


def add_partitions(meta: TransactionMetadata | None, cmd: AddPartitions) -> Outcome:
    """AddPartitionsToTxn / the implicit add of KIP-890 part 2 (§4.3 table).

    Adding to a Prepared transaction is INVALID_TXN_STATE: once prepared, its
    content is what the external coordinator decides on. In PrepareCommit/
    PrepareAbort the client's next transaction adds ahead (``_add_next``).
    """
    tid = cmd.transactional_id
    if (err := check_id(tid)) is not None:
        return Outcome(err)
    if not cmd.partitions:
        return _fail(ErrorCode.INVALID_REQUEST, "no partitions to add")
    for tp in cmd.partitions:
        if not tp.topic or tp.partition < 0:
            return _fail(ErrorCode.INVALID_REQUEST, f"invalid partition {tp.topic!r}/{tp.partition}")
    if meta is None:
        return _fail(ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"unknown transactional id {tid!r}")
    ident = classify(meta, cmd.producer_id, cmd.producer_epoch)
    if pipelined_add_allowed(meta, ident):
        return _add_next(meta, cmd)
    if (bad := _identity_error(meta, ident, cmd.producer_id, cmd.producer_epoch)) is not None:
        return bad
    if meta.state is S.PREPARED:
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is prepared; it accepts no more partitions")
    if meta.state not in (S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is in state {meta.state}")
    new_tps = frozenset(cmd.partitions) - meta.partitions if meta.state is S.ONGOING else frozenset(cmd.partitions)
    if meta.state is S.ONGOING and not new_tps:
        return Outcome(AddPartitionsResult(tid, meta.producer_id, meta.producer_epoch, ()))
    start = meta.txn_start_time_ms if meta.state is S.ONGOING else cmd.now_ms
    new = meta.transition_to(
        S.ONGOING,
        cmd.now_ms,
        partitions=(meta.partitions if meta.state is S.ONGOING else frozenset()) | new_tps,
        txn_start_time_ms=start,
    )
    return Outcome(AddPartitionsResult(tid, meta.producer_id, meta.producer_epoch, tuple(sorted(new_tps))), new)


def pipelined_add_allowed(meta: TransactionMetadata, ident: Identity) -> bool:
    """Whether ``ident`` may add partitions for its next transaction while ``meta`` completes.

    Only after an EndTxn (TV2: the client was handed the next identity, recorded as
    a retry identity; classic: the client keeps its identity): a fence's PrepareAbort
    bumped past every client.
    """
    return (
        meta.state in PREPARE_STATES
        and (meta.last_producer_epoch != NO_PRODUCER_EPOCH or meta.classic)
        and ident in (Identity.CURRENT, Identity.NEXT)
    )


def _add_next(meta: TransactionMetadata, cmd: AddPartitions) -> Outcome:
    """A pipelined add: the client's next transaction adds partitions while this one completes.

    Kafka answers CONCURRENT_TRANSACTIONS here and the client retries after a
    backoff. txbroker records them instead (``next_partitions``); the state
    stays PrepareCommit/PrepareAbort, and CompleteTxn opens the next
    transaction with them. The coordinator service answers the caller only
    once the previous transaction's marker is written on each added partition
    that it also touched, so on every partition the markers of one transaction
    precede the data of the next.
    """
    pid, epoch = meta.next_identity()
    new_tps = frozenset(cmd.partitions) - meta.next_partitions
    if not new_tps:
        return Outcome(AddPartitionsResult(meta.transactional_id, pid, epoch, ()))
    new = meta.amended(
        cmd.now_ms,
        next_partitions=meta.next_partitions | new_tps,
        next_start_ms=meta.next_start_ms if meta.next_partitions else cmd.now_ms,
    )
    return Outcome(AddPartitionsResult(meta.transactional_id, pid, epoch, tuple(sorted(new_tps))), new)


# -- EndTxn / CompleteTxn ---------------------------------------------------------


def _same_direction(state: TransactionState, commit: bool) -> bool:
    return (state in (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)) == commit


def end_txn(meta: TransactionMetadata | None, cmd: EndTxn) -> Outcome:
    """EndTxn (§4.3 table, TV2; §14 item 6).

    * Ongoing, unbound Prepared: PrepareCommit/PrepareAbort with the epoch bump;
    * a RETRY identity: in the matching complete state NONE again (with the
      identity for the next transaction); in the matching prepare state
      CONCURRENT_TRANSACTIONS; in the opposite state INVALID_TXN_STATE;
    * the client's next identity while a prepare state completes:
      CONCURRENT_TRANSACTIONS for commit and abort alike (TV2 refinement: the
      client is ahead of the markers, not confused about the outcome);
    * Empty/Complete*: abort bumps the epoch (TV2), commit is INVALID_TXN_STATE;
    * a Prepared bound to a commit group: INVALID_TXN_STATE (its group decides).
    """
    tid = cmd.transactional_id
    if (err := check_id(tid)) is not None:
        return Outcome(err)
    if meta is None:
        return _fail(ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"unknown transactional id {tid!r}")
    if cmd.classic:
        return _end_classic(meta, cmd)
    ident = classify(meta, cmd.producer_id, cmd.producer_epoch)
    if ident in (Identity.CURRENT, Identity.NEXT) and (cmd.settle or cmd.settled_partitions):
        # Carried markers, the fold: the previous transaction's carried markers are settled, so it completes
        # here (Prepare* -> Complete* -> Ongoing with its next transaction's partitions), and this command then
        # ends that next transaction. Otherwise the receipted partitions only join the open transaction.
        if cmd.settle and meta.state in PREPARE_STATES and meta.carried:
            meta = _complete(_settled(meta, cmd.settled_partitions, cmd.now_ms), cmd.now_ms)
        elif meta.state not in PREPARE_STATES:
            meta = _settled(meta, cmd.settled_partitions, cmd.now_ms)
        ident = classify(meta, cmd.producer_id, cmd.producer_epoch)
    state = meta.state
    if ident is Identity.RETRY:
        if not _same_direction(state, cmd.commit):
            return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} already ended the other way ({state})")
        if state in PREPARE_STATES:
            return _fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"{tid!r} is completing ({state}); retry")
        return Outcome(EndTxnResult(tid, meta.producer_id, meta.producer_epoch, cmd.commit, True, None))
    if (bad := _identity_error(meta, ident, cmd.producer_id, cmd.producer_epoch)) is not None:
        return bad
    if state is S.PREPARED and meta.group_id is not None:
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is prepared in commit group {meta.group_id!r}")
    if state in (S.ONGOING, S.PREPARED) or (not cmd.commit and state in (S.EMPTY, *COMPLETE_STATES)):
        return _end_requested(meta, cmd)
    return _fail(ErrorCode.INVALID_TXN_STATE, f"cannot commit {tid!r}: no transaction is open ({state})")


def _end_classic(meta: TransactionMetadata, cmd: EndTxn) -> Outcome:
    """EndTxn of the classic protocol (Kafka's TV1 rules; clients below EndTxn version 5).

    The client keeps its producer id and epoch across transactions, so no epoch
    is bumped and a retry comes with the CURRENT identity:

    * Ongoing, unbound Prepared: PrepareCommit/PrepareAbort, markers at the current epoch;
    * a prepare state: CONCURRENT_TRANSACTIONS in the same direction (a retry
      while the markers are written), INVALID_TXN_STATE in the other;
    * CompleteCommit/CompleteAbort in the same direction: NONE again (a retry
      whose answer was lost); in the other direction, and in Empty: INVALID_TXN_STATE;
    * any identity other than CURRENT: PRODUCER_FENCED (a stale epoch, or the
      previous epoch of a TV2 EndTxn), INVALID_PRODUCER_ID_MAPPING for an unknown
      producer id; the next identity of a pending rotation: CONCURRENT_TRANSACTIONS.
    """
    tid = cmd.transactional_id
    ident = classify(meta, cmd.producer_id, cmd.producer_epoch)
    if (bad := _fenced_or_unknown(meta, ident, cmd.producer_id, cmd.producer_epoch)) is not None:
        return bad
    state = meta.state
    if ident is Identity.NEXT:
        return _fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"{tid!r} is completing ({state}); retry")
    if ident is not Identity.CURRENT:
        return _fenced(meta, cmd.producer_id, cmd.producer_epoch)
    if state in PREPARE_STATES:
        if _same_direction(state, cmd.commit):
            return _fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"{tid!r} is completing ({state}); retry")
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is ending the other way ({state})")
    if state in COMPLETE_STATES:
        if _same_direction(state, cmd.commit):
            return Outcome(EndTxnResult(tid, meta.producer_id, meta.producer_epoch, cmd.commit, True, None))
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} already ended the other way ({state})")
    if state is S.PREPARED and meta.group_id is not None:
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is prepared in commit group {meta.group_id!r}")
    if state not in (S.ONGOING, S.PREPARED):
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} has no open transaction ({state})")
    return _end(
        meta,
        commit=cmd.commit,
        bump=False,
        now_ms=cmd.now_ms,
        coordinator_epoch=cmd.coordinator_epoch,
        candidate=None,
        classic=True,
    )


def complete_txn(meta: TransactionMetadata | None, cmd: CompleteTxn) -> Outcome:
    """Every marker is written: PrepareCommit -> CompleteCommit, PrepareAbort -> CompleteAbort.

    The command names the marker identity (producer id, marker epoch) and the
    outcome, so a CompleteTxn for an older transaction (from a deposed leader,
    or retried) never completes a newer one.
    """
    tid = cmd.transactional_id
    if meta is None:
        return _fail(ErrorCode.INVALID_TXN_STATE, f"unknown transactional id {tid!r}")
    marker = (cmd.producer_id, cmd.producer_epoch)
    if meta.state in PREPARE_STATES and _same_direction(meta.state, cmd.commit):
        if marker == (meta.producer_id, meta.producer_epoch):
            done = _complete(_settled(meta, cmd.settled_partitions, cmd.now_ms), cmd.now_ms)
            return Outcome(CompleteTxnResult(tid, done.state, done.producer_id, done.producer_epoch, False), done)
    elif meta.state in COMPLETE_STATES and _same_direction(meta.state, cmd.commit):
        ended_by = (meta.last_producer_id, meta.last_producer_epoch + 1)  # the marker identity of an EndTxn
        if marker == (meta.producer_id, meta.producer_epoch) or (
            meta.last_producer_epoch != NO_PRODUCER_EPOCH and marker == ended_by
        ):
            return Outcome(CompleteTxnResult(tid, meta.state, meta.producer_id, meta.producer_epoch, True))
    return _fail(
        ErrorCode.INVALID_TXN_STATE,
        f"{tid!r} has no {'commit' if cmd.commit else 'abort'} pending for producer {marker[0]} "
        f"epoch {marker[1]} ({meta.state})",
    )


# -- Prepared transactions (external coordinators) ----------------------------------


def prepare(meta: TransactionMetadata | None, cmd: Prepare) -> Outcome:
    """Ongoing/Empty/Complete* -> Prepared (durable, no timeout, completed later by EndTxn or the group).

    A repeated Prepare of the same identity answers success again (retry); one
    naming a different commit group than the one bound is INVALID_TXN_STATE.
    """
    tid = cmd.transactional_id
    for value, what in ((tid, "transactional id"), (cmd.group_id, "commit group id")):
        if value is not None and (err := check_id(value, what)) is not None:
            return Outcome(err)
    if meta is None:
        return _fail(ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"unknown transactional id {tid!r}")
    ident = classify(meta, cmd.producer_id, cmd.producer_epoch)
    if (bad := _identity_error(meta, ident, cmd.producer_id, cmd.producer_epoch)) is not None:
        return bad
    if meta.state is S.PREPARED and meta.prepared is not None:
        if cmd.group_id is not None and cmd.group_id != meta.group_id:
            return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is prepared in commit group {meta.group_id!r}")
        info = meta.prepared
        return Outcome(PrepareResult(tid, meta.producer_id, meta.producer_epoch, info.prepared_ms, info.group_id, True))
    if meta.state not in (S.ONGOING, S.EMPTY, *COMPLETE_STATES):
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} cannot be prepared in state {meta.state}")
    new = meta.transition_to(S.PREPARED, cmd.now_ms, prepared=PreparedInfo(cmd.now_ms, cmd.group_id))
    return Outcome(PrepareResult(tid, new.producer_id, new.producer_epoch, cmd.now_ms, cmd.group_id, False), new)


def bind_prepared(meta: TransactionMetadata | None, cmd: BindPrepared) -> Outcome:
    """Bind a prepared transaction to a commit group before the group's decision is recorded."""
    tid = cmd.transactional_id
    for value, what in ((tid, "transactional id"), (cmd.group_id, "commit group id")):
        if (err := check_id(value, what)) is not None:
            return Outcome(err)
    if meta is None:
        return _fail(ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"unknown transactional id {tid!r}")
    ident = classify(meta, cmd.producer_id, cmd.producer_epoch)
    if meta.state is not S.PREPARED or meta.prepared is None:
        if (bad := _fenced_or_unknown(meta, ident, cmd.producer_id, cmd.producer_epoch)) is not None:
            return bad
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is not prepared ({meta.state})")
    if (bad := _identity_error(meta, ident, cmd.producer_id, cmd.producer_epoch)) is not None:
        return bad
    info = meta.prepared
    result = PrepareResult(tid, meta.producer_id, meta.producer_epoch, info.prepared_ms, cmd.group_id, True)
    if info.group_id == cmd.group_id:
        return Outcome(result)
    if info.group_id is not None:
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is prepared in commit group {info.group_id!r}")
    new = meta.transition_to(S.PREPARED, cmd.now_ms, prepared=PreparedInfo(info.prepared_ms, cmd.group_id))
    return Outcome(replace(result, retry=False), new)


def resolve_prepared(meta: TransactionMetadata | None, cmd: ResolvePrepared) -> Outcome:
    """Carry out a recorded group decision on one member (PrepareCommit/PrepareAbort, TV2 bump).

    Idempotent: a member already ended the same way for this identity answers
    success (``retry``); ended the other way, INVALID_TXN_STATE -- which a
    write-once decision makes impossible unless a member was ended outside
    its group.
    """
    tid = cmd.transactional_id
    if meta is None:
        return _fail(ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"unknown transactional id {tid!r}")
    ident = classify(meta, cmd.producer_id, cmd.producer_epoch)
    if ident is Identity.RETRY:
        if not _same_direction(meta.state, cmd.commit):
            return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} already ended the other way ({meta.state})")
        next_pid, next_epoch = meta.next_identity()
        return Outcome(EndTxnResult(tid, next_pid, next_epoch, cmd.commit, True, None))
    if meta.state is S.PREPARED and ident is Identity.CURRENT:
        if meta.group_id != cmd.group_id:
            return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is not bound to commit group {cmd.group_id!r}")
        return _end_requested(meta, cmd)
    if (bad := _fenced_or_unknown(meta, ident, cmd.producer_id, cmd.producer_epoch)) is not None:
        return bad
    return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is not prepared for this identity ({meta.state})")


# -- Coordinator-initiated aborts and expiry -----------------------------------------


def fence_and_abort(meta: TransactionMetadata | None, cmd: FenceAndAbort) -> Outcome:
    """Fence and abort the open transaction of exactly (pid, epoch): timeout scan, abort-by-prefix, admin.

    A Prepared transaction bound to a commit group is refused (INVALID_TXN_STATE):
    it may only end through its group's decision (``coordinator.group_commit``).
    """
    tid = cmd.transactional_id
    if meta is None:
        return _fail(ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"unknown transactional id {tid!r}")
    if (cmd.producer_id, cmd.producer_epoch) != (meta.producer_id, meta.producer_epoch):
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} moved on; no open transaction at that identity")
    if meta.state is S.PREPARED and meta.group_id is not None:
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is prepared in commit group {meta.group_id!r}")
    if meta.state not in (S.ONGOING, S.PREPARED):
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} has no open transaction ({meta.state})")
    return _fence_and_abort(meta, cmd.now_ms, cmd.coordinator_epoch)


def is_expired_id(meta: TransactionMetadata, now_ms: int, expiration_ms: int) -> bool:
    """transactional.id.expiration.ms: only Empty/Complete* ids expire ("not while ongoing", §5)."""
    return meta.state in EXPIRABLE_STATES and meta.txn_last_update_ms + expiration_ms < now_ms


def expire_transactional_id(meta: TransactionMetadata | None, cmd: ExpireTransactionalId) -> Outcome:
    """Remove an idle id (through Dead, never persisted); a later InitProducerId gets a new producer id."""
    tid = cmd.transactional_id
    if meta is None:
        return _fail(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"unknown transactional id {tid!r}")
    if (cmd.producer_id, cmd.producer_epoch) != (meta.producer_id, meta.producer_epoch):
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} moved on; not expiring it")
    if not is_expired_id(meta, cmd.now_ms, cmd.expiration_ms):
        return _fail(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is not expired ({meta.state})")
    validate_transition(tid, meta.state, S.DEAD)
    return Outcome(ExpireResult(tid, meta.producer_id), removed=True)
