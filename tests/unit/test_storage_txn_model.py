"""PartitionLog's transaction behaviour against a model (hypothesis state machine, real RocksDB).

The model is the plain statement of kafka_txn.md §7: the LSO is the first
offset of the earliest open transaction (never below the log start), else the
HW; a read_committed consumer sees, below the LSO, every non-transactional
record and the records of committed transactions, each at its own offset.
Markers follow the TV2 rules (§4.3): they carry the epoch bumped at EndTxn,
a stale one is rejected, a retry with no open transaction appends nothing.
Carried markers (docs/carried-markers.md) are the marker and then the batch;
a revoking marker is a marker that also refuses carried markers of its epoch
from then on, unless the transaction of its epoch is open ("used").
The run also restarts the store and restores snapshots between steps.
"""

from __future__ import annotations

import io
import pathlib
import shutil
import tempfile
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from clients.protocol import BrokerError, ControlType, ErrorCode
from storage.commands import AppendResult, RevokeResult, encode_delete_records
from storage.partition_log import PartitionLog
from storage.store import NodeStore
from tests.support.partition_txn import TxnLog, read_committed

PIDS = (1, 2, 3)
IDEMPOTENT_PID = 9


@dataclass
class ModelProducer:
    epoch: int = 0
    seq: int = 0
    coordinator_epoch: int | None = None  # highest one a marker carried
    txn: int | None = None  # id of the open transaction
    first_offset: int | None = None
    revoked: int = -1  # highest epoch a revoking marker revoked


@dataclass
class Model:
    hw: int = 0
    log_start: int = 0
    producers: dict[int, ModelProducer] = field(default_factory=lambda: {p: ModelProducer() for p in PIDS})
    records: list[tuple[int, bytes, int | None]] = field(default_factory=list)  # offset, value, txn id
    committed: set[int] = field(default_factory=set)
    next_txn: int = 0

    @property
    def lso(self) -> int:
        firsts = [p.first_offset for p in self.producers.values() if p.first_offset is not None]
        return max(min(firsts), self.log_start) if firsts else self.hw

    def visible(self) -> list[tuple[int, bytes | None]]:
        lso = self.lso
        return [
            (off, value)
            for off, value, txn in self.records
            if self.log_start <= off < lso and (txn is None or txn in self.committed)
        ]

    def add(self, base: int, tag: str, count: int, txn: int | None) -> None:
        self.records.extend((base + i, f"{tag}{i}".encode(), txn) for i in range(count))
        self.hw = base + count


class PartitionTxnMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="txn-model-"))
        self.store = NodeStore(self.dir / "db")
        self.prefix_n = 0
        self.txn = TxnLog(PartitionLog(self.store, self._prefix(), "m-0"))
        self.model = Model()
        self.batches = 0

    def _prefix(self) -> bytes:
        return b"P" + self.prefix_n.to_bytes(4, "big") + bytes(4)

    def _tag(self) -> str:
        self.batches += 1
        return f"b{self.batches}-"

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- producers --------------------------------------------------------------------

    @rule(pid=st.sampled_from(PIDS), records=st.integers(1, 3))
    def transactional_send(self, pid: int, records: int) -> None:
        p = self.model.producers[pid]
        tag = self._tag()
        result = self.txn.ok(pid, p.epoch, p.seq, records=records, txn=True, tag=tag)
        self._sent(p, result, tag, records)

    def _sent(self, p: ModelProducer, result: AppendResult | BrokerError, tag: str, records: int) -> None:
        assert isinstance(result, AppendResult) and result.base_offset == self.model.hw, result
        if p.txn is None:
            p.txn, p.first_offset = self.model.next_txn, result.base_offset
            self.model.next_txn += 1
        p.seq += records
        self.model.add(result.base_offset, tag, records, p.txn)

    @rule(pid=st.sampled_from(PIDS), commit=st.booleans(), records=st.integers(1, 3), next_epoch=st.booleans())
    def carried_send(self, pid: int, commit: bool, records: int, next_epoch: bool) -> None:
        """A marker of the next epoch (or, resent, of the current one) riding on a transactional batch."""
        p = self.model.producers[pid]
        epoch, ce, tag = (p.epoch + 1 if next_epoch else p.epoch), p.coordinator_epoch or 0, self._tag()
        ctype = ControlType.COMMIT if commit else ControlType.ABORT
        result = self.txn.carried(pid, epoch, 0 if next_epoch else p.seq, ctype, ce, records=records, tag=tag)
        if p.revoked >= epoch:
            assert isinstance(result, BrokerError), result
            assert result.error_code is ErrorCode.TRANSACTION_RESERVATION_REVOKED
            return
        if next_epoch or p.txn is None:  # the marker applies (with nothing open at this epoch, it closes nothing)
            self._ended(p, epoch, commit, ce, self.model.hw if p.txn is not None else None)
        self._sent(p, result, tag, records)

    @rule(pid=st.sampled_from(PIDS), commit=st.booleans(), next_epoch=st.booleans())
    def revoke(self, pid: int, commit: bool, next_epoch: bool) -> None:
        p = self.model.producers[pid]
        epoch, ce = (p.epoch + 1 if next_epoch else p.epoch), p.coordinator_epoch or 0
        result = self.txn.revoke(pid, epoch, ControlType.COMMIT if commit else ControlType.ABORT, ce)
        if not next_epoch and p.txn is not None:
            assert result == RevokeResult(used=True, marker=None)
            return
        assert isinstance(result, RevokeResult) and not result.used and result.marker is not None, result
        expected = self.model.hw if p.txn is not None else None
        assert (result.marker.offset, result.marker.txn_first_offset) == (expected, p.first_offset)
        self._ended(p, epoch, commit, ce, expected)
        p.revoked = max(p.revoked, epoch)

    @rule(pid=st.sampled_from(PIDS))
    def non_transactional_send_from_a_txn_producer(self, pid: int) -> None:
        p = self.model.producers[pid]
        tag = self._tag()
        result = self.txn.send(pid, p.epoch, p.seq, tag=tag)
        if p.txn is not None:
            assert isinstance(result, BrokerError) and result.error_code is ErrorCode.INVALID_TXN_STATE
            return
        assert not isinstance(result, BrokerError), result
        p.seq += 1
        self.model.add(result.base_offset, tag, 1, None)

    @rule(records=st.integers(1, 3), idempotent=st.booleans())
    def plain_send(self, records: int, idempotent: bool) -> None:
        tag = self._tag()
        if idempotent:
            seq = sum(1 for _o, v, _t in self.model.records if v.startswith(b"i"))
            result = self.txn.ok(IDEMPOTENT_PID, 0, seq, records=records, tag="i" + tag)
            self.model.add(result.base_offset, "i" + tag, records, None)
        else:
            result = self.txn.ok(records=records, tag=tag)
            self.model.add(result.base_offset, tag, records, None)

    # -- markers ----------------------------------------------------------------------

    @rule(pid=st.sampled_from(PIDS), commit=st.booleans(), new_coordinator=st.booleans())
    def end_txn(self, pid: int, commit: bool, new_coordinator: bool) -> None:
        p = self.model.producers[pid]
        ce = (p.coordinator_epoch or 0) + (1 if new_coordinator else 0)
        result = self.txn.end(pid, p.epoch + 1, ControlType.COMMIT if commit else ControlType.ABORT, ce)
        expected = self.model.hw if p.txn is not None else None
        assert (result.offset, result.txn_first_offset) == (expected, p.first_offset)
        self._ended(p, p.epoch + 1, commit, ce, expected)

    def _ended(self, p: ModelProducer, epoch: int, commit: bool, ce: int, control_offset: int | None) -> None:
        """A marker of ``epoch`` applied; its control batch (if it closed a transaction) at ``control_offset``."""
        if epoch != p.epoch:
            p.epoch, p.seq = epoch, 0
        p.coordinator_epoch = max(p.coordinator_epoch or 0, ce)
        if p.txn is None:
            return
        assert control_offset == self.model.hw
        if commit:
            self.model.committed.add(p.txn)
        p.txn = p.first_offset = None
        self.model.hw += 1

    @rule(pid=st.sampled_from(PIDS))
    def marker_with_the_current_epoch(self, pid: int) -> None:
        p = self.model.producers[pid]
        ce = p.coordinator_epoch or 0
        result = self.txn.marker(pid, p.epoch, ControlType.ABORT, ce)
        if p.txn is not None:  # stale: it cannot end the open transaction
            assert isinstance(result, BrokerError) and result.error_code is ErrorCode.INVALID_PRODUCER_EPOCH
            return
        assert not isinstance(result, BrokerError) and result.offset is None, result
        p.coordinator_epoch = ce

    @precondition(lambda self: any((p.coordinator_epoch or 0) > 0 for p in self.model.producers.values()))
    @rule(data=st.data())
    def marker_from_a_fenced_coordinator(self, data: st.DataObject) -> None:
        fenced = [pid for pid, p in self.model.producers.items() if (p.coordinator_epoch or 0) > 0]
        pid = data.draw(st.sampled_from(fenced))
        p = self.model.producers[pid]
        assert p.coordinator_epoch is not None
        result = self.txn.marker(pid, p.epoch + 1, ControlType.COMMIT, p.coordinator_epoch - 1)
        assert isinstance(result, BrokerError) and result.error_code is ErrorCode.TRANSACTION_COORDINATOR_FENCED

    # -- log maintenance and lifecycle -------------------------------------------------

    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.model.log_start, self.model.hw))
        self.txn.log.apply(self.txn.log.last_applied + 1, encode_delete_records(target))
        self.model.log_start = max(self.model.log_start, target)

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = NodeStore(self.dir / "db")
        self.txn = TxnLog(PartitionLog(self.store, self._prefix(), "m-0"), self.txn.now)

    @rule()
    def install_snapshot_on_a_new_replica(self) -> None:
        snap = io.BytesIO()
        self.txn.log.write_snapshot(snap)
        old = self.txn.log
        self.prefix_n += 1
        replica = PartitionLog(self.store, self._prefix(), "m-0")
        snap.seek(0)
        replica.read_snapshot(snap, old.last_applied)
        old.destroy()
        self.txn = TxnLog(replica, self.txn.now)

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def offsets_match(self) -> None:
        log = self.txn.log
        assert (log.high_watermark, log.log_start_offset) == (self.model.hw, self.model.log_start)
        assert log.last_stable_offset == self.model.lso
        ongoing = sorted((p.first_offset, pid) for pid, p in self.model.producers.items() if p.first_offset is not None)
        assert log.ongoing_transactions() == [(pid, first) for first, pid in ongoing]

    @invariant()
    def read_committed_sees_exactly_the_committed_and_plain_records(self) -> None:
        expected = self.model.visible()
        assert read_committed(self.txn.log, self.model.log_start) == expected
        assert read_committed(self.txn.log, self.model.log_start, max_bytes=1) == expected


PartitionTxnMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestPartitionTxnModel = PartitionTxnMachine.TestCase
