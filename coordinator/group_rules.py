"""The rules of the offsets partition, as pure functions from (state view, command) to a change.

Each rule reads the replicated state through ``OffsetsView`` and returns a
``GroupsChange``: the answer plus the values to write (None deletes). The
state machine persists the change and publishes it; nothing here writes.
Errors are ``BrokerError`` values with an empty change.

Group fencing of commits (Kafka's ``validateOffsetCommit``, KIP-447):

* a commit that carries a group identity (``generation_id >= 0`` or a
  ``member_id``) must come from a current member (else ``UNKNOWN_MEMBER_ID``)
  of the current generation (else ``ILLEGAL_GENERATION``) -- transactional or
  not, so a zombie copier that lost its partitions in a rebalance cannot commit;
* a plain commit without identity is allowed only while the group has no
  members (a group used just to store offsets); a transactional one without
  identity is allowed (producers that do not send group metadata, KIP-447's
  compatibility path), fenced by its producer epoch only.

Producer fencing of TxnOffsetCommit and markers (the rules of
``storage.producer_state`` on this partition, transactions v2):

* a TxnOffsetCommit with an epoch below the producer's newest is
  ``INVALID_PRODUCER_EPOCH`` (it arrived after its transaction ended); one
  with a newer epoch while the previous transaction's offsets still wait for
  their marker is ``CONCURRENT_TRANSACTIONS`` (retriable);
* a marker from an older transaction-coordinator epoch than seen is
  ``TRANSACTION_COORDINATOR_FENCED``; one whose epoch is below the
  producer's, or equal while offsets are pending, is ``INVALID_PRODUCER_EPOCH``
  (TV2 markers carry the epoch bumped at EndTxn);
* a COMMIT marker makes the producer's pending offsets of every group of this
  partition committed (unless a later commit already wrote that partition);
  an ABORT marker drops them.

Deleting a group (Kafka's DeleteGroups) writes tombstones for its metadata and
every committed offset, and only for an empty group: one that is unknown here
(no metadata, no offsets) is ``GROUP_ID_NOT_FOUND``; one whose last stored
generation has members is ``NON_EMPTY_GROUP``; one with transactional offsets
still pending for a producer is ``CONCURRENT_TRANSACTIONS`` (retriable: the
transaction's marker resolves them, then the delete succeeds), so a COMMIT
marker can never bring offsets of a deleted group back. Deleting some of a
group's offsets (Kafka's OffsetDelete) removes the committed offsets of the
named partitions, except those of topics a member of the stored generation
subscribes to (refused per partition, Kafka's GROUP_SUBSCRIBED_TO_TOPIC); a
group unknown here is ``GROUP_ID_NOT_FOUND``.

A client-assigned group's generation is stored twice: ``store_group`` with
its members (``awaiting_sync``), then ``store_assignment`` with the leader's
assignment for that generation (else ``ILLEGAL_GENERATION``; a second one is
``REBALANCE_IN_PROGRESS``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Protocol

from clients.protocol import BrokerError, ErrorCode
from coordinator.consumer_protocol import CONSUMER_PROTOCOL_TYPE, ConsumerProtocolError, decode_assignment
from coordinator.group_commands import (
    CommitOffsets,
    DeleteGroup,
    DeleteOffsets,
    ExpireProducers,
    OffsetCommit,
    StoreAssignment,
    StoreGroup,
    TxnCommitOffsets,
    WriteTxnMarker,
)
from coordinator.group_metadata import (
    NO_GENERATION,
    CommittedOffset,
    GroupMetadata,
    PendingOffsets,
    ProducerFence,
)
from coordinator.metadata import TopicPartition
from storage.producer_state import ProducerAppendInfo, ProducerStateEntry

__all__ = [
    "GroupDeleted",
    "GroupStored",
    "GroupsChange",
    "GroupsResult",
    "MarkerApplied",
    "OffsetsCommitted",
    "OffsetsDeleted",
    "OffsetsView",
    "ProducersExpired",
    "commit_offsets",
    "delete_group",
    "delete_offsets",
    "expire_producers",
    "marker_error",
    "store_assignment",
    "store_group",
    "txn_commit_offsets",
    "validate_member",
    "write_txn_marker",
]


class OffsetsView(Protocol):
    def group(self, group_id: str) -> GroupMetadata | None: ...
    def committed(self, group_id: str, tp: TopicPartition) -> CommittedOffset | None: ...
    def pending(self, group_id: str, producer_id: int) -> PendingOffsets | None: ...
    def committed_of(self, group_id: str) -> Collection[TopicPartition]: ...
    def has_pending(self, group_id: str) -> bool: ...
    def pending_of_producer(self, producer_id: int) -> list[PendingOffsets]: ...
    def producer(self, producer_id: int) -> ProducerFence | None: ...
    def producers(self) -> list[ProducerFence]: ...


@dataclass(frozen=True, slots=True)
class OffsetsCommitted:
    group_id: str
    count: int
    pending: bool  # transactional: visible only after the COMMIT marker


@dataclass(frozen=True, slots=True)
class MarkerApplied:
    producer_id: int
    commit: bool
    groups: tuple[str, ...]  # groups whose pending offsets the marker resolved
    offsets: int  # offsets made visible (commit) or dropped (abort)


@dataclass(frozen=True, slots=True)
class GroupStored:
    metadata: GroupMetadata


@dataclass(frozen=True, slots=True)
class ProducersExpired:
    count: int


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    group_id: str
    offsets: int  # committed offsets removed


@dataclass(frozen=True, slots=True)
class OffsetsDeleted:
    group_id: str
    deleted: int  # committed offsets removed
    subscribed: tuple[TopicPartition, ...]  # refused: a member subscribes to their topic


GroupsResult = (
    OffsetsCommitted | MarkerApplied | GroupStored | ProducersExpired | GroupDeleted | OffsetsDeleted | BrokerError
)


@dataclass
class GroupsChange:
    """The answer and the values to write; None deletes (a tombstone)."""

    result: GroupsResult
    groups: dict[str, GroupMetadata | None] = field(default_factory=dict)
    committed: dict[tuple[str, TopicPartition], CommittedOffset | None] = field(default_factory=dict)
    pending: dict[tuple[str, int], PendingOffsets | None] = field(default_factory=dict)
    producers: dict[int, ProducerFence | None] = field(default_factory=dict)


def validate_member(
    members: Collection[str], group_generation: int, member_id: str, generation_id: int, *, transactional: bool
) -> BrokerError | None:
    """KIP-447 group fencing of a commit against a group's members and generation (module docstring)."""
    if generation_id != NO_GENERATION or member_id:
        if member_id not in members:
            return BrokerError(ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} is not a member of the group")
        if generation_id != group_generation:
            return BrokerError(
                ErrorCode.ILLEGAL_GENERATION,
                f"generation {generation_id} is not the group's current generation {group_generation}",
            )
        return None
    if not transactional and members:
        return BrokerError(
            ErrorCode.UNKNOWN_MEMBER_ID, "the group has members: commit with your member_id and generation_id"
        )
    return None


def _group_check(view: OffsetsView, group_id: str, member_id: str, generation_id: int, txn: bool) -> BrokerError | None:
    g = view.group(group_id)
    members = g.member_ids if g is not None else frozenset()
    return validate_member(members, g.generation_id if g else 0, member_id, generation_id, transactional=txn)


def _committed(group_id: str, o: OffsetCommit, now_ms: int, index: int) -> CommittedOffset:
    return CommittedOffset(group_id, o.topic, o.partition, o.offset, o.metadata, now_ms, index, o.leader_epoch)


def commit_offsets(view: OffsetsView, cmd: CommitOffsets, index: int) -> GroupsChange:
    err = _group_check(view, cmd.group_id, cmd.member_id, cmd.generation_id, False)
    if err is not None:
        return GroupsChange(err)
    change = GroupsChange(OffsetsCommitted(cmd.group_id, len(cmd.offsets), pending=False))
    for o in cmd.offsets:
        change.committed[(cmd.group_id, TopicPartition(o.topic, o.partition))] = _committed(
            cmd.group_id, o, cmd.now_ms, index
        )
    return change


def txn_commit_offsets(view: OffsetsView, cmd: TxnCommitOffsets, index: int) -> GroupsChange:
    err = _group_check(view, cmd.group_id, cmd.member_id, cmd.generation_id, True)
    if err is not None:
        return GroupsChange(err)
    pid, epoch = cmd.producer_id, cmd.producer_epoch
    fence = view.producer(pid)
    if fence is not None and epoch < fence.producer_epoch:
        return GroupsChange(
            BrokerError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {pid}: epoch {epoch} is older than {fence.producer_epoch} (its transaction has ended)",
            )
        )
    if fence is not None and fence.open_epoch is not None and epoch != fence.open_epoch:
        return GroupsChange(
            BrokerError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"producer {pid}: offsets of epoch {fence.open_epoch} still wait for their transaction marker",
            )
        )
    old = view.pending(cmd.group_id, pid)
    offsets = dict(old.offsets) if old is not None else {}
    for o in cmd.offsets:
        offsets[TopicPartition(o.topic, o.partition)] = _committed(cmd.group_id, o, cmd.now_ms, index)
    change = GroupsChange(OffsetsCommitted(cmd.group_id, len(cmd.offsets), pending=True))
    change.pending[(cmd.group_id, pid)] = PendingOffsets(cmd.group_id, pid, epoch, cmd.transactional_id, offsets)
    last_cepoch = fence.coordinator_epoch if fence is not None else -1
    change.producers[pid] = ProducerFence(pid, epoch, last_cepoch, epoch, cmd.now_ms)
    return change


def marker_error(
    fence: ProducerFence | None, producer_epoch: int, txn_coordinator_epoch: int, classic: bool = False
) -> BrokerError | None:
    """The error for a COMMIT/ABORT marker of this producer, or None: a data partition's marker rule
    (``storage.producer_state``), with "a transaction is open" meaning "offsets are pending"."""
    if fence is None:
        return None
    entry = ProducerStateEntry(
        fence.producer_id,
        fence.producer_epoch,
        coordinator_epoch=fence.coordinator_epoch,
        current_txn_first_offset=None if fence.open_epoch is None else 0,
    )
    info = ProducerAppendInfo(fence.producer_id, entry, state_may_be_lost=False)
    return info.validate_marker(producer_epoch, txn_coordinator_epoch, classic)


def write_txn_marker(view: OffsetsView, cmd: WriteTxnMarker, index: int) -> GroupsChange:
    pid = cmd.producer_id
    fence = view.producer(pid)
    err = marker_error(fence, cmd.producer_epoch, cmd.txn_coordinator_epoch, cmd.classic)
    if err is not None:
        return GroupsChange(err)
    pendings = sorted(view.pending_of_producer(pid), key=lambda p: p.group_id)
    count = sum(len(p.offsets) for p in pendings)
    change = GroupsChange(MarkerApplied(pid, cmd.commit, tuple(p.group_id for p in pendings), count))
    for p in pendings:
        change.pending[(p.group_id, pid)] = None
        if not cmd.commit:
            continue
        for tp, offset in p.offsets.items():
            current = view.committed(p.group_id, tp)
            if current is None or current.applied_index < offset.applied_index:
                change.committed[(p.group_id, tp)] = offset
    cepoch = max(fence.coordinator_epoch if fence is not None else -1, cmd.txn_coordinator_epoch)
    change.producers[pid] = ProducerFence(pid, cmd.producer_epoch, cepoch, None, cmd.now_ms)
    return change


def store_group(view: OffsetsView, cmd: StoreGroup) -> GroupsChange:
    old = view.group(cmd.group_id)
    meta = GroupMetadata(
        group_id=cmd.group_id,
        generation_id=(old.generation_id if old is not None else 0) + 1,
        protocol=cmd.protocol,
        leader_id=cmd.leader_id,
        members=cmd.members,
        topic_partitions=cmd.topic_partitions,
        updated_ms=cmd.now_ms,
        protocol_type=cmd.protocol_type,
        awaiting_sync=cmd.protocol_type is not None and bool(cmd.members),
    )
    return GroupsChange(GroupStored(meta), groups={cmd.group_id: meta})


def store_assignment(view: OffsetsView, cmd: StoreAssignment) -> GroupsChange:
    """SyncGroup's assignment of the stored generation (``StoreAssignment``); decoded for display only."""
    g = view.group(cmd.group_id)
    if g is None or g.generation_id != cmd.generation_id:
        current = g.generation_id if g is not None else 0
        return GroupsChange(
            BrokerError(
                ErrorCode.ILLEGAL_GENERATION,
                f"generation {cmd.generation_id} is not the group's current generation {current}",
            )
        )
    if not g.awaiting_sync:
        return GroupsChange(
            BrokerError(ErrorCode.REBALANCE_IN_PROGRESS, f"generation {g.generation_id} already has its assignment")
        )
    given = dict(cmd.assignments)
    members = tuple(
        replace(m, assignment_data=given.get(m.member_id, b""), assignment=_decoded_assignment(g.protocol_type,
                given.get(m.member_id, b"")))
        for m in g.members
    )  # fmt: skip
    meta = replace(g, members=members, awaiting_sync=False, updated_ms=cmd.now_ms)
    return GroupsChange(GroupStored(meta), groups={cmd.group_id: meta})


def _decoded_assignment(protocol_type: str | None, data: bytes) -> tuple[TopicPartition, ...]:
    if protocol_type != CONSUMER_PROTOCOL_TYPE:
        return ()
    try:
        return decode_assignment(data)
    except ConsumerProtocolError:
        return ()


def expire_producers(view: OffsetsView, cmd: ExpireProducers) -> GroupsChange:
    change = GroupsChange(ProducersExpired(0))
    for f in view.producers():
        if f.open_epoch is None and f.last_update_ms + cmd.expiration_ms <= cmd.now_ms:
            change.producers[f.producer_id] = None
    change.result = ProducersExpired(len(change.producers))
    return change


def delete_group(view: OffsetsView, cmd: DeleteGroup) -> GroupsChange:
    """DeleteGroups for an empty group: tombstones for its metadata and committed offsets (module docstring)."""
    gid = cmd.group_id
    g = view.group(gid)
    committed = sorted(view.committed_of(gid))
    pending = view.has_pending(gid)
    if g is None and not committed and not pending:
        return GroupsChange(BrokerError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {gid!r} does not exist"))
    if g is not None and g.members:
        return GroupsChange(
            BrokerError(ErrorCode.NON_EMPTY_GROUP, f"group {gid!r} has {len(g.members)} member(s); it is not empty")
        )
    if pending:
        return GroupsChange(
            BrokerError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"group {gid!r} has transactional offsets waiting for their transaction's marker; retry after it",
            )
        )
    change = GroupsChange(GroupDeleted(gid, len(committed)))
    if g is not None:
        change.groups[gid] = None
    for tp in committed:
        change.committed[(gid, tp)] = None
    return change


def delete_offsets(view: OffsetsView, cmd: DeleteOffsets) -> GroupsChange:
    """OffsetDelete: tombstones for the named partitions' committed offsets (module docstring)."""
    gid = cmd.group_id
    g = view.group(gid)
    if g is None and not view.committed_of(gid) and not view.has_pending(gid):
        return GroupsChange(BrokerError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {gid!r} does not exist"))
    subscribed_topics = {t for m in g.members for t in m.topics} if g is not None else set()
    named = sorted({TopicPartition(t, p) for t, p in cmd.partitions})
    refused = tuple(tp for tp in named if tp.topic in subscribed_topics)
    change = GroupsChange(OffsetsDeleted(gid, 0, refused))
    for tp in named:
        if tp.topic not in subscribed_topics and view.committed(gid, tp) is not None:
            change.committed[(gid, tp)] = None
    change.result = OffsetsDeleted(gid, len(change.committed), refused)
    return change
