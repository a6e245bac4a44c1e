"""Transaction state of a transactional producer (Kafka's ``TransactionManager``, transactional half). Pure.

Terms (kafka_txn.md §4.3, §8 KIP-890/KIP-939):

* **identity**: (producer id, epoch) from InitProducerId. Under TV2 the
  coordinator bumps the epoch at every EndTxn and answers with the identity
  of the NEXT transaction, so one identity names one transaction; sequences
  restart at 0 with each (``IdempotenceManager.set_producer_id``).
* **abortable error**: a batch of the open transaction failed, or its outcome
  is unknown (an unresolved sequence). The transaction can no longer commit:
  ``commit_transaction`` and ``send`` raise ``TRANSACTION_ABORTABLE`` until the
  application calls ``abort_transaction``; the producer then goes on.
* **fatal error**: the producer is fenced (a newer instance called
  ``init_transactions`` with the same transactional id, or the coordinator
  fenced a timed-out transaction) or the coordinator rejected its identity.
  Every later call raises the same ``PRODUCER_FENCED`` error; only ``close``
  is left.
* **prepared**: ``prepare_transaction`` flushed and made the transaction
  durable on the coordinator (KIP-939 idea); an external coordinator holding
  the returned ``PreparedTransaction`` ends it. This producer may only be
  closed or re-initialised (which aborts the prepared transaction unless it
  is bound to a commit group).
* **pipelined commit** (``AsyncProducer.commit_and_begin``): the open
  transaction commits while the next one is already open. Records sent
  meanwhile are batched but held -- never sequenced or sent -- until the
  commit ends; then they go out under the identity EndTxn handed out, in
  order after everything of the committed transaction. If the commit does
  not succeed, the next transaction never happened: its held records fail
  unsent and the state is what ``commit_transaction`` would have left
  (ABORTABLE_ERROR, FATAL_ERROR, or COMMITTING after a timeout).
* a commit or abort that timed out stays COMMITTING/ABORTING: calling the
  same method again resumes it with the same identity (the coordinator
  answers a retried EndTxn idempotently). A commit is never turned into an
  abort (the KAFKA-17754 lesson, kafka_txn.md §12).

State machine (an enum plus ``VALID_PREVIOUS``)::

    UNINITIALIZED -> INITIALIZING -> READY -> IN_TRANSACTION -> COMMITTING -> READY
                          ^                        |  \\-> PIPELINED_COMMIT -> IN_TRANSACTION
                          |                        |             \\-> COMMITTING, ABORTABLE_ERROR
                          |                        |  \\-> ABORTING -> READY
                          |                        |  \\-> PREPARING -> PREPARED -> INITIALIZING
                          |                        \\-> ABORTABLE_ERROR -> ABORTING
    any -> FATAL_ERROR

Not thread-safe: the producer's event loop drives it.
"""

from __future__ import annotations

import enum

from ..protocol import BrokerError, ErrorCode
from ._idempotence import IdempotenceManager

__all__ = ["FENCING_ERRORS", "TransactionAbortedError", "TransactionManager", "TxnState"]

# Coordinator answers that end this producer instance (Kafka: ProducerFencedException and friends).
FENCING_ERRORS = frozenset(
    {
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"  # init_transactions() not called (or it timed out)
    INITIALIZING = "initializing"  # InitProducerId under way
    READY = "ready"  # between transactions
    IN_TRANSACTION = "in_transaction"  # begin_transaction() called; send() allowed
    COMMITTING = "committing"  # flushing, then EndTxn(commit)
    PIPELINED_COMMIT = "pipelined_commit"  # committing while the next transaction is open (its records held)
    ABORTING = "aborting"  # failing unsent batches, waiting for in-flight ones, then EndTxn(abort)
    PREPARING = "preparing"  # flushing, then Prepare
    PREPARED = "prepared"  # durable on the coordinator; someone else ends it
    ABORTABLE_ERROR = "abortable_error"  # the open transaction can only be aborted
    FATAL_ERROR = "fatal_error"  # fenced: only close() is left


_S = TxnState
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    _S.UNINITIALIZED: frozenset({_S.INITIALIZING}),  # InitProducerId did not finish in time
    _S.INITIALIZING: frozenset({_S.UNINITIALIZED, _S.PREPARED}),
    _S.READY: frozenset({_S.INITIALIZING, _S.COMMITTING, _S.ABORTING}),
    _S.IN_TRANSACTION: frozenset({_S.READY, _S.PIPELINED_COMMIT}),
    _S.COMMITTING: frozenset({_S.IN_TRANSACTION, _S.PIPELINED_COMMIT}),  # from PIPELINED_COMMIT: it timed out
    _S.PIPELINED_COMMIT: frozenset({_S.IN_TRANSACTION}),
    _S.PREPARING: frozenset({_S.IN_TRANSACTION}),
    _S.PREPARED: frozenset({_S.PREPARING}),
    # From PREPARING: a prepare whose outcome is unknown may still be aborted (abort ends a Prepared txn too).
    _S.ABORTING: frozenset({_S.IN_TRANSACTION, _S.ABORTABLE_ERROR, _S.PREPARING}),
    _S.ABORTABLE_ERROR: frozenset({_S.IN_TRANSACTION, _S.COMMITTING, _S.PIPELINED_COMMIT, _S.PREPARING}),
    _S.FATAL_ERROR: frozenset(s for s in TxnState if s is not _S.FATAL_ERROR),
}

# States in which batches of the open transaction may be sequenced and sent.
_SENDING = frozenset({_S.IN_TRANSACTION, _S.COMMITTING, _S.PIPELINED_COMMIT, _S.PREPARING})
# States in which ``send`` is allowed (during a pipelined commit the records are the next transaction's).
_OPEN = frozenset({_S.IN_TRANSACTION, _S.PIPELINED_COMMIT})


class TransactionAbortedError(BrokerError):
    """A record's batch was never sent because its transaction is being aborted (Kafka's
    ``TransactionAbortedException``). ``error_code`` is ``TRANSACTION_ABORTABLE``."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.TRANSACTION_ABORTABLE, message)


class TransactionManager:
    """Owns the transaction state above; ``IdempotenceManager`` keeps the identity and sequences.

    It registers itself as the idempotence manager's ``TxnListener`` so a
    failed batch or a fencing answer changes the transaction state at once,
    and it gates sequencing (``sending_allowed``) by state.
    """

    def __init__(self, transactional_id: str, idempotence: IdempotenceManager) -> None:
        if not idempotence.transactional:
            raise BrokerError(ErrorCode.INVALID_CONFIG, "a transaction manager needs a transactional producer state")
        self.transactional_id = transactional_id
        self.idem = idempotence
        self.state = TxnState.UNINITIALIZED
        self.abortable_error: BrokerError | None = None
        self.fatal_error: BrokerError | None = None
        self.offset_groups: set[str] = set()  # groups added with AddOffsetsToTxn in the open transaction
        self.transactions_committed = 0
        self.transactions_aborted = 0
        # Carried markers (docs/carried-markers.md): the last EndTxn's tokens, one per partition, for the next
        # transaction's first batch there; and this transaction's receipts from the partition leaders.
        self.tokens: dict[tuple[str, int], bytes] = {}
        self.token_generation = 0  # bumped with every new set of tokens (a release timer names its set)
        self.receipts: dict[tuple[str, int], bytes] = {}
        idempotence.listener = self
        idempotence.sending_allowed = False

    # ---- the table ---------------------------------------------------------------------

    def transition_to(self, state: TxnState) -> None:
        if self.state not in VALID_PREVIOUS[state]:
            raise BrokerError(
                ErrorCode.INVALID_TXN_STATE,
                f"transactional id {self.transactional_id!r}: illegal transition {self.state.name} -> {state.name}",
            )
        self.state = state
        self.idem.sending_allowed = state in _SENDING

    # ---- listener (send path) ------------------------------------------------------------

    def on_abortable(self, reason: str) -> None:
        if self.state in (_S.IN_TRANSACTION, _S.COMMITTING, _S.PIPELINED_COMMIT, _S.PREPARING):
            self.abortable_error = BrokerError(
                ErrorCode.TRANSACTION_ABORTABLE,
                f"transaction of {self.transactional_id!r} must be aborted: {reason}",
            )
            self.transition_to(_S.ABORTABLE_ERROR)

    def on_fatal(self, exc: BrokerError) -> None:
        if self.state is _S.FATAL_ERROR:
            return
        if exc.error_code in FENCING_ERRORS:
            exc = BrokerError(
                ErrorCode.PRODUCER_FENCED,
                f"producer of {self.transactional_id!r} is fenced ({exc.error_code.name}: {exc.message}); "
                "a newer instance exists or the coordinator ended its transaction -- close it",
                cause=exc.error_code.name,
            )
        self.fatal_error = exc
        self.transition_to(_S.FATAL_ERROR)

    def fail(self, exc: BrokerError) -> BrokerError:
        """Record a coordinator answer that ends the producer; returns the error to raise."""
        if self.idem.fatal_error is None:
            self.idem.fail_fatally(exc)  # calls on_fatal
        else:
            self.on_fatal(exc)
        assert self.fatal_error is not None
        return self.fatal_error

    # ---- guards for the public API -------------------------------------------------------------

    def _raise_unusable(self) -> None:
        if self.fatal_error is not None:
            raise self.fatal_error

    def _wrong_state(self, what: str) -> BrokerError:
        if self.state is _S.ABORTABLE_ERROR and self.abortable_error is not None:
            return self.abortable_error
        hint = {
            _S.UNINITIALIZED: "call init_transactions() first",
            _S.INITIALIZING: "init_transactions() has not finished",
            _S.READY: "call begin_transaction() first",
            _S.IN_TRANSACTION: "a transaction is already open",
            _S.COMMITTING: "a commit is under way: call commit_transaction() again to finish it",
            _S.PIPELINED_COMMIT: "the previous transaction is committing: await its commit first",
            _S.ABORTING: "an abort is under way: call abort_transaction() again to finish it",
            _S.PREPARING: "a prepare is under way: call prepare_transaction() again to finish it",
            _S.PREPARED: "the transaction is prepared: close the producer or call init_transactions()",
        }.get(self.state, "")
        return BrokerError(ErrorCode.INVALID_TXN_STATE, f"cannot {what} in state {self.state.name}: {hint}")

    @property
    def open(self) -> bool:
        """Whether ``send`` is allowed: a transaction is open (perhaps behind a pipelined commit)."""
        return self.state in _OPEN

    def check_send(self) -> None:
        """``send`` is allowed only inside a transaction (Kafka: IllegalStateException otherwise)."""
        if self.state not in _OPEN:
            self._raise_unusable()
            raise self._wrong_state("send")

    def begin_init(self) -> None:
        self._raise_unusable()
        if self.state not in VALID_PREVIOUS[_S.INITIALIZING]:
            raise self._wrong_state("init_transactions")
        self.transition_to(_S.INITIALIZING)

    def init_failed(self) -> None:
        """InitProducerId did not finish in time: init_transactions() may be called again."""
        if self.state is _S.INITIALIZING:
            self.transition_to(_S.UNINITIALIZED)

    def initialized(self, producer_id: int, epoch: int) -> None:
        self.idem.set_producer_id(producer_id, epoch)
        self.offset_groups.clear()
        self.tokens.clear()
        self.receipts.clear()
        self.transition_to(_S.READY)

    def begin(self) -> None:
        self._raise_unusable()
        if self.state is not _S.READY:
            raise self._wrong_state("begin_transaction")
        self.abortable_error = None
        self.transition_to(_S.IN_TRANSACTION)

    def begin_end(self, target: TxnState) -> None:
        """Enter COMMITTING, ABORTING or PREPARING (a no-op when resuming the same one after a timeout)."""
        self._raise_unusable()
        if self.state is target:
            return
        what = {_S.COMMITTING: "commit", _S.ABORTING: "abort", _S.PREPARING: "prepare"}[target]
        # PIPELINED_COMMIT -> COMMITTING is only the pipelined commit's own timeout (pipelined_commit_unsettled).
        if self.state not in VALID_PREVIOUS[target] or self.state is _S.PIPELINED_COMMIT:
            raise self._wrong_state(f"{what} the transaction")
        self.transition_to(target)

    def begin_pipelined_commit(self) -> None:
        """IN_TRANSACTION -> PIPELINED_COMMIT: the open transaction commits, the next one is open already."""
        self._raise_unusable()
        if self.state is not _S.IN_TRANSACTION:
            raise self._wrong_state("commit and begin")
        self.transition_to(_S.PIPELINED_COMMIT)

    def pipelined_commit_unsettled(self) -> None:
        """The pipelined commit's outcome is unknown (a timeout): COMMITTING, to be finished by commit_transaction."""
        if self.state is _S.PIPELINED_COMMIT:
            self.transition_to(_S.COMMITTING)

    def check_offsets(self) -> None:
        self._raise_unusable()
        if self.state is not _S.IN_TRANSACTION:
            raise self._wrong_state("send offsets to the transaction")

    def raise_if_abortable(self) -> None:
        """After a flush: a batch failed meanwhile (the state moved to ABORTABLE_ERROR)."""
        self._raise_unusable()
        if self.state is _S.ABORTABLE_ERROR:
            assert self.abortable_error is not None
            raise self.abortable_error

    def needs_end_txn(self) -> bool:
        """Whether the coordinator knows of this transaction: a batch was sent or offsets were added.

        Kafka ends a transaction that never started locally; so does this
        client (the coordinator rejects a commit of an Empty transaction).
        """
        return bool(self.idem.sequenced_partitions()) or bool(self.offset_groups)

    def take_token(self, topic: str, partition: int) -> bytes | None:
        """The carried marker's token for the first batch of this transaction to ``topic-partition``, once."""
        return self.tokens.pop((topic, partition), None)

    def ended(
        self, producer_id: int, epoch: int, *, committed: bool, tokens: dict[tuple[str, int], bytes] | None = None
    ) -> None:
        """EndTxn succeeded with the identity of the next transaction (or ended locally: same identity).

        ``tokens``: the carried markers of the ended transaction, for the next one (None: keep the ones
        held, as a transaction that ended locally leaves them unused).
        """
        self.idem.set_producer_id(producer_id, epoch)
        self.offset_groups.clear()
        self.receipts.clear()
        if tokens is not None:
            self.tokens = tokens
            self.token_generation += 1
        self.abortable_error = None
        if committed:
            self.transactions_committed += 1
        else:
            self.transactions_aborted += 1
        # A pipelined commit's next transaction is open already (its held records go out now).
        self.transition_to(_S.IN_TRANSACTION if self.state is _S.PIPELINED_COMMIT else _S.READY)

    def end_rejected(self, exc: BrokerError) -> BrokerError:
        """EndTxn/Prepare answered with a non-retriable error; returns what to raise."""
        if exc.error_code is ErrorCode.TRANSACTION_ABORTABLE and self.state is not _S.ABORTING:
            self.on_abortable(exc.message)
            return self.abortable_error or exc
        return self.fail(exc)

    def prepared(self) -> None:
        self.transition_to(_S.PREPARED)
