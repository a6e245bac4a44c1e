"""One ``__transaction_state-p`` partition as a Raft state machine (``raft.state_machine.StateMachine``).

State: the ``TransactionMetadata`` of every transactional id that hashes to
this partition (``coordinator.placement``) and the decisions of the commit
groups that hash here (``coordinator.group_commit``). It lives in the node's
RocksDB under this partition's prefix, one key per id, plus a header::

    prefix + b"M"          header record: last applied Raft index, highest coordinator epoch
    prefix + b"T" + tid    encode_metadata(...)   (tid as UTF-8)
    prefix + b"G" + group  encode_decision(...)

Every value is a checksummed, versioned record (``coordinator.codec``). Each
applied entry writes the keys it changes and the header in one WriteBatch
(DESIGN.md rule 3), so after a crash the state and ``last_applied`` agree and
replayed entries are skipped.

``apply`` decodes the command, rejects one from an older coordinator epoch
(NOT_COORDINATOR), runs the pure rule of ``coordinator.transitions`` /
``coordinator.group_commit``, persists the outcome, and returns its result;
it never raises.

Thread-safety: ``apply``, ``write_snapshot``, ``read_snapshot`` and
``destroy`` run on the group's Raft thread only. The read methods may run on
any thread: values are immutable and the two dicts are replaced entry by
entry under ``_lock`` (held only for dict operations, never for I/O), after
the WriteBatch is written, so a reader never sees a state that is not durable.
The callbacks (``on_markers`` when a transaction enters a prepare state,
``on_group_decision`` when a decision is recorded) run on every replica, on
the Raft thread, after the state is durable; they must only hand off
(``loop.call_soon_threadsafe``), and only a leader acts on them. A snapshot is
read whole into memory: the state is metadata, one small value per id.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any, BinaryIO, TypeVar

from clients.protocol import BrokerError, ErrorCode
from coordinator import group_commit, scans, transitions
from coordinator.codec import decode_record, encode_record, get_int
from coordinator.commands import (
    AddPartitions,
    BindPrepared,
    Command,
    CompleteTxn,
    DecideGroup,
    EndTxn,
    ExpireTransactionalId,
    FenceAndAbort,
    ForgetGroup,
    GroupCommand,
    GroupMemberDone,
    InitProducerId,
    Prepare,
    ResolvePrepared,
    decode_command,
)
from coordinator.errors import CommandDecodeError, CoordinatorCorruptionError
from coordinator.group_commit import GroupDecision, GroupDecisionResult, decode_decision, encode_decision
from coordinator.metadata import MarkerPlan, TopicPartition, TransactionMetadata, decode_metadata, encode_metadata
from coordinator.scans import DEFAULT_MAX_PREPARED_MS
from coordinator.sm_support import SNAPSHOT_HEAD, guarded_apply, open_snapshot, seal_snapshot
from coordinator.states import OPEN_STATES, TransactionState
from coordinator.transitions import TxnResult
from storage.store import NodeStore

__all__ = ["ApplyResult", "TransactionStateMachine"]

log = logging.getLogger(__name__)

ApplyResult = TxnResult | GroupDecisionResult | BrokerError | None

_V = TypeVar("_V", TransactionMetadata, GroupDecision)

_HEADER_TAG = b"M"
_TXN_TAG = b"T"
_GROUP_TAG = b"G"
_HEADER_VERSION = 1
_SNAPSHOT_MAGIC = b"TXCO"
_SNAPSHOT_VERSION = 1
_ENTRY_HEAD = struct.Struct(">cII")  # tag, key length, value length
_CRC = struct.Struct(">I")

_TXN_RULES: Mapping[type, Callable[[TransactionMetadata | None, Any], transitions.Outcome]] = {
    InitProducerId: transitions.init_producer_id,
    AddPartitions: transitions.add_partitions,
    EndTxn: transitions.end_txn,
    CompleteTxn: transitions.complete_txn,
    Prepare: transitions.prepare,
    BindPrepared: transitions.bind_prepared,
    ResolvePrepared: transitions.resolve_prepared,
    FenceAndAbort: transitions.fence_and_abort,
    ExpireTransactionalId: transitions.expire_transactional_id,
}
_GROUP_RULES: Mapping[type, Callable[[GroupDecision | None, Any], group_commit.GroupOutcome]] = {
    DecideGroup: group_commit.decide_group,
    GroupMemberDone: group_commit.group_member_done,
    ForgetGroup: group_commit.forget_group,
}


class TransactionStateMachine:
    """The coordinator state of one ``__transaction_state`` partition.

    ``prefix``: this partition's unique, prefix-free key prefix in the node's
    RocksDB (see ``storage.store``); ``partition``: its index (log lines only).
    """

    def __init__(self, store: NodeStore, prefix: bytes, partition: int) -> None:
        if not prefix:
            raise ValueError("a transaction-state partition needs a non-empty key prefix")
        self._store = store
        self._prefix = prefix
        self.partition = partition
        self.name = f"__transaction_state-{partition}"
        self._lock = threading.Lock()
        self._txns: dict[str, TransactionMetadata] = {}
        self._groups: dict[str, GroupDecision] = {}
        self._last_applied = 0
        self._coordinator_epoch = -1
        self.on_markers: Callable[[MarkerPlan], None] | None = None
        self.on_group_decision: Callable[[GroupDecision], None] | None = None
        self._load()

    # -- keys and loading ---------------------------------------------------------

    def _txn_key(self, transactional_id: str) -> bytes:
        return self._prefix + _TXN_TAG + transactional_id.encode()

    def _group_key(self, group_id: str) -> bytes:
        return self._prefix + _GROUP_TAG + group_id.encode()

    def _header(self, last_applied: int, coordinator_epoch: int) -> bytes:
        return encode_record({"last_applied": last_applied, "cepoch": coordinator_epoch}, _HEADER_VERSION)

    def _load(self) -> None:
        raw = self._store.db.get(self._prefix + _HEADER_TAG)
        txns = self._load_entries(_TXN_TAG, decode_metadata, lambda m: m.transactional_id)
        groups = self._load_entries(_GROUP_TAG, decode_decision, lambda g: g.group_id)
        if raw is None:
            if txns or groups:
                raise CoordinatorCorruptionError(f"{self.name}: entries exist but the header is missing")
            return
        header = decode_record(raw, version=_HEADER_VERSION, where=f"{self.name} header")
        try:
            last_applied, cepoch = get_int(header, "last_applied"), get_int(header, "cepoch")
        except CommandDecodeError as exc:
            raise CoordinatorCorruptionError(f"{self.name} header: {exc}") from exc
        with self._lock:
            self._txns, self._groups = txns, groups
            self._last_applied, self._coordinator_epoch = last_applied, cepoch

    def _load_entries(self, tag: bytes, decode: Callable[..., Any], ident: Callable[[Any], str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        start = len(self._prefix) + 1
        for key, value in self._store.iter_prefix(self._prefix + tag):
            where = f"{self.name} key {key!r}"
            item = decode(value, where=where)
            if key[start:] != ident(item).encode():
                raise CoordinatorCorruptionError(f"{where}: holds {ident(item)!r}")
            out[ident(item)] = item
        return out

    # -- StateMachine ---------------------------------------------------------------

    @property
    def last_applied(self) -> int:
        return self._last_applied

    @property
    def coordinator_epoch(self) -> int:
        """The highest coordinator epoch (Raft term) applied; commands below it are NOT_COORDINATOR."""
        return self._coordinator_epoch

    def apply(self, index: int, command: bytes) -> ApplyResult:
        result: ApplyResult = guarded_apply(
            self.name,
            index,
            command,
            last_applied=self._last_applied,
            coordinator_epoch=self._coordinator_epoch,
            decode=decode_command,
            record=lambda i: self._write_header(i, self._coordinator_epoch),
            run=self._apply_command,
        )
        return result

    def _write_header(self, index: int, cepoch: int) -> None:
        wb = self._store.new_batch()
        wb.put(self._prefix + _HEADER_TAG, self._header(index, cepoch))
        self._store.write(wb)
        self._last_applied, self._coordinator_epoch = index, cepoch

    def _apply_command(self, index: int, cmd: Command) -> ApplyResult:
        cepoch = max(self._coordinator_epoch, cmd.coordinator_epoch)
        if isinstance(cmd, GroupCommand):
            existing = self._groups.get(cmd.group_id)
            g = _GROUP_RULES[type(cmd)](existing, cmd)
            change = (self._group_key(cmd.group_id), g.decision, g.removed)
            self._store_change(index, cepoch, self._groups, cmd.group_id, change, encode_decision)
            if existing is None and g.decision is not None and self.on_group_decision is not None:
                self.on_group_decision(g.decision)
            return g.result
        old = self._txns.get(cmd.transactional_id)
        outcome = _TXN_RULES[type(cmd)](old, cmd)
        tid = cmd.transactional_id
        self._store_change(
            index, cepoch, self._txns, tid, (self._txn_key(tid), outcome.metadata, outcome.removed), encode_metadata
        )
        plan = outcome.metadata.marker_plan() if outcome.metadata is not None else None
        if plan is not None and self.on_markers is not None and (old is None or old.marker_plan() != plan):
            self.on_markers(plan)
        return outcome.result

    def _store_change(
        self,
        index: int,
        cepoch: int,
        table: dict[str, _V],
        ident: str,
        change: tuple[bytes, _V | None, bool],
        encode: Callable[[_V], bytes],
    ) -> None:
        """Write the header and the changed entry (key, new value, removed) in one WriteBatch, then publish it."""
        key, value, removed = change
        wb = self._store.new_batch()
        wb.put(self._prefix + _HEADER_TAG, self._header(index, cepoch))
        if removed:
            wb.delete(key)
        elif value is not None:
            wb.put(key, encode(value))
        self._store.write(wb)
        with self._lock:
            if removed:
                table.pop(ident, None)
            elif value is not None:
                table[ident] = value
            self._last_applied, self._coordinator_epoch = index, cepoch

    def preview(self, cmd: Command) -> ApplyResult:
        """What applying ``cmd`` now would answer; changes nothing (the leader's fail-fast pre-check)."""
        if cmd.coordinator_epoch < self._coordinator_epoch:
            return BrokerError(ErrorCode.NOT_COORDINATOR, f"{self.name}: coordinator epoch is stale")
        if isinstance(cmd, GroupCommand):
            return _GROUP_RULES[type(cmd)](self.group_decision(cmd.group_id), cmd).result
        return _TXN_RULES[type(cmd)](self.get(cmd.transactional_id), cmd).result

    # -- snapshots --------------------------------------------------------------------

    def write_snapshot(self, out: BinaryIO) -> None:
        """``TXCO | version | last_applied | coordinator epoch | count | (tag, key, value)* | crc32c``."""
        with self._lock:
            entries = [(_TXN_TAG, tid.encode(), encode_metadata(m)) for tid, m in sorted(self._txns.items())]
            entries += [(_GROUP_TAG, gid.encode(), encode_decision(g)) for gid, g in sorted(self._groups.items())]
            last_applied, cepoch = self._last_applied, self._coordinator_epoch
        framed = [_ENTRY_HEAD.pack(tag, len(key), len(value)) + key + value for tag, key, value in entries]
        out.write(seal_snapshot(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, last_applied, cepoch, framed))

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        """Replace the whole state with a ``write_snapshot`` stream, atomically.

        Every entry is decoded and checked before anything is written, then the
        old keys are deleted and the new ones written in one WriteBatch: a bad
        snapshot raises ``CoordinatorCorruptionError`` and leaves the state as it was.
        """
        where = f"{self.name} snapshot"
        body, cepoch, count = open_snapshot(inp.read(), _SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, where)
        txns: dict[str, TransactionMetadata] = {}
        groups: dict[str, GroupDecision] = {}
        pos = SNAPSHOT_HEAD.size
        for _ in range(count):
            if pos + _ENTRY_HEAD.size > len(body):
                raise CoordinatorCorruptionError(f"{where}: truncated entry")
            tag, klen, vlen = _ENTRY_HEAD.unpack_from(body, pos)
            pos += _ENTRY_HEAD.size
            key, value = body[pos : pos + klen], body[pos + klen : pos + klen + vlen]
            pos += klen + vlen
            if len(key) != klen or len(value) != vlen:
                raise CoordinatorCorruptionError(f"{where}: truncated entry")
            if tag == _TXN_TAG:
                meta = decode_metadata(value, where=f"{where} {key!r}")
                txns[meta.transactional_id] = meta
                ok = key == meta.transactional_id.encode()
            elif tag == _GROUP_TAG:
                decision = decode_decision(value, where=f"{where} {key!r}")
                groups[decision.group_id] = decision
                ok = key == decision.group_id.encode()
            else:
                raise CoordinatorCorruptionError(f"{where}: unknown entry tag {tag!r}")
            if not ok:
                raise CoordinatorCorruptionError(f"{where}: key {key!r} does not match its value")
        if pos != len(body):
            raise CoordinatorCorruptionError(f"{where}: {len(body) - pos} trailing bytes")
        wb = self._store.new_batch()
        wb.delete_range(self._prefix, self._prefix_end())
        for tid, meta in txns.items():
            wb.put(self._txn_key(tid), encode_metadata(meta))
        for gid, decision in groups.items():
            wb.put(self._group_key(gid), encode_decision(decision))
        wb.put(self._prefix + _HEADER_TAG, self._header(last_applied, cepoch))
        self._store.write(wb)
        with self._lock:
            self._txns, self._groups = txns, groups
            self._last_applied, self._coordinator_epoch = last_applied, cepoch

    def _prefix_end(self) -> bytes:
        # Every key is prefix + one tag byte (M, T or G) + ...; all tags are < 0xff.
        return self._prefix + b"\xff"

    def destroy(self) -> None:
        """Delete this partition's whole state (the replica was moved away)."""
        self._store.delete_prefix(self._prefix)
        with self._lock:
            self._txns, self._groups = {}, {}
            self._last_applied, self._coordinator_epoch = 0, -1

    # -- reads (any thread) -------------------------------------------------------------

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        with self._lock:
            return self._txns.get(transactional_id)

    def transactions(self, states: Collection[TransactionState] | None = None) -> list[TransactionMetadata]:
        """Every transaction (DescribeTransactions / ListTransactions), optionally only in ``states``; by id."""
        with self._lock:
            txns = list(self._txns.values())
        return sorted((m for m in txns if states is None or m.state in states), key=lambda m: m.transactional_id)

    def group_decision(self, group_id: str) -> GroupDecision | None:
        with self._lock:
            return self._groups.get(group_id)

    def group_decisions(self) -> list[GroupDecision]:
        with self._lock:
            decisions = list(self._groups.values())
        return sorted(decisions, key=lambda g: g.group_id)

    def pending_group_decisions(self) -> list[GroupDecision]:
        """Decisions with members not yet carried out; a new leader resumes them (group_commit step 3)."""
        return [g for g in self.group_decisions() if g.pending]

    def pending_completions(self) -> list[MarkerPlan]:
        return scans.pending_completions(self.transactions())

    def expired_transactions(
        self, now_ms: int, max_prepared_ms: int = DEFAULT_MAX_PREPARED_MS
    ) -> list[TransactionMetadata]:
        return scans.expired_transactions(self.transactions(), now_ms, max_prepared_ms)

    def expired_transactional_ids(self, now_ms: int, expiration_ms: int) -> list[TransactionMetadata]:
        return scans.expired_transactional_ids(self.transactions(), now_ms, expiration_ms)

    def transactions_matching_prefix(
        self, prefix: str, states: Collection[TransactionState] = OPEN_STATES
    ) -> list[TransactionMetadata]:
        return scans.transactions_matching_prefix(self.transactions(), prefix, states)

    def partition_in_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> BrokerError | None:
        return scans.partition_in_txn(
            self.get(transactional_id), producer_id, producer_epoch, TopicPartition(topic, partition)
        )
