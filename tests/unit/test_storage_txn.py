"""The partition side of transactions on a real RocksDB (kafka_txn.md §3.1 rule 7, §4.3 WriteTxnMarkers, §7).

Each test cites the rule it guards; §14 items 11-14 are the named scenarios.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Iterator

import crc32c
import pytest

from clients.protocol import BrokerError, ControlType, ErrorCode, control_type_of, decode_records, parse_batch
from storage.commands import (
    RetentionResult,
    TxnMarkerCommand,
    TxnMarkerResult,
    decode_command,
    encode_delete_records,
    encode_retention,
    encode_txn_marker,
)
from storage.errors import StorageCorruptionError
from storage.partition_log import PartitionLog
from storage.store import NodeStore
from storage.txn_index import AbortedTxn, collect_aborted, encode_aborted_txn, next_aborted_txn
from tests.support.partition_txn import TxnLog, make_batch, read_committed

PREFIX = b"P\x00\x00\x00\x07\x00\x00\x00\x00"
OTHER = b"P\x00\x00\x00\x07\x00\x00\x00\x01"
A, B, C = 100, 200, 300
COMMIT, ABORT = ControlType.COMMIT, ControlType.ABORT


@pytest.fixture
def make_log(store: NodeStore) -> Callable[..., PartitionLog]:
    def factory(prefix: bytes = PREFIX) -> PartitionLog:
        return PartitionLog(store, prefix, "t-0")

    return factory


@pytest.fixture
def txn(make_log: Callable[..., PartitionLog]) -> TxnLog:
    return TxnLog(make_log())


def error_of(result: object) -> ErrorCode:
    assert isinstance(result, BrokerError), result
    return result.error_code


def state(log: PartitionLog) -> tuple[object, ...]:
    return (
        log.high_watermark,
        log.last_stable_offset,
        log.log_start_offset,
        log.size_bytes,
        log.batch_count,
        log.producer_entries(),
        log.ongoing_transactions(),
        log.aborted_transactions(0, 2**62),
    )


# -- transactional appends (§3.1 rule 7, §13 "Partition leader") ---------------------------


def test_first_transactional_batch_opens_a_txn_and_pins_the_lso(txn: TxnLog) -> None:
    txn.plain(records=3)
    first = txn.ok(A, 0, 0, records=2, txn=True)
    txn.ok(A, 0, 2, records=2, txn=True)  # later batches join the open txn
    txn.plain()
    entry = txn.log.producer_entry(A)
    assert entry is not None
    assert entry.current_txn_first_offset == first.base_offset == 3
    assert entry.current_txn_start_time == first.log_append_time
    assert txn.log.ongoing_transactions() == [(A, 3)]
    assert (txn.log.last_stable_offset, txn.log.high_watermark) == (3, 8)


def test_non_transactional_write_during_a_txn_is_invalid_txn_state(txn: TxnLog) -> None:
    # §14 item 14 / §3.1 rule 7 (ProducerStateManagerTest "non-txn append during a txn").
    txn.ok(A, 0, 0, txn=True)
    before = state(txn.log)
    assert error_of(txn.send(A, 0, 1)) is ErrorCode.INVALID_TXN_STATE
    assert state(txn.log) == before
    # Other producers and plain writes are unaffected.
    txn.ok(B, 0, 0)
    txn.plain()


def test_sequence_errors_take_precedence_over_the_txn_state(txn: TxnLog) -> None:
    # Kafka validates epoch and sequence before the transaction state.
    txn.ok(A, 1, 0, txn=True)
    assert error_of(txn.send(A, 0, 1)) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert error_of(txn.send(A, 1, 5)) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_new_epoch_cannot_join_a_txn_whose_marker_has_not_landed(txn: TxnLog) -> None:
    # TV2: (pid, epoch) is one transaction, so epoch 1 data waits for epoch 0's marker.
    txn.ok(A, 0, 0, txn=True)
    result = txn.send(A, 1, 0, txn=True)
    assert error_of(result) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert isinstance(result, BrokerError) and result.retriable
    txn.end(A, 1, COMMIT)
    assert txn.ok(A, 1, 0, txn=True).base_offset == 2


def test_transactional_batch_after_the_marker_opens_a_new_txn(txn: TxnLog) -> None:
    txn.ok(A, 0, 0, txn=True)
    txn.end(A, 1, COMMIT)
    second = txn.ok(A, 1, 0, txn=True)
    assert txn.log.ongoing_transactions() == [(A, second.base_offset)]
    assert txn.log.last_stable_offset == second.base_offset


def test_opens_transaction_tells_the_leader_which_batches_need_verification(txn: TxnLog) -> None:
    # KIP-890: only a batch that would open a transaction here is checked with the coordinator.
    def opens(pid: int, epoch: int, txn_flag: bool = True) -> bool:
        return txn.log.opens_transaction(parse_batch(make_batch(pid, epoch, 0, txn=txn_flag)))

    assert opens(A, 0)
    assert not opens(A, 0, txn_flag=False)
    txn.ok(A, 0, 0, txn=True)
    assert not opens(A, 0)
    assert opens(A, 1)  # a new epoch is a new transaction
    txn.end(A, 1, COMMIT)
    assert opens(A, 1)


# -- markers (§4.3 WriteTxnMarkers, §7.1 control records) -----------------------------------


def test_commit_marker_appends_a_control_batch_and_releases_the_lso(txn: TxnLog) -> None:
    txn.ok(A, 0, 0, records=2, txn=True)
    result = txn.end(A, 1, COMMIT, coordinator_epoch=7)
    assert result == TxnMarkerResult(COMMIT, 2, 0, result.log_append_time)
    assert (txn.log.high_watermark, txn.log.last_stable_offset) == (3, 3)
    assert txn.log.ongoing_transactions() == []
    (marker,) = txn.log.read(2, 1 << 20)
    assert marker.header.is_control and marker.header.is_transactional
    assert (marker.header.producer_id, marker.header.producer_epoch) == (A, 1)
    assert control_type_of(marker.data) is COMMIT
    (record,) = decode_records(marker.data)
    assert record.value == b"\x00\x00\x00\x00\x00\x07"  # version 0, coordinator epoch 7 (§7.1)
    assert txn.log.aborted_transactions(0, 10) == []


def test_abort_marker_records_an_aborted_txn_entry(txn: TxnLog) -> None:
    txn.ok(A, 0, 0, txn=True)  # 0
    txn.ok(B, 0, 0, txn=True)  # 1
    txn.plain()  # 2
    txn.end(A, 1, ABORT)  # 3; B still open at 1
    assert txn.log.aborted_transactions(0, 10) == [AbortedTxn(A, 0, 3, 1)]
    txn.end(B, 1, ABORT)  # 4
    assert txn.log.aborted_transactions(0, 10) == [AbortedTxn(A, 0, 3, 1), AbortedTxn(B, 1, 4, 5)]


def test_lso_evolution_matches_kafkas_first_unstable_offset_test(txn: TxnLog) -> None:
    # §14 item 12 (testFirstUnstableOffset): A starts at 99, B at 105, A commits at 109,
    # B aborts at 112. A marker applied here is committed at once, so the LSO moves to
    # the first undecided offset as soon as the marker is applied.
    txn.plain(records=99)
    assert txn.ok(A, 0, 0, txn=True).base_offset == 99
    assert (txn.log.high_watermark, txn.log.last_stable_offset) == (100, 99)
    txn.plain(records=5)
    assert txn.ok(B, 0, 0, records=4, txn=True).base_offset == 105
    assert txn.log.last_stable_offset == 99
    assert txn.end(A, 1, COMMIT).offset == 109
    assert (txn.log.high_watermark, txn.log.last_stable_offset) == (110, 105)
    txn.plain(records=2)
    assert txn.end(B, 1, ABORT).offset == 112
    assert (txn.log.high_watermark, txn.log.last_stable_offset) == (113, 113)
    assert txn.log.aborted_transactions(0, 113) == [AbortedTxn(B, 105, 112, 113)]


def test_coordinator_epoch_fencing_survives_restart_and_snapshot(
    txn: TxnLog, store: NodeStore, open_store: Callable[..., NodeStore]
) -> None:
    # §14 item 13: marker with coordinator epoch 1, then 2 OK, then 1 -> TRANSACTION_COORDINATOR_FENCED.
    txn.ok(A, 0, 0, txn=True)
    txn.end(A, 1, COMMIT, coordinator_epoch=1)
    txn.ok(A, 1, 0, txn=True)
    txn.end(A, 2, COMMIT, coordinator_epoch=2)
    txn.ok(A, 2, 0, txn=True)
    before = state(txn.log)
    assert error_of(txn.marker(A, 3, COMMIT, coordinator_epoch=1)) is ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert state(txn.log) == before
    snap = io.BytesIO()
    txn.log.write_snapshot(snap)
    store.close()
    for log in (PartitionLog(open_store(), PREFIX, "t-0"), PartitionLog(open_store("other"), OTHER, "t-0")):
        if log.high_watermark == 0:
            snap.seek(0)
            log.read_snapshot(snap, 50)
        again = TxnLog(log)
        assert error_of(again.marker(A, 3, COMMIT, coordinator_epoch=1)) is ErrorCode.TRANSACTION_COORDINATOR_FENCED
        assert again.end(A, 3, COMMIT, coordinator_epoch=2).offset == 5


def test_marker_with_an_older_producer_epoch_is_invalid_producer_epoch(txn: TxnLog) -> None:
    # §4.3 / ProducerStateManagerTest "old-epoch marker -> InvalidProducerEpoch".
    txn.ok(A, 3, 0, txn=True)
    before = state(txn.log)
    assert error_of(txn.marker(A, 2, ABORT)) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert state(txn.log) == before


def test_tv2_marker_with_the_data_epoch_is_rejected_while_the_txn_is_open(txn: TxnLog) -> None:
    # §4.3 TV2: marker epoch must be > current; equal only as an idempotent retry with no txn open.
    txn.ok(A, 3, 0, txn=True)
    assert error_of(txn.marker(A, 3, COMMIT)) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert txn.log.last_stable_offset == 0


def test_retried_marker_appends_nothing(txn: TxnLog) -> None:
    # Coordinators resend markers until applied (§4.3), so a repeat must be harmless.
    txn.ok(A, 0, 0, txn=True)
    first = txn.end(A, 1, ABORT, coordinator_epoch=4)
    before = state(txn.log)
    again = txn.end(A, 1, ABORT, coordinator_epoch=4)
    assert (first.offset, again.offset, again.txn_first_offset) == (1, None, None)
    after = state(txn.log)
    assert after[:5] == before[:5] and after[6:] == before[6:]
    entry = txn.log.producer_entry(A)
    assert entry is not None and (entry.producer_epoch, entry.coordinator_epoch) == (1, 4)


def test_stale_marker_retry_cannot_end_the_next_txn(txn: TxnLog) -> None:
    # KAFKA-17754 class (§12): the epoch-1 marker of txn 1, replayed after txn 2 began
    # at epoch 1, must not commit txn 2.
    txn.ok(A, 0, 0, txn=True)
    txn.end(A, 1, COMMIT)
    txn.ok(A, 1, 0, txn=True)
    assert error_of(txn.marker(A, 1, COMMIT)) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert txn.log.ongoing_transactions() == [(A, 2)]


def test_marker_without_an_open_txn_records_epochs_only(txn: TxnLog) -> None:
    # A partition in the txn that never got data: no control batch, but the fencing sticks
    # (testProducerStateAfterFencingAbortMarker) and a late produce is rejected (§14 item 23).
    txn.ok(A, 0, 0, txn=True)
    txn.end(A, 1, ABORT)
    txn.plain()
    hw = txn.log.high_watermark
    result = txn.end(A, 2, ABORT, coordinator_epoch=3)
    assert (result.offset, txn.log.high_watermark) == (None, hw)
    entry = txn.log.producer_entry(A)
    assert entry is not None and (entry.producer_epoch, entry.coordinator_epoch) == (2, 3)
    assert error_of(txn.send(A, 1, 0, txn=True)) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert error_of(txn.marker(A, 3, ABORT, coordinator_epoch=2)) is ErrorCode.TRANSACTION_COORDINATOR_FENCED


def test_marker_for_an_unknown_producer_creates_its_fencing_state(txn: TxnLog) -> None:
    # ProducerStateManagerTest "a marker with no prior state".
    result = txn.end(C, 5, ABORT, coordinator_epoch=2)
    assert (result.offset, txn.log.high_watermark) == (None, 0)
    entry = txn.log.producer_entry(C)
    assert entry is not None and (entry.producer_epoch, entry.coordinator_epoch, entry.batches) == (5, 2, ())
    assert error_of(txn.send(C, 4, 0)) is ErrorCode.INVALID_PRODUCER_EPOCH
    txn.ok(C, 5, 0)


def test_control_record_bumps_the_epoch_and_resets_sequences(txn: TxnLog) -> None:
    # testControlRecordBumpsProducerEpoch / testOutOfSequenceAfterControlRecordEpochBump.
    txn.ok(A, 0, 0, txn=True)
    txn.ok(A, 0, 1, txn=True)
    txn.end(A, 1, COMMIT)
    entry = txn.log.producer_entry(A)
    assert entry is not None and (entry.producer_epoch, entry.batches) == (1, ())
    assert error_of(txn.send(A, 1, 2, txn=True)) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert error_of(txn.send(A, 0, 2, txn=True)) is ErrorCode.INVALID_PRODUCER_EPOCH
    txn.ok(A, 1, 0, txn=True)


def test_replayed_marker_index_changes_nothing(txn: TxnLog) -> None:
    # DESIGN.md rule 3: entries at or below last_applied are skipped.
    txn.ok(A, 0, 0, txn=True)
    txn.end(A, 1, ABORT)
    before = state(txn.log)
    assert txn.log.apply(txn.log.last_applied, encode_txn_marker(A, 2, 0, COMMIT, 5)) is None
    assert state(txn.log) == before


def test_txn_marker_command_round_trips_and_rejects_bad_fields() -> None:
    cmd = decode_command(encode_txn_marker(A, 3, 9, ABORT, 1234))
    assert cmd == TxnMarkerCommand(A, 3, 9, ABORT, 1234)
    good = encode_txn_marker(A, 3, 9, COMMIT, 1)
    unknown_type = good[:15] + b"\x07" + good[16:]
    no_epoch = b"\x04" + bytes(8) + b"\xff\xff" + good[11:]
    for bad in (good[:-1], good + b"\x00", unknown_type, no_epoch):
        with pytest.raises(BrokerError) as info:
            decode_command(bad)
        assert info.value.error_code is ErrorCode.INVALID_REQUEST
    for args in ((-1, 0, 0), (A, -1, 0), (A, 2**15, 0), (A, 0, -1)):
        with pytest.raises(ValueError, match="bad"):
            encode_txn_marker(*args, COMMIT, 1)


def test_malformed_marker_is_answered_not_raised(txn: TxnLog) -> None:
    good = encode_txn_marker(A, 3, 9, COMMIT, 1)
    assert error_of(txn.log.apply(1, good[:-2])) is ErrorCode.INVALID_REQUEST
    assert (txn.log.last_applied, txn.log.high_watermark) == (1, 0)


# -- read path (§7.2 TXN_COMMITTED bound, §7.4 aborted transactions in the fetch) ------------


def test_read_committed_fetch_stops_at_the_lso(txn: TxnLog) -> None:
    txn.plain(records=2)  # 0-1
    txn.ok(A, 0, 0, txn=True)  # 2: pins the LSO
    txn.plain()  # 3: another producer's record, hidden behind the open txn (§7.4)
    committed = txn.log.fetch(0, 1 << 20, read_committed=True)
    assert [b.base_offset for b in committed.batches] == [0]
    assert (committed.upper_bound, committed.last_stable_offset, committed.high_watermark) == (2, 2, 4)
    assert txn.log.fetch(2, 1 << 20, read_committed=True).batches == []
    assert txn.log.fetch(3, 1 << 20, read_committed=True).batches == []  # past the LSO: empty, not an error
    uncommitted = txn.log.fetch(0, 1 << 20)
    assert [b.base_offset for b in uncommitted.batches] == [0, 2, 3]
    assert uncommitted.upper_bound == 4
    txn.end(A, 1, COMMIT)
    assert [v for _o, v in read_committed(txn.log, 0)] == [b"r0", b"r1", b"r0", b"r0"]


def test_fetch_returns_the_aborted_txns_of_the_returned_range(txn: TxnLog) -> None:
    # §14 item 17 shape: A x1, B y1 y2, A x2, B aborts, A commits.
    txn.ok(A, 0, 0, txn=True)  # 0 x1
    txn.ok(B, 0, 0, txn=True)  # 1 y1
    txn.ok(B, 0, 1, txn=True)  # 2 y2
    txn.ok(A, 0, 1, txn=True)  # 3 x2
    txn.end(B, 1, ABORT)  # 4
    txn.end(A, 1, COMMIT)  # 5
    info = txn.log.fetch(0, 1 << 20, read_committed=True)
    assert info.aborted_transactions == [(B, 1)]
    assert txn.log.fetch(0, 1 << 20).aborted_transactions == []  # read_uncommitted: none
    assert [o for o, _v in read_committed(txn.log, 0)] == [0, 3]
    assert [o for o, _v in read_committed(txn.log, 0, max_bytes=1)] == [0, 3]  # one batch per fetch
    # A fetch that stops before B's txn starts carries no entry for it.
    one = txn.log.fetch(0, 1, read_committed=True)
    assert ([b.base_offset for b in one.batches], one.aborted_transactions) == ([0], [])
    # A fetch starting after B's marker carries none either.
    assert txn.log.fetch(5, 1 << 20, read_committed=True).aborted_transactions == []


def test_aborted_index_lookup_cases_from_kafkas_transaction_index_test() -> None:
    # §14 item 11 (TransactionIndexTest.collectAbortedTxns).
    entries = [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13), AbortedTxn(2, 18, 35, 25), AbortedTxn(3, 32, 50, 40)]
    assert collect_aborted(entries, 0, 32) == entries[:3]
    assert collect_aborted(entries, 11, 35) == entries[1:]
    assert collect_aborted(entries, 20, 41) == entries[2:]


def test_aborted_index_last_offsets_must_increase() -> None:
    # §14 item 11 / testLastOffsetMustIncrease, testLastOffsetCannotDecrease.
    assert next_aborted_txn(None, AbortedTxn(1, 0, 5, 6)) == AbortedTxn(1, 0, 5, 6)
    for previous in (5, 6):
        with pytest.raises(ValueError, match="does not follow"):
            next_aborted_txn(previous, AbortedTxn(1, 0, 5, 6))
    with pytest.raises(ValueError, match="inconsistent"):
        next_aborted_txn(None, AbortedTxn(1, 6, 5, 6))


def test_collect_stops_at_the_first_entry_stable_past_the_upper_bound() -> None:
    def entries() -> Iterator[AbortedTxn]:
        yield AbortedTxn(1, 0, 3, 4)
        yield AbortedTxn(2, 5, 8, 9)
        raise AssertionError("read past an entry whose LSO covers the upper bound")

    assert collect_aborted(entries(), 0, 9) == [AbortedTxn(1, 0, 3, 4), AbortedTxn(2, 5, 8, 9)]


# -- retention and producer expiration -----------------------------------------------------


def aborted_log(txn: TxnLog) -> None:
    """Offsets: A 0, marker 1 (aborted); B 2, plain 3, marker 4 (aborted); plain 5."""
    txn.ok(A, 0, 0, txn=True)
    txn.end(A, 1, ABORT)
    txn.ok(B, 0, 0, txn=True)
    txn.plain()
    txn.end(B, 1, ABORT)
    txn.plain()


def test_delete_records_drops_index_entries_wholly_below_the_log_start(txn: TxnLog) -> None:
    aborted_log(txn)
    txn.log.apply(txn.log.last_applied + 1, encode_delete_records(3))
    assert txn.log.log_start_offset == 3
    assert txn.log.aborted_transactions(0, 100) == [AbortedTxn(B, 2, 4, 5)]  # B overlaps the new start: kept
    txn.log.apply(txn.log.last_applied + 1, encode_delete_records(5))
    assert txn.log.aborted_transactions(0, 100) == []


def test_retention_drops_index_entries_wholly_below_the_log_start(txn: TxnLog) -> None:
    aborted_log(txn)
    result = txn.log.apply(txn.log.last_applied + 1, encode_retention(10_000, -1, 1, -1))
    assert isinstance(result, RetentionResult)
    assert result.log_start_offset == 5  # everything but the newest batch
    assert txn.log.aborted_transactions(0, 100) == []


def test_lso_never_falls_below_the_log_start(txn: TxnLog) -> None:
    txn.ok(A, 0, 0, txn=True)  # 0: open
    txn.plain(records=3)  # 1-3
    txn.log.apply(txn.log.last_applied + 1, encode_delete_records(2))
    assert (txn.log.log_start_offset, txn.log.last_stable_offset) == (2, 2)
    assert txn.log.fetch(2, 1 << 20, read_committed=True).batches == []
    txn.end(A, 1, ABORT)  # 4
    assert txn.log.aborted_transactions(2, 100) == [AbortedTxn(A, 0, 4, 5)]
    assert [o for o, _v in read_committed(txn.log, 2)] == [2, 3]


def test_producer_with_an_open_txn_never_expires(txn: TxnLog) -> None:
    # §3.1 rule 9 (testProducersWithOngoingTransactionsDontExpire): expiring it would unpin the LSO.
    txn.ok(A, 0, 0, txn=True)
    txn.ok(B, 0, 0)
    result = txn.log.apply(txn.log.last_applied + 1, encode_retention(10**9, -1, -1, 1000))
    assert isinstance(result, RetentionResult) and result.expired_producers == 1
    assert txn.log.producer_entry(B) is None
    assert txn.log.producer_entry(A) is not None
    assert txn.log.last_stable_offset == 0
    txn.end(A, 1, COMMIT)
    txn.log.apply(txn.log.last_applied + 1, encode_retention(2 * 10**9, -1, -1, 1000))
    assert txn.log.producer_entry(A) is None


# -- persistence -----------------------------------------------------------------------------


def busy_log(txn: TxnLog) -> None:
    aborted_log(txn)
    txn.ok(C, 0, 0, txn=True)  # open
    txn.ok(A, 1, 0, txn=True)  # open
    txn.end(A, 2, COMMIT, coordinator_epoch=6)


def test_reopen_restores_txn_state_exactly(txn: TxnLog, store: NodeStore, open_store: Callable[..., NodeStore]) -> None:
    busy_log(txn)
    before = state(txn.log)
    committed = read_committed(txn.log, 0)
    store.close()
    log = PartitionLog(open_store(), PREFIX, "t-0")
    assert state(log) == before
    assert read_committed(log, 0) == committed
    assert log.last_stable_offset == 6
    TxnLog(log).end(C, 1, ABORT)
    assert log.aborted_transactions(6, 100) == [AbortedTxn(C, 6, 9, 10)]


def test_snapshot_carries_txn_state(txn: TxnLog, make_log: Callable[..., PartitionLog]) -> None:
    busy_log(txn)
    snap = io.BytesIO()
    txn.log.write_snapshot(snap)
    target = make_log(OTHER)
    TxnLog(target).ok(C, 0, 0, txn=True)  # state the snapshot must replace
    snap.seek(0)
    target.read_snapshot(snap, 99)
    assert state(target) == state(txn.log)
    assert target.last_applied == 99
    assert read_committed(target, 0) == read_committed(txn.log, 0)


# -- corrupted bytes -------------------------------------------------------------------------


def aborted_key(prefix: bytes, last_offset: int) -> bytes:
    return prefix + b"a" + last_offset.to_bytes(8, "big")


def flip(store: NodeStore, key: bytes, pos: int, mask: int) -> None:
    value = store.db.get(key)
    assert isinstance(value, bytes)
    corrupt = bytearray(value)
    corrupt[pos] ^= mask
    store.db[key] = bytes(corrupt)


@pytest.mark.parametrize("pos", [0, 1, 9, 20, 33, 36])
def test_flipped_byte_in_the_newest_index_entry_is_detected_on_load(
    txn: TxnLog, make_log: Callable[..., PartitionLog], store: NodeStore, pos: int
) -> None:
    aborted_log(txn)
    flip(store, aborted_key(PREFIX, 4), pos, 0x10)
    with pytest.raises(StorageCorruptionError):
        make_log()


def test_flipped_byte_in_an_older_index_entry_fails_the_fetch(txn: TxnLog, store: NodeStore) -> None:
    aborted_log(txn)
    flip(store, aborted_key(PREFIX, 1), 12, 0x01)
    with pytest.raises(BrokerError) as info:
        txn.log.fetch(0, 1 << 20, read_committed=True)
    assert info.value.error_code is ErrorCode.CORRUPT_MESSAGE
    assert txn.log.fetch(2, 1 << 20, read_committed=True).aborted_transactions == [(B, 2)]


def test_index_entry_under_the_wrong_key_is_detected(
    txn: TxnLog, make_log: Callable[..., PartitionLog], store: NodeStore
) -> None:
    aborted_log(txn)
    store.db[aborted_key(PREFIX, 5)] = store.db[aborted_key(PREFIX, 4)]
    with pytest.raises(StorageCorruptionError, match="key says 5"):
        make_log()


def test_index_entry_beyond_the_high_watermark_is_detected(
    txn: TxnLog, make_log: Callable[..., PartitionLog], store: NodeStore
) -> None:
    aborted_log(txn)
    store.db[aborted_key(PREFIX, 50)] = encode_aborted_txn(AbortedTxn(A, 40, 50, 51))
    with pytest.raises(StorageCorruptionError, match="beyond the HW"):
        make_log()


def test_meta_disagreeing_with_the_open_txns_is_detected(
    txn: TxnLog, make_log: Callable[..., PartitionLog], store: NodeStore
) -> None:
    # The LSO is persisted in meta and derived from the producer entries: a lost entry shows.
    txn.ok(A, 0, 0, txn=True)
    txn.ok(B, 0, 0, txn=True)
    del store.db[PREFIX + b"s" + A.to_bytes(8, "big")]
    with pytest.raises(StorageCorruptionError, match="first unstable offset"):
        make_log()


def test_version_1_meta_and_entries_still_load(
    txn: TxnLog, make_log: Callable[..., PartitionLog], store: NodeStore
) -> None:
    # Partitions written before transactions: meta v1 (no first unstable offset) and
    # producer entries v1 (no txn start time) load, and the LSO is derived.
    txn.plain(records=2)
    txn.ok(A, 0, 0, records=3)
    before = state(txn.log)
    meta = txn.log.high_watermark, txn.log.last_applied, txn.log.size_bytes, txn.log.batch_count
    body = struct.pack(">Bqqqqqq", 1, 0, meta[0], meta[1], meta[2], meta[3], 0)
    store.db[PREFIX + b"m"] = body + struct.pack(">I", crc32c.crc32c(body))
    entry = txn.log.producer_entry(A)
    assert entry is not None
    (b,) = entry.batches
    body = struct.pack(">Bqhiqqb", 1, A, 0, -1, entry.last_timestamp, -1, 1) + struct.pack(
        ">iiqqq", b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.log_append_time
    )
    store.db[PREFIX + b"s" + A.to_bytes(8, "big")] = body + struct.pack(">I", crc32c.crc32c(body))
    log = make_log()
    assert state(log) == before
    assert log.last_stable_offset == log.high_watermark == 5
    TxnLog(log).ok(A, 0, 3, txn=True)
    assert log.last_stable_offset == 5
