"""``TransactionMetadata``: what the coordinator knows of one transactional id (Kafka's ``TransactionMetadata``).

Terms:

* **producer id / epoch**: the identity the client must use now. While a
  transaction is in a prepare state the epoch is the one its markers carry
  (TV2 bumps it at EndTxn, so the markers fence every late write of the old
  epoch).
* **last producer id / epoch**: the identity the client used before the last
  bump, kept so a retried EndTxn (TV2) or InitProducerId (KIP-360) can be
  recognised and answered again instead of fenced; -1 when no retry is
  acceptable (after a fence, for instance).
* **next producer id**: set while a prepare state waits for its markers and
  the epoch is exhausted: the producer id the transactional id rotates to when
  the transaction completes (KIP-890's overflow handling).
* **coordinator epoch**: the Raft term of the coordinator that wrote the
  current prepare state; markers carry the term of whichever leader sends them.
* **prepared**: set in ``PREPARED``: when it was prepared and the commit group
  it is bound to, if any.
* **next partitions / next start**: only in a prepare state: the partitions the
  client's *next* transaction added while this one's markers were still being
  written (pipelined adds, ``docs/pipelined-transactions.md``), and when the
  first of them was added. CompleteTxn opens that transaction (Ongoing) with
  them in the same apply.
* **carried**: only in a prepare state: the partitions whose markers ride on
  the client's next transaction (tokens, docs/carried-markers.md) instead of
  being written by the coordinator. Until each is *settled* (a receipt, or a
  revoking marker) the transaction cannot complete; a leader that resumes it
  settles them with revoking markers.
* **classic**: the prepare state was entered by a classic EndTxn (the protocol
  of Kafka clients below EndTxn version 5): the epoch was not bumped, so the
  markers carry the epoch of the transaction's own batches and tell the
  partitions so (``MarkerPlan.classic``).

Values are immutable. Every change of ``state`` goes through
``transition_to``, which checks the transition table; there is no other way
to build a metadata with a different state from an existing one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from coordinator.codec import decode_record, encode_record, get_int, get_opt_int, get_opt_str, get_str
from coordinator.errors import CommandDecodeError, CoordinatorCorruptionError
from coordinator.states import TransactionState, validate_transition

__all__ = [
    "EPOCH_EXHAUSTED",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "MarkerPlan",
    "PreparedInfo",
    "TopicPartition",
    "TransactionMetadata",
    "decode_metadata",
    "encode_metadata",
]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
#: Kafka's ``isEpochExhausted``: an epoch at or above Short.MAX_VALUE - 1 cannot be bumped for
#: another transaction, so the transactional id rotates to a new producer id with epoch 0.
EPOCH_EXHAUSTED = 32766
MAX_EPOCH = 32767
_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class PreparedInfo:
    prepared_ms: int
    group_id: str | None = None


@dataclass(frozen=True, slots=True)
class MarkerPlan:
    """The COMMIT/ABORT markers a prepare state needs before its CompleteTxn may be written.

    ``producer_epoch`` is the marker epoch (bumped at EndTxn); ``coordinator_epoch``
    is the term of the coordinator that wrote the prepare state -- a leader
    that resumes the plan stamps its own, newer term on the markers it sends.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]
    coordinator_epoch: int
    carried: tuple[TopicPartition, ...] = ()
    #: markers of a classic EndTxn: their epoch is the one of the transaction they end (no bump)
    classic: bool = False

    @property
    def explicit(self) -> tuple[TopicPartition, ...]:
        """The partitions whose markers the coordinator writes itself."""
        return tuple(tp for tp in self.partitions if tp not in self.carried)


@dataclass(frozen=True, slots=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TransactionState
    txn_last_update_ms: int
    last_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    next_producer_id: int = NO_PRODUCER_ID
    partitions: frozenset[TopicPartition] = field(default_factory=frozenset)
    txn_start_time_ms: int = -1
    prepared: PreparedInfo | None = None
    coordinator_epoch: int = -1
    next_partitions: frozenset[TopicPartition] = field(default_factory=frozenset)
    next_start_ms: int = -1
    carried: frozenset[TopicPartition] = field(default_factory=frozenset)
    classic: bool = False

    @property
    def epoch_exhausted(self) -> bool:
        return self.producer_epoch >= EPOCH_EXHAUSTED

    @property
    def group_id(self) -> str | None:
        """The commit group a prepared transaction is bound to (None when unbound or not prepared)."""
        return self.prepared.group_id if self.prepared is not None else None

    def next_identity(self) -> tuple[int, int]:
        """The (producer id, epoch) the client was told to use after the current prepare state.

        Equal to the current identity except while a rotation is pending.
        """
        if self.next_producer_id != NO_PRODUCER_ID:
            return self.next_producer_id, 0
        return self.producer_id, self.producer_epoch

    def transition_to(self, state: TransactionState, now_ms: int, **changes: Any) -> TransactionMetadata:
        """The metadata after moving to ``state`` with ``changes``; checks the transition table.

        ``txn_last_update_ms`` never moves backwards (a leader with a slower
        clock than its predecessor must not rewind it, §4.1 invariants).
        """
        validate_transition(self.transactional_id, self.state, state)
        return replace(self, state=state, txn_last_update_ms=max(self.txn_last_update_ms, now_ms), **changes)

    def amended(self, now_ms: int, **changes: Any) -> TransactionMetadata:
        """The metadata with ``changes`` in the same state (no transition; ``state`` may not be changed)."""
        if "state" in changes:
            raise TypeError("amended() keeps the state; use transition_to()")
        return replace(self, txn_last_update_ms=max(self.txn_last_update_ms, now_ms), **changes)

    def marker_plan(self) -> MarkerPlan | None:
        """The markers still owed for a prepare state; None in any other state."""
        if self.state is TransactionState.PREPARE_COMMIT:
            commit = True
        elif self.state is TransactionState.PREPARE_ABORT:
            commit = False
        else:
            return None
        return MarkerPlan(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            commit=commit,
            partitions=tuple(sorted(self.partitions)),
            coordinator_epoch=self.coordinator_epoch,
            carried=tuple(sorted(self.carried)),
            classic=self.classic,
        )

    def describe(self) -> dict[str, Any]:
        """The JSON view of the HTTP API (describe, list, abort answers); state as Kafka's display name."""
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "state": self.state.display_name,
            "timeout_ms": self.timeout_ms,
            "start_time_ms": self.txn_start_time_ms,
            "last_update_time_ms": self.txn_last_update_ms,
            "partitions": _partition_list(self.partitions),
            "prepared_ms": self.prepared.prepared_ms if self.prepared is not None else None,
            "group_id": self.group_id,
            # Pipelined adds: what the client's next transaction added while this one's markers are written.
            "next_transaction_partitions": _partition_list(self.next_partitions),
            # Carried markers: partitions whose marker rides on the next transaction's first batch there.
            "carried_partitions": _partition_list(self.carried),
        }


def _partition_list(partitions: frozenset[TopicPartition]) -> list[dict[str, Any]]:
    return [{"topic": tp.topic, "partition": tp.partition} for tp in sorted(partitions, key=str)]


def _topics_json(partitions: frozenset[TopicPartition]) -> dict[str, list[int]]:
    topics: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        topics.setdefault(tp.topic, []).append(tp.partition)
    return topics


def _topics_from_json(tps: Any) -> frozenset[TopicPartition]:
    if not isinstance(tps, dict):
        raise CommandDecodeError("partitions must be an object")
    return frozenset(TopicPartition(str(topic), get_int({"p": p}, "p")) for topic, ps in tps.items() for p in ps)


def encode_metadata(meta: TransactionMetadata) -> bytes:
    body: dict[str, Any] = {
        "tid": meta.transactional_id,
        "pid": meta.producer_id,
        "epoch": meta.producer_epoch,
        "lpid": meta.last_producer_id,
        "lepoch": meta.last_producer_epoch,
        "npid": meta.next_producer_id,
        "timeout": meta.timeout_ms,
        "state": meta.state.id,
        "tps": _topics_json(meta.partitions),
        "start": meta.txn_start_time_ms,
        "update": meta.txn_last_update_ms,
        "prepared_ms": meta.prepared.prepared_ms if meta.prepared is not None else None,
        "group": meta.group_id,
        "cepoch": meta.coordinator_epoch,
    }
    if meta.next_partitions:  # absent in records written before pipelined adds; absent means none
        body["ntps"] = _topics_json(meta.next_partitions)
        body["nstart"] = meta.next_start_ms
    if meta.carried:  # absent in records written before carried markers; absent means none
        body["ctps"] = _topics_json(meta.carried)
    if meta.classic:  # absent means a TV2 (or no) EndTxn
        body["tv1"] = True
    return encode_record(body, _FORMAT_VERSION)


def decode_metadata(raw: bytes, *, where: str) -> TransactionMetadata:
    d = decode_record(raw, version=_FORMAT_VERSION, where=where)
    try:
        partitions = _topics_from_json(d.get("tps"))
        next_partitions = _topics_from_json(d.get("ntps", {}))
        prepared_ms = get_opt_int(d, "prepared_ms")
        return TransactionMetadata(
            transactional_id=get_str(d, "tid"),
            producer_id=get_int(d, "pid"),
            producer_epoch=get_int(d, "epoch"),
            last_producer_id=get_int(d, "lpid"),
            last_producer_epoch=get_int(d, "lepoch"),
            next_producer_id=get_int(d, "npid"),
            timeout_ms=get_int(d, "timeout"),
            state=TransactionState.from_id(get_int(d, "state")),
            partitions=partitions,
            txn_start_time_ms=get_int(d, "start"),
            txn_last_update_ms=get_int(d, "update"),
            prepared=None if prepared_ms is None else PreparedInfo(prepared_ms, get_opt_str(d, "group")),
            coordinator_epoch=get_int(d, "cepoch"),
            next_partitions=next_partitions,
            next_start_ms=get_int(d, "nstart") if next_partitions else -1,
            carried=_topics_from_json(d.get("ctps", {})),
            classic=d.get("tv1") is True,
        )
    except (CommandDecodeError, ValueError, TypeError) as exc:
        raise CoordinatorCorruptionError(f"{where}: malformed transaction metadata: {exc}") from exc
