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
``opens_transaction``, ``producer_entry``, ``ongoing_transactions``, ``oldest_batch_max_timestamp``,
``offset_for_timestamp`` and the properties may run concurrently on any other thread. That is safe
because (a) the in-memory summary (offsets, LSO) is one immutable ``LogMeta``
object whose reference is replaced only *after* its WriteBatch is written, so a
reader never sees an offset whose batch, marker or index entry is not yet in
RocksDB, and (b) a read iterates a RocksDB iterator, which pins a
point-in-time view (``storage.log_reader`` says how a read copes with
retention). There are no locks. A reader racing ``read_snapshot``/``destroy``
may get an error (never wrong data).

The read path is ``storage.log_reader``, the snapshot stream
``storage.log_snapshot``, the key layout ``storage.log_format``; this class
owns the state and applies the commands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import BinaryIO

from rocksdict import WriteBatch

from clients.protocol import (
    BatchFormat,
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
from storage.kafka_batch import parse_kafka_batch
from storage.log_format import LogMeta, PartitionKeys, decode_meta, encode_meta, encode_stored_batch_header
from storage.log_reader import LogReader, LogReadInfo
from storage.log_snapshot import check_snapshot_header, consistent_snapshot, restore_snapshot, write_snapshot
from storage.producer_state import (
    CarriedMarkerAction,
    EndTxnOutcome,
    ProducerStateEntry,
    ProducerStateManager,
    decode_entry,
    encode_entry,
)
from storage.store import NodeStore, stop_on_storage_failure
from storage.txn_index import AbortedTxn, encode_aborted_txn, next_aborted_txn

__all__ = ["LogReadInfo", "PartitionLog", "StorageCorruptionError"]

log = logging.getLogger(__name__)

ApplyResult = AppendResult | RetentionResult | TxnMarkerResult | RevokeResult | BrokerError | None


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
        self.name = name
        self._keys = PartitionKeys(prefix, name)
        self._reader = LogReader(store, self._keys, lambda: self._meta)
        self._meta = LogMeta()
        self._producers = ProducerStateManager()
        self._last_aborted_offset: int | None = None
        self._load()

    # -- loading ----------------------------------------------------------------

    def _load(self) -> None:
        """Read meta and producer state; check the ends of the log and the index agree with meta."""
        db = self._store.db
        if db.get(self._keys.restore) is not None:
            raise StorageCorruptionError(
                f"{self.name}: a snapshot restore was interrupted; destroy the partition "
                "and let Raft install a snapshot again"
            )
        raw = db.get(self._keys.meta)
        recorded = True
        if raw is None:
            for key, _value in self._store.iter_prefix(self._keys.prefix):
                raise StorageCorruptionError(f"{self.name}: key {key!r} exists but meta is missing")
            meta = LogMeta()
        else:
            meta, recorded = decode_meta(raw, where=f"{self.name} meta")
        entries = []
        for key, value in self._store.iter_prefix(self._keys.producer_prefix):
            where = f"{self.name} producer entry {key!r}"
            entry = decode_entry(value, where=where)
            if key != self._keys.producer(entry.producer_id):
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
        for entry in self._keys.iter_aborted(
            self._store.iter_range(self._keys.aborted_prefix, self._keys.batch_prefix, backwards=True)
        ):
            if entry.last_offset >= meta.next_offset:
                raise StorageCorruptionError(
                    f"{self.name}: aborted txn index ends at {entry.last_offset}, beyond the HW {meta.next_offset}"
                )
            return entry
        return None

    def _check_ends(self, meta: LogMeta) -> None:
        first = self._reader.edge_batch(backwards=False)
        last = self._reader.edge_batch(backwards=True)
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
        self._store.put(self._keys.meta, encode_meta(meta))
        self._meta = meta

    def _apply_append(self, index: int, cmd: AppendCommand) -> ApplyResult:
        if cmd.format is BatchFormat.KAFKA:
            header = parse_kafka_batch(cmd.batch, verify=False)
        else:
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
            self._keys.batch(base),
            b"".join((encode_stored_batch_header(base, cmd.log_append_time, cmd.format), cmd.batch)),
        )
        if entry is not None:
            wb.put(self._keys.producer(entry.producer_id), encode_entry(entry))
        return new_meta, AppendResult(base, last, cmd.log_append_time, False)

    def _commit(
        self, wb: WriteBatch, new_meta: LogMeta, entry: ProducerStateEntry | None, aborted: AbortedTxn | None = None
    ) -> None:
        """Write ``wb`` with ``new_meta``, then publish: readers must never see an HW ahead of RocksDB."""
        wb.put(self._keys.meta, encode_meta(new_meta))
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
        err = info.validate_marker(cmd.producer_epoch, cmd.coordinator_epoch, cmd.classic)
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
            wb.put(self._keys.batch(offset), encode_stored_batch_header(offset, cmd.timestamp_ms) + batch)
            if cmd.control_type is ControlType.ABORT:
                aborted = next_aborted_txn(
                    self._last_aborted_offset, AbortedTxn(pid, first, offset, new_meta.last_stable_offset)
                )
                wb.put(self._keys.aborted(offset), encode_aborted_txn(aborted))
        wb.put(self._keys.producer(pid), encode_entry(outcome.entry))
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
        wb.delete_range(self._keys.aborted(0), self._keys.aborted(log_start_offset))

    def _apply_retention(self, index: int, cmd: RetentionCommand) -> RetentionResult:
        meta = self._meta
        cutoff = cmd.now_ms - cmd.retention_ms
        size, count, start = meta.size_bytes, meta.batch_count, meta.log_start_offset
        deleted_bytes = 0
        wb = self._store.new_batch()
        for key, value in self._store.iter_prefix(self._keys.batch_prefix):
            batch = self._keys.decode_batch(key, value)
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
            wb.delete(self._keys.producer(pid))
        new_meta = replace(
            meta,
            log_start_offset=start,
            last_applied=index,
            size_bytes=size,
            batch_count=count,
            expired_producers=meta.expired_producers + len(expired),
        )
        wb.put(self._keys.meta, encode_meta(new_meta))
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
        for key, value in self._store.iter_prefix(self._keys.batch_prefix):
            batch = self._keys.decode_batch(key, value)
            if batch.last_offset >= target:
                break
            wb.delete(key)
            size -= len(batch.data)
            deleted_bytes += len(batch.data)
            count -= 1
        self._delete_aborted_below(wb, target)
        new_meta = replace(meta, log_start_offset=target, last_applied=index, size_bytes=size, batch_count=count)
        wb.put(self._keys.meta, encode_meta(new_meta))
        self._store.write(wb)
        self._meta = new_meta
        return RetentionResult(target, meta.batch_count - count, deleted_bytes)

    # -- reads (any thread; storage.log_reader) ----------------------------------------

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> list[StoredBatch]:
        """Batches overlapping ``[offset, min(upper_bound, HW))``, oldest first (``LogReader.read``)."""
        return self._reader.read(offset, max_bytes, upper_bound)

    def fetch(self, offset: int, max_bytes: int, *, read_committed: bool = False) -> LogReadInfo:
        """A consumer fetch bounded by the HW, or by the LSO for read_committed (``LogReader.fetch``)."""
        return self._reader.fetch(offset, max_bytes, read_committed=read_committed)

    def aborted_transactions(self, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """Index entries overlapping ``[fetch_offset, upper_bound_offset)`` (``LogReader.aborted_transactions``)."""
        return self._reader.aborted_transactions(fetch_offset, upper_bound_offset)

    def oldest_batch_max_timestamp(self) -> int | None:
        """Max timestamp of the oldest stored batch (None when empty), for retention."""
        return self._reader.oldest_batch_max_timestamp()

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """First offset with a record timestamp >= ``timestamp_ms``, else None (``LogReader.offset_for_timestamp``)."""
        return self._reader.offset_for_timestamp(timestamp_ms)

    def record_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with a timestamp >= ``timestamp_ms``, else None."""
        return self._reader.record_for_timestamp(timestamp_ms)

    # -- snapshots and lifecycle (Raft thread; stream format in storage.log_snapshot) -------------

    def write_snapshot(self, out: BinaryIO) -> None:
        """Every key of this partition (relative to the prefix) plus ``last_applied``."""
        write_snapshot(out, self._keys, self._meta.last_applied, self._store.iter_prefix(self._keys.prefix))

    def make_durable(self) -> None:
        """Every applied entry survives a machine crash (``DurableStateMachine``)."""
        self._store.make_durable()

    def consistent_snapshot(self) -> tuple[int, Callable[[BinaryIO], None]]:
        """``write_snapshot`` of one RocksDB view, safe to run on another thread while apply goes on.

        The state index is the view's own ``last_applied`` (read from the meta
        key through the same view), so header and pairs agree.
        """
        return consistent_snapshot(self._store, self._keys)

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        """Replace this partition's state with a ``write_snapshot`` stream.

        Raises ``StorageCorruptionError`` for a malformed stream; the partition
        is then marked as an interrupted restore until the next successful one.
        """
        check_snapshot_header(inp, self.name)
        self._meta = LogMeta(last_applied=self._meta.last_applied)
        self._producers.clear()
        self._last_aborted_offset = None
        restore_snapshot(self._store, self._keys, inp, last_applied)
        self._load()

    def destroy(self) -> None:
        """Delete every key of this partition (its topic was deleted)."""
        self._store.delete_prefix(self._keys.prefix)
        self._producers.clear()
        self._last_aborted_offset = None
        self._meta = LogMeta()
