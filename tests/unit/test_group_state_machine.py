"""The offsets partition on disk: reopen, replay, snapshots, corrupted bytes, epoch fencing, command codec.

STYLE "every on-disk structure gets a reopen test and a corrupted-bytes test"; DESIGN rule 3 (last
applied index in the same WriteBatch), rule 1 (apply never raises), rule 7 (stale leader's commands).
"""

from __future__ import annotations

import io
from dataclasses import replace
from typing import Any

import pytest

from clients.protocol import BrokerError, ErrorCode
from coordinator import group_rules
from coordinator.errors import CommandDecodeError, CoordinatorCorruptionError
from coordinator.group_commands import (
    CommitOffsets,
    ExpireProducers,
    OffsetCommit,
    StoreGroup,
    TxnCommitOffsets,
    WriteTxnMarker,
    decode_group_command,
    encode_group_command,
)
from coordinator.group_metadata import MemberMetadata
from coordinator.group_state_machine import GroupStateMachine
from coordinator.metadata import TopicPartition
from raft.state_machine import NOOP_COMMAND
from storage.store import NodeStore
from tests.unit.test_group_rules import PREFIX, Offsets

OTHER = b"O\x00\x00\x00\x02"


def populate(o: Offsets) -> None:
    """A group with members and a generation, committed offsets, one pending transaction, two fences."""
    o.store_group("g", "a", "b")
    o.commit("g", {0: 5}, member="a", gen=1)
    o.txn_commit("g", 7, 0, {1: 9}, member="b", gen=1)
    o.txn_commit("h", 8, 0, {2: 3})
    o.marker(8, 1, commit=True, cepoch=4)


def snapshot_of(sm: GroupStateMachine) -> dict[str, Any]:
    """Everything a reader can see, for equality checks."""
    return {
        "applied": (sm.last_applied, sm.coordinator_epoch),
        "groups": sm.groups(),
        "ids": sm.group_ids(),
        "committed": {g: sm.committed_offsets(g) for g in sm.group_ids()},
        "pending": {g: sm.pending_offsets(g) for g in sm.group_ids()},
        "producers": sm.producers(),
    }


def test_reopen_restores_groups_offsets_pending_and_fences(store: NodeStore) -> None:
    o = Offsets(store)
    populate(o)
    before = snapshot_of(o.sm)
    assert before["ids"] == ["g", "h"] and o.sm.group("g").generation_id == 1  # type: ignore[union-attr]
    assert snapshot_of(GroupStateMachine(store, PREFIX, 1)) == before


def test_replayed_entries_change_nothing(store: NodeStore) -> None:
    o = Offsets(store)
    populate(o)
    before = snapshot_of(o.sm)
    replay = CommitOffsets(group_id="g", offsets=(OffsetCommit("t", 0, 99),), now_ms=1, coordinator_epoch=1)
    for index in range(1, o.sm.last_applied + 1):
        assert o.sm.apply(index, encode_group_command(replay)) is None
    assert snapshot_of(o.sm) == before


def test_noop_and_malformed_commands_only_record_their_index(store: NodeStore) -> None:
    o = Offsets(store)
    assert o.sm.apply(1, NOOP_COMMAND) is None
    bad = o.sm.apply(2, b'{"op":"commit_offsets","group_id":1}')
    assert isinstance(bad, BrokerError) and bad.error_code is ErrorCode.INVALID_REQUEST
    assert o.sm.last_applied == 2 and o.sm.group_ids() == []
    assert GroupStateMachine(store, PREFIX, 1).last_applied == 2


def test_command_from_a_deposed_leader_is_not_coordinator(store: NodeStore) -> None:
    o = Offsets(store)
    o.sm.apply(1, encode_group_command(CommitOffsets(group_id="g", offsets=(OffsetCommit("t", 0, 1),), now_ms=1,
                                                     coordinator_epoch=3)))  # fmt: skip
    late = o.sm.apply(2, encode_group_command(CommitOffsets(group_id="g", offsets=(OffsetCommit("t", 0, 2),),
                                                            now_ms=2, coordinator_epoch=2)))  # fmt: skip
    assert isinstance(late, BrokerError) and late.error_code is ErrorCode.NOT_COORDINATOR
    assert {c.offset for c in o.sm.committed_offsets("g").values()} == {1}
    assert GroupStateMachine(store, PREFIX, 1).coordinator_epoch == 3


def test_apply_never_raises(store: NodeStore, monkeypatch: pytest.MonkeyPatch) -> None:
    o = Offsets(store)

    def boom(*_a: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(group_rules, "commit_offsets", boom)
    result = o.commit("g", {0: 1})
    assert isinstance(result, BrokerError) and result.error_code is ErrorCode.UNKNOWN_SERVER_ERROR
    assert o.sm.last_applied == 1 and o.sm.group_ids() == []


def test_preview_answers_like_apply_and_changes_nothing(store: NodeStore) -> None:
    o = Offsets(store)
    populate(o)
    before = snapshot_of(o.sm)
    stale = TxnCommitOffsets(group_id="g", transactional_id="x", producer_id=8, producer_epoch=0,
                             offsets=(OffsetCommit("t", 0, 1),), now_ms=1, coordinator_epoch=1)  # fmt: skip
    result = o.sm.preview(stale)
    assert isinstance(result, BrokerError) and result.error_code is ErrorCode.INVALID_PRODUCER_EPOCH
    ok = CommitOffsets(group_id="h", offsets=(OffsetCommit("t", 0, 1),), now_ms=1, coordinator_epoch=1)
    assert o.sm.preview(ok) == group_rules.OffsetsCommitted("h", 1, pending=False)
    assert snapshot_of(o.sm) == before


def test_snapshot_round_trip_replaces_the_whole_state(store: NodeStore) -> None:
    o = Offsets(store)
    populate(o)
    buf = io.BytesIO()
    o.sm.write_snapshot(buf)
    other = Offsets(store, OTHER)
    other.commit("stale", {0: 1})  # replaced by the snapshot
    other.sm.read_snapshot(io.BytesIO(buf.getvalue()), 50)
    expected = snapshot_of(o.sm) | {"applied": (50, o.sm.coordinator_epoch)}
    assert snapshot_of(other.sm) == expected
    assert snapshot_of(GroupStateMachine(store, OTHER, 2)) == expected  # durable too
    assert snapshot_of(GroupStateMachine(store, PREFIX, 1))["ids"] == ["g", "h"]  # the source is untouched


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "trailing"])
def test_corrupted_snapshot_is_refused_and_changes_nothing(store: NodeStore, damage: str) -> None:
    o = Offsets(store)
    populate(o)
    buf = io.BytesIO()
    o.sm.write_snapshot(buf)
    raw = bytearray(buf.getvalue())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x40
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "magic":
        raw[0:4] = b"TXCO"
    else:
        raw[-4:-4] = b"xx"
    target = Offsets(store, OTHER)
    target.commit("keep", {0: 1})
    before = snapshot_of(target.sm)
    with pytest.raises(CoordinatorCorruptionError):
        target.sm.read_snapshot(io.BytesIO(bytes(raw)), 99)
    assert snapshot_of(target.sm) == before
    assert snapshot_of(GroupStateMachine(store, OTHER, 2)) == before


@pytest.mark.parametrize("tag", [b"G", b"C", b"P", b"F", b"M"])
def test_corrupted_bytes_on_disk_are_detected_at_open(store: NodeStore, tag: bytes) -> None:
    o = Offsets(store)
    populate(o)
    key = next(k for k, _v in store.iter_prefix(PREFIX + tag))
    value = bytearray(store.db[key])
    value[-1] ^= 0x01
    store.db[key] = bytes(value)
    with pytest.raises(CoordinatorCorruptionError):
        GroupStateMachine(store, PREFIX, 1)


def test_misplaced_or_headless_entries_are_detected(store: NodeStore) -> None:
    o = Offsets(store)
    populate(o)
    (gkey, gvalue), *_ = list(store.iter_prefix(PREFIX + b"G"))
    store.db[PREFIX + b"Gnot-g"] = gvalue  # a group's value under another group's key
    with pytest.raises(CoordinatorCorruptionError, match="another key"):
        GroupStateMachine(store, PREFIX, 1)
    del store.db[PREFIX + b"Gnot-g"]
    del store.db[PREFIX + b"M"]
    with pytest.raises(CoordinatorCorruptionError, match="header"):
        GroupStateMachine(store, PREFIX, 1)
    assert gkey == PREFIX + b"Gg"


def test_destroy_removes_only_this_partition(store: NodeStore) -> None:
    a, b = Offsets(store), Offsets(store, OTHER)
    populate(a)
    b.commit("g", {0: 1})
    a.sm.destroy()
    assert a.sm.group_ids() == [] and a.sm.last_applied == 0
    assert list(store.iter_prefix(PREFIX)) == []
    assert GroupStateMachine(store, OTHER, 2).group_ids() == ["g"]


MEMBER = MemberMetadata("m-1", ("a", "b"), "roundrobin", 6000, 30000, (TopicPartition("a", 0),))


@pytest.mark.parametrize(
    "cmd",
    [
        CommitOffsets(
            group_id="g",
            offsets=(OffsetCommit("t", 1, 2, "meta"),),
            generation_id=3,
            member_id="m",
            now_ms=5,
            coordinator_epoch=6,
        ),
        TxnCommitOffsets(
            group_id="g",
            transactional_id="tx",
            producer_id=1,
            producer_epoch=2,
            offsets=(OffsetCommit("t", 1, 2),),
            now_ms=5,
            coordinator_epoch=6,
        ),
        WriteTxnMarker(
            producer_id=1, producer_epoch=2, txn_coordinator_epoch=3, commit=True, now_ms=5, coordinator_epoch=6
        ),
        StoreGroup(
            group_id="g",
            protocol="roundrobin",
            leader_id="m-1",
            members=(MEMBER,),
            topic_partitions=(("a", 1), ("b", 0)),
            now_ms=5,
            coordinator_epoch=6,
        ),
        StoreGroup(
            group_id="g", protocol=None, leader_id=None, members=(), topic_partitions=(), now_ms=5, coordinator_epoch=6
        ),
        ExpireProducers(now_ms=5, coordinator_epoch=6, expiration_ms=7),
    ],
    ids=lambda c: type(c).__name__,
)
def test_every_command_round_trips_and_is_not_a_noop(cmd: Any) -> None:
    raw = encode_group_command(cmd)
    assert raw[:1] == b"{" and raw[:1] != NOOP_COMMAND
    assert decode_group_command(raw) == cmd


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1]",
        b'{"op":"nope"}',
        b'{"op":"expire_producers","now_ms":true,"coordinator_epoch":1,"expiration_ms":1}',
        b'{"op":"commit_offsets","group_id":"g","offsets":[["t",0,1]],"generation_id":-1,"member_id":"",'
        b'"now_ms":1,"coordinator_epoch":1}',
        b'{"op":"store_group","group_id":"g","protocol":null,"leader_id":null,"members":[{"id":1}],'
        b'"topic_partitions":[],"now_ms":1,"coordinator_epoch":1}',
    ],
)
def test_malformed_commands_are_refused_as_a_whole(raw: bytes) -> None:
    with pytest.raises(CommandDecodeError):
        decode_group_command(raw)


def test_committed_leader_epochs_are_kept_through_commits_markers_and_reopen(store: NodeStore) -> None:
    o = Offsets(store)
    o.apply(CommitOffsets(group_id="g", offsets=(OffsetCommit("t", 0, 5, "m", 3), OffsetCommit("t", 1, 6)),
                          now_ms=o.now, coordinator_epoch=1))  # fmt: skip
    o.apply(TxnCommitOffsets(group_id="g", transactional_id="tx", producer_id=7, producer_epoch=0,
                             offsets=(OffsetCommit("t", 2, 9, "", 4),), now_ms=o.now, coordinator_epoch=1))  # fmt: skip
    o.marker(7, 1, commit=True)
    expected = {0: (5, 3), 1: (6, -1), 2: (9, 4)}
    assert {c.partition: (c.offset, c.leader_epoch) for c in o.sm.fetch_offsets("g")} == expected
    reopened = GroupStateMachine(store, PREFIX, 1)
    assert {c.partition: (c.offset, c.leader_epoch) for c in reopened.fetch_offsets("g")} == expected
    # a later commit without an epoch replaces the whole entry
    o.apply(CommitOffsets(group_id="g", offsets=(OffsetCommit("t", 0, 8),), now_ms=o.now, coordinator_epoch=1))
    assert [(c.offset, c.leader_epoch) for c in o.sm.fetch_offsets("g") if c.partition == 0] == [(8, -1)]


def test_an_offset_row_without_a_leader_epoch_decodes_as_none() -> None:
    with_epoch = CommitOffsets(group_id="g", offsets=(OffsetCommit("t", 1, 2, "m", 5),), now_ms=5, coordinator_epoch=6)
    raw = encode_group_command(with_epoch)
    assert decode_group_command(raw) == with_epoch
    four_fields = raw.replace(b'["t",1,2,"m",5]', b'["t",1,2,"m"]')
    assert four_fields != raw and decode_group_command(four_fields) == replace(
        with_epoch, offsets=(OffsetCommit("t", 1, 2, "m"),)
    )
    with pytest.raises(CommandDecodeError):
        decode_group_command(raw.replace(b'["t",1,2,"m",5]', b'["t",1,2,"m",5,6]'))
