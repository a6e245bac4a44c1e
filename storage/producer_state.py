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
  window), the log append time of its last batch, the coordinator epoch and the
  first offset of its open transaction on this partition (``None`` until the
  transactions work lands; the field is persisted already).
* **ProducerAppendInfo**: validates one batch against one entry and computes
  the entry that results (Kafka's class of the same name, kafka_txn.md §3.1).

Rules (kafka_txn.md §3.1; rule numbers refer to that list):

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
9. Entries idle longer than ``producer.id.expiration.ms`` are removed, except
   while a transaction is open.

Transactional batches are validated exactly like idempotent ones and stored;
nothing else about transactions (open-txn tracking, INVALID_TXN_STATE for mixed
writes, markers) is implemented yet.

Idle time is measured with the *log append time* (leader clock, carried in the
command), not the producer's record timestamps, so a producer with a skewed
clock can neither pin nor lose its state.

Thread-safety: every value here is immutable except ``ProducerStateManager``,
which only its owner thread (the Raft thread) mutates; ``get`` from another
thread is safe under CPython (a single dict lookup).
"""

from __future__ import annotations

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

    @property
    def last_seq(self) -> int:
        """Last sequence of the newest retained batch, ``NO_SEQUENCE`` when none."""
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The retained batch with exactly this epoch and sequence range, if any (rule 1)."""
        if epoch != self.producer_epoch:
            return None
        for meta in self.batches:
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return meta
        return None

    def is_expired(self, now_ms: int, expiration_ms: int) -> bool:
        """Idle for longer than ``expiration_ms`` and no transaction open here (rule 9)."""
        return (
            expiration_ms >= 0
            and self.current_txn_first_offset is None
            and now_ms - self.last_timestamp > expiration_ms
        )


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
        """The error for ``header`` under rules 2-5, or None when it may be appended.

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
        if epoch > cur.producer_epoch:
            if first_seq != 0:
                return BrokerError(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {pid}: new epoch {epoch} must start at sequence 0, got {first_seq}",
                )
            return None
        if not in_sequence(cur.last_seq, first_seq):
            return BrokerError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {pid} epoch {epoch}: expected sequence "
                f"{0 if cur.last_seq == MAX_SEQUENCE else cur.last_seq + 1}, got {first_seq}",
            )
        return None

    def append(self, header: BatchHeader, base_offset: int, log_append_time: int) -> ProducerStateEntry:
        """The entry after appending ``header`` at ``base_offset`` (call after ``validate``)."""
        meta = BatchMetadata(
            header.base_sequence,
            header.last_sequence,
            base_offset,
            base_offset + header.record_count - 1,
            log_append_time,
        )
        cur = self.current
        if cur is None:
            return ProducerStateEntry(self.producer_id, header.producer_epoch, (meta,), log_append_time)
        if header.producer_epoch != cur.producer_epoch:
            # Rule 3: a new epoch starts a new sequence space; old batches can no
            # longer be duplicates of anything.
            return replace(
                cur,
                producer_epoch=header.producer_epoch,
                batches=(meta,),
                last_timestamp=log_append_time,
            )
        batches = (*cur.batches, meta)[-NUM_BATCHES_TO_RETAIN:]
        return replace(cur, batches=batches, last_timestamp=log_append_time)


class ProducerStateManager:
    """The pid -> ProducerStateEntry map of one partition (in memory; the caller persists).

    Only the owner thread calls the mutating methods; ``get`` is safe from any thread.
    """

    def __init__(self, entries: Iterable[ProducerStateEntry] = ()) -> None:
        self._entries: dict[int, ProducerStateEntry] = {e.producer_id: e for e in entries}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, producer_id: int) -> ProducerStateEntry | None:
        return self._entries.get(producer_id)

    def prepare_append(self, producer_id: int, *, state_may_be_lost: bool) -> ProducerAppendInfo:
        """A validator for ``producer_id``'s next batch (mutates nothing)."""
        return ProducerAppendInfo(producer_id, self._entries.get(producer_id), state_may_be_lost)

    def update(self, entry: ProducerStateEntry) -> None:
        """Install ``entry`` once it is durable."""
        self._entries[entry.producer_id] = entry

    def remove(self, producer_id: int) -> None:
        self._entries.pop(producer_id, None)

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


# --------------------------------------------------------------------------
# On-disk encoding of one entry
# --------------------------------------------------------------------------

ENTRY_VERSION = 1
# version, producer_id, epoch, coordinator_epoch, last_timestamp,
# current_txn_first_offset (-1 = None), batch count
_ENTRY_HEAD = struct.Struct(">Bqhiqqb")
# first_seq, last_seq, base_offset, last_offset, log_append_time
_ENTRY_BATCH = struct.Struct(">iiqqq")
_CRC = struct.Struct(">I")


def encode_entry(entry: ProducerStateEntry) -> bytes:
    """Versioned bytes of ``entry`` with a trailing CRC-32C of everything before it."""
    parts = [
        _ENTRY_HEAD.pack(
            ENTRY_VERSION,
            entry.producer_id,
            entry.producer_epoch,
            entry.coordinator_epoch,
            entry.last_timestamp,
            -1 if entry.current_txn_first_offset is None else entry.current_txn_first_offset,
            len(entry.batches),
        )
    ]
    for b in entry.batches:
        parts.append(_ENTRY_BATCH.pack(b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.log_append_time))
    body = b"".join(parts)
    return body + _CRC.pack(crc32c.crc32c(body))


def decode_entry(data: bytes, *, where: str = "producer entry") -> ProducerStateEntry:
    """Inverse of ``encode_entry``; raises ``StorageCorruptionError`` naming ``where``."""
    if len(data) < _ENTRY_HEAD.size + _CRC.size:
        raise StorageCorruptionError(f"{where}: truncated ({len(data)} bytes)")
    body, (crc,) = data[: -_CRC.size], _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc32c.crc32c(body) != crc:
        raise StorageCorruptionError(f"{where}: CRC mismatch")
    version, pid, epoch, coord_epoch, last_ts, txn_first, n = _ENTRY_HEAD.unpack_from(body, 0)
    if version != ENTRY_VERSION:
        raise StorageCorruptionError(f"{where}: unknown version {version}")
    if n < 0 or n > NUM_BATCHES_TO_RETAIN or len(body) != _ENTRY_HEAD.size + n * _ENTRY_BATCH.size:
        raise StorageCorruptionError(f"{where}: bad batch count {n} for {len(body)} bytes")
    batches = tuple(
        BatchMetadata(*_ENTRY_BATCH.unpack_from(body, _ENTRY_HEAD.size + i * _ENTRY_BATCH.size)) for i in range(n)
    )
    return ProducerStateEntry(pid, epoch, batches, last_ts, coord_epoch, None if txn_first < 0 else txn_first)
