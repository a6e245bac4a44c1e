"""One ``__consumer_offsets-p`` partition as a Raft state machine (``raft.state_machine.StateMachine``).

State: for every group that hashes to this partition (``coordinator.placement``)
its last completed rebalance (``GroupMetadata``), its committed offsets and
its pending transactional offsets per producer id, plus the producer fences
(``coordinator.group_metadata`` defines the terms). It lives in the node's
RocksDB under this partition's prefix::

    prefix + b"M"                                       header: last applied Raft index, coordinator epoch
    prefix + b"G" + group                               GroupMetadata
    prefix + b"C" + u16 len + group + u16 len + topic + u32 partition    CommittedOffset
    prefix + b"P" + u64 producer id + group             PendingOffsets
    prefix + b"F" + u64 producer id                     ProducerFence

(ids as UTF-8; every value a checksummed record that repeats its key's fields,
so a misplaced value is detected at load). Each applied entry writes the keys
it changes and the header in one WriteBatch (DESIGN.md rule 3): after a crash
state and ``last_applied`` agree and replayed entries are skipped.

``apply`` decodes the command, answers ``NOT_COORDINATOR`` to one from an older
coordinator epoch (a deposed leader's), runs the pure rule of
``coordinator.group_rules`` and persists its change; it never raises.

Thread-safety: ``apply``, ``write_snapshot``, ``read_snapshot`` and ``destroy``
run on the group's Raft thread only. The read methods may run on any thread:
values are immutable, and the maps are changed only under ``_lock`` (held for
dict operations, never for I/O) after the WriteBatch is written, so a reader
never sees a state that is not durable. The whole state is kept in memory: it
is metadata (a value per group, per committed partition and per producer).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable, Collection, Iterator
from typing import Any, BinaryIO

from clients.protocol import BrokerError, ErrorCode
from coordinator import group_rules
from coordinator.codec import decode_record, encode_record, get_int
from coordinator.errors import CommandDecodeError, CoordinatorCorruptionError
from coordinator.group_commands import (
    CommitOffsets,
    DeleteGroup,
    DeleteOffsets,
    ExpireProducers,
    GroupsCommand,
    StoreAssignment,
    StoreGroup,
    TxnCommitOffsets,
    WriteTxnMarker,
    decode_group_command,
)
from coordinator.group_metadata import (
    CommittedOffset,
    GroupMetadata,
    PendingOffsets,
    ProducerFence,
    decode_committed,
    decode_group,
    decode_pending,
    decode_producer,
    encode_committed,
    encode_group,
    encode_pending,
    encode_producer,
)
from coordinator.group_rules import GroupsChange, GroupsResult
from coordinator.metadata import TopicPartition
from coordinator.sm_support import SNAPSHOT_HEAD, guarded_apply, open_snapshot, seal_snapshot
from storage.store import NodeStore

__all__ = ["GroupStateMachine"]

log = logging.getLogger(__name__)

_HEADER = b"M"
_GROUP = b"G"
_COMMITTED = b"C"
_PENDING = b"P"
_PRODUCER = b"F"
_HEADER_VERSION = 1
_SNAPSHOT_MAGIC = b"GRCO"
_SNAPSHOT_VERSION = 1
_ENTRY_HEAD = struct.Struct(">II")  # key length, value length
_CRC = struct.Struct(">I")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

ApplyResult = GroupsResult | None


def _sized(text: str) -> bytes:
    raw = text.encode()
    return _U16.pack(len(raw)) + raw


def group_key(group_id: str) -> bytes:
    return _GROUP + group_id.encode()


def committed_key(group_id: str, tp: TopicPartition) -> bytes:
    return _COMMITTED + _sized(group_id) + _sized(tp.topic) + _U32.pack(tp.partition)


def pending_key(group_id: str, producer_id: int) -> bytes:
    return _PENDING + _U64.pack(producer_id) + group_id.encode()


def producer_key(producer_id: int) -> bytes:
    return _PRODUCER + _U64.pack(producer_id)


def _check_key(key: bytes, expected: bytes, where: str) -> None:
    if key != expected:
        raise CoordinatorCorruptionError(f"{where}: the value belongs under another key")


class _OffsetsState:
    """The in-memory maps; an ``OffsetsView`` for the rules. Mutated only through ``apply_change``/``add``."""

    def __init__(self) -> None:
        self.group_map: dict[str, GroupMetadata] = {}
        self.committed_map: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self.pending_map: dict[str, dict[int, PendingOffsets]] = {}
        self.producer_groups: dict[int, set[str]] = {}  # producer id -> groups it has pending offsets in
        self.fence_map: dict[int, ProducerFence] = {}

    # -- OffsetsView (group_rules)
    def group(self, group_id: str) -> GroupMetadata | None:
        return self.group_map.get(group_id)

    def committed(self, group_id: str, tp: TopicPartition) -> CommittedOffset | None:
        return self.committed_map.get(group_id, {}).get(tp)

    def pending(self, group_id: str, producer_id: int) -> PendingOffsets | None:
        return self.pending_map.get(group_id, {}).get(producer_id)

    def committed_of(self, group_id: str) -> list[TopicPartition]:
        return list(self.committed_map.get(group_id, {}))

    def has_pending(self, group_id: str) -> bool:
        return bool(self.pending_map.get(group_id))

    def pending_of_producer(self, producer_id: int) -> list[PendingOffsets]:
        return [self.pending_map[g][producer_id] for g in self.producer_groups.get(producer_id, ())]

    def producer(self, producer_id: int) -> ProducerFence | None:
        return self.fence_map.get(producer_id)

    def producers(self) -> list[ProducerFence]:
        return list(self.fence_map.values())

    # -- changes
    def set_group(self, g: GroupMetadata) -> None:
        self.group_map[g.group_id] = g

    def set_committed(self, c: CommittedOffset) -> None:
        self.committed_map.setdefault(c.group_id, {})[c.tp] = c

    def delete_committed(self, group_id: str, tp: TopicPartition) -> None:
        per_group = self.committed_map.get(group_id, {})
        per_group.pop(tp, None)
        if not per_group:
            self.committed_map.pop(group_id, None)

    def set_pending(self, group_id: str, producer_id: int, p: PendingOffsets | None) -> None:
        if p is None:
            per_group = self.pending_map.get(group_id, {})
            per_group.pop(producer_id, None)
            if not per_group:
                self.pending_map.pop(group_id, None)
            groups = self.producer_groups.get(producer_id, set())
            groups.discard(group_id)
            if not groups:
                self.producer_groups.pop(producer_id, None)
            return
        self.pending_map.setdefault(group_id, {})[producer_id] = p
        self.producer_groups.setdefault(producer_id, set()).add(group_id)

    def set_fence(self, producer_id: int, f: ProducerFence | None) -> None:
        if f is None:
            self.fence_map.pop(producer_id, None)
        else:
            self.fence_map[producer_id] = f

    def apply_change(self, change: GroupsChange) -> None:
        for gid, g in change.groups.items():
            if g is None:
                self.group_map.pop(gid, None)
            else:
                self.set_group(g)
        for (gid, tp), c in change.committed.items():
            if c is None:
                self.delete_committed(gid, tp)
            else:
                self.set_committed(c)
        for (group_id, pid), p in change.pending.items():
            self.set_pending(group_id, pid, p)
        for pid, f in change.producers.items():
            self.set_fence(pid, f)

    def add(self, key: bytes, value: bytes, where: str) -> None:
        """Load one persisted entry (``key`` without the partition prefix); checks it sits under its own key."""
        tag = key[:1]
        if tag == _GROUP:
            g = decode_group(value, where=where)
            _check_key(key, group_key(g.group_id), where)
            self.set_group(g)
        elif tag == _COMMITTED:
            c = decode_committed(value, where=where)
            _check_key(key, committed_key(c.group_id, c.tp), where)
            self.set_committed(c)
        elif tag == _PENDING:
            p = decode_pending(value, where=where)
            _check_key(key, pending_key(p.group_id, p.producer_id), where)
            self.set_pending(p.group_id, p.producer_id, p)
        elif tag == _PRODUCER:
            f = decode_producer(value, where=where)
            _check_key(key, producer_key(f.producer_id), where)
            self.set_fence(f.producer_id, f)
        else:
            raise CoordinatorCorruptionError(f"{where}: unknown entry tag {tag!r}")

    def entries(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key without prefix, value) of the state, in key order per kind."""
        for gid, g in sorted(self.group_map.items()):
            yield group_key(gid), encode_group(g)
        for gid, offsets in sorted(self.committed_map.items()):
            for tp, c in sorted(offsets.items()):
                yield committed_key(gid, tp), encode_committed(c)
        for gid, per_pid in sorted(self.pending_map.items()):
            for pid, p in sorted(per_pid.items()):
                yield pending_key(gid, pid), encode_pending(p)
        for pid, f in sorted(self.fence_map.items()):
            yield producer_key(pid), encode_producer(f)


def _run_rule(view: _OffsetsState, cmd: GroupsCommand, index: int) -> GroupsChange:
    if isinstance(cmd, CommitOffsets):
        return group_rules.commit_offsets(view, cmd, index)
    if isinstance(cmd, TxnCommitOffsets):
        return group_rules.txn_commit_offsets(view, cmd, index)
    if isinstance(cmd, WriteTxnMarker):
        return group_rules.write_txn_marker(view, cmd, index)
    if isinstance(cmd, StoreGroup):
        return group_rules.store_group(view, cmd)
    if isinstance(cmd, StoreAssignment):
        return group_rules.store_assignment(view, cmd)
    if isinstance(cmd, DeleteGroup):
        return group_rules.delete_group(view, cmd)
    if isinstance(cmd, DeleteOffsets):
        return group_rules.delete_offsets(view, cmd)
    assert isinstance(cmd, ExpireProducers)
    return group_rules.expire_producers(view, cmd)


class GroupStateMachine:
    """The group-coordinator state of one ``__consumer_offsets`` partition.

    ``prefix``: this partition's unique, prefix-free key prefix in the node's
    RocksDB (see ``storage.store``); ``partition``: its index (messages only).
    ``on_group_stored`` (optional) runs on the Raft thread after a completed
    rebalance is durable, on every replica; it must only hand off.
    """

    def __init__(self, store: NodeStore, prefix: bytes, partition: int) -> None:
        if not prefix:
            raise ValueError("an offsets partition needs a non-empty key prefix")
        self._store = store
        self._prefix = prefix
        self.partition = partition
        self.name = f"__consumer_offsets-{partition}"
        self._lock = threading.Lock()
        self._state = _OffsetsState()
        self._last_applied = 0
        self._coordinator_epoch = -1
        self.on_group_stored: Callable[[GroupMetadata], None] | None = None
        self._load()

    # -- loading -------------------------------------------------------------------------

    def _header(self, last_applied: int, coordinator_epoch: int) -> bytes:
        return encode_record({"last_applied": last_applied, "cepoch": coordinator_epoch}, _HEADER_VERSION)

    def _load(self) -> None:
        raw = self._store.db.get(self._prefix + _HEADER)
        state = _OffsetsState()
        count = 0
        for key, value in self._store.iter_prefix(self._prefix):
            suffix = key[len(self._prefix) :]
            if suffix == _HEADER:
                continue
            state.add(suffix, value, f"{self.name} key {suffix!r}")
            count += 1
        if raw is None:
            if count:
                raise CoordinatorCorruptionError(f"{self.name}: entries exist but the header is missing")
            return
        header = decode_record(raw, version=_HEADER_VERSION, where=f"{self.name} header")
        try:
            last_applied, cepoch = get_int(header, "last_applied"), get_int(header, "cepoch")
        except CommandDecodeError as exc:
            raise CoordinatorCorruptionError(f"{self.name} header: {exc}") from exc
        with self._lock:
            self._state, self._last_applied, self._coordinator_epoch = state, last_applied, cepoch

    # -- StateMachine ------------------------------------------------------------------------

    @property
    def last_applied(self) -> int:
        return self._last_applied

    @property
    def coordinator_epoch(self) -> int:
        return self._coordinator_epoch

    def apply(self, index: int, command: bytes) -> ApplyResult:
        result: ApplyResult = guarded_apply(
            self.name,
            index,
            command,
            last_applied=self._last_applied,
            coordinator_epoch=self._coordinator_epoch,
            decode=decode_group_command,
            record=lambda i: self._write(i, self._coordinator_epoch, None),
            run=self._apply_command,
        )
        return result

    def _apply_command(self, index: int, cmd: Any) -> ApplyResult:
        change = _run_rule(self._state, cmd, index)
        self._write(index, max(self._coordinator_epoch, cmd.coordinator_epoch), change)
        if isinstance(change.result, group_rules.GroupStored) and self.on_group_stored is not None:
            self.on_group_stored(change.result.metadata)
        return change.result

    def _write(self, index: int, cepoch: int, change: GroupsChange | None) -> None:
        """The header and the change's keys in one WriteBatch, then publish the change."""
        wb = self._store.new_batch()
        wb.put(self._prefix + _HEADER, self._header(index, cepoch))
        if change is not None:
            p = self._prefix
            for gid, g in change.groups.items():
                if g is None:
                    wb.delete(p + group_key(gid))
                else:
                    wb.put(p + group_key(gid), encode_group(g))
            for (gid, tp), c in change.committed.items():
                if c is None:
                    wb.delete(p + committed_key(gid, tp))
                else:
                    wb.put(p + committed_key(gid, tp), encode_committed(c))
            for (gid, pid), pending in change.pending.items():
                if pending is None:
                    wb.delete(p + pending_key(gid, pid))
                else:
                    wb.put(p + pending_key(gid, pid), encode_pending(pending))
            for pid, f in change.producers.items():
                if f is None:
                    wb.delete(p + producer_key(pid))
                else:
                    wb.put(p + producer_key(pid), encode_producer(f))
        self._store.write(wb)
        with self._lock:
            if change is not None:
                self._state.apply_change(change)
            self._last_applied, self._coordinator_epoch = index, cepoch

    def preview(self, cmd: GroupsCommand) -> GroupsResult:
        """What applying ``cmd`` now would answer; changes nothing (the leader's fail-fast pre-check)."""
        if cmd.coordinator_epoch < self._coordinator_epoch:
            return BrokerError(ErrorCode.NOT_COORDINATOR, f"{self.name}: coordinator epoch is stale")
        with self._lock:
            return _run_rule(self._state, cmd, self._last_applied + 1).result

    # -- snapshots ------------------------------------------------------------------------

    def write_snapshot(self, out: BinaryIO) -> None:
        """``GRCO | version | last_applied | coordinator epoch | count | (klen, vlen, key, value)* | crc32c``."""
        with self._lock:
            entries = list(self._state.entries())
            last_applied, cepoch = self._last_applied, self._coordinator_epoch
        framed = [_ENTRY_HEAD.pack(len(key), len(value)) + key + value for key, value in entries]
        out.write(seal_snapshot(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, last_applied, cepoch, framed))

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        """Replace the whole state with a ``write_snapshot`` stream, atomically.

        Every entry is decoded and checked before anything is written; then the
        old keys are deleted and the new ones written in one WriteBatch. A bad
        snapshot raises ``CoordinatorCorruptionError`` and leaves the state as it was.
        """
        where = f"{self.name} snapshot"
        body, cepoch, count = open_snapshot(inp.read(), _SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, where)
        state = _OffsetsState()
        entries: list[tuple[bytes, bytes]] = []
        pos = SNAPSHOT_HEAD.size
        for _ in range(count):
            if pos + _ENTRY_HEAD.size > len(body):
                raise CoordinatorCorruptionError(f"{where}: truncated entry")
            klen, vlen = _ENTRY_HEAD.unpack_from(body, pos)
            pos += _ENTRY_HEAD.size
            key, value = body[pos : pos + klen], body[pos + klen : pos + klen + vlen]
            pos += klen + vlen
            if len(key) != klen or len(value) != vlen or key == _HEADER:
                raise CoordinatorCorruptionError(f"{where}: truncated or misplaced entry")
            state.add(key, value, f"{where} {key!r}")
            entries.append((key, value))
        if pos != len(body):
            raise CoordinatorCorruptionError(f"{where}: {len(body) - pos} trailing bytes")
        wb = self._store.new_batch()
        wb.delete_range(self._prefix, self._prefix + b"\xff")  # every tag byte is < 0xff
        for key, value in entries:
            wb.put(self._prefix + key, value)
        wb.put(self._prefix + _HEADER, self._header(last_applied, cepoch))
        self._store.write(wb)
        with self._lock:
            self._state, self._last_applied, self._coordinator_epoch = state, last_applied, cepoch

    def destroy(self) -> None:
        """Delete this partition's whole state (the replica was moved away)."""
        self._store.delete_prefix(self._prefix)
        with self._lock:
            self._state = _OffsetsState()
            self._last_applied, self._coordinator_epoch = 0, -1

    # -- reads (any thread) ------------------------------------------------------------------

    def group(self, group_id: str) -> GroupMetadata | None:
        with self._lock:
            return self._state.group(group_id)

    def groups(self) -> list[GroupMetadata]:
        with self._lock:
            return sorted(self._state.group_map.values(), key=lambda g: g.group_id)

    def group_ids(self) -> list[str]:
        """Every group with metadata, committed offsets or pending offsets here."""
        with self._lock:
            s = self._state
            return sorted(set(s.group_map) | set(s.committed_map) | set(s.pending_map))

    def committed_offsets(self, group_id: str) -> dict[TopicPartition, CommittedOffset]:
        with self._lock:
            return dict(self._state.committed_map.get(group_id, {}))

    def pending_offsets(self, group_id: str) -> list[PendingOffsets]:
        with self._lock:
            return sorted(self._state.pending_map.get(group_id, {}).values(), key=lambda p: p.producer_id)

    def producer(self, producer_id: int) -> ProducerFence | None:
        with self._lock:
            return self._state.producer(producer_id)

    def producers(self) -> list[ProducerFence]:
        with self._lock:
            return sorted(self._state.producers(), key=lambda f: f.producer_id)

    def fetch_offsets(
        self,
        group_id: str,
        topics: Collection[str] | None = None,
        *,
        partitions: Collection[TopicPartition] | None = None,
        require_stable: bool = False,
    ) -> list[CommittedOffset]:
        """OffsetFetch: the committed offsets of ``group_id``, by partition.

        Only those of ``topics`` and of ``partitions`` when either is given. With
        ``require_stable`` (KIP-447) raises ``UNSTABLE_OFFSET_COMMIT`` while a
        transactional offset is pending for any requested partition: the new owner
        of a partition must not start from an offset a commit is about to replace.
        """
        with self._lock:
            committed = list(self._state.committed_map.get(group_id, {}).values())
            pending = list(self._state.pending_map.get(group_id, {}).values())
        everything = topics is None and partitions is None

        def wanted(tp: TopicPartition) -> bool:
            return (
                everything
                or (topics is not None and tp.topic in topics)
                or (partitions is not None and tp in partitions)
            )

        if require_stable:
            unstable = sorted({tp for p in pending for tp in p.offsets if wanted(tp)})
            if unstable:
                raise BrokerError(
                    ErrorCode.UNSTABLE_OFFSET_COMMIT,
                    f"transactional offsets are pending for {', '.join(map(str, unstable[:5]))}",
                    partitions=[{"topic": tp.topic, "partition": tp.partition} for tp in unstable],
                )
        return sorted((c for c in committed if wanted(c.tp)), key=lambda c: (c.topic, c.partition))

    def describe_pending(self, group_id: str) -> list[dict[str, Any]]:
        return [
            {
                "producer_id": p.producer_id,
                "producer_epoch": p.producer_epoch,
                "transactional_id": p.transactional_id,
                "topic": tp.topic,
                "partition": tp.partition,
                "offset": c.offset,
            }
            for p in self.pending_offsets(group_id)
            for tp, c in sorted(p.offsets.items())
        ]
