"""Retention (age, bytes, producer expiration) and DeleteRecords, applied deterministically."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from clients.protocol import BrokerError, ErrorCode, Record, encode_batch
from storage.commands import AppendResult, RetentionResult, encode_append, encode_delete_records, encode_retention
from storage.partition_log import PartitionLog
from storage.store import NodeStore

PREFIX = b"P\x00\x00\x00\x02\x00\x00\x00\x00"


@pytest.fixture
def log(store: NodeStore) -> PartitionLog:
    return PartitionLog(store, PREFIX, "r-0")


def append(
    log: PartitionLog, *, ts: int, pid: int = -1, seq: int = -1, records: int = 2, size: int = 100
) -> AppendResult:
    batch = encode_batch(
        [Record(value=bytes(size), timestamp=ts) for _ in range(records)],
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=seq,
    )
    result = log.apply(log.last_applied + 1, encode_append(batch, ts))
    assert isinstance(result, AppendResult), result
    return result


def retention(log: PartitionLog, now: int, ms: int = -1, nbytes: int = -1, expiration: int = -1) -> RetentionResult:
    result = log.apply(log.last_applied + 1, encode_retention(now, ms, nbytes, expiration))
    assert isinstance(result, RetentionResult), result
    return result


def test_retention_by_age_deletes_only_old_batches(log: PartitionLog) -> None:
    for ts in (1000, 2000, 3000, 4000):
        append(log, ts=ts)
    per_batch = log.size_bytes // 4
    assert log.oldest_batch_max_timestamp() == 1000
    # cutoff = 4500 - 2000 = 2500: batches with max timestamp < 2500 go.
    result = retention(log, now=4500, ms=2000)
    assert result == RetentionResult(log_start_offset=4, deleted_batches=2, deleted_bytes=2 * per_batch)
    assert (log.log_start_offset, log.high_watermark, log.size_bytes) == (4, 8, 2 * per_batch)
    assert log.oldest_batch_max_timestamp() == 3000
    assert log.read(4, 1 << 20)[0].base_offset == 4


def test_retention_by_age_may_empty_the_log(log: PartitionLog) -> None:
    append(log, ts=1000)
    append(log, ts=1000)
    result = retention(log, now=10_000, ms=100)
    assert (result.log_start_offset, result.deleted_batches) == (4, 2)
    assert (log.log_start_offset, log.high_watermark, log.size_bytes) == (4, 4, 0)
    assert log.read(4, 100) == []
    assert append(log, ts=10_001).base_offset == 4  # offsets keep counting


def test_retention_by_age_stops_at_the_first_young_batch(log: PartitionLog) -> None:
    # Only a prefix of the log is deleted, even if later batches carry older timestamps.
    append(log, ts=5000)
    append(log, ts=1000)
    assert retention(log, now=6000, ms=2000).deleted_batches == 0


def test_retention_by_bytes_keeps_size_within_the_limit_but_never_the_active_batch(log: PartitionLog) -> None:
    for ts in range(5):
        append(log, ts=ts)
    per_batch = log.size_bytes // 5
    result = retention(log, now=10, nbytes=2 * per_batch + 1)
    assert (result.deleted_batches, result.log_start_offset) == (3, 6)
    assert log.size_bytes == 2 * per_batch
    result = retention(log, now=10, nbytes=0)
    assert result.deleted_batches == 1  # the last (active) batch stays
    assert (log.log_start_offset, log.size_bytes) == (8, per_batch)


def test_minus_one_disables_every_rule(log: PartitionLog) -> None:
    append(log, ts=1, pid=3, seq=0)
    assert retention(log, now=10**12) == RetentionResult(0, 0, 0, 0)
    assert log.producer_entry(3) is not None


def test_retention_is_a_deterministic_function_of_the_command(open_store: Callable[..., NodeStore]) -> None:
    # Two replicas applying the same commands end in the same state (DESIGN.md rule 1).
    states = []
    for name in ("a", "b"):
        replica = PartitionLog(open_store(name), PREFIX, "r-0")
        for ts in (100, 200, 300):
            append(replica, ts=ts, pid=1, seq=(ts // 100 - 1) * 2)
        retention(replica, now=350, ms=100, expiration=1000)
        states.append((replica.log_start_offset, replica.size_bytes, replica.producer_entries()))
    assert states[0] == states[1]


def test_idle_producers_expire(log: PartitionLog) -> None:
    # kafka_txn.md §3.1 rule 9: entries idle past producer.id.expiration.ms are removed.
    append(log, ts=1000, pid=1, seq=0)
    append(log, ts=5000, pid=2, seq=0)
    result = retention(log, now=6000, expiration=2000)
    assert result.expired_producers == 1
    assert log.producer_entry(1) is None
    assert log.producer_entry(2) is not None
    assert log.high_watermark == 4  # expiration deletes no records


def test_expired_producer_gets_unknown_producer_id(log: PartitionLog) -> None:
    # KIP-360: the state is gone, so a non-zero sequence cannot be checked; the
    # client bumps its epoch and restarts at 0, which is accepted.
    append(log, ts=1000, pid=1, seq=0)
    retention(log, now=10_000, expiration=100)
    batch = encode_batch([Record(value=b"x")], producer_id=1, producer_epoch=0, base_sequence=2)
    result = log.apply(log.last_applied + 1, encode_append(batch, 10_001))
    assert isinstance(result, BrokerError)
    assert result.error_code is ErrorCode.UNKNOWN_PRODUCER_ID
    assert append(log, ts=10_002, pid=1, seq=0).base_offset == 2


def test_retention_survives_reopen(store: NodeStore, open_store: Callable[..., NodeStore]) -> None:
    log = PartitionLog(store, PREFIX, "r-0")
    for ts in (1, 2, 3):
        append(log, ts=ts * 1000, pid=1, seq=(ts - 1) * 2)
    retention(log, now=2500, ms=0, expiration=10_000)
    before = (log.log_start_offset, log.high_watermark, log.size_bytes, log.last_applied, log.producer_entries())
    store.close()
    again = PartitionLog(open_store(), PREFIX, "r-0")
    assert (
        again.log_start_offset,
        again.high_watermark,
        again.size_bytes,
        again.last_applied,
        again.producer_entries(),
    ) == before


# -- DeleteRecords ------------------------------------------------------------------------


def test_delete_records_deletes_whole_batches_below_the_new_start(log: PartitionLog) -> None:
    for ts in range(4):
        append(log, ts=ts)  # batches at 0, 2, 4, 6
    per_batch = log.size_bytes // 4
    result = log.apply(log.last_applied + 1, encode_delete_records(5))
    assert result == RetentionResult(5, 2, 2 * per_batch)
    assert (log.log_start_offset, log.size_bytes) == (5, 2 * per_batch)
    assert log.read(5, 1 << 20)[0].base_offset == 4


def test_delete_records_never_moves_the_start_backwards(log: PartitionLog) -> None:
    append(log, ts=1)
    append(log, ts=2)
    log.apply(log.last_applied + 1, encode_delete_records(3))
    assert log.apply(log.last_applied + 1, encode_delete_records(1)) == RetentionResult(3, 0, 0)
    assert log.log_start_offset == 3


def test_delete_records_to_the_high_watermark(log: PartitionLog) -> None:
    append(log, ts=1)
    size = log.size_bytes
    assert log.apply(log.last_applied + 1, encode_delete_records(-1)) == RetentionResult(2, 1, size)
    assert (log.log_start_offset, log.size_bytes) == (2, 0)


@pytest.mark.parametrize("offset", [3, -2])
def test_delete_records_outside_the_log_is_offset_out_of_range(log: PartitionLog, offset: int) -> None:
    append(log, ts=1)
    result = log.apply(log.last_applied + 1, encode_delete_records(offset))
    assert isinstance(result, BrokerError)
    assert result.error_code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert log.log_start_offset == 0
    assert log.last_applied == 2
