"""The coordinator state on disk: reopen, replay, snapshots, corrupted bytes, command codec, placement.

STYLE "every on-disk structure gets a reopen test and a corrupted-bytes test"; DESIGN rule 3 (last
applied index in the same WriteBatch) and rule 1 (apply never raises).
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from clients.protocol import BrokerError, ErrorCode
from coordinator import state_machine as sm_module
from coordinator.commands import (
    AddPartitions,
    BindPrepared,
    CompleteTxn,
    DecideGroup,
    EndTxn,
    ExpireTransactionalId,
    FenceAndAbort,
    ForgetGroup,
    GroupMember,
    GroupMemberDone,
    InitProducerId,
    Prepare,
    ResolvePrepared,
    decode_command,
    encode_command,
)
from coordinator.errors import CommandDecodeError, CoordinatorCorruptionError
from coordinator.metadata import TopicPartition
from coordinator.placement import coordinator_partition, java_string_hash
from coordinator.state_machine import TransactionStateMachine
from coordinator.states import TransactionState
from raft.state_machine import NOOP_COMMAND
from storage.store import NodeStore

PREFIX = b"X\x00\x00\x00\x07"
TP = TopicPartition("t", 0)


def populate(sm: TransactionStateMachine) -> int:
    """Three ids in three states and one group decision; returns the last index used."""
    cmds = [
        InitProducerId(transactional_id="a", timeout_ms=1000, now_ms=1, coordinator_epoch=3, producer_id_candidate=10),
        AddPartitions(
            transactional_id="a", producer_id=10, producer_epoch=0, partitions=(TP,), now_ms=2, coordinator_epoch=3
        ),
        InitProducerId(transactional_id="b", timeout_ms=1000, now_ms=3, coordinator_epoch=3, producer_id_candidate=11),
        AddPartitions(
            transactional_id="b", producer_id=11, producer_epoch=0, partitions=(TP,), now_ms=4, coordinator_epoch=3
        ),
        EndTxn(transactional_id="b", producer_id=11, producer_epoch=0, commit=True, now_ms=5, coordinator_epoch=3),
        InitProducerId(transactional_id="c", timeout_ms=1000, now_ms=6, coordinator_epoch=3, producer_id_candidate=12),
        Prepare(transactional_id="c", producer_id=12, producer_epoch=0, now_ms=7, coordinator_epoch=3, group_id="g"),
        DecideGroup(group_id="g", commit=True, members=(GroupMember("c", 12, 0),), now_ms=8, coordinator_epoch=3),
    ]
    for i, cmd in enumerate(cmds, start=1):
        assert not isinstance(sm.apply(i, encode_command(cmd)), BrokerError)
    return len(cmds)


def state_of(sm: TransactionStateMachine) -> tuple[Any, ...]:
    return sm.transactions(), sm.group_decisions(), sm.last_applied, sm.coordinator_epoch


def test_reopen_restores_transactions_decisions_and_index(store: NodeStore) -> None:
    sm = TransactionStateMachine(store, PREFIX, 7)
    last = populate(sm)
    reopened = TransactionStateMachine(store, PREFIX, 7)
    assert state_of(reopened) == state_of(sm)
    assert reopened.last_applied == last and reopened.coordinator_epoch == 3
    assert [m.state for m in reopened.transactions()] == [
        TransactionState.ONGOING,
        TransactionState.PREPARE_COMMIT,
        TransactionState.PREPARED,
    ]
    assert reopened.get("c").group_id == "g" and reopened.group_decision("g").commit


def test_replayed_entries_change_nothing(store: NodeStore) -> None:
    # DESIGN rule 3: after a restart PySyncObj replays its journal; entries <= last_applied are skipped.
    sm = TransactionStateMachine(store, PREFIX, 7)
    last = populate(sm)
    before = state_of(sm)
    again = InitProducerId(
        transactional_id="a", timeout_ms=1000, now_ms=1, coordinator_epoch=3, producer_id_candidate=99
    )
    assert sm.apply(last, encode_command(again)) is None
    assert sm.apply(1, encode_command(again)) is None
    assert state_of(sm) == before
    assert sm.apply(last + 1, NOOP_COMMAND) is None and sm.last_applied == last + 1
    assert sm.transactions() == before[0]


def test_malformed_command_is_answered_and_recorded(store: NodeStore) -> None:
    sm = TransactionStateMachine(store, PREFIX, 7)
    for i, raw in enumerate([b"{", b"[]", b'{"op":"nope"}', b'{"op":["x"]}', b"\xff\xfe"], start=1):
        res = sm.apply(i, raw)
        assert isinstance(res, BrokerError) and res.error_code is ErrorCode.INVALID_REQUEST
        assert sm.last_applied == i
    assert TransactionStateMachine(store, PREFIX, 7).last_applied == 5


def test_apply_never_raises(store: NodeStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # A raise inside a replicated method wedges the Raft group on every replica (DESIGN rule 7).
    def broken(meta: object, cmd: object) -> object:
        raise RuntimeError("boom")

    monkeypatch.setitem(sm_module._TXN_RULES, InitProducerId, broken)  # type: ignore[index]
    sm = TransactionStateMachine(store, PREFIX, 7)
    cmd = InitProducerId(transactional_id="a", timeout_ms=1000, now_ms=1, coordinator_epoch=1, producer_id_candidate=1)
    res = sm.apply(1, encode_command(cmd))
    assert isinstance(res, BrokerError) and res.error_code is ErrorCode.UNKNOWN_SERVER_ERROR
    assert sm.last_applied == 1 and sm.get("a") is None


def test_snapshot_round_trip_replaces_the_whole_state(store: NodeStore) -> None:
    source = TransactionStateMachine(store, PREFIX, 7)
    populate(source)
    buf = io.BytesIO()
    source.write_snapshot(buf)
    target = TransactionStateMachine(store, b"X\x00\x00\x00\x08", 8)
    stale = InitProducerId(
        transactional_id="zzz", timeout_ms=1000, now_ms=1, coordinator_epoch=1, producer_id_candidate=1
    )
    target.apply(1, encode_command(stale))
    target.read_snapshot(io.BytesIO(buf.getvalue()), 42)
    assert target.transactions() == source.transactions() and target.get("zzz") is None
    assert target.group_decisions() == source.group_decisions()
    assert (target.last_applied, target.coordinator_epoch) == (42, 3)
    reopened = TransactionStateMachine(store, b"X\x00\x00\x00\x08", 8)
    assert state_of(reopened) == state_of(target)
    assert state_of(TransactionStateMachine(store, PREFIX, 7)) == state_of(source)  # neighbours untouched


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "empty"])
def test_corrupted_snapshot_is_refused_and_changes_nothing(store: NodeStore, damage: str) -> None:
    source = TransactionStateMachine(store, PREFIX, 7)
    populate(source)
    buf = io.BytesIO()
    source.write_snapshot(buf)
    raw = bytearray(buf.getvalue())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x40
    elif damage == "truncate":
        raw = raw[: len(raw) - 9]
    elif damage == "magic":
        raw[0:4] = b"NOPE"
    else:
        raw = bytearray()
    target = TransactionStateMachine(store, b"X\x00\x00\x00\x08", 8)
    target.apply(1, NOOP_COMMAND)
    with pytest.raises(CoordinatorCorruptionError):
        target.read_snapshot(io.BytesIO(bytes(raw)), 99)
    assert (target.transactions(), target.last_applied) == ([], 1)
    assert TransactionStateMachine(store, b"X\x00\x00\x00\x08", 8).last_applied == 1


@pytest.mark.parametrize("key", [b"M", b"Ta", b"Gg"])
@pytest.mark.parametrize("damage", ["flip", "truncate", "version"])
def test_corrupted_bytes_on_disk_are_detected_at_open(store: NodeStore, key: bytes, damage: str) -> None:
    populate(TransactionStateMachine(store, PREFIX, 7))
    raw = bytearray(store.db.get(PREFIX + key))
    if damage == "flip":
        raw[-2] ^= 0x01
    elif damage == "truncate":
        raw = raw[:3]
    else:
        raw[0] = 9
    store.db.put(PREFIX + key, bytes(raw))
    with pytest.raises(CoordinatorCorruptionError):
        TransactionStateMachine(store, PREFIX, 7)


def test_misplaced_or_headless_entries_are_detected(store: NodeStore) -> None:
    populate(TransactionStateMachine(store, PREFIX, 7))
    store.db.put(PREFIX + b"Tx", store.db.get(PREFIX + b"Ta"))  # a value under another id's key
    with pytest.raises(CoordinatorCorruptionError, match="holds 'a'"):
        TransactionStateMachine(store, PREFIX, 7)
    store.db.delete(PREFIX + b"Tx")
    store.db.delete(PREFIX + b"M")
    with pytest.raises(CoordinatorCorruptionError, match="header is missing"):
        TransactionStateMachine(store, PREFIX, 7)


def test_destroy_removes_only_this_partition(store: NodeStore) -> None:
    sm = TransactionStateMachine(store, PREFIX, 7)
    populate(sm)
    other = TransactionStateMachine(store, b"X\x00\x00\x00\x70", 70)
    populate(other)
    sm.destroy()
    assert state_of(TransactionStateMachine(store, PREFIX, 7)) == ([], [], 0, -1)
    assert len(TransactionStateMachine(store, b"X\x00\x00\x00\x70", 70).transactions()) == 3


# -- command codec -----------------------------------------------------------------------------

EVERY_COMMAND = [
    InitProducerId(
        transactional_id="é",
        timeout_ms=5,
        now_ms=6,
        coordinator_epoch=7,
        producer_id_candidate=8,
        expected_producer_id=9,
        expected_producer_epoch=10,
        max_timeout_ms=11,
    ),
    InitProducerId(transactional_id="t", timeout_ms=5, now_ms=6, coordinator_epoch=7),
    AddPartitions(
        transactional_id="t",
        producer_id=1,
        producer_epoch=2,
        partitions=(TP, TopicPartition("u", 3)),
        now_ms=4,
        coordinator_epoch=5,
    ),
    EndTxn(
        transactional_id="t",
        producer_id=1,
        producer_epoch=2,
        commit=False,
        now_ms=3,
        coordinator_epoch=4,
        producer_id_candidate=5,
    ),
    CompleteTxn(transactional_id="t", producer_id=1, producer_epoch=2, commit=True, now_ms=3, coordinator_epoch=4),
    Prepare(transactional_id="t", producer_id=1, producer_epoch=2, now_ms=3, coordinator_epoch=4, group_id=None),
    BindPrepared(transactional_id="t", producer_id=1, producer_epoch=2, group_id="g", now_ms=3, coordinator_epoch=4),
    ResolvePrepared(
        transactional_id="t", producer_id=1, producer_epoch=2, group_id="g", commit=True, now_ms=3, coordinator_epoch=4
    ),
    FenceAndAbort(transactional_id="t", producer_id=1, producer_epoch=2, now_ms=3, coordinator_epoch=4),
    ExpireTransactionalId(
        transactional_id="t", producer_id=1, producer_epoch=2, now_ms=3, coordinator_epoch=4, expiration_ms=5
    ),
    DecideGroup(group_id="g", commit=True, members=(GroupMember("t", 1, 2),), now_ms=3, coordinator_epoch=4),
    GroupMemberDone(group_id="g", transactional_id="t", now_ms=3, coordinator_epoch=4),
    ForgetGroup(group_id="g", now_ms=3, coordinator_epoch=4, retention_ms=5),
]


@pytest.mark.parametrize("cmd", EVERY_COMMAND, ids=lambda c: type(c).__name__)
def test_every_command_round_trips_and_is_not_a_noop(cmd: Any) -> None:
    raw = encode_command(cmd)
    assert raw[:1] == b"{" != NOOP_COMMAND
    assert decode_command(raw) == cmd


@pytest.mark.parametrize(
    "raw",
    [
        b'{"op":"end_txn","transactional_id":"t","producer_id":1,"producer_epoch":2,"commit":1,"now_ms":3,'
        b'"coordinator_epoch":4,"producer_id_candidate":null}',  # 1 is not a boolean
        b'{"op":"end_txn","transactional_id":"t","producer_id":true,"producer_epoch":2,"commit":true,"now_ms":3,'
        b'"coordinator_epoch":4,"producer_id_candidate":null}',  # true is not an integer
        b'{"op":"complete_txn","transactional_id":"t","producer_id":1,"producer_epoch":2,"commit":true,"now_ms":3}',
        b'{"op":"add_partitions","transactional_id":"t","producer_id":1,"producer_epoch":2,"partitions":[["t"]],'
        b'"now_ms":3,"coordinator_epoch":4}',
        b'{"op":"fence_and_abort","transactional_id":"\\ud800","producer_id":1,"producer_epoch":2,"now_ms":3,'
        b'"coordinator_epoch":4}',  # a lone surrogate cannot become a UTF-8 key
    ],
)
def test_malformed_fields_are_refused_as_a_whole(raw: bytes) -> None:
    with pytest.raises(CommandDecodeError):
        decode_command(raw)


# -- placement -------------------------------------------------------------------------------------


def test_placement_is_kafkas_java_string_hash() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)  # Utils.abs(MIN_VALUE) is 0
    assert coordinator_partition("polygenelubricants", 50) == 0
    assert java_string_hash("😀") == 55357 * 31 + 56832  # UTF-16 surrogate pair, as Java hashes it
    assert coordinator_partition("my-txn", 50) == abs(java_string_hash("my-txn")) % 50
    with pytest.raises(ValueError, match="positive"):
        coordinator_partition("x", 0)
