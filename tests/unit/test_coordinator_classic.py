"""The classic transaction protocol (Kafka clients below EndTxn version 5) next to TV2.

A classic client keeps its producer id and epoch across transactions: EndTxn
bumps nothing, a retried EndTxn comes with the same identity, and the markers
carry the transaction's own epoch, which partitions accept only from a marker
that says it is classic.
"""

from __future__ import annotations

import json

import pytest

from clients.protocol import ControlType, ErrorCode
from coordinator.commands import EndTxn, decode_command, encode_command
from coordinator.group_commands import WriteTxnMarker, decode_group_command, encode_group_command
from coordinator.group_metadata import ProducerFence
from coordinator.group_rules import marker_error
from coordinator.metadata import decode_metadata, encode_metadata
from coordinator.results import EndTxnResult
from storage.commands import TxnMarkerCommand, encode_txn_marker
from storage.commands import decode_command as decode_partition_command
from storage.producer_state import ProducerAppendInfo, ProducerStateEntry
from storage.store import NodeStore
from tests.unit.test_coordinator import TID, TP0, TP1, Coordinator, S, err


def _without_classic(raw: bytes) -> bytes:
    """A command as written before the ``classic`` field existed."""
    body = json.loads(raw)
    del body["classic"]
    return json.dumps(body).encode()


@pytest.fixture
def coord(store: NodeStore) -> Coordinator:
    return Coordinator(store)


def test_classic_end_txn_keeps_the_identity_and_marks_at_the_same_epoch(coord: Coordinator) -> None:
    pid, epoch = coord.open_txn(TID, TP0, TP1)
    r = coord.end(pid, epoch, True, classic=True)
    assert isinstance(r, EndTxnResult)
    assert (r.producer_id, r.producer_epoch, r.retry) == (pid, epoch, False)
    assert r.markers is not None
    assert (r.markers.producer_epoch, r.markers.classic, r.markers.partitions) == (epoch, True, (TP0, TP1))
    m = coord.meta()
    assert (m.state, m.producer_epoch, m.last_producer_epoch, m.classic) == (S.PREPARE_COMMIT, epoch, -1, True)
    # Survives a restart (the marker plan a new leader resumes is still classic).
    assert decode_metadata(encode_metadata(m), where="test").marker_plan() == r.markers
    coord.reopen()
    assert coord.meta().marker_plan() == r.markers
    coord.complete(r.markers)
    # The next transaction runs with the same identity.
    assert coord.add(pid, epoch, TP1).added == (TP1,)
    again = coord.end(pid, epoch, False, classic=True)
    assert (again.producer_epoch, again.markers.producer_epoch, again.markers.classic) == (epoch, epoch, True)


def test_classic_end_txn_retry_table(coord: Coordinator) -> None:
    pid, epoch = coord.open_txn()
    r = coord.end(pid, epoch, True, classic=True)
    # In PrepareCommit: the same direction is a retry still completing, the other way is wrong.
    assert err(coord.end(pid, epoch, True, classic=True)) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert err(coord.end(pid, epoch, False, classic=True)) is ErrorCode.INVALID_TXN_STATE
    coord.complete(r.markers)
    retry = coord.end(pid, epoch, True, classic=True)
    assert (retry.producer_epoch, retry.retry, retry.markers) == (epoch, True, None)
    assert err(coord.end(pid, epoch, False, classic=True)) is ErrorCode.INVALID_TXN_STATE
    assert err(coord.end(pid, epoch - 1 if epoch else epoch + 1, True, classic=True)) is ErrorCode.PRODUCER_FENCED
    assert err(coord.end(pid + 7, epoch, True, classic=True)) is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert coord.meta().state is S.COMPLETE_COMMIT


def test_classic_end_txn_without_an_open_transaction(coord: Coordinator) -> None:
    r = coord.init()
    for commit in (True, False):
        assert err(coord.end(r.producer_id, r.producer_epoch, commit, classic=True)) is ErrorCode.INVALID_TXN_STATE
    assert coord.meta().state is S.EMPTY


def test_classic_adds_of_the_next_transaction_are_recorded_while_markers_are_written(coord: Coordinator) -> None:
    pid, epoch = coord.open_txn(TID, TP0)
    r = coord.end(pid, epoch, True, classic=True)
    a = coord.add(pid, epoch, TP1)
    assert (a.producer_epoch, a.added) == (epoch, (TP1,))
    coord.complete(r.markers)
    m = coord.meta()
    assert (m.state, m.partitions, m.producer_epoch) == (S.ONGOING, frozenset({TP1}), epoch)


def test_init_producer_id_fences_a_classic_producer_and_aborts_at_a_higher_epoch(coord: Coordinator) -> None:
    pid, epoch = coord.open_txn(TID, TP0)
    assert err(coord.init()) is ErrorCode.CONCURRENT_TRANSACTIONS  # fenced and aborted; the client retries
    plan = coord.meta().marker_plan()
    assert (plan.producer_epoch, plan.commit, plan.classic) == (epoch + 1, False, False)
    coord.complete(plan)
    new = coord.init()
    assert new.producer_epoch == epoch + 2
    for commit in (True, False):
        assert err(coord.end(pid, epoch, commit, classic=True)) is ErrorCode.PRODUCER_FENCED
    assert err(coord.add(pid, epoch, TP1)) is ErrorCode.PRODUCER_FENCED


def test_end_txn_command_reads_without_the_classic_field() -> None:
    cmd = EndTxn(transactional_id=TID, producer_id=1, producer_epoch=0, commit=True, now_ms=0, coordinator_epoch=1)
    raw = encode_command(cmd)
    assert decode_command(_without_classic(raw)) == cmd
    classic = EndTxn(
        transactional_id=TID, producer_id=1, producer_epoch=0, commit=True, now_ms=0, coordinator_epoch=1, classic=True
    )
    assert decode_command(encode_command(classic)) == classic


def test_partition_marker_rule_classic_vs_tv2() -> None:
    open_txn = ProducerStateEntry(5, 3, current_txn_first_offset=10)
    info = ProducerAppendInfo(5, open_txn, state_may_be_lost=False)
    tv2 = info.validate_marker(3, 0)
    assert tv2 is not None and tv2.error_code is ErrorCode.INVALID_PRODUCER_EPOCH  # TV2: a stale marker
    assert info.validate_marker(3, 0, classic=True) is None
    older = info.validate_marker(2, 0, classic=True)
    assert older is not None and older.error_code is ErrorCode.INVALID_PRODUCER_EPOCH
    assert info.validate_marker(4, 0) is None


def test_classic_marker_command_round_trip() -> None:
    raw = encode_txn_marker(5, 3, 2, ControlType.ABORT, 1234, classic=True)
    assert decode_partition_command(raw) == TxnMarkerCommand(5, 3, 2, ControlType.ABORT, 1234, True)
    plain = encode_txn_marker(5, 3, 2, ControlType.COMMIT, 1234)
    assert decode_partition_command(plain) == TxnMarkerCommand(5, 3, 2, ControlType.COMMIT, 1234, False)
    assert plain[1:] != raw[1:]


def test_offsets_partition_marker_rule_and_command() -> None:
    fence = ProducerFence(5, 3, 0, 3, 0)  # offsets of epoch 3 pending
    bad = marker_error(fence, 3, 0)
    assert bad is not None and bad.error_code is ErrorCode.INVALID_PRODUCER_EPOCH
    assert marker_error(fence, 3, 0, classic=True) is None
    cmd = WriteTxnMarker(producer_id=5, producer_epoch=3, txn_coordinator_epoch=0, commit=True, now_ms=1,
                         coordinator_epoch=1, classic=True)  # fmt: skip
    assert decode_group_command(encode_group_command(cmd)) == cmd
    old = encode_group_command(WriteTxnMarker(producer_id=5, producer_epoch=3, txn_coordinator_epoch=0,
                                              commit=True, now_ms=1, coordinator_epoch=1))  # fmt: skip
    assert decode_group_command(_without_classic(old)).classic is False
