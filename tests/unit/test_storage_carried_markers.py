"""Carried markers and revoking markers on a real RocksDB (docs/carried-markers.md, "Partition").

A carried marker must leave the log exactly as the marker followed by the batch would, in one entry;
a revoking marker must race a carried one safely: whichever Raft orders first decides, and the other
learns it.
"""

from __future__ import annotations

import struct

import crc32c
import pytest

from clients.protocol import BrokerError, ControlType, ErrorCode
from storage.commands import (
    AppendResult,
    CarriedAppendCommand,
    RevokeMarkerCommand,
    RevokeResult,
    TxnMarkerCommand,
    decode_command,
    encode_carried_append,
    encode_revoke_marker,
)
from storage.partition_log import PartitionLog
from storage.producer_state import ProducerStateEntry, decode_entry, encode_entry
from storage.store import NodeStore
from tests.support.partition_txn import TxnLog, make_batch, read_committed

A, B = 100, 200
COMMIT, ABORT = ControlType.COMMIT, ControlType.ABORT


def new_log(store: NodeStore, n: int = 0, now: int = 1000) -> TxnLog:
    return TxnLog(PartitionLog(store, b"P\x00\x00\x00\x07\x00\x00\x00" + bytes((n,)), f"t-{n}"), now=now)


def error_of(result: object) -> ErrorCode:
    assert isinstance(result, BrokerError), result
    return result.error_code


def view(log: PartitionLog) -> tuple[object, ...]:
    """Everything a reader or the coordinator can observe, without the clock's values."""
    entries = [
        (e.producer_id, e.producer_epoch, e.coordinator_epoch, e.current_txn_first_offset, e.revoked_epoch,
         [(b.first_seq, b.last_seq, b.base_offset) for b in e.batches])
        for e in log.producer_entries()
    ]  # fmt: skip
    aborted = [
        (a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset) for a in log.aborted_transactions(0, 2**62)
    ]
    return (
        log.high_watermark,
        log.last_stable_offset,
        log.batch_count,
        log.size_bytes,
        entries,
        log.ongoing_transactions(),
        aborted,
        read_committed(log, 0),
    )


def open_txn(t: TxnLog, pid: int = A, epoch: int = 0, records: int = 2) -> None:
    """A plain record, then transaction ``epoch`` of ``pid`` open with ``records`` records."""
    t.plain()
    t.ok(pid, epoch, 0, records=records, txn=True, tag=f"e{epoch}-")


@pytest.mark.parametrize("ctype", [COMMIT, ABORT])
def test_a_carried_marker_leaves_the_log_as_the_marker_then_the_batch_would(
    store: NodeStore, ctype: ControlType
) -> None:
    separate, carried = new_log(store, 0), new_log(store, 1)
    for t in (separate, carried):
        open_txn(t)
        t.ok(B, 0, 0, txn=True, tag="other-")  # another producer's open txn keeps the LSO honest
    separate.end(A, 1, ctype)
    first = separate.ok(A, 1, 0, records=2, txn=True, tag="e1-")
    result = carried.carried(A, 1, 0, ctype, records=2, tag="e1-")
    assert isinstance(result, AppendResult) and not result.duplicate
    assert (result.base_offset, result.last_offset) == (first.base_offset, first.last_offset) == (5, 6)
    assert view(carried.log) == view(separate.log)
    # A's old transaction is closed; B's (offset 3) now pins the LSO, and A's new one is open after it.
    assert carried.log.last_stable_offset == 3 and sorted(carried.log.ongoing_transactions()) == [(A, 5), (B, 3)]
    carried.end(B, 1, COMMIT)
    expected = [b"r0", b"e0-0", b"e0-1"] if ctype is COMMIT else [b"r0"]
    assert [v for _, v in read_committed(carried.log, 0)] == [*expected, b"other-0"]


def test_a_carried_marker_on_a_partition_the_previous_transaction_skipped_writes_no_control_batch(
    store: NodeStore,
) -> None:
    t = new_log(store)
    t.plain()
    result = t.carried(A, 3, 0, COMMIT, coordinator_epoch=4)
    assert isinstance(result, AppendResult) and result.base_offset == 1  # no control batch at offset 1
    entry = t.log.producer_entry(A)
    assert entry is not None
    assert (entry.producer_epoch, entry.coordinator_epoch, entry.current_txn_first_offset) == (3, 4, 1)
    assert t.log.last_stable_offset == 1


def test_the_marker_is_skipped_once_its_transaction_is_open_and_a_retry_is_a_duplicate(store: NodeStore) -> None:
    t = new_log(store)
    open_txn(t)
    first = t.carried(A, 1, 0, COMMIT)
    assert isinstance(first, AppendResult)
    before = view(t.log)
    again = t.carried(A, 1, 0, COMMIT)  # the same batch resent (its answer was lost)
    assert isinstance(again, AppendResult) and again.duplicate and again.base_offset == first.base_offset
    assert view(t.log) == before
    # A later batch that still carries the token joins the open transaction; the marker cannot close it.
    later = t.carried(A, 1, 1, ABORT)
    assert isinstance(later, AppendResult) and later.base_offset == first.base_offset + 1
    assert t.log.ongoing_transactions() == [(A, first.base_offset)]
    assert t.log.aborted_transactions(0, 2**62) == []


def test_a_revoked_reservation_refuses_the_token_but_not_the_verified_path(store: NodeStore) -> None:
    t = new_log(store)
    open_txn(t)
    revoked = t.revoke(A, 1, COMMIT)
    assert isinstance(revoked, RevokeResult) and not revoked.used
    assert revoked.marker is not None and revoked.marker.offset == 3 and revoked.marker.txn_first_offset == 1
    assert [v for _, v in read_committed(t.log, 0)] == [b"r0", b"e0-0", b"e0-1"]
    before = view(t.log)
    assert error_of(t.carried(A, 1, 0, COMMIT)) is ErrorCode.TRANSACTION_RESERVATION_REVOKED
    assert ErrorCode.TRANSACTION_RESERVATION_REVOKED.retriable
    assert view(t.log) == before
    # The producer resends without the token (after the coordinator verified the partition): accepted.
    t.ok(A, 1, 0, txn=True)
    assert t.log.ongoing_transactions() == [(A, 4)]
    # A token of a later epoch is not revoked here.
    t.end(A, 2, COMMIT)
    assert isinstance(t.carried(A, 2, 0, COMMIT), AppendResult)
    assert t.log.ongoing_transactions() == [(A, 6)]


def test_a_revocation_after_the_token_was_used_answers_used_and_writes_nothing(store: NodeStore) -> None:
    t = new_log(store)
    open_txn(t)
    assert isinstance(t.carried(A, 1, 0, COMMIT), AppendResult)
    before = view(t.log)
    result = t.revoke(A, 1, COMMIT)
    assert result == RevokeResult(used=True, marker=None)
    assert view(t.log) == before
    # The transaction the token opened is intact: its own marker (epoch 2) closes it.
    assert t.end(A, 2, COMMIT).txn_first_offset == 4


def test_a_revocation_with_nothing_open_still_revokes(store: NodeStore) -> None:
    t = new_log(store)
    t.plain()
    result = t.revoke(A, 5, ABORT, coordinator_epoch=2)
    assert isinstance(result, RevokeResult) and not result.used
    assert result.marker is not None and result.marker.offset is None
    assert t.log.high_watermark == 1
    assert error_of(t.carried(A, 5, 0, ABORT, coordinator_epoch=2)) is ErrorCode.TRANSACTION_RESERVATION_REVOKED


def test_carried_markers_are_fenced_like_markers(store: NodeStore) -> None:
    t = new_log(store)
    open_txn(t)
    t.ok(A, 0, 2, txn=True)
    # A stale coordinator (epoch 1 after epoch 3 was seen) and a stale producer epoch change nothing.
    t.end(B, 1, COMMIT, coordinator_epoch=0)
    assert isinstance(t.carried(A, 1, 0, COMMIT, coordinator_epoch=3), AppendResult)
    t.end(A, 2, COMMIT, coordinator_epoch=3)
    before = view(t.log)
    assert error_of(t.carried(A, 3, 0, COMMIT, coordinator_epoch=1)) is ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert error_of(t.carried(A, 1, 0, COMMIT, coordinator_epoch=3)) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert error_of(t.revoke(A, 3, COMMIT, coordinator_epoch=1)) is ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert view(t.log) == before


def test_a_carried_marker_needs_a_transactional_batch_of_its_producer_and_epoch(store: NodeStore) -> None:
    t = new_log(store)
    open_txn(t)
    before = view(t.log)
    bad = {
        "another producer": make_batch(B, 1, 0, txn=True),
        "another epoch": make_batch(A, 2, 0, txn=True),
        "not transactional": make_batch(A, 1, 0),
        "plain": make_batch(),
    }
    for what, batch in bad.items():
        assert error_of(t.carried(A, 1, 0, COMMIT, batch=batch)) is ErrorCode.INVALID_REQUEST, what
    assert view(t.log) == before


def test_the_marker_stands_when_its_batch_is_refused(store: NodeStore) -> None:
    t = new_log(store)
    open_txn(t)
    # A new epoch must start at sequence 0: the batch is refused, the coordinator's decision is written.
    assert error_of(t.carried(A, 1, 7, COMMIT)) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert [v for _, v in read_committed(t.log, 0)] == [b"r0", b"e0-0", b"e0-1"]
    assert t.log.ongoing_transactions() == [] and t.log.high_watermark == 4
    # The producer's resend (sequence 0) opens the next transaction after it.
    result = t.carried(A, 1, 0, COMMIT)
    assert isinstance(result, AppendResult) and result.base_offset == 4


def test_revoked_epochs_survive_a_reopen_and_old_entries_still_read(store: NodeStore) -> None:
    t = new_log(store)
    open_txn(t)
    t.revoke(A, 1, ABORT)
    reopened = new_log(store, 0, now=t.now)
    entry = reopened.log.producer_entry(A)
    assert entry is not None and entry.revoked_epoch == 1
    assert error_of(reopened.carried(A, 1, 0, ABORT)) is ErrorCode.TRANSACTION_RESERVATION_REVOKED
    # A version-2 entry (written before carried markers) reads back with nothing revoked.
    v3 = encode_entry(ProducerStateEntry(A, 4, (), 10, 2, None, None, 3))
    assert decode_entry(v3).revoked_epoch == 3
    v2_body = struct.pack(">Bqhiqqqb", 2, A, 4, 2, 10, -1, -1, 0)
    v2 = v2_body + struct.pack(">I", crc32c.crc32c(v2_body))
    assert decode_entry(v2) == ProducerStateEntry(A, 4, (), 10, 2, None, None, -1)


def test_the_new_commands_round_trip_and_refuse_truncation() -> None:
    marker = TxnMarkerCommand(A, 7, 3, ABORT, 12345)
    batch = make_batch(A, 7, 0, txn=True)
    carried = decode_command(encode_carried_append(marker, batch))
    assert isinstance(carried, CarriedAppendCommand)
    assert carried.marker == marker and bytes(carried.batch) == batch
    assert decode_command(encode_revoke_marker(marker)) == RevokeMarkerCommand(marker)
    for raw in (encode_carried_append(marker, b"")[:10], encode_revoke_marker(marker)[:-1],
                encode_revoke_marker(marker) + b"x"):  # fmt: skip
        with pytest.raises(BrokerError) as exc:
            decode_command(raw)
        assert exc.value.error_code is ErrorCode.INVALID_REQUEST
    with pytest.raises(ValueError, match="bad producer id"):
        encode_revoke_marker(TxnMarkerCommand(-1, 0, 0, COMMIT, 0))
