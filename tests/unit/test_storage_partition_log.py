"""PartitionLog as a Raft state machine: apply idempotence, reopen, corruption, reads, snapshots."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Iterator

import pytest

from clients.protocol import BrokerError, ControlType, ErrorCode, Record, encode_batch, encode_control_batch
from storage.commands import AppendResult, encode_append, encode_delete_records
from storage.errors import StorageCorruptionError
from storage.partition_log import PartitionLog
from storage.store import NodeStore, StoreView

PREFIX = b"P\x00\x00\x00\x01\x00\x00\x00\x00"
OTHER = b"P\x00\x00\x00\x01\x00\x00\x00\x01"


def make_batch(pid: int = -1, epoch: int = -1, seq: int = -1, *, records: int = 1, size: int = 10) -> bytes:
    return encode_batch(
        [Record(value=bytes(size), timestamp=1000 + i) for i in range(records)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


@pytest.fixture
def make_log(store: NodeStore) -> Callable[..., PartitionLog]:
    def factory(prefix: bytes = PREFIX, s: NodeStore | None = None) -> PartitionLog:
        return PartitionLog(s or store, prefix, "t-0")

    return factory


def fill(log: PartitionLog, n: int, *, pid: int = 5, records: int = 2, size: int = 10) -> list[AppendResult]:
    """Append ``n`` idempotent batches of ``records`` records at the next Raft indexes."""
    out = []
    for i in range(n):
        cmd = encode_append(make_batch(pid, 0, i * records, records=records, size=size), 100 * (i + 1))
        result = log.apply(log.last_applied + 1, cmd)
        assert isinstance(result, AppendResult), result
        out.append(result)
    return out


# -- apply --------------------------------------------------------------------------


def test_offsets_are_assigned_at_apply_from_the_high_watermark(make_log: Callable[..., PartitionLog]) -> None:
    log = make_log()
    results = fill(log, 3, records=4)
    assert [(r.base_offset, r.last_offset) for r in results] == [(0, 3), (4, 7), (8, 11)]
    assert [r.log_append_time for r in results] == [100, 200, 300]
    assert log.high_watermark == log.last_stable_offset == 12
    assert log.last_applied == 3


def test_replay_of_an_applied_index_changes_nothing(make_log: Callable[..., PartitionLog]) -> None:
    # DESIGN.md rule 3: entries at or below last_applied are skipped.
    log = make_log()
    fill(log, 2)
    state = (log.high_watermark, log.size_bytes, log.producer_entry(5), log.last_applied)
    assert log.apply(1, encode_append(make_batch(-1, records=3), 999)) is None
    assert log.apply(2, encode_append(make_batch(5, 0, 4), 999)) is None
    assert (log.high_watermark, log.size_bytes, log.producer_entry(5), log.last_applied) == state


def test_noop_records_the_index_only(make_log: Callable[..., PartitionLog]) -> None:
    log = make_log()
    assert log.apply(7, b"\x00") is None
    assert (log.last_applied, log.high_watermark) == (7, 0)


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (b"", ErrorCode.INVALID_REQUEST),
        (b"\x7f", ErrorCode.INVALID_REQUEST),
        (b"\x01\x00", ErrorCode.INVALID_REQUEST),
        (b"\x03\x00\x00", ErrorCode.INVALID_REQUEST),
        (encode_append(b"\x02" + bytes(60), 1), ErrorCode.CORRUPT_MESSAGE),
        (encode_append(make_batch()[:-1], 1), ErrorCode.CORRUPT_MESSAGE),
    ],
    ids=["empty", "unknown-type", "truncated-append", "truncated-delete", "bad-crc", "truncated-batch"],
)
def test_bad_commands_are_answered_not_raised(
    make_log: Callable[..., PartitionLog], command: bytes, code: ErrorCode
) -> None:
    log = make_log()
    result = log.apply(1, command)
    assert isinstance(result, BrokerError)
    assert result.error_code is code
    assert (log.last_applied, log.high_watermark, log.size_bytes) == (1, 0, 0)


def test_control_batches_cannot_be_appended(make_log: Callable[..., PartitionLog]) -> None:
    marker = encode_control_batch(ControlType.COMMIT, producer_id=1, producer_epoch=0, coordinator_epoch=0, timestamp=1)
    result = make_log().apply(1, encode_append(marker, 1))
    assert isinstance(result, BrokerError)
    assert result.error_code is ErrorCode.INVALID_REQUEST


def test_apply_never_raises_even_when_storage_fails(store: NodeStore, make_log: Callable[..., PartitionLog]) -> None:
    log = make_log()
    store.close()
    result = log.apply(1, encode_append(make_batch(), 1))
    assert isinstance(result, BrokerError)
    assert result.error_code is ErrorCode.UNKNOWN_SERVER_ERROR
    assert log.high_watermark == 0


def test_partitions_with_different_prefixes_are_independent(make_log: Callable[..., PartitionLog]) -> None:
    a, b = make_log(PREFIX), make_log(OTHER)
    fill(a, 3)
    fill(b, 1)
    a.destroy()
    assert (a.high_watermark, a.last_applied) == (0, 0)
    assert b.high_watermark == 2
    assert len(b.read(0, 1 << 20)) == 1


# -- reopen -----------------------------------------------------------------------------


def test_reopen_restores_state_exactly(store: NodeStore, open_store: Callable[..., NodeStore]) -> None:
    log = PartitionLog(store, PREFIX, "t-0")
    fill(log, 4, pid=5)
    fill(log, 2, pid=6)
    log.apply(log.last_applied + 1, encode_delete_records(3))
    log.apply(log.last_applied + 1, b"\x00")
    before = (
        log.high_watermark,
        log.log_start_offset,
        log.size_bytes,
        log.last_applied,
        log.producer_entries(),
        log.read(3, 1 << 20),
    )
    store.close()
    again = PartitionLog(open_store(), PREFIX, "t-0")
    after = (
        again.high_watermark,
        again.log_start_offset,
        again.size_bytes,
        again.last_applied,
        again.producer_entries(),
        again.read(3, 1 << 20),
    )
    assert after == before
    # A duplicate is still recognised after the restart.
    dup = again.apply(again.last_applied + 1, encode_append(make_batch(6, 0, 2, records=2), 1))
    assert isinstance(dup, AppendResult)
    assert dup.duplicate


def test_a_fresh_partition_opens_empty(make_log: Callable[..., PartitionLog]) -> None:
    log = make_log()
    assert (log.high_watermark, log.log_start_offset, log.last_applied, log.size_bytes) == (0, 0, 0, 0)
    assert log.read(0, 100) == []
    assert log.oldest_batch_max_timestamp() is None


# -- corrupted bytes ----------------------------------------------------------------------


def _flip(store: NodeStore, key: bytes, pos: int) -> None:
    value = bytearray(store.db.get(key))
    value[pos] ^= 0x01
    store.db.put(key, bytes(value))


def _batch_key(base: int) -> bytes:
    return PREFIX + b"b" + struct.pack(">Q", base)


@pytest.mark.parametrize("pos", [0, 3, 12, 20, 21, 22, 30, 60, -1])
def test_flipped_byte_in_a_stored_batch_fails_the_read(
    make_log: Callable[..., PartitionLog], store: NodeStore, pos: int
) -> None:
    log = make_log()
    fill(log, 3)
    _flip(store, _batch_key(2), pos)
    assert len(log.read(0, 1)) == 1  # batches before the corrupt one still read
    with pytest.raises(BrokerError) as info:
        log.read(2, 1 << 20)
    assert info.value.error_code is ErrorCode.CORRUPT_MESSAGE
    assert "t-0 batch 2" in info.value.message


def test_truncated_stored_batch_fails_the_read(make_log: Callable[..., PartitionLog], store: NodeStore) -> None:
    log = make_log()
    fill(log, 2)
    for cut in (5, 21, 40):
        store.db.put(_batch_key(0), store.db.get(_batch_key(0))[:cut])
        with pytest.raises(BrokerError) as info:
            log.read(0, 1 << 20)
        assert info.value.error_code is ErrorCode.CORRUPT_MESSAGE


def test_corrupt_tail_batch_is_detected_on_load(make_log: Callable[..., PartitionLog], store: NodeStore) -> None:
    fill(make_log(), 3)
    _flip(store, _batch_key(4), 40)
    with pytest.raises(StorageCorruptionError, match="batch 4"):
        make_log()


@pytest.mark.parametrize("pos", [0, 1, 9, 20, 40, 49, -1])
def test_flipped_byte_in_meta_is_detected_on_load(
    make_log: Callable[..., PartitionLog], store: NodeStore, pos: int
) -> None:
    fill(make_log(), 2)
    _flip(store, PREFIX + b"m", pos)
    with pytest.raises(StorageCorruptionError, match="meta"):
        make_log()


def test_truncated_or_missing_meta_is_detected_on_load(make_log: Callable[..., PartitionLog], store: NodeStore) -> None:
    fill(make_log(), 2)
    meta = store.db.get(PREFIX + b"m")
    store.db.put(PREFIX + b"m", meta[:-3])
    with pytest.raises(StorageCorruptionError, match="meta"):
        make_log()
    store.db.delete(PREFIX + b"m")
    with pytest.raises(StorageCorruptionError, match="meta is missing"):
        make_log()


@pytest.mark.parametrize("pos", [0, 5, 30, -1])
def test_flipped_byte_in_a_producer_entry_is_detected_on_load(
    make_log: Callable[..., PartitionLog], store: NodeStore, pos: int
) -> None:
    fill(make_log(), 2, pid=5)
    _flip(store, PREFIX + b"s" + struct.pack(">Q", 5), pos)
    with pytest.raises(StorageCorruptionError, match="producer entry"):
        make_log()


def test_truncated_producer_entry_is_detected_on_load(make_log: Callable[..., PartitionLog], store: NodeStore) -> None:
    fill(make_log(), 2, pid=5)
    key = PREFIX + b"s" + struct.pack(">Q", 5)
    store.db.put(key, store.db.get(key)[:20])
    with pytest.raises(StorageCorruptionError, match="truncated"):
        make_log()


def test_producer_entry_under_the_wrong_key_is_detected(
    make_log: Callable[..., PartitionLog], store: NodeStore
) -> None:
    fill(make_log(), 1, pid=5)
    value = store.db.get(PREFIX + b"s" + struct.pack(">Q", 5))
    store.db.put(PREFIX + b"s" + struct.pack(">Q", 6), value)
    with pytest.raises(StorageCorruptionError, match="holds producer 5"):
        make_log()


def test_batch_under_the_wrong_key_is_detected(make_log: Callable[..., PartitionLog], store: NodeStore) -> None:
    log = make_log()
    fill(log, 2)
    store.db.put(_batch_key(2), store.db.get(_batch_key(0)))
    with pytest.raises(BrokerError, match="key says 2"):
        log.read(2, 100)


# -- reads ----------------------------------------------------------------------------------


@pytest.fixture
def ten_batches(make_log: Callable[..., PartitionLog]) -> PartitionLog:
    log = make_log()
    fill(log, 10, records=2, size=100)  # offsets 0..19, batch i holds 2i and 2i+1
    return log


def test_read_returns_batches_overlapping_the_offset(ten_batches: PartitionLog) -> None:
    batches = ten_batches.read(5, 1 << 20)
    assert [b.base_offset for b in batches] == [4, 6, 8, 10, 12, 14, 16, 18]
    assert batches[0].last_offset == 5
    assert batches[0].header.producer_id == 5
    assert batches[0].log_append_time == 300


def test_read_stops_at_max_bytes_but_returns_at_least_one_batch(ten_batches: PartitionLog) -> None:
    size = len(ten_batches.read(0, 1)[0].data)
    assert len(ten_batches.read(0, 0)) == 1
    assert len(ten_batches.read(0, size - 1)) == 1
    assert len(ten_batches.read(0, 3 * size)) == 3
    assert len(ten_batches.read(0, 3 * size + size - 1)) == 3


class _CountingIter:
    """A RocksDB iterator that counts the values read through it (each a whole blob read in a node)."""

    def __init__(self, it: object, values: list[bytes]) -> None:
        self._it, self._values = it, values

    def value(self) -> bytes:
        self._values.append(self._it.key())  # type: ignore[attr-defined]
        return self._it.value()  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._it, name)


def test_fetch_reads_no_batch_value_it_does_not_return(
    make_log: Callable[..., PartitionLog], store: NodeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make_log()
    fill(log, 6, records=2, size=100)
    size = len(log.read(0, 1)[0].data)
    read: list[bytes] = []
    real_view = store.view

    def counting_view(upper: bytes | None = None) -> StoreView:
        view = real_view(upper)
        view._it = _CountingIter(view._it, read)  # type: ignore[assignment]
        return view

    monkeypatch.setattr(store, "view", counting_view)
    info = log.fetch(0, 2 * size + size // 2, read_committed=True)
    assert [b.base_offset for b in info.batches] == [0, 2]
    batch_keys = [k for k in read if k.startswith(PREFIX + b"b")]
    assert len(batch_keys) == 2, "the third batch (would not fit) and no batch beyond the aborted index is read"
    assert info.aborted_transactions == []


def test_read_respects_the_upper_bound(ten_batches: PartitionLog) -> None:
    assert [b.base_offset for b in ten_batches.read(0, 1 << 20, upper_bound=5)] == [0, 2, 4]
    assert ten_batches.read(6, 1 << 20, upper_bound=6) == []
    assert len(ten_batches.read(0, 1 << 20, upper_bound=1000)) == 10


def test_read_at_the_high_watermark_is_empty(ten_batches: PartitionLog) -> None:
    assert ten_batches.read(20, 1 << 20) == []


@pytest.mark.parametrize("offset", [21, 1000, -1])
def test_read_outside_the_log_is_offset_out_of_range(ten_batches: PartitionLog, offset: int) -> None:
    with pytest.raises(BrokerError) as info:
        ten_batches.read(offset, 100)
    assert info.value.error_code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert info.value.extra == {"log_start_offset": 0, "high_watermark": 20}


def test_read_below_the_log_start_offset_is_offset_out_of_range(ten_batches: PartitionLog) -> None:
    ten_batches.apply(ten_batches.last_applied + 1, encode_delete_records(7))
    with pytest.raises(BrokerError) as info:
        ten_batches.read(6, 100)
    assert info.value.error_code is ErrorCode.OFFSET_OUT_OF_RANGE
    # The batch holding the log start offset is returned whole, as Kafka does.
    assert ten_batches.read(7, 1)[0].base_offset == 6


def test_stored_bytes_are_the_producers_bytes(make_log: Callable[..., PartitionLog]) -> None:
    log = make_log()
    batch = make_batch(-1, records=3)
    log.apply(1, encode_append(batch, 42))
    stored = log.read(0, 100)
    assert stored[0].data == batch
    assert log.size_bytes == len(batch)


# -- snapshots --------------------------------------------------------------------------------


def test_snapshot_round_trips_into_a_fresh_database(
    ten_batches: PartitionLog, open_store: Callable[..., NodeStore]
) -> None:
    ten_batches.apply(ten_batches.last_applied + 1, encode_delete_records(3))
    snap = io.BytesIO()
    ten_batches.write_snapshot(snap)
    other = open_store("other")
    restored = PartitionLog(other, b"Pxyz", "t-0")
    fill(restored, 1, pid=99)  # state the snapshot must replace
    snap.seek(0)
    restored.read_snapshot(snap, 77)
    assert restored.last_applied == 77
    assert (restored.high_watermark, restored.log_start_offset, restored.size_bytes) == (
        ten_batches.high_watermark,
        ten_batches.log_start_offset,
        ten_batches.size_bytes,
    )
    assert restored.producer_entries() == ten_batches.producer_entries()
    assert restored.read(3, 1 << 20) == ten_batches.read(3, 1 << 20)
    assert restored.producer_entry(99) is None
    other.close()
    assert PartitionLog(open_store("other"), b"Pxyz", "t-0").read(3, 1 << 20) == ten_batches.read(3, 1 << 20)


def test_consistent_snapshot_is_the_state_when_taken_even_while_apply_goes_on(
    ten_batches: PartitionLog, make_log: Callable[..., PartitionLog]
) -> None:
    before = io.BytesIO()
    ten_batches.write_snapshot(before)
    index, write = ten_batches.consistent_snapshot()
    assert index == ten_batches.last_applied
    fill(ten_batches, 3, pid=77)  # applied after the view was taken: not in the snapshot
    ten_batches.apply(ten_batches.last_applied + 1, encode_delete_records(5))
    snap = io.BytesIO()
    write(snap)
    assert snap.getvalue() == before.getvalue()
    target = make_log(OTHER)
    snap.seek(0)
    target.read_snapshot(snap, index)
    assert (target.high_watermark, target.log_start_offset, target.last_applied) == (20, 0, index)
    assert target.producer_entry(77) is None
    ten_batches.make_durable()  # fsyncs the WAL; nothing to observe but that it works on an open store


def test_empty_snapshot_round_trips(make_log: Callable[..., PartitionLog]) -> None:
    snap = io.BytesIO()
    make_log(PREFIX).write_snapshot(snap)
    target = make_log(OTHER)
    fill(target, 2)
    snap.seek(0)
    target.read_snapshot(snap, 5)
    assert (target.high_watermark, target.last_applied, target.producer_entries()) == (0, 5, [])


def test_truncated_snapshot_is_rejected_and_blocks_reopen(
    ten_batches: PartitionLog, make_log: Callable[..., PartitionLog]
) -> None:
    snap = io.BytesIO()
    ten_batches.write_snapshot(snap)
    target = make_log(OTHER)
    with pytest.raises(StorageCorruptionError, match="truncated"):
        target.read_snapshot(io.BytesIO(snap.getvalue()[:-100]), 5)
    with pytest.raises(StorageCorruptionError, match="interrupted"):
        make_log(OTHER)
    target.read_snapshot(io.BytesIO(snap.getvalue()), 5)  # a later complete restore heals it
    assert make_log(OTHER).high_watermark == 20


def test_snapshot_with_a_bad_header_is_rejected(make_log: Callable[..., PartitionLog]) -> None:
    with pytest.raises(StorageCorruptionError):
        make_log().read_snapshot(io.BytesIO(b"NOPE" + bytes(20)), 1)


def test_corrupt_batch_in_a_snapshot_is_detected_on_restore(
    ten_batches: PartitionLog, make_log: Callable[..., PartitionLog]
) -> None:
    buf = io.BytesIO()
    ten_batches.write_snapshot(buf)
    snap = bytearray(buf.getvalue())
    # Stream header 13 bytes, pair header 8, key b"b"+u64 9, stored header 21: flip a record byte.
    snap[13 + 8 + 9 + 21 + 60] ^= 0x01
    with pytest.raises(StorageCorruptionError, match="batch 0: batch CRC mismatch"):
        make_log(OTHER).read_snapshot(io.BytesIO(bytes(snap)), 5)


def test_a_read_the_disk_refuses_during_apply_stops_the_node(
    make_log: Callable[..., PartitionLog], store: NodeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Retention reads the log while it applies. Had the read's I/O error been answered as an error, this replica
    # would skip the entry while the others applied it. The fatal hook (os._exit in production) is replaced here,
    # and so is the read: a real disk cannot be made to fail a read on demand.
    from storage import store as store_module
    from storage.commands import encode_retention

    log = make_log()
    fill(log, 3)
    stops: list[str] = []

    def stop(path: str, exc: BaseException) -> None:
        stops.append(f"{path}: {exc}")
        raise SystemExit(74)

    def failing_read(prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        raise Exception("IO error: While reading a blob file: Input/output error")

    monkeypatch.setattr(store_module, "fatal_storage_error", stop)
    monkeypatch.setattr(store, "iter_prefix", failing_read)
    with pytest.raises(SystemExit):
        log.apply(log.last_applied + 1, encode_retention(10_000, 1, -1, -1))
    assert len(stops) == 1 and "IO error" in stops[0] and "t-0" in stops[0]
    assert log.last_applied == 3, "the entry is not recorded as applied"

    # Any other failure is the same on every replica: answered as an error, the entry recorded as applied.
    def buggy_read(prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        raise ValueError("not the disk")

    monkeypatch.setattr(store, "iter_prefix", buggy_read)
    res = log.apply(log.last_applied + 1, encode_retention(10_000, 1, -1, -1))
    assert isinstance(res, BrokerError) and res.error_code is ErrorCode.UNKNOWN_SERVER_ERROR
    assert log.last_applied == 4 and len(stops) == 1
