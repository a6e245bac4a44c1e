"""Offsets-partition rules: KIP-447 group fencing of commits, pending transactional offsets and their
markers (kafka_txn.md §4.3 TxnOffsetCommit/WriteTxnMarkers, §14 item 21), with a model-based check."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from clients.protocol import BrokerError, ErrorCode
from coordinator.group_commands import (
    CommitOffsets,
    ExpireProducers,
    GroupsCommand,
    OffsetCommit,
    StoreGroup,
    TxnCommitOffsets,
    WriteTxnMarker,
    encode_group_command,
)
from coordinator.group_metadata import MemberMetadata
from coordinator.group_rules import GroupStored, MarkerApplied, OffsetsCommitted, validate_member
from coordinator.group_state_machine import GroupStateMachine
from coordinator.metadata import TopicPartition
from storage.store import NodeStore

PREFIX = b"O\x00\x00\x00\x01"


class Offsets:
    """A GroupStateMachine driven like its Raft group would (increasing indexes, leader term 1)."""

    def __init__(self, store: NodeStore, prefix: bytes = PREFIX) -> None:
        self.sm = GroupStateMachine(store, prefix, 1)
        self.index = itertools.count(self.sm.last_applied + 1)
        self.now = 1000

    def apply(self, cmd: GroupsCommand) -> object:
        self.now += 1
        return self.sm.apply(next(self.index), encode_group_command(cmd))

    def commit(self, group: str, offsets: dict[int, int], member: str = "", gen: int = -1) -> object:
        return self.apply(CommitOffsets(group_id=group, offsets=_offs(offsets), member_id=member, generation_id=gen,
                                        now_ms=self.now, coordinator_epoch=1))  # fmt: skip

    def txn_commit(self, group: str, pid: int, epoch: int, offsets: dict[int, int], member: str = "",
                   gen: int = -1) -> object:  # fmt: skip
        return self.apply(TxnCommitOffsets(group_id=group, transactional_id=f"tx{pid}", producer_id=pid,
                                           producer_epoch=epoch, offsets=_offs(offsets), member_id=member,
                                           generation_id=gen, now_ms=self.now, coordinator_epoch=1))  # fmt: skip

    def marker(self, pid: int, epoch: int, commit: bool, cepoch: int = 0) -> object:
        return self.apply(WriteTxnMarker(producer_id=pid, producer_epoch=epoch, txn_coordinator_epoch=cepoch,
                                         commit=commit, now_ms=self.now, coordinator_epoch=1))  # fmt: skip

    def store_group(self, group: str, *members: str) -> object:
        metas = tuple(MemberMetadata(m, ("t",), "range", 10_000, 30_000) for m in members)
        return self.apply(StoreGroup(group_id=group, protocol="range" if members else None,
                                     leader_id=members[0] if members else None, members=metas,
                                     topic_partitions=(("t", 4),), now_ms=self.now, coordinator_epoch=1))  # fmt: skip

    def visible(self, group: str, stable: bool = False) -> dict[int, int]:
        return {c.partition: c.offset for c in self.sm.fetch_offsets(group, require_stable=stable)}


def _offs(offsets: dict[int, int]) -> tuple[OffsetCommit, ...]:
    return tuple(OffsetCommit("t", p, o, "") for p, o in offsets.items())


def code(result: object) -> ErrorCode | None:
    return result.error_code if isinstance(result, BrokerError) else None


@pytest.mark.parametrize(
    ("members", "member_id", "generation", "transactional", "expected"),
    [
        ((), "", -1, False, None),  # a group used only to store offsets
        (("a",), "", -1, False, ErrorCode.UNKNOWN_MEMBER_ID),  # a group with members requires them
        (("a",), "", -1, True, None),  # KIP-447 compatibility: txn commit without group metadata
        (("a",), "a", 3, False, None),
        (("a",), "a", 3, True, None),
        (("a",), "a", 2, True, ErrorCode.ILLEGAL_GENERATION),  # a zombie from an older generation
        (("a",), "b", 3, True, ErrorCode.UNKNOWN_MEMBER_ID),  # expelled or never a member
        (("a",), "", 3, False, ErrorCode.UNKNOWN_MEMBER_ID),
        ((), "a", 3, True, ErrorCode.UNKNOWN_MEMBER_ID),
    ],
)
def test_group_fencing_of_commits_kip447(
    members: tuple[str, ...], member_id: str, generation: int, transactional: bool, expected: ErrorCode | None
) -> None:
    assert code(validate_member(members, 3, member_id, generation, transactional=transactional)) is expected


def test_commits_are_checked_against_the_stored_generation(store: NodeStore) -> None:
    o = Offsets(store)
    stored = o.store_group("g", "a")
    assert isinstance(stored, GroupStored) and stored.metadata.generation_id == 1
    assert o.store_group("g", "a", "b").metadata.generation_id == 2  # type: ignore[attr-defined]
    assert code(o.commit("g", {0: 5}, member="a", gen=1)) is ErrorCode.ILLEGAL_GENERATION
    assert code(o.txn_commit("g", 7, 0, {0: 5}, member="a", gen=1)) is ErrorCode.ILLEGAL_GENERATION
    assert code(o.commit("g", {0: 5})) is ErrorCode.UNKNOWN_MEMBER_ID
    assert o.visible("g") == {} and o.sm.pending_offsets("g") == [] and o.sm.producer(7) is None
    assert o.commit("g", {0: 5}, member="b", gen=2) == OffsetsCommitted("g", 1, pending=False)
    assert o.visible("g") == {0: 5}


def test_transactional_offsets_are_pending_until_commit_and_dropped_on_abort(store: NodeStore) -> None:
    o = Offsets(store)
    assert o.txn_commit("g", 7, 0, {0: 10, 1: 11}) == OffsetsCommitted("g", 2, pending=True)
    assert o.visible("g") == {}
    with pytest.raises(BrokerError) as exc:
        o.visible("g", stable=True)
    assert exc.value.error_code is ErrorCode.UNSTABLE_OFFSET_COMMIT and exc.value.retriable
    assert o.sm.fetch_offsets("g", ["other"], require_stable=True) == []  # only requested partitions count
    assert o.sm.fetch_offsets("g", partitions=[TopicPartition("t", 2)], require_stable=True) == []
    with pytest.raises(BrokerError, match="UNSTABLE_OFFSET_COMMIT"):
        o.sm.fetch_offsets("g", partitions=[TopicPartition("t", 1)], require_stable=True)
    assert o.marker(7, 1, commit=False) == MarkerApplied(7, False, ("g",), 2)
    assert o.visible("g", stable=True) == {}
    assert o.txn_commit("g", 7, 1, {0: 20}) == OffsetsCommitted("g", 1, pending=True)
    assert o.marker(7, 2, commit=True) == MarkerApplied(7, True, ("g",), 1)
    assert o.visible("g", stable=True) == {0: 20}


def test_one_marker_resolves_the_producers_offsets_in_every_group(store: NodeStore) -> None:
    o = Offsets(store)
    o.txn_commit("g1", 7, 0, {0: 1})
    o.txn_commit("g2", 7, 0, {0: 2})
    o.txn_commit("g2", 8, 0, {1: 3})  # another producer's transaction is not touched
    assert o.marker(7, 1, commit=True) == MarkerApplied(7, True, ("g1", "g2"), 2)
    assert o.visible("g1") == {0: 1} and o.visible("g2") == {0: 2}
    assert [p.producer_id for p in o.sm.pending_offsets("g2")] == [8]


@pytest.mark.parametrize(
    ("marker_epoch", "cepoch", "expected"),
    [
        (1, 4, ErrorCode.TRANSACTION_COORDINATOR_FENCED),  # from a deposed transaction coordinator
        (0, 5, ErrorCode.INVALID_PRODUCER_EPOCH),  # older than the open transaction
        (1, 5, ErrorCode.INVALID_PRODUCER_EPOCH),  # TV2: equal to the open txn's epoch: a stale marker
        (2, 5, None),
    ],
)
def test_marker_fencing(store: NodeStore, marker_epoch: int, cepoch: int, expected: ErrorCode | None) -> None:
    o = Offsets(store)
    o.marker(7, 1, commit=False, cepoch=5)  # the producer's previous transaction ended at epoch 1, term 5
    o.txn_commit("g", 7, 1, {0: 9})
    result = o.marker(7, marker_epoch, commit=True, cepoch=cepoch)
    assert code(result) is expected
    assert o.visible("g") == ({} if expected else {0: 9})


def test_retried_marker_with_nothing_pending_is_accepted(store: NodeStore) -> None:
    o = Offsets(store)
    o.txn_commit("g", 7, 0, {0: 9})
    assert isinstance(o.marker(7, 1, commit=True), MarkerApplied)
    assert o.marker(7, 1, commit=True) == MarkerApplied(7, True, (), 0)
    assert o.visible("g") == {0: 9}


def test_txn_commit_fenced_by_producer_epoch(store: NodeStore) -> None:
    o = Offsets(store)
    o.txn_commit("g", 7, 3, {0: 1})
    # a commit of the next transaction while this one waits for its marker: retriable
    assert code(o.txn_commit("g", 7, 4, {0: 2})) is ErrorCode.CONCURRENT_TRANSACTIONS
    o.marker(7, 4, commit=True)
    # a late commit of the ended transaction (KIP-890's delayed request) is fenced
    assert code(o.txn_commit("g", 7, 3, {0: 5})) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert o.visible("g", stable=True) == {0: 1}


def test_a_later_plain_commit_wins_over_an_earlier_transactional_one(store: NodeStore) -> None:
    o = Offsets(store)
    o.txn_commit("g", 7, 0, {0: 10, 1: 10})
    o.commit("g", {0: 50})  # written after the txn's offset for partition 0
    o.marker(7, 1, commit=True)
    assert o.visible("g") == {0: 50, 1: 10}


def test_idle_producer_fences_expire_but_not_with_pending_offsets(store: NodeStore) -> None:
    o = Offsets(store)
    o.txn_commit("g", 7, 0, {0: 1})
    o.marker(7, 1, commit=True)
    o.txn_commit("g", 8, 0, {0: 2})
    o.now += 10_000
    assert [f.producer_id for f in o.sm.producers()] == [7, 8]
    o.apply(ExpireProducers(now_ms=o.now, coordinator_epoch=1, expiration_ms=5_000))
    assert [f.producer_id for f in o.sm.producers()] == [8]


class OffsetsModel(RuleBasedStateMachine):
    """Visible offsets == the newest write (by apply order) among plain and committed-transaction writes."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self._dir = tempfile.TemporaryDirectory()
        self.store = NodeStore(Path(self._dir.name) / "db")
        self.o = Offsets(self.store)
        self.seq = itertools.count()
        self.visible: dict[int, tuple[int, int]] = {}  # partition -> (write seq, offset)
        self.pending: dict[int, dict[int, tuple[int, int]]] = {7: {}, 8: {}}
        self.epoch = {7: 0, 8: 0}

    def teardown(self) -> None:
        self.store.close()
        self._dir.cleanup()

    @rule(partition=st.integers(0, 2), offset=st.integers(0, 100))
    def plain_commit(self, partition: int, offset: int) -> None:
        assert isinstance(self.o.commit("g", {partition: offset}), OffsetsCommitted)
        self.visible[partition] = (next(self.seq), offset)

    @rule(pid=st.sampled_from([7, 8]), partition=st.integers(0, 2), offset=st.integers(0, 100))
    def txn_commit(self, pid: int, partition: int, offset: int) -> None:
        assert isinstance(self.o.txn_commit("g", pid, self.epoch[pid], {partition: offset}), OffsetsCommitted)
        self.pending[pid][partition] = (next(self.seq), offset)

    @rule(pid=st.sampled_from([7, 8]), commit=st.booleans())
    def end_txn(self, pid: int, commit: bool) -> None:
        self.epoch[pid] += 1
        assert isinstance(self.o.marker(pid, self.epoch[pid], commit), MarkerApplied)
        if commit:
            for p, write in self.pending[pid].items():
                if p not in self.visible or self.visible[p] < write:
                    self.visible[p] = write
        self.pending[pid] = {}

    @rule(pid=st.sampled_from([7, 8]))
    def stale_txn_commit(self, pid: int) -> None:
        if self.epoch[pid] > 0:
            assert code(self.o.txn_commit("g", pid, self.epoch[pid] - 1, {0: 999})) is ErrorCode.INVALID_PRODUCER_EPOCH

    @invariant()
    def matches(self) -> None:
        assert self.o.visible("g") == {p: off for p, (_s, off) in self.visible.items()}
        if any(self.pending.values()):
            with pytest.raises(BrokerError, match="UNSTABLE_OFFSET_COMMIT"):
                self.o.visible("g", stable=True)
        else:
            self.o.visible("g", stable=True)


TestOffsetsModel = OffsetsModel.TestCase
TestOffsetsModel.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
