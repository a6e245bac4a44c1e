"""The read path of a partition log: ``read``, ``fetch`` with its aborted transactions, the oldest batch.

Terms as in ``storage.partition_log`` (high watermark, log start offset, last
stable offset, aborted-transaction index).

Thread-safety: any thread, concurrently with apply, without locks. Each read
takes the published ``LogMeta`` once (offsets that agree with each other and
whose batches are already in RocksDB), then iterates a RocksDB iterator,
which pins a point-in-time view. When retention removed the wanted batch
between the look at the log start offset and the creation of the iterator,
the read reports ``OFFSET_OUT_OF_RANGE``. ``fetch`` reads batches and
aborted-index entries through the *same* view (the index sorts just below
the batches, ``storage.log_format``), so retention cannot remove an entry of
a batch it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from clients.protocol import BrokerError, ErrorCode, StoredBatch
from storage.errors import StorageCorruptionError
from storage.kafka_batch import batch_records
from storage.log_format import STORED_HEADER_SIZE, LogMeta, PartitionKeys
from storage.store import NodeStore, StoreView
from storage.txn_index import AbortedTxn, collect_aborted

__all__ = ["LogReadInfo", "LogReader"]


def _through(pairs: Iterator[tuple[bytes, bytes]], last: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``pairs`` up to and including the key ``last``, without stepping the iterator past it."""
    for key, value in pairs:
        yield key, value
        if key >= last:
            return


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


class LogReader:
    """Reads one partition's batches and aborted-index entries; ``meta()`` returns the published ``LogMeta``."""

    def __init__(self, store: NodeStore, keys: PartitionKeys, meta: Callable[[], LogMeta]) -> None:
        self._store = store
        self._keys = keys
        self._meta = meta

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> list[StoredBatch]:
        """Batches overlapping ``[offset, min(upper_bound, HW))``, oldest first.

        The first batch is returned even when it is larger than ``max_bytes``
        (so a consumer always makes progress, as in Kafka); later batches only
        while the total stays within ``max_bytes``, and the read stops once a
        next batch as large as the last one taken would not fit (a batch's
        value is read whole from RocksDB's blob files, so one read and left
        out costs as much as one returned: with 1 MiB producer batches, as
        much again as the fetch). ``offset == HW`` gives [].
        Raises ``BrokerError(OFFSET_OUT_OF_RANGE)`` for an offset below the log
        start or above the HW, ``BrokerError(CORRUPT_MESSAGE)`` for bad bytes.
        """
        meta = self._meta()
        self._check_fetch_offset(offset, meta)
        end = meta.next_offset if upper_bound is None else min(upper_bound, meta.next_offset)
        if offset >= end:
            return []
        return self._read_batches(self._store.view(self._keys.batch(end)), offset, max_bytes, end)

    def fetch(self, offset: int, max_bytes: int, *, read_committed: bool = False) -> LogReadInfo:
        """A consumer fetch: ``read`` bounded by the HW, or by the LSO for read_committed.

        read_committed also answers the aborted transactions overlapping the
        returned batches (``aborted_transactions``), read through the same
        point-in-time view as the batches. An offset at or past the LSO (but
        within the log) gives no batches, as in Kafka. Errors as ``read``.
        """
        meta = self._meta()
        self._check_fetch_offset(offset, meta)
        lso = meta.last_stable_offset
        end = lso if read_committed else meta.next_offset
        batches: list[StoredBatch] = []
        aborted: list[tuple[int, int]] = []
        if offset < end:
            view = self._store.view(self._keys.batch(end))
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
        return self._collect_aborted(self._store.view(self._keys.batch_prefix), fetch_offset, upper_bound_offset)

    def edge_batch(self, *, backwards: bool) -> StoredBatch | None:
        """The first (or, ``backwards``, the last) stored batch; raises ``StorageCorruptionError``."""
        keys = self._keys
        for key, value in self._store.iter_range(keys.batch_prefix, keys.batch_end, backwards=backwards):
            return keys.decode_batch(key, value)
        return None

    def oldest_batch_max_timestamp(self) -> int | None:
        """Max timestamp of the oldest stored batch (None when empty), for retention."""
        try:
            first = self.edge_batch(backwards=False)
        except StorageCorruptionError as exc:
            raise BrokerError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from exc
        return None if first is None else first.header.max_timestamp

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The offset of ``record_for_timestamp`` (None when no record is that new)."""
        found = self.record_for_timestamp(timestamp_ms)
        return None if found is None else found[0]

    def record_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """Kafka's ListOffsets by timestamp: (offset, timestamp) of the first record at or above the log
        start whose timestamp is >= ``timestamp_ms``; None when no record is that new.

        The log keeps no time index: batches are scanned from the log start
        (each stored batch carries its max timestamp, so only the batch that
        holds the answer is decoded record by record, in either stored format). Control batches hold no
        records of the partition and are skipped. The scan reads one
        point-in-time view; callers run it off the event loop.
        """
        meta = self._meta()
        keys = self._keys
        view = self._store.view(keys.batch(meta.next_offset))
        pairs = view.range(keys.batch_prefix, keys.batch(meta.next_offset), floor=keys.batch(meta.log_start_offset))
        for key, value in pairs:
            try:
                batch = keys.decode_batch(key, value)
            except StorageCorruptionError as exc:
                raise BrokerError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from exc
            if batch.header.is_control or batch.last_offset < meta.log_start_offset:
                continue
            if batch.header.max_timestamp < timestamp_ms:
                continue
            for i, record in enumerate(batch_records(batch)):
                offset = batch.base_offset + i
                if offset >= meta.log_start_offset and record.timestamp >= timestamp_ms:
                    return offset, record.timestamp
        return None

    def _collect_aborted(self, view: StoreView, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The index entries for ``collect_aborted``, read forward from ``fetch_offset``.

        The index sorts just below the batches, so a forward read that runs
        off its end would land on a batch and read its whole value. The last
        entry is found first (a backward seek lands on a small value), and the
        read stops on it.
        """
        keys = self._keys
        last = view.last_key_below(keys.batch_prefix)
        first = keys.aborted(max(fetch_offset, 0))
        if last is None or last < first or not last.startswith(keys.aborted_prefix):
            return []
        try:
            return collect_aborted(keys.iter_aborted(_through(view.range(first, keys.batch_prefix), last)),
                                   fetch_offset, upper_bound_offset)  # fmt: skip
        except StorageCorruptionError as exc:
            raise BrokerError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from exc

    def _check_fetch_offset(self, offset: int, meta: LogMeta) -> None:
        if offset < meta.log_start_offset or offset > meta.next_offset:
            raise self._out_of_range(offset, meta)

    def _read_batches(self, view: StoreView, offset: int, max_bytes: int, end: int) -> list[StoredBatch]:
        """Batches overlapping ``[offset, end)`` (``offset < end``) as ``read`` describes."""
        keys = self._keys
        batches = view.range(keys.batch_prefix, keys.batch(end), floor=keys.batch(offset))
        out: list[StoredBatch] = []
        total = 0
        for key, value in batches:
            if out and total + len(value) - STORED_HEADER_SIZE > max_bytes:
                break  # checked before decoding: a batch we do not return is not verified
            try:
                batch = keys.decode_batch(key, value)
            except StorageCorruptionError as exc:
                raise BrokerError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from exc
            if batch.last_offset < offset:
                continue
            if not out and batch.base_offset > offset:
                break  # the batch holding `offset` is gone: reported below
            out.append(batch)
            total += len(batch.data)
            if total + len(batch.data) > max_bytes:
                break  # the next batch, were it as large, would not fit: not read for nothing (``read``)
        if not out:
            current = self._meta()
            if offset < current.log_start_offset:
                raise self._out_of_range(offset, current)  # retention won the race
            raise BrokerError(
                ErrorCode.CORRUPT_MESSAGE,
                f"{keys.name}: no batch holds offset {offset} "
                f"(log start {current.log_start_offset}, HW {current.next_offset})",
            )
        return out

    def _out_of_range(self, offset: int, meta: LogMeta) -> BrokerError:
        return BrokerError(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"{self._keys.name}: offset {offset} is outside [{meta.log_start_offset}, {meta.next_offset}]",
            log_start_offset=meta.log_start_offset,
            high_watermark=meta.next_offset,
        )
