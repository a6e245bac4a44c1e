"""One data partition's log in the node's RocksDB: the Raft state machine of a partition group.

Terms (Kafka's):

* **high watermark (HW)**: the next offset to assign. Offsets are assigned at
  apply and everything applied is committed (DESIGN.md rule 2), so the HW is
  the end of the applied log.
* **log start offset**: the first offset a fetch may ask for; retention and
  DeleteRecords advance it. It may lie inside a batch (DeleteRecords); such a
  batch is kept and a fetch returns it whole, as Kafka does.
* **open transaction**: transactional batches of one producer id written
  since its last COMMIT/ABORT marker (``storage.producer_state``).
* **last stable offset (LSO)**: the first offset of the earliest open
  transaction (never below the log start), else the HW (kafka_txn.md §7.2).
  read_committed fetches stop there.
* **aborted-transaction index**: one ``AbortedTxn`` per ABORT marker that
  closed a transaction here (``storage.txn_index``); a read_committed fetch
  returns the entries overlapping what it read, for the client-side filter
  (``clients.txn_filter``).

Thread-safety: ``apply``, ``write_snapshot``, ``read_snapshot`` and
``destroy`` run on the partition's Raft thread only, never concurrently with
each other. ``read``, ``fetch``, ``aborted_transactions``, ``check_append``,
``opens_transaction``, ``producer_entry``, ``ongoing_transactions``, ``oldest_batch_max_timestamp``
and the properties may run concurrently on any other thread. That is safe
because (a) the in-memory summary (offsets, LSO) is one immutable ``LogMeta``
object whose reference is replaced only *after* its WriteBatch is written, so a
reader never sees an offset whose batch, marker or index entry is not yet in
RocksDB, and (b) a read iterates a RocksDB iterator, which pins a
point-in-time view, and reports ``OFFSET_OUT_OF_RANGE`` when retention removed
the wanted batch between its look at the log start offset and the creation of
its iterator. ``fetch`` reads batches and aborted-index entries through the
*same* iterator, so retention cannot remove an entry of a batch it returns.
There are no locks. A reader racing ``read_snapshot``/``destroy`` may get an
error (never wrong data).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import BinaryIO

from rocksdict import WriteBatch

from clients.protocol import (
    BatchHeader,
    BrokerError,
    ControlType,
    ErrorCode,
    StoredBatch,
    encode_control_batch,
    parse_batch,
)
from storage.commands import (
    AppendCommand,
    AppendResult,
    CarriedAppendCommand,
    DeleteRecordsCommand,
    NoopCommand,
    RetentionCommand,
    RetentionResult,
    RevokeMarkerCommand,
    RevokeResult,
    TxnMarkerCommand,
    TxnMarkerResult,
    decode_command,
)
from storage.errors import StorageCorruptionError
from storage.log_format import (
    ABORTED_TAG,
    BATCH_TAG,
    META_TAG,
    PRODUCER_TAG,
    RESTORE_TAG,
    STORED_HEADER_SIZE,
    LogMeta,
    decode_meta,
    decode_stored_batch,
    encode_meta,
    encode_stored_batch_header,
    offset_key_suffix,
)
from storage.producer_state import (
    CarriedMarkerAction,
    EndTxnOutcome,
    ProducerStateEntry,
    ProducerStateManager,
    decode_entry,
    encode_entry,
)
from storage.store import NodeStore, StoreView, stop_on_storage_failure
from storage.txn_index import (
    AbortedTxn,
    collect_aborted,
    decode_aborted_txn,
    encode_aborted_txn,
    next_aborted_txn,
)

__all__ = ["LogReadInfo", "PartitionLog", "StorageCorruptionError"]

log = logging.getLogger(__name__)

_SNAPSHOT_MAGIC = b"TXPL"
_SNAPSHOT_VERSION = 1
_SNAPSHOT_HEAD = struct.Struct(">4sBq")  # magic, version, last_applied
_PAIR_HEAD = struct.Struct(">II")  # key suffix length, value length
_END_OF_PAIRS = 0xFFFFFFFF
_RESTORE_BATCH_BYTES = 4 * 1024 * 1024
_U64 = struct.Struct(">Q")

ApplyResult = AppendResult | RetentionResult | TxnMarkerResult | RevokeResult | BrokerError | None


@dataclass(frozen=True, slots=True)
class LogReadInfo:
    """What ``PartitionLog.fetch`` read, with the offsets of the same moment (FetchResponse v4 shape).

    ``upper_bound`` is the bound the read stopped at (the LSO for
    read_committed, else the HW). ``aborted_transactions`` holds
    ``(producer_id, first_offset)`` of every aborted transaction overlapping
    the returned batches; only read_committed fetches fill it.
    """

    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    upper_bound: int
    batches: list[StoredBatch]
    aborted_transactions: list[tuple[int, int]]


class PartitionLog:
    """The log of one data partition; implements ``raft.state_machine.StateMachine``.

    ``prefix`` is this partition's unique key prefix in the node's RocksDB (see
    ``storage.store`` for the prefix-free requirement); ``name`` (``topic-p``)
    appears in log lines and error messages.
    """

    def __init__(self, store: NodeStore, prefix: bytes, name: str) -> None:
        if not prefix:
            raise ValueError("a partition needs a non-empty key prefix")
        self._store = store
        self._prefix = prefix
        self.name = name
        self._meta_key = prefix + META_TAG
        self._restore_key = prefix + RESTORE_TAG
        self._batch_prefix = prefix + BATCH_TAG
        self._producer_prefix = prefix + PRODUCER_TAG
        self._aborted_prefix = prefix + ABORTED_TAG
        self._meta = LogMeta()
        self._producers = ProducerStateManager()
        self._last_aborted_offset: int | None = None
        self._load()

    # -- loading ----------------------------------------------------------------

    def _load(self) -> None:
        """Read meta and producer state; check the ends of the log and the index agree with meta."""
        db = self._store.db
        if db.get(self._restore_key) is not None:
            raise StorageCorruptionError(
                f"{self.name}: a snapshot restore was interrupted; destroy the partition "
                "and let Raft install a snapshot again"
            )
        raw = db.get(self._meta_key)
        recorded = True
        if raw is None:
            for key, _value in self._store.iter_prefix(self._prefix):
                raise StorageCorruptionError(f"{self.name}: key {key!r} exists but meta is missing")
            meta = LogMeta()
        else:
            meta, recorded = decode_meta(raw, where=f"{self.name} meta")
        entries = []
        for key, value in self._store.iter_prefix(self._producer_prefix):
            where = f"{self.name} producer entry {key!r}"
            entry = decode_entry(value, where=where)
            if key != self._producer_key(entry.producer_id):
                raise StorageCorruptionError(f"{where}: holds producer {entry.producer_id}")
            first = entry.current_txn_first_offset
            if first is not None and first >= meta.next_offset:
                raise StorageCorruptionError(f"{where}: open txn at {first} is beyond the HW {meta.next_offset}")
            entries.append(entry)
        self._check_ends(meta)
        producers = ProducerStateManager(entries)
        first_unstable = producers.first_unstable_offset()
        if recorded and first_unstable != meta.first_unstable_offset:
            raise StorageCorruptionError(
                f"{self.name}: meta says the first unstable offset is {meta.first_unstable_offset}, "
                f"producer entries say {first_unstable}"
            )
        last_aborted = self._last_aborted_entry(meta)
        self._producers = producers
        self._last_aborted_offset = None if last_aborted is None else last_aborted.last_offset
        self._meta = replace(meta, first_unstable_offset=first_unstable)

    def _last_aborted_entry(self, meta: LogMeta) -> AbortedTxn | None:
        for entry in self._iter_aborted(
            self._store.iter_range(self._aborted_prefix, self._batch_prefix, backwards=True)
        ):
            if entry.last_offset >= meta.next_offset:
                raise StorageCorruptionError(
                    f"{self.name}: aborted txn index ends at {entry.last_offset}, beyond the HW {meta.next_offset}"
                )
            return entry
        return None

    def _check_ends(self, meta: LogMeta) -> None:
        first = self._edge_batch(backwards=False)
        last = self._edge_batch(backwards=True)
        if meta.batch_count == 0:
            if first is not None:
                raise StorageCorruptionError(f"{self.name}: meta says empty, found a batch")
            return
        if first is None or last is None:
            raise StorageCorruptionError(f"{self.name}: meta says {meta.batch_count} batches, found none")
        if last.last_offset + 1 != meta.next_offset:
            raise StorageCorruptionError(
                f"{self.name}: last batch ends at {last.last_offset}, meta's next offset is {meta.next_offset}"
            )
        if not first.base_offset <= meta.log_start_offset <= first.last_offset:
            raise StorageCorruptionError(
                f"{self.name}: first batch [{first.base_offset}, {first.last_offset}] does not "
                f"hold the log start offset {meta.log_start_offset}"
            )

    def _edge_batch(self, *, backwards: bool) -> StoredBatch | None:
        edges = self._store.iter_range(self._batch_prefix, self._batch_key_upper(), backwards=backwards)
        for key, value in edges:
            return self._decode_batch(key, value)
        return None

    # -- keys -----------------------------------------------------------------------

    def _batch_key(self, offset: int) -> bytes:
        return self._prefix + offset_key_suffix(BATCH_TAG, offset)

    def _batch_key_upper(self) -> bytes:
        return self._prefix + bytes((BATCH_TAG[0] + 1,))

    def _producer_key(self, producer_id: int) -> bytes:
        return self._prefix + offset_key_suffix(PRODUCER_TAG, producer_id)

    def _aborted_key(self, last_offset: int) -> bytes:
        return self._prefix + offset_key_suffix(ABORTED_TAG, last_offset)

    def _decode_batch(self, key: bytes, value: bytes) -> StoredBatch:
        (base,) = _U64.unpack_from(key, len(self._batch_prefix))
        return decode_stored_batch(value, base_offset=base, where=f"{self.name} batch {base}")

    def _iter_aborted(self, pairs: Iterator[tuple[bytes, bytes]]) -> Iterator[AbortedTxn]:
        for key, value in pairs:
            (last,) = _U64.unpack_from(key, len(self._aborted_prefix))
            yield decode_aborted_txn(value, last_offset=last, where=f"{self.name} aborted txn {last}")

    # -- published state (any thread) ----------------------------------------------

    @property
    def last_applied(self) -> int:
        return self._meta.last_applied

    @property
    def high_watermark(self) -> int:
        return self._meta.next_offset

    @property
    def log_start_offset(self) -> int:
        return self._meta.log_start_offset

    @property
    def last_stable_offset(self) -> int:
        return self._meta.last_stable_offset

    @property
    def size_bytes(self) -> int:
        return self._meta.size_bytes

    @property
    def batch_count(self) -> int:
        return self._meta.batch_count

    def producer_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def expected_sequence(self, producer_id: int, producer_epoch: int) -> int | None:
        """The base sequence the applied state accepts next from this producer and epoch.

        None when it cannot tell: an older epoch (fenced), or no entry while the
        state may have been lost (the batch will be judged at apply anyway).
        """
        entry = self._producers.get(producer_id)
        if entry is None:
            return None if self._meta.state_may_be_lost else 0
        if producer_epoch != entry.producer_epoch:
            return 0 if producer_epoch > entry.producer_epoch else None
        return entry.next_seq

    def producer_entries(self) -> list[ProducerStateEntry]:
        """Every producer entry by pid (DescribeProducers). Raft thread or a quiet log only."""
        return self._producers.entries()

    def ongoing_transactions(self) -> list[tuple[int, int]]:
        """``(producer_id, first_offset)`` of each open transaction here, oldest first. Any thread.

        ``producer_entry(pid)`` has the epoch and ``current_txn_start_time``
        (hanging-transaction detection, KIP-664).
        """
        return self._producers.ongoing()

    # -- validation (shared by the leader's pre-check and apply) ---------------------

    @staticmethod
    def _check_plain(header: BatchHeader) -> BrokerError | None:
        if header.is_control:
            return BrokerError(
                ErrorCode.INVALID_REQUEST,
                "control batches are written by transaction markers, not produced",
            )
        if header.producer_id < -1:
            return BrokerError(ErrorCode.INVALID_REQUEST, f"bad producer id {header.producer_id}")
        if header.is_transactional and not header.is_idempotent:
            return BrokerError(ErrorCode.INVALID_REQUEST, "a transactional batch needs a producer id")
        if header.is_idempotent and (header.producer_epoch < 0 or header.base_sequence < 0):
            return BrokerError(ErrorCode.INVALID_REQUEST, "an idempotent batch needs an epoch and a sequence >= 0")
        if not header.is_idempotent and (header.producer_epoch != -1 or header.base_sequence != -1):
            return BrokerError(
                ErrorCode.INVALID_REQUEST, "a plain batch (producer id -1) carries epoch and sequence -1"
            )
        return None

    def check_append(self, header: BatchHeader) -> BrokerError | None:
        """The leader's fast pre-check: an error apply is certain to return, or None.

        Only checks that hold whatever is still in flight: up to 5 batches of a
        producer may be proposed but not yet applied, so sequence rules (gaps,
        unknown producer, duplicates) are left to apply, which sees batches in
        log order. A fenced (older) epoch can never become valid again.
        Mutates nothing; apply remains the authority (DESIGN.md rule 1).
        """
        err = self._check_plain(header)
        if err is not None or not header.is_idempotent:
            return err
        entry = self._producers.get(header.producer_id)
        if entry is not None and header.producer_epoch < entry.producer_epoch:
            return BrokerError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {header.producer_id}: epoch {header.producer_epoch} is older than {entry.producer_epoch}",
            )
        return None

    def opens_transaction(self, header: BatchHeader) -> bool:
        """Whether ``header`` would open a transaction here, judged on applied state. Any thread.

        KIP-890 verification hook: the leader asks the coordinator whether this
        partition is in the producer's transaction before proposing such a
        batch. Batches of a transaction already open here need no check; a
        batch pipelined behind the one that opens it still answers True.
        """
        if not header.is_transactional:
            return False
        entry = self._producers.get(header.producer_id)
        return entry is None or entry.current_txn_first_offset is None or header.producer_epoch > entry.producer_epoch

    # -- apply (Raft thread) ----------------------------------------------------------

    def apply(self, index: int, command: bytes) -> ApplyResult:
        """Apply the committed entry at ``index``. Deterministic; never raises.

        Entries at or below ``last_applied`` are skipped (journal replay). A
        rejected command changes nothing but ``last_applied``.
        """
        if index <= self._meta.last_applied:
            return None
        try:
            cmd = decode_command(command)
            if isinstance(cmd, AppendCommand):
                return self._apply_append(index, cmd)
            if isinstance(cmd, RetentionCommand):
                return self._apply_retention(index, cmd)
            if isinstance(cmd, DeleteRecordsCommand):
                return self._apply_delete_records(index, cmd)
            if isinstance(cmd, TxnMarkerCommand):
                return self._apply_txn_marker(index, cmd)
            if isinstance(cmd, CarriedAppendCommand):
                return self._apply_carried_append(index, cmd)
            if isinstance(cmd, RevokeMarkerCommand):
                return self._apply_txn_marker(index, cmd.marker, revoke=True)
            assert isinstance(cmd, NoopCommand)
            self._record_index(index)
            return None
        except BrokerError as err:
            return self._reject(index, err)
        except Exception as exc:
            # A read the disk refused (writes end the process in the store): going on would skip the entry
            # here while the other replicas apply it.
            stop_on_storage_failure(exc, f"{self._store.path} ({self.name})")
            log.exception("%s: apply of index %d failed", self.name, index)
            return self._reject(index, BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{self.name}: {exc!r}"))

    def _reject(self, index: int, err: BrokerError) -> BrokerError:
        try:
            self._record_index(index)
        except Exception:
            log.exception("%s: could not record index %d", self.name, index)
        return err

    def _record_index(self, index: int) -> None:
        meta = replace(self._meta, last_applied=index)
        self._store.put(self._meta_key, encode_meta(meta))
        self._meta = meta

    def _apply_append(self, index: int, cmd: AppendCommand) -> ApplyResult:
        header = parse_batch(cmd.batch, verify=False)
        err = self._check_plain(header)
        if err is not None:
            return self._reject(index, err)
        meta = self._meta
        entry: ProducerStateEntry | None = None
        if header.is_idempotent:
            info = self._producers.prepare_append(header.producer_id, state_may_be_lost=meta.state_may_be_lost)
            dup = info.duplicate_of(header)
            if dup is not None:
                self._record_index(index)
                return AppendResult(dup.base_offset, dup.last_offset, dup.log_append_time, True)
            err = info.validate(header)
            if err is not None:
                return self._reject(index, err)
            entry = info.append(header, meta.next_offset, cmd.log_append_time)
        wb = self._store.new_batch()
        new_meta, result = self._stage_append(wb, replace(meta, last_applied=index), header, cmd, entry)
        self._commit(wb, new_meta, entry)
        return result

    def _stage_append(
        self, wb: WriteBatch, meta: LogMeta, header: BatchHeader, cmd: AppendCommand, entry: ProducerStateEntry | None
    ) -> tuple[LogMeta, AppendResult]:
        """Put the batch at ``meta.next_offset`` (and ``entry``, the producer's after it) into ``wb``."""
        base = meta.next_offset
        last = base + header.record_count - 1
        first_unstable = meta.first_unstable_offset
        if first_unstable is None and entry is not None:
            first_unstable = entry.current_txn_first_offset  # this batch opened the only open txn
        new_meta = replace(
            meta,
            next_offset=last + 1,
            size_bytes=meta.size_bytes + len(cmd.batch),
            batch_count=meta.batch_count + 1,
            first_unstable_offset=first_unstable,
        )
        wb.put(
            self._batch_key(base),
            b"".join((encode_stored_batch_header(base, cmd.log_append_time), cmd.batch)),
        )
        if entry is not None:
            wb.put(self._producer_key(entry.producer_id), encode_entry(entry))
        return new_meta, AppendResult(base, last, cmd.log_append_time, False)

    def _commit(
        self, wb: WriteBatch, new_meta: LogMeta, entry: ProducerStateEntry | None, aborted: AbortedTxn | None = None
    ) -> None:
        """Write ``wb`` with ``new_meta``, then publish: readers must never see an HW ahead of RocksDB."""
        wb.put(self._meta_key, encode_meta(new_meta))
        self._store.write(wb)
        if entry is not None:
            self._producers.update(entry)
        if aborted is not None:
            self._last_aborted_offset = aborted.last_offset
        self._meta = new_meta

    def _apply_txn_marker(self, index: int, cmd: TxnMarkerCommand, *, revoke: bool = False) -> ApplyResult:
        """WriteTxnMarkers for this partition (kafka_txn.md §4.3, §7.1-7.3; rules in storage.producer_state).

        ``revoke``: a REVOKE_MARKER -- also revokes the reservation of its epoch, unless the transaction
        of that epoch is open here already (then nothing is written: "used"; docs/carried-markers.md).
        """
        meta = self._meta
        info = self._producers.prepare_append(cmd.producer_id, state_may_be_lost=meta.state_may_be_lost)
        if revoke and info.current is not None and info.current.txn_open_at(cmd.producer_epoch):
            self._record_index(index)
            return RevokeResult(used=True, marker=None)
        err = info.validate_marker(cmd.producer_epoch, cmd.coordinator_epoch)
        if err is not None:
            return self._reject(index, err)
        outcome = (info.revoke if revoke else info.end_txn)(cmd.producer_epoch, cmd.coordinator_epoch, cmd.timestamp_ms)
        wb = self._store.new_batch()
        new_meta, aborted, result = self._stage_marker(wb, replace(meta, last_applied=index), cmd, outcome)
        self._commit(wb, new_meta, outcome.entry, aborted)
        return RevokeResult(used=False, marker=result) if revoke else result

    def _stage_marker(
        self, wb: WriteBatch, meta: LogMeta, cmd: TxnMarkerCommand, outcome: EndTxnOutcome
    ) -> tuple[LogMeta, AbortedTxn | None, TxnMarkerResult]:
        """Put the marker's control batch (if it closes a transaction) and the producer's new entry into ``wb``.

        The producer manager is not updated yet (``_commit`` does): the first unstable offset is computed
        without this producer, which the marker leaves with no open transaction here.
        """
        pid = cmd.producer_id
        first = outcome.closed_txn_first_offset
        new_meta = meta
        offset: int | None = None
        aborted: AbortedTxn | None = None
        if first is not None:
            # Only a marker that closes a transaction takes an offset: a retried
            # marker must leave the log as it is.
            offset = meta.next_offset
            batch = encode_control_batch(
                cmd.control_type,
                producer_id=pid,
                producer_epoch=cmd.producer_epoch,
                coordinator_epoch=cmd.coordinator_epoch,
                timestamp=cmd.timestamp_ms,
            )
            new_meta = replace(
                meta,
                next_offset=offset + 1,
                size_bytes=meta.size_bytes + len(batch),
                batch_count=meta.batch_count + 1,
                first_unstable_offset=self._producers.first_unstable_offset(without=pid),
            )
            wb.put(self._batch_key(offset), encode_stored_batch_header(offset, cmd.timestamp_ms) + batch)
            if cmd.control_type is ControlType.ABORT:
                aborted = next_aborted_txn(
                    self._last_aborted_offset, AbortedTxn(pid, first, offset, new_meta.last_stable_offset)
                )
                wb.put(self._aborted_key(offset), encode_aborted_txn(aborted))
        wb.put(self._producer_key(pid), encode_entry(outcome.entry))
        return new_meta, aborted, TxnMarkerResult(cmd.control_type, offset, first, cmd.timestamp_ms)

    def _apply_carried_append(self, index: int, cmd: CarriedAppendCommand) -> ApplyResult:
        """A marker and the producer's next transactional batch in one entry (docs/carried-markers.md)."""
        marker = cmd.marker
        append = AppendCommand(marker.timestamp_ms, cmd.batch)
        header = parse_batch(cmd.batch, verify=False)
        if (
            not header.is_transactional
            or header.producer_id != marker.producer_id
            or header.producer_epoch != marker.producer_epoch
        ):
            return self._reject(index, BrokerError(
                ErrorCode.INVALID_REQUEST,
                f"a carried marker of producer {marker.producer_id} epoch {marker.producer_epoch} needs a "
                f"transactional batch of the same producer and epoch, got producer {header.producer_id} "
                f"epoch {header.producer_epoch}",
            ))  # fmt: skip
        meta = self._meta
        info = self._producers.prepare_append(marker.producer_id, state_may_be_lost=meta.state_may_be_lost)
        action = info.carried_marker_action(marker.producer_epoch)
        if action is CarriedMarkerAction.REFUSE:
            return self._reject(index, BrokerError(
                ErrorCode.TRANSACTION_RESERVATION_REVOKED,
                f"producer {marker.producer_id}: the reservation of epoch {marker.producer_epoch} was revoked "
                "on this partition; send the batch without its token",
            ))  # fmt: skip
        if action is CarriedMarkerAction.SKIP_MARKER:
            return self._apply_append(index, append)
        err = info.validate_marker(marker.producer_epoch, marker.coordinator_epoch)
        if err is not None:
            return self._reject(index, err)
        outcome = info.end_txn(marker.producer_epoch, marker.coordinator_epoch, marker.timestamp_ms)
        wb = self._store.new_batch()
        new_meta, aborted, _ = self._stage_marker(wb, replace(meta, last_applied=index), marker, outcome)
        batch_info = info.after_marker(outcome.entry)
        err = batch_info.validate(header)
        if err is not None:
            # The marker is the coordinator's decision and stands on its own: it is written; the batch is not.
            self._commit(wb, new_meta, outcome.entry, aborted)
            return err
        entry = batch_info.append(header, new_meta.next_offset, marker.timestamp_ms)
        new_meta, result = self._stage_append(wb, new_meta, header, append, entry)
        self._commit(wb, new_meta, entry, aborted)
        return result

    def _delete_aborted_below(self, wb: WriteBatch, log_start_offset: int) -> None:
        """Drop index entries of transactions wholly below the log start (their batches are gone)."""
        wb.delete_range(self._aborted_key(0), self._aborted_key(log_start_offset))

    def _apply_retention(self, index: int, cmd: RetentionCommand) -> RetentionResult:
        meta = self._meta
        cutoff = cmd.now_ms - cmd.retention_ms
        size, count, start = meta.size_bytes, meta.batch_count, meta.log_start_offset
        deleted_bytes = 0
        wb = self._store.new_batch()
        for key, value in self._store.iter_prefix(self._batch_prefix):
            batch = self._decode_batch(key, value)
            by_time = cmd.retention_ms >= 0 and max(batch.header.max_timestamp, 0) < cutoff
            # The newest batch is never deleted for size: it is the active one.
            by_size = cmd.retention_bytes >= 0 and size > cmd.retention_bytes and count > 1
            if not (by_time or by_size):
                break
            wb.delete(key)
            size -= len(batch.data)
            deleted_bytes += len(batch.data)
            count -= 1
            start = max(start, batch.last_offset + 1)
        if start > meta.log_start_offset:
            self._delete_aborted_below(wb, start)
        # Entries with an open transaction never expire: that would unpin the LSO.
        expired = self._producers.expired(cmd.now_ms, cmd.producer_expiration_ms)
        for pid in expired:
            wb.delete(self._producer_key(pid))
        new_meta = replace(
            meta,
            log_start_offset=start,
            last_applied=index,
            size_bytes=size,
            batch_count=count,
            expired_producers=meta.expired_producers + len(expired),
        )
        wb.put(self._meta_key, encode_meta(new_meta))
        self._store.write(wb)
        for pid in expired:
            self._producers.remove(pid)
        self._meta = new_meta
        return RetentionResult(start, meta.batch_count - count, deleted_bytes, len(expired))

    def _apply_delete_records(self, index: int, cmd: DeleteRecordsCommand) -> ApplyResult:
        meta = self._meta
        target = meta.next_offset if cmd.before_offset == -1 else cmd.before_offset
        if not 0 <= target <= meta.next_offset:
            return self._reject(
                index,
                BrokerError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"{self.name}: cannot delete records before {cmd.before_offset}: "
                    f"high watermark is {meta.next_offset}",
                ),
            )
        if target <= meta.log_start_offset:
            self._record_index(index)
            return RetentionResult(meta.log_start_offset, 0, 0)
        size, count, deleted_bytes = meta.size_bytes, meta.batch_count, 0
        wb = self._store.new_batch()
        for key, value in self._store.iter_prefix(self._batch_prefix):
            batch = self._decode_batch(key, value)
            if batch.last_offset >= target:
                break
            wb.delete(key)
            size -= len(batch.data)
            deleted_bytes += len(batch.data)
            count -= 1
        self._delete_aborted_below(wb, target)
        new_meta = replace(meta, log_start_offset=target, last_applied=index, size_bytes=size, batch_count=count)
        wb.put(self._meta_key, encode_meta(new_meta))
        self._store.write(wb)
        self._meta = new_meta
        return RetentionResult(target, meta.batch_count - count, deleted_bytes)

    # -- reads (any thread) -----------------------------------------------------------

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> list[StoredBatch]:
        """Batches overlapping ``[offset, min(upper_bound, HW))``, oldest first.

        The first batch is returned even when it is larger than ``max_bytes``
        (so a consumer always makes progress, as in Kafka); later batches only
        while the total stays within ``max_bytes``. ``offset == HW`` gives [].
        Raises ``BrokerError(OFFSET_OUT_OF_RANGE)`` for an offset below the log
        start or above the HW, ``BrokerError(CORRUPT_MESSAGE)`` for bad bytes.
        """
        meta = self._meta
        self._check_fetch_offset(offset, meta)
        end = meta.next_offset if upper_bound is None else min(upper_bound, meta.next_offset)
        if offset >= end:
            return []
        return self._read_batches(self._store.view(self._batch_key(end)), offset, max_bytes, end)

    def fetch(self, offset: int, max_bytes: int, *, read_committed: bool = False) -> LogReadInfo:
        """A consumer fetch: ``read`` bounded by the HW, or by the LSO for read_committed.

        read_committed also answers the aborted transactions overlapping the
        returned batches (``aborted_transactions``), read through the same
        point-in-time view as the batches. An offset at or past the LSO (but
        within the log) gives no batches, as in Kafka. Errors as ``read``.
        """
        meta = self._meta
        self._check_fetch_offset(offset, meta)
        lso = meta.last_stable_offset
        end = lso if read_committed else meta.next_offset
        batches: list[StoredBatch] = []
        aborted: list[tuple[int, int]] = []
        if offset < end:
            view = self._store.view(self._batch_key(end))
            batches = self._read_batches(view, offset, max_bytes, end)
            if read_committed:
                found = self._collect_aborted(view, offset, batches[-1].last_offset + 1)
                aborted = [(e.producer_id, e.first_offset) for e in found]
        return LogReadInfo(meta.next_offset, lso, meta.log_start_offset, end, batches, aborted)

    def aborted_transactions(self, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """Index entries with ``last_offset >= fetch_offset`` and ``first_offset < upper_bound_offset``.

        Kafka's ``collectAbortedTxns``, in ``last_offset`` order. Raises
        ``BrokerError(CORRUPT_MESSAGE)`` for an entry that fails its checks.
        """
        return self._collect_aborted(self._store.view(self._batch_prefix), fetch_offset, upper_bound_offset)

    def _collect_aborted(self, view: StoreView, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        pairs = view.range(self._aborted_key(max(fetch_offset, 0)), self._batch_prefix)
        try:
            return collect_aborted(self._iter_aborted(pairs), fetch_offset, upper_bound_offset)
        except StorageCorruptionError as exc:
            raise BrokerError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from exc

    def _check_fetch_offset(self, offset: int, meta: LogMeta) -> None:
        if offset < meta.log_start_offset or offset > meta.next_offset:
            raise self._out_of_range(offset, meta)

    def _read_batches(self, view: StoreView, offset: int, max_bytes: int, end: int) -> list[StoredBatch]:
        """Batches overlapping ``[offset, end)`` (``offset < end``) as ``read`` describes."""
        batches = view.range(self._batch_prefix, self._batch_key(end), floor=self._batch_key(offset))
        out: list[StoredBatch] = []
        total = 0
        for key, value in batches:
            if out and total + len(value) - STORED_HEADER_SIZE > max_bytes:
                break  # checked before decoding: a batch we do not return is not verified
            try:
                batch = self._decode_batch(key, value)
            except StorageCorruptionError as exc:
                raise BrokerError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from exc
            if batch.last_offset < offset:
                continue
            if not out and batch.base_offset > offset:
                break  # the batch holding `offset` is gone: reported below
            out.append(batch)
            total += len(batch.data)
        if not out:
            current = self._meta
            if offset < current.log_start_offset:
                raise self._out_of_range(offset, current)  # retention won the race
            raise BrokerError(
                ErrorCode.CORRUPT_MESSAGE,
                f"{self.name}: no batch holds offset {offset} "
                f"(log start {current.log_start_offset}, HW {current.next_offset})",
            )
        return out

    def _out_of_range(self, offset: int, meta: LogMeta) -> BrokerError:
        return BrokerError(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"{self.name}: offset {offset} is outside [{meta.log_start_offset}, {meta.next_offset}]",
            log_start_offset=meta.log_start_offset,
            high_watermark=meta.next_offset,
        )

    def oldest_batch_max_timestamp(self) -> int | None:
        """Max timestamp of the oldest stored batch (None when empty), for retention."""
        try:
            first = self._edge_batch(backwards=False)
        except StorageCorruptionError as exc:
            raise BrokerError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from exc
        return None if first is None else first.header.max_timestamp

    # -- snapshots and lifecycle (Raft thread) --------------------------------------------

    def write_snapshot(self, out: BinaryIO) -> None:
        """Every key of this partition (relative to the prefix) plus ``last_applied``.

        Layout: ``b"TXPL" | version u8 | last_applied i64`` then
        ``(key_len u32 | value_len u32 | key | value)*`` then ``0xFFFFFFFF``.
        Keys are stored without the prefix, so a snapshot restores under any prefix.
        """
        self._write_pairs(out, self._meta.last_applied, self._store.iter_prefix(self._prefix))

    def make_durable(self) -> None:
        """Every applied entry survives a machine crash (``DurableStateMachine``)."""
        self._store.make_durable()

    def consistent_snapshot(self) -> tuple[int, Callable[[BinaryIO], None]]:
        """``write_snapshot`` of one RocksDB view, safe to run on another thread while apply goes on.

        The state index is the view's own ``last_applied`` (read from the meta
        key through the same view), so header and pairs agree.
        """
        view = self._store.view(self._prefix_end())
        last_applied = 0
        for _key, value in view.range(self._meta_key, self._meta_key + b"\x00"):
            last_applied = decode_meta(value, where=f"{self.name} meta")[0].last_applied
        pairs = view.range(self._prefix, self._prefix_end())

        def write(out: BinaryIO) -> None:
            self._write_pairs(out, last_applied, pairs)

        return last_applied, write

    def _write_pairs(self, out: BinaryIO, last_applied: int, pairs: Iterator[tuple[bytes, bytes]]) -> None:
        out.write(_SNAPSHOT_HEAD.pack(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, last_applied))
        plen = len(self._prefix)
        for key, value in pairs:
            suffix = key[plen:]
            out.write(_PAIR_HEAD.pack(len(suffix), len(value)))
            out.write(suffix)
            out.write(value)
        out.write(struct.pack(">I", _END_OF_PAIRS))

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        """Replace this partition's state with a ``write_snapshot`` stream.

        Raises ``StorageCorruptionError`` for a malformed stream; the partition
        is then marked as an interrupted restore until the next successful one.
        """
        magic, version, _snap_applied = _SNAPSHOT_HEAD.unpack(_read_exact(inp, _SNAPSHOT_HEAD.size, self.name))
        if magic != _SNAPSHOT_MAGIC or version != _SNAPSHOT_VERSION:
            raise StorageCorruptionError(f"{self.name}: not a partition snapshot (v{version})")
        self._meta = LogMeta(last_applied=self._meta.last_applied)
        self._producers.clear()
        self._last_aborted_offset = None
        wb = self._store.new_batch()
        wb.delete_range(self._prefix, self._prefix_end())
        wb.put(self._restore_key, b"")
        self._store.write(wb)
        wb = self._store.new_batch()
        pending = 0
        meta_value: bytes | None = None
        open_firsts: list[int] = []
        while True:
            (klen,) = struct.unpack(">I", _read_exact(inp, 4, self.name))
            if klen == _END_OF_PAIRS:
                break
            (vlen,) = struct.unpack(">I", _read_exact(inp, 4, self.name))
            suffix = _read_exact(inp, klen, self.name)
            value = _read_exact(inp, vlen, self.name)
            if suffix == META_TAG:
                meta_value = value
                continue
            if suffix[:1] not in (BATCH_TAG, PRODUCER_TAG, ABORTED_TAG):
                raise StorageCorruptionError(f"{self.name}: snapshot holds unknown key {suffix!r}")
            if suffix[:1] == PRODUCER_TAG:
                txn_first = decode_entry(value, where=f"{self.name} snapshot entry").current_txn_first_offset
                if txn_first is not None:
                    open_firsts.append(txn_first)
            wb.put(self._prefix + suffix, value)
            pending += klen + vlen
            if pending >= _RESTORE_BATCH_BYTES:
                self._store.write(wb)
                wb, pending = self._store.new_batch(), 0
        meta, recorded = LogMeta(), True
        if meta_value is not None:
            meta, recorded = decode_meta(meta_value, where=f"{self.name} snapshot meta")
        if not recorded:  # a version-1 meta: derive what it predates (the load checks it)
            meta = replace(meta, first_unstable_offset=min(open_firsts, default=None))
        wb.put(self._meta_key, encode_meta(replace(meta, last_applied=last_applied)))
        wb.delete(self._restore_key)
        self._store.write(wb)
        self._load()

    def _prefix_end(self) -> bytes:
        # Our keys are prefix + one tag byte (+ u64), all tags < 0xff.
        return self._prefix + b"\xff"

    def destroy(self) -> None:
        """Delete every key of this partition (its topic was deleted)."""
        self._store.delete_prefix(self._prefix)
        self._producers.clear()
        self._last_aborted_offset = None
        self._meta = LogMeta()


def _read_exact(inp: BinaryIO, n: int, name: str) -> bytes:
    data = inp.read(n)
    if len(data) != n:
        raise StorageCorruptionError(f"{name}: snapshot truncated")
    return data
