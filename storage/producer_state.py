"""Idempotent-producer state of one partition (Kafka's ProducerStateManager family). Pure.

Terms:

* **producer id (pid)** and **producer epoch** identify one producer instance;
  a batch with ``producer_id == -1`` is a plain write and has no state here.
* **sequence**: each idempotent batch carries ``base_sequence``; its
  ``last_sequence`` is ``base_sequence + record_count - 1`` modulo 2**31.
  Sequences are per (pid, partition), start at 0 and restart at 0 after every
  epoch bump.
* **ProducerStateEntry**: what the partition remembers of a pid: its epoch,
  the metadata of its last ``NUM_BATCHES_TO_RETAIN`` batches (the dedup
  window), the log append time of its last batch, the highest coordinator
  epoch seen in its markers, the first offset (and log append time) of its
  open transaction on this partition, and the highest epoch whose reservation
  was revoked here (carried markers, below).
* **open transaction**: transactional batches of a pid written here since its
  last COMMIT/ABORT marker. The first one opens it; the marker closes it.
* **ProducerAppendInfo**: validates one batch or marker against one entry and
  computes the entry that results (Kafka's class of the same name, kafka_txn.md §3.1).

Rules (kafka_txn.md §3.1 and §4.3; rule numbers refer to the §3.1 list):

1. Same epoch and ``(first_seq, last_seq)`` equal to a retained batch: a
   duplicate. The caller answers the original offsets and writes nothing.
2. Epoch lower than the entry's: ``INVALID_PRODUCER_EPOCH``.
3. Epoch higher than the entry's: ``first_seq`` must be 0, else
   ``OUT_OF_ORDER_SEQUENCE_NUMBER``; the retained batches are dropped.
4. Same epoch: ``first_seq == last_seq + 1``, the only wrap being
   2**31-1 -> 0; else ``OUT_OF_ORDER_SEQUENCE_NUMBER``.
5. Unknown pid (txbroker's documented choice, stricter than Kafka's "accept any
   sequence"): ``first_seq`` must be 0. A non-zero ``first_seq`` is
   ``UNKNOWN_PRODUCER_ID`` when the partition may have lost the pid's state
   (records deleted by retention/DeleteRecords, or idle entries expired) so the
   client bumps its epoch and resets its sequences (KIP-360), else
   ``OUT_OF_ORDER_SEQUENCE_NUMBER``.
7. A non-transactional batch from a pid with an open transaction here:
   ``INVALID_TXN_STATE``. A transactional batch with a *higher* epoch than the
   open transaction's: ``CONCURRENT_TRANSACTIONS`` (retriable). Under TV2 a new
   epoch is a new transaction, so this batch must wait for the marker that
   ends the old one instead of joining it (Kafka would let it join).
   Sequence and epoch errors (rules 2-5) take precedence, as in Kafka.
9. Entries idle longer than ``producer.id.expiration.ms`` are removed, except
   while a transaction is open (an expired open txn would unpin the LSO).

Markers (WriteTxnMarkers, §4.3, TV2 semantics as §12 recommends):

* coordinator epoch lower than the highest seen for the pid:
  ``TRANSACTION_COORDINATOR_FENCED``;
* producer epoch lower than the entry's, or equal while a transaction is
  open: ``INVALID_PRODUCER_EPOCH`` (TV2 markers carry the epoch bumped at
  EndTxn, so only a stale marker can carry the data's epoch; an equal epoch
  with no open transaction is an idempotent retry and succeeds). A classic
  marker (transaction version 1: the coordinator does not bump at EndTxn)
  carries the open transaction's own epoch, so equal is accepted for it, as
  Kafka does for TV1;
* otherwise the marker closes the open transaction (if any), its epoch becomes
  the pid's epoch (a higher one drops the retained batches, rule 3) and its
  coordinator epoch is recorded. A marker for an unknown pid creates the
  entry, so the fencing it carries is kept (``testProducerStateAfterFencingAbortMarker``).

Carried markers (docs/carried-markers.md): a marker that rides on the
producer's first batch of its next transaction (``carried_marker_action``):
* a reservation revoked here for the marker's epoch or a later one: the whole
  entry is refused (``TRANSACTION_RESERVATION_REVOKED``);
* a transaction of the marker's epoch already open here: the marker is skipped
  (it was carried before, or the batch's transaction was verified) and the
  batch is an ordinary one;
* otherwise the marker is applied as above, then the batch.
A revoking marker (``revoke``) applies as a marker and records its epoch as
revoked, unless the transaction of its epoch is open here already ("used").

Idle time is measured with the *log append time* (leader clock, carried in the
command), not the producer's record timestamps, so a producer with a skewed
clock can neither pin nor lose its state.

Thread-safety: every value here is immutable except ``ProducerStateManager``,
which only its owner thread (the Raft thread) mutates; ``get`` and
``ongoing`` from another thread are safe under CPython (a single dict lookup;
the open-transaction map is replaced, never mutated).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass, replace

import crc32c

from clients.protocol import NO_SEQUENCE, BatchHeader, BrokerError, ErrorCode
from storage.errors import StorageCorruptionError

__all__ = [
    "MAX_SEQUENCE",
    "NUM_BATCHES_TO_RETAIN",
    "BatchMetadata",
    "CarriedMarkerAction",
    "EndTxnOutcome",
    "ProducerAppendInfo",
    "ProducerStateEntry",
    "ProducerStateManager",
    "decode_entry",
    "encode_entry",
    "in_sequence",
]

NUM_BATCHES_TO_RETAIN = 5
MAX_SEQUENCE = 2**31 - 1


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Whether ``next_seq`` directly follows ``last_seq`` (``NO_SEQUENCE`` is followed by 0)."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == MAX_SEQUENCE)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One retained batch of a producer: its sequence range and where it landed."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    log_append_time: int


@dataclass(frozen=True, slots=True)
class ProducerStateEntry:
    """What a partition remembers of one producer id (see the module docstring)."""

    producer_id: int
    producer_epoch: int
    batches: tuple[BatchMetadata, ...] = ()
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int | None = None
    current_txn_start_time: int | None = None
    revoked_epoch: int = -1

    @property
    def last_seq(self) -> int:
        """Last sequence of the newest retained batch, ``NO_SEQUENCE`` when none."""
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def next_seq(self) -> int:
        """The base sequence an in-order batch of the current epoch must carry (wraps to 0 like Kafka's)."""
        return 0 if self.last_seq == MAX_SEQUENCE else self.last_seq + 1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The retained batch with exactly this epoch and sequence range, if any (rule 1)."""
        if epoch != self.producer_epoch:
            return None
        for meta in self.batches:
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return meta
        return None

    def txn_open_at(self, epoch: int) -> bool:
        """Whether this producer's transaction of ``epoch`` is open here."""
        return self.current_txn_first_offset is not None and self.producer_epoch == epoch

    def is_expired(self, now_ms: int, expiration_ms: int) -> bool:
        """Idle for longer than ``expiration_ms`` and no transaction open here (rule 9)."""
        return (
            expiration_ms >= 0
            and self.current_txn_first_offset is None
            and now_ms - self.last_timestamp > expiration_ms
        )


class CarriedMarkerAction(enum.Enum):
    """What a carried marker does (module docstring, "Carried markers")."""

    REFUSE = "refuse"  # the reservation of its epoch was revoked here
    SKIP_MARKER = "skip_marker"  # the transaction of its epoch is open here: append the batch alone
    APPLY_MARKER = "apply_marker"  # the marker (validated as any marker), then the batch


@dataclass(frozen=True, slots=True)
class ProducerAppendInfo:
    """Validates one producer's next batch against its current entry; mutates nothing.

    ``state_may_be_lost``: this partition has deleted records or expired
    producer entries, so an unknown pid may be a producer whose state is gone
    (rule 5).
    """

    producer_id: int
    current: ProducerStateEntry | None
    state_may_be_lost: bool

    def duplicate_of(self, header: BatchHeader) -> BatchMetadata | None:
        """The original batch when ``header`` is a retry inside the dedup window (rule 1)."""
        if self.current is None:
            return None
        return self.current.find_duplicate(header.producer_epoch, header.base_sequence, header.last_sequence)

    def validate(self, header: BatchHeader) -> BrokerError | None:
        """The error for ``header`` under rules 2-5 and 7, or None when it may be appended.

        Call ``duplicate_of`` first: a duplicate is out of sequence by definition.
        """
        pid, epoch, first_seq = header.producer_id, header.producer_epoch, header.base_sequence
        if epoch < 0 or first_seq < 0 or first_seq > MAX_SEQUENCE:
            return BrokerError(
                ErrorCode.INVALID_REQUEST,
                f"producer {pid}: idempotent batch needs epoch >= 0 and a sequence "
                f"in [0, 2**31-1], got epoch {epoch} sequence {first_seq}",
            )
        cur = self.current
        if cur is None:
            if first_seq == 0:
                return None
            if self.state_may_be_lost:
                return BrokerError(
                    ErrorCode.UNKNOWN_PRODUCER_ID,
                    f"producer {pid} has no state on this partition (records or idle state "
                    f"were removed); sequence {first_seq} cannot be checked",
                )
            return BrokerError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {pid} is new on this partition: expected sequence 0, got {first_seq}",
            )
        if epoch < cur.producer_epoch:
            return BrokerError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {pid}: epoch {epoch} is older than the current epoch {cur.producer_epoch}",
            )
        if epoch > cur.producer_epoch and first_seq != 0:
            return BrokerError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {pid}: new epoch {epoch} must start at sequence 0, got {first_seq}",
            )
        if epoch == cur.producer_epoch and not in_sequence(cur.last_seq, first_seq):
            return BrokerError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {pid} epoch {epoch}: expected sequence {cur.next_seq}, got {first_seq}",
            )
        return self._validate_txn_state(header, cur)

    @staticmethod
    def _validate_txn_state(header: BatchHeader, cur: ProducerStateEntry) -> BrokerError | None:
        """Rule 7: a batch must agree with the pid's open transaction here, if any."""
        if cur.current_txn_first_offset is None:
            return None
        pid = header.producer_id
        if not header.is_transactional:
            return BrokerError(
                ErrorCode.INVALID_TXN_STATE,
                f"producer {pid} has a transaction open at offset {cur.current_txn_first_offset}: "
                "a non-transactional write must wait for it to end",
            )
        if header.producer_epoch > cur.producer_epoch:
            return BrokerError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"producer {pid}: the transaction of epoch {cur.producer_epoch} open at offset "
                f"{cur.current_txn_first_offset} has not ended here yet; epoch {header.producer_epoch} must wait",
            )
        return None

    def append(self, header: BatchHeader, base_offset: int, log_append_time: int) -> ProducerStateEntry:
        """The entry after appending ``header`` at ``base_offset`` (call after ``validate``).

        A transactional batch opens a transaction here unless one is open.
        """
        meta = BatchMetadata(
            header.base_sequence,
            header.last_sequence,
            base_offset,
            base_offset + header.record_count - 1,
            log_append_time,
        )
        cur = self.current
        if cur is None:
            cur = ProducerStateEntry(self.producer_id, header.producer_epoch)
            batches: tuple[BatchMetadata, ...] = (meta,)
        elif header.producer_epoch != cur.producer_epoch:
            # Rule 3: a new epoch starts a new sequence space; old batches can no
            # longer be duplicates of anything.
            batches = (meta,)
        else:
            batches = (*cur.batches, meta)[-NUM_BATCHES_TO_RETAIN:]
        entry = replace(cur, producer_epoch=header.producer_epoch, batches=batches, last_timestamp=log_append_time)
        if header.is_transactional and entry.current_txn_first_offset is None:
            entry = replace(entry, current_txn_first_offset=base_offset, current_txn_start_time=log_append_time)
        return entry

    def carried_marker_action(self, marker_epoch: int) -> CarriedMarkerAction:
        cur = self.current
        if cur is not None and cur.revoked_epoch >= marker_epoch:
            return CarriedMarkerAction.REFUSE
        if cur is not None and cur.txn_open_at(marker_epoch):
            return CarriedMarkerAction.SKIP_MARKER
        return CarriedMarkerAction.APPLY_MARKER

    def after_marker(self, entry: ProducerStateEntry) -> ProducerAppendInfo:
        """The info to validate the carried batch with, once its marker made ``entry``."""
        return replace(self, current=entry)

    def validate_marker(self, producer_epoch: int, coordinator_epoch: int, classic: bool = False) -> BrokerError | None:
        """The error for a COMMIT/ABORT marker (see "Markers" in the module docstring), or None.

        ``classic``: a marker of the classic protocol, whose epoch may be the open transaction's.
        """
        cur = self.current
        if cur is None:
            return None
        pid = self.producer_id
        if coordinator_epoch < cur.coordinator_epoch:
            return BrokerError(
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"producer {pid}: marker from coordinator epoch {coordinator_epoch}, "
                f"but epoch {cur.coordinator_epoch} was already seen",
            )
        if producer_epoch < cur.producer_epoch:
            return BrokerError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {pid}: marker epoch {producer_epoch} is older than the current epoch {cur.producer_epoch}",
            )
        if producer_epoch == cur.producer_epoch and cur.current_txn_first_offset is not None and not classic:
            return BrokerError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {pid}: a marker must carry an epoch above the open transaction's "
                f"epoch {cur.producer_epoch} (transactions v2)",
            )
        return None

    def end_txn(self, producer_epoch: int, coordinator_epoch: int, timestamp: int) -> EndTxnOutcome:
        """The entry after a marker (call after ``validate_marker``) and the txn it closes."""
        cur = self.current or ProducerStateEntry(self.producer_id, producer_epoch)
        batches = cur.batches if producer_epoch == cur.producer_epoch else ()
        entry = replace(
            cur,
            producer_epoch=producer_epoch,
            batches=batches,
            last_timestamp=max(cur.last_timestamp, timestamp),
            coordinator_epoch=max(cur.coordinator_epoch, coordinator_epoch),
            current_txn_first_offset=None,
            current_txn_start_time=None,
        )
        return EndTxnOutcome(entry, cur.current_txn_first_offset)

    def revoke(self, producer_epoch: int, coordinator_epoch: int, timestamp: int) -> EndTxnOutcome:
        """A revoking marker that was not used (call after ``validate_marker``): ``end_txn``, and the epoch revoked."""
        outcome = self.end_txn(producer_epoch, coordinator_epoch, timestamp)
        entry = replace(outcome.entry, revoked_epoch=max(outcome.entry.revoked_epoch, producer_epoch))
        return EndTxnOutcome(entry, outcome.closed_txn_first_offset)


@dataclass(frozen=True, slots=True)
class EndTxnOutcome:
    """What a marker does to one pid: its new entry and the first offset of the txn it closed."""

    entry: ProducerStateEntry
    closed_txn_first_offset: int | None


class ProducerStateManager:
    """The pid -> ProducerStateEntry map of one partition (in memory; the caller persists).

    Also indexes the open transactions (pid -> first offset) so the first
    unstable offset is known without scanning entries on every append.
    Only the owner thread calls the mutating methods; ``get`` and ``ongoing``
    are safe from any thread.
    """

    def __init__(self, entries: Iterable[ProducerStateEntry] = ()) -> None:
        self._entries: dict[int, ProducerStateEntry] = {e.producer_id: e for e in entries}
        # Replaced on change, never mutated: readers on other threads hold a stable dict.
        self._open: dict[int, int] = {
            e.producer_id: e.current_txn_first_offset
            for e in self._entries.values()
            if e.current_txn_first_offset is not None
        }

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, producer_id: int) -> ProducerStateEntry | None:
        return self._entries.get(producer_id)

    def prepare_append(self, producer_id: int, *, state_may_be_lost: bool) -> ProducerAppendInfo:
        """A validator for ``producer_id``'s next batch or marker (mutates nothing)."""
        return ProducerAppendInfo(producer_id, self._entries.get(producer_id), state_may_be_lost)

    def update(self, entry: ProducerStateEntry) -> None:
        """Install ``entry`` once it is durable."""
        pid = entry.producer_id
        self._entries[pid] = entry
        if self._open.get(pid) != entry.current_txn_first_offset:
            self._set_open(pid, entry.current_txn_first_offset)

    def remove(self, producer_id: int) -> None:
        self._entries.pop(producer_id, None)
        if producer_id in self._open:
            self._set_open(producer_id, None)

    def _set_open(self, producer_id: int, first_offset: int | None) -> None:
        updated = dict(self._open)
        if first_offset is None:
            updated.pop(producer_id, None)
        else:
            updated[producer_id] = first_offset
        self._open = updated

    def first_unstable_offset(self, *, without: int | None = None) -> int | None:
        """The smallest first offset of an open transaction (ignoring pid ``without``), None if none.

        O(open transactions); called only when a transaction ends.
        """
        return min((first for pid, first in self._open.items() if pid != without), default=None)

    def ongoing(self) -> list[tuple[int, int]]:
        """``(producer_id, first_offset)`` of every open transaction, by first offset. Any thread."""
        return sorted(self._open.items(), key=lambda item: item[1])

    def expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Producer ids idle past ``expiration_ms`` as of ``now_ms``, ascending (deterministic)."""
        if expiration_ms < 0:
            return []
        return sorted(pid for pid, e in self._entries.items() if e.is_expired(now_ms, expiration_ms))

    def entries(self) -> list[ProducerStateEntry]:
        """Every entry, by ascending producer id."""
        return [self._entries[pid] for pid in sorted(self._entries)]

    def clear(self) -> None:
        self._entries = {}
        self._open = {}


# --------------------------------------------------------------------------
# On-disk encoding of one entry
# --------------------------------------------------------------------------

ENTRY_VERSION = 3
# version, producer_id, epoch, coordinator_epoch, last_timestamp,
# current_txn_first_offset (-1 = None), [v2: current_txn_start_time (-1 = None)],
# [v3: revoked_epoch (-1 = none)], batch count
_ENTRY_HEAD_V1 = struct.Struct(">Bqhiqqb")
_ENTRY_HEAD_V2 = struct.Struct(">Bqhiqqqb")
_ENTRY_HEAD = struct.Struct(">Bqhiqqqhb")
# first_seq, last_seq, base_offset, last_offset, log_append_time
_ENTRY_BATCH = struct.Struct(">iiqqq")
_CRC = struct.Struct(">I")


def encode_entry(entry: ProducerStateEntry) -> bytes:
    """Version-3 bytes of ``entry`` with a trailing CRC-32C of everything before it."""
    parts = [
        _ENTRY_HEAD.pack(
            ENTRY_VERSION,
            entry.producer_id,
            entry.producer_epoch,
            entry.coordinator_epoch,
            entry.last_timestamp,
            _or_minus_one(entry.current_txn_first_offset),
            _or_minus_one(entry.current_txn_start_time),
            entry.revoked_epoch,
            len(entry.batches),
        )
    ]
    for b in entry.batches:
        parts.append(_ENTRY_BATCH.pack(b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.log_append_time))
    body = b"".join(parts)
    return body + _CRC.pack(crc32c.crc32c(body))


def _or_minus_one(value: int | None) -> int:
    return -1 if value is None else value


def decode_entry(data: bytes, *, where: str = "producer entry") -> ProducerStateEntry:
    """Inverse of ``encode_entry``; also reads versions 1 (no txn start time) and 2 (no revoked epoch).

    Raises ``StorageCorruptionError`` naming ``where``.
    """
    if len(data) < _ENTRY_HEAD_V1.size + _CRC.size:
        raise StorageCorruptionError(f"{where}: truncated ({len(data)} bytes)")
    body, (crc,) = data[: -_CRC.size], _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc32c.crc32c(body) != crc:
        raise StorageCorruptionError(f"{where}: CRC mismatch")
    version = body[0]
    revoked = -1
    if version == 1:
        head = _ENTRY_HEAD_V1
        _v, pid, epoch, coord_epoch, last_ts, txn_first, n = head.unpack_from(body, 0)
        # Version 1 never recorded the start time: the last write is the best bound left.
        txn_start = last_ts if txn_first >= 0 else -1
    elif version == 2 and len(body) >= _ENTRY_HEAD_V2.size:
        head = _ENTRY_HEAD_V2
        _v, pid, epoch, coord_epoch, last_ts, txn_first, txn_start, n = head.unpack_from(body, 0)
    elif version == ENTRY_VERSION and len(body) >= _ENTRY_HEAD.size:
        head = _ENTRY_HEAD
        _v, pid, epoch, coord_epoch, last_ts, txn_first, txn_start, revoked, n = head.unpack_from(body, 0)
    else:
        raise StorageCorruptionError(f"{where}: unknown version {version} or truncated ({len(data)} bytes)")
    if n < 0 or n > NUM_BATCHES_TO_RETAIN or len(body) != head.size + n * _ENTRY_BATCH.size:
        raise StorageCorruptionError(f"{where}: bad batch count {n} for {len(body)} bytes")
    if (txn_first < 0) != (txn_start < 0):
        raise StorageCorruptionError(f"{where}: open txn offset {txn_first} but start time {txn_start}")
    batches = tuple(BatchMetadata(*_ENTRY_BATCH.unpack_from(body, head.size + i * _ENTRY_BATCH.size)) for i in range(n))
    return ProducerStateEntry(
        pid,
        epoch,
        batches,
        last_ts,
        coord_epoch,
        None if txn_first < 0 else txn_first,
        None if txn_start < 0 else txn_start,
        revoked,
    )
