"""Property test (§14 item 5): the coordinator against a plain model of the transition table.

Hypothesis drives random InitProducerId (with and without KIP-360 expected
identities, valid and invalid timeouts), AddPartitions, EndTxn, CompleteTxn,
Prepare (bound to a group or not), timeout scans with FenceAndAbort, jumps to
an exhausted epoch, restarts and snapshot restores, with identities chosen
among current / last / next / stale / unknown. After every step:

* every answer (error name, or the identity handed to the client) equals the model's;
* the persisted metadata equals the model's (so an illegal request never mutated state);
* every observed state change is a path of the transition table (§4.1) whose
  inner hops are the transient states one apply goes through (CompleteTxn that
  opens a pipelined next transaction goes Prepare* -> Complete* -> Ongoing);
* ``pending_completions`` and ``expired_transactions`` equal the model's view.

The model restates the rules of kafka_txn.md §4.3 (TV2 column) and of
``coordinator.transitions`` as plainly as possible, one branch per table row.
"""

from __future__ import annotations

import dataclasses
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from clients.protocol import BrokerError, ErrorCode
from coordinator.commands import (
    AddPartitions,
    Command,
    CompleteTxn,
    EndTxn,
    FenceAndAbort,
    InitProducerId,
    Prepare,
    encode_command,
)
from coordinator.metadata import MarkerPlan, TopicPartition, encode_metadata
from coordinator.results import EndTxnResult, InitProducerIdResult
from coordinator.state_machine import TransactionStateMachine
from coordinator.states import VALID_PREVIOUS, TransactionState
from storage.store import NodeStore

S = TransactionState
E = ErrorCode
MAX_TIMEOUT = 900_000
MAX_PREPARED = 50_000
EXHAUSTED = 32766
TIDS = ("a", "b")
TPS = (TopicPartition("x", 0), TopicPartition("x", 1), TopicPartition("y", 0), TopicPartition("__consumer_offsets", 3))
OFFSETS = "__consumer_offsets"
PREP = {S.PREPARE_COMMIT, S.PREPARE_ABORT}
DONE = {S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
# States one apply may pass through: the fence, EndTxn with no partitions, CompleteTxn that opens the next
# transaction (pipelined adds), and EndTxn's fold (carried markers: Prepare* -> Complete* -> Ongoing -> Prepare*).
TRANSIENT = {S.PREPARE_EPOCH_FENCE, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.ONGOING}


@dataclass
class Txn:
    pid: int
    epoch: int
    timeout: int
    state: TransactionState = S.EMPTY
    last: tuple[int, int] | None = None
    next_pid: int | None = None
    parts: frozenset[TopicPartition] = frozenset()
    start: int = -1
    prepared_at: int | None = None
    group: str | None = None
    next_parts: frozenset[TopicPartition] = frozenset()  # pipelined adds of the next transaction
    next_start: int = -1
    carried: frozenset[TopicPartition] = frozenset()  # carried markers (docs/carried-markers.md)

    def ident(self, pid: int, epoch: int) -> str:
        nxt = (self.next_pid, 0) if self.next_pid is not None else (self.pid, self.epoch)
        if epoch < 32767 and (pid, epoch) == (self.pid, self.epoch):
            return "current"
        if epoch < 32767 and self.state in PREP and (pid, epoch) == nxt:
            return "next"
        if self.state in PREP | DONE and self.last is not None and self.last[1] != -1 and self.last == (pid, epoch):
            return "retry"
        known = {self.pid, self.next_pid, self.last[0] if self.last else None}
        return "stale" if pid in known else "unknown"

    def plan(self) -> MarkerPlan | None:
        if self.state not in PREP:
            return None
        return MarkerPlan(
            "", self.pid, self.epoch, self.state is S.PREPARE_COMMIT, tuple(sorted(self.parts)), 0,
            tuple(sorted(self.carried)),
        )  # fmt: skip


Expect = tuple[ErrorCode | None, Any, Txn | None]  # error, answered identity, model after


def _identity_error(m: Txn, who: str) -> ErrorCode | None:
    """The rows shared by AddPartitions, Prepare and EndTxn (after EndTxn's retry rows)."""
    if who == "unknown":
        return E.INVALID_PRODUCER_ID_MAPPING
    if who == "stale":
        return E.PRODUCER_FENCED
    if m.state in PREP:
        return E.CONCURRENT_TRANSACTIONS if who in ("current", "next") else E.PRODUCER_FENCED
    return None if who == "current" else E.PRODUCER_FENCED


def _complete(m: Txn) -> Txn:
    m.state = S.COMPLETE_COMMIT if m.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
    m.parts, m.carried = frozenset(), frozenset()
    if m.next_pid is not None:
        m.pid, m.epoch, m.next_pid = m.next_pid, 0, None
    if m.next_parts:  # the next transaction added ahead: it opens now
        m.state, m.parts, m.start = S.ONGOING, m.next_parts, m.next_start
    m.next_parts, m.next_start = frozenset(), -1
    return m


def _settled(m: Txn, settled: frozenset[TopicPartition], now: int) -> Txn:
    """Partitions the next transaction wrote to through carried markers join it (or open it)."""
    m = dataclasses.replace(m)
    if not settled:
        return m
    if m.state in PREP:
        m.next_start = m.next_start if m.next_parts else now
        m.next_parts |= settled
    elif m.state is S.ONGOING:
        m.parts |= settled
    elif m.state in DONE | {S.EMPTY}:
        m.state, m.parts, m.start = S.ONGOING, settled, now
    return m


def _end(m: Txn, commit: bool, *, bump: bool, cand: int | None, carry: bool = False) -> Expect:
    m = dataclasses.replace(m)
    rotate = bump and m.epoch >= EXHAUSTED
    if rotate and cand is None:
        return E.CONCURRENT_TRANSACTIONS, None, None
    m.carried = frozenset(tp for tp in m.parts if tp.topic != OFFSETS) if carry and bump and not rotate else frozenset()
    if bump:
        m.last = (m.pid, m.epoch)
        m.epoch += 1
    else:
        m.last = None
    m.next_pid = cand if rotate else None
    m.state = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
    m.prepared_at, m.group = None, None
    if not m.parts:
        _complete(m)
    return None, (m.next_pid, 0) if m.next_pid is not None else (m.pid, m.epoch), m


def _fence(m: Txn) -> Txn:
    fenced = dataclasses.replace(m, epoch=m.epoch + 1)
    result = _end(fenced, False, bump=False, cand=None)[2]
    assert result is not None
    return result


def model_init(m: Txn | None, timeout: int, expected: tuple[int, int] | None, cand: int) -> Expect:
    if not 0 < timeout <= MAX_TIMEOUT:
        return E.INVALID_TRANSACTION_TIMEOUT, None, None
    if m is None:
        return None, (cand, 0), Txn(cand, 0, timeout)
    if expected is not None:
        exp_pid, exp_epoch = expected
        valid = exp_pid == m.pid or exp_pid == m.next_pid
        valid |= m.last is not None and exp_pid == m.last[0] and exp_epoch >= EXHAUSTED
        if not valid:
            return E.PRODUCER_FENCED, None, None
    if m.state in PREP or (m.state is S.PREPARED and m.group is not None):
        return E.CONCURRENT_TRANSACTIONS, None, None
    if m.state in (S.ONGOING, S.PREPARED):
        return E.CONCURRENT_TRANSACTIONS, None, _fence(m)
    new = dataclasses.replace(m, state=S.EMPTY, timeout=timeout, parts=frozenset(), next_pid=None)
    if m.epoch >= EXHAUSTED and (expected is None or expected[1] == m.epoch):
        new.pid, new.epoch, new.last = cand, 0, (m.pid, m.epoch if expected else -1)
    elif expected is None:
        new.epoch, new.last = m.epoch + 1, None
    elif expected[1] == m.epoch:
        new.epoch, new.last = m.epoch + 1, (m.pid, m.epoch)
    elif m.last is not None and expected[1] == m.last[1]:
        return None, (m.pid, m.epoch), None
    else:
        return E.PRODUCER_FENCED, None, None
    return None, (new.pid, new.epoch), new


def model_add(m: Txn | None, pid: int, epoch: int, parts: frozenset[TopicPartition], now: int) -> Expect:
    if m is None:
        return E.INVALID_PRODUCER_ID_MAPPING, None, None
    who = m.ident(pid, epoch)
    if m.state in PREP and who in ("current", "next") and m.last is not None and m.last[1] != -1:
        # Pipelined add (txbroker): recorded for the next transaction, the state stays.
        if parts <= m.next_parts:
            return None, None, None
        start = m.next_start if m.next_parts else now
        return None, None, dataclasses.replace(m, next_parts=m.next_parts | parts, next_start=start)
    if (code := _identity_error(m, who)) is not None:
        return code, None, None
    if m.state is S.PREPARED:
        return E.INVALID_TXN_STATE, None, None
    if m.state is S.ONGOING:
        return (None, None, None) if parts <= m.parts else (None, None, dataclasses.replace(m, parts=m.parts | parts))
    return None, None, dataclasses.replace(m, state=S.ONGOING, parts=parts, start=now)


def model_end(
    m: Txn | None, pid: int, epoch: int, commit: bool, cand: int | None,
    carry: bool = False, settle: bool = False, settled: frozenset[TopicPartition] = frozenset(), now: int = 0,
) -> Expect:  # fmt: skip
    if m is None:
        return E.INVALID_PRODUCER_ID_MAPPING, None, None
    who = m.ident(pid, epoch)
    if who in ("current", "next") and (settle or settled):
        # The fold: a carried prepare state completes first; elsewhere the settled partitions join the open one.
        if settle and m.state in PREP and m.carried:
            m = _complete(_settled(m, settled, now))
        elif m.state not in PREP:
            m = _settled(m, settled, now)
        who = m.ident(pid, epoch)
    if who == "retry":
        if (m.state in (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)) != commit:
            return E.INVALID_TXN_STATE, None, None
        if m.state in PREP:
            return E.CONCURRENT_TRANSACTIONS, None, None
        return None, (m.pid, m.epoch), None
    if (code := _identity_error(m, who)) is not None:
        return code, None, None
    if m.state is S.PREPARED and m.group is not None:
        return E.INVALID_TXN_STATE, None, None
    if m.state in (S.ONGOING, S.PREPARED) or (not commit and m.state in DONE | {S.EMPTY}):
        return _end(m, commit, bump=True, cand=cand, carry=carry)
    return E.INVALID_TXN_STATE, None, None


def model_complete(
    m: Txn | None, pid: int, epoch: int, commit: bool, settled: frozenset[TopicPartition] = frozenset(), now: int = 0
) -> Expect:
    if m is not None and (m.state in (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)) == commit:
        if m.state in PREP and (pid, epoch) == (m.pid, m.epoch):
            return None, None, _complete(_settled(m, settled, now))
        ended_by = (m.last[0], m.last[1] + 1) if m.last and m.last[1] != -1 else None
        if m.state in DONE and (pid, epoch) in ((m.pid, m.epoch), ended_by):
            return None, None, None
    return E.INVALID_TXN_STATE, None, None


def model_prepare(m: Txn | None, pid: int, epoch: int, group: str | None, now: int) -> Expect:
    if m is None:
        return E.INVALID_PRODUCER_ID_MAPPING, None, None
    if (code := _identity_error(m, m.ident(pid, epoch))) is not None:
        return code, None, None
    if m.state is S.PREPARED:
        return (E.INVALID_TXN_STATE if group is not None and group != m.group else None), None, None
    return None, None, dataclasses.replace(m, state=S.PREPARED, prepared_at=now, group=group)


def model_fence(m: Txn | None, pid: int, epoch: int) -> Expect:
    if m is None:
        return E.INVALID_PRODUCER_ID_MAPPING, None, None
    if (pid, epoch) != (m.pid, m.epoch) or m.group is not None or m.state not in (S.ONGOING, S.PREPARED):
        return E.INVALID_TXN_STATE, None, None
    return None, None, _fence(m)


def reachable(old: TransactionState, new: TransactionState) -> bool:
    """``old -> new`` is one table transition, or a chain through the transient states of one apply."""
    frontier, seen = {old}, set()
    for _ in range(3):
        frontier = {n for s in frontier for n in TransactionState if s in VALID_PREVIOUS[n]}
        if new in frontier:
            return True
        frontier = (frontier & TRANSIENT) - seen
        seen |= frontier
    return False


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.store = NodeStore(Path(self.tmp.name) / "db")
        self.prefix = b"C\x00"
        self.sm = TransactionStateMachine(self.store, self.prefix, 0)
        self.index = 0
        self.now = 0
        self.next_pid = 10_000
        self.model: dict[str, Txn] = {}

    def teardown(self) -> None:
        self.store.close()
        self.tmp.cleanup()

    # -- helpers --------------------------------------------------------------------------

    def identity(self, tid: str, who: str) -> tuple[int, int]:
        m = self.model.get(tid)
        if m is None:
            return 1, 0
        choices = {
            "current": (m.pid, m.epoch),
            "last": m.last or (m.pid, max(m.epoch - 1, 0)),
            "next": (m.next_pid, 0) if m.next_pid is not None else (m.pid, m.epoch),
            "older": (m.pid, max(m.epoch - 2, 0)),
            "newer": (m.pid, m.epoch + 1),
            "unknown": (m.pid + 500_000, m.epoch),
        }
        return choices[who]

    def producer_cmd(self, cls: type[Any], tid: str, pid: int, epoch: int, **kw: Any) -> Any:
        return cls(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, now_ms=self.now, coordinator_epoch=1, **kw
        )

    def candidate(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def run(self, tid: str, cmd: Command, expect: Expect) -> Any:
        before = self.sm.get(tid)
        self.index += 1
        result = self.sm.apply(self.index, encode_command(cmd))
        code, answer, after = expect
        if code is None:
            assert not isinstance(result, BrokerError), (cmd, result)
        else:
            assert isinstance(result, BrokerError) and result.error_code is code, (cmd, result, code)
        if answer is not None:
            assert isinstance(result, InitProducerIdResult | EndTxnResult), result
            assert (result.producer_id, result.producer_epoch) == answer, (cmd, result, answer)
        now_meta = self.sm.get(tid)
        if after is None:
            assert now_meta == before, (cmd, before, now_meta)  # §14 item 5: no change
        else:
            self.model[tid] = after
            if before is not None and before.state is not now_meta.state:  # a pipelined add keeps the state
                assert reachable(before.state, now_meta.state), (before.state, now_meta.state)
        return result

    # -- rules ----------------------------------------------------------------------------

    tids = st.sampled_from(TIDS)
    whos = st.sampled_from(["current", "last", "next", "older", "newer", "unknown"])

    @rule(
        tid=tids,
        timeout=st.sampled_from([100, 5_000, MAX_TIMEOUT, MAX_TIMEOUT + 1, 0]),
        who=whos,
        with_expected=st.booleans(),
    )
    def init(self, tid: str, timeout: int, who: str, with_expected: bool) -> None:
        expected = self.identity(tid, who) if with_expected else None
        cand = self.candidate()
        cmd = InitProducerId(
            transactional_id=tid,
            timeout_ms=timeout,
            now_ms=self.now,
            coordinator_epoch=1,
            producer_id_candidate=cand,
            expected_producer_id=expected and expected[0],
            expected_producer_epoch=expected and expected[1],
            max_timeout_ms=MAX_TIMEOUT,
        )
        self.run(tid, cmd, model_init(self.model.get(tid), timeout, expected, cand))

    @rule(tid=tids, who=whos, parts=st.frozensets(st.sampled_from(TPS), min_size=1))
    def add(self, tid: str, who: str, parts: frozenset[TopicPartition]) -> None:
        pid, epoch = self.identity(tid, who)
        cmd = self.producer_cmd(AddPartitions, tid, pid, epoch, partitions=tuple(sorted(parts)))
        self.run(tid, cmd, model_add(self.model.get(tid), pid, epoch, parts, self.now))

    settles = st.frozensets(st.sampled_from(TPS[:3]), max_size=2)

    @rule(
        tid=tids, who=whos, commit=st.booleans(), with_candidate=st.booleans(), carry=st.booleans(),
        settle=st.booleans(), settled=settles,
    )  # fmt: skip
    def end(
        self, tid: str, who: str, commit: bool, with_candidate: bool, carry: bool, settle: bool,
        settled: frozenset[TopicPartition],
    ) -> None:  # fmt: skip
        pid, epoch = self.identity(tid, who)
        cand = self.candidate() if with_candidate else None
        cmd = self.producer_cmd(EndTxn, tid, pid, epoch, commit=commit, producer_id_candidate=cand, carry=carry,
                                settle=settle, settled_partitions=tuple(sorted(settled)))  # fmt: skip
        expect = model_end(self.model.get(tid), pid, epoch, commit, cand, carry, settle, settled, self.now)
        self.run(tid, cmd, expect)

    @rule(tid=tids, who=st.sampled_from(["current", "last", "older"]), commit=st.booleans(), settled=settles)
    def complete(self, tid: str, who: str, commit: bool, settled: frozenset[TopicPartition]) -> None:
        pid, epoch = self.identity(tid, who)
        cmd = self.producer_cmd(CompleteTxn, tid, pid, epoch, commit=commit, settled_partitions=tuple(sorted(settled)))
        self.run(tid, cmd, model_complete(self.model.get(tid), pid, epoch, commit, settled, self.now))

    @rule(tid=tids, who=whos, group=st.sampled_from([None, None, "g"]))
    def prepare(self, tid: str, who: str, group: str | None) -> None:
        pid, epoch = self.identity(tid, who)
        cmd = self.producer_cmd(Prepare, tid, pid, epoch, group_id=group)
        self.run(tid, cmd, model_prepare(self.model.get(tid), pid, epoch, group, self.now))

    @rule(step=st.sampled_from([1, 50, 5_000, 60_000]))
    def timeout_scan(self, step: int) -> None:
        """The leader's periodic scan (§5): list what expired, fence and abort it."""
        self.now += step
        expired = self.sm.expired_transactions(self.now, MAX_PREPARED)
        expected = sorted(
            tid
            for tid, m in self.model.items()
            if (m.state is S.ONGOING and m.start + m.timeout < self.now)
            or (m.state is S.PREPARED and m.prepared_at is not None and m.prepared_at + MAX_PREPARED < self.now)
        )
        assert [m.transactional_id for m in expired] == expected
        for meta in expired:
            tid = meta.transactional_id
            cmd = self.producer_cmd(FenceAndAbort, tid, meta.producer_id, meta.producer_epoch)
            self.run(tid, cmd, model_fence(self.model.get(tid), meta.producer_id, meta.producer_epoch))

    @precondition(lambda self: any(m.state in DONE | {S.EMPTY} for m in self.model.values()))
    @rule(data=st.data(), epoch=st.sampled_from([EXHAUSTED - 2, EXHAUSTED - 1, EXHAUSTED]))
    def near_exhaustion(self, data: st.DataObject, epoch: int) -> None:
        """Jump an idle id to a high epoch (as if loaded from disk) so rotations happen."""
        tid = data.draw(st.sampled_from(sorted(t for t, m in self.model.items() if m.state in DONE | {S.EMPTY})))
        meta = dataclasses.replace(self.sm.get(tid), producer_epoch=epoch, last_producer_id=-1, last_producer_epoch=-1)
        self.store.db.put(self.prefix + b"T" + tid.encode(), encode_metadata(meta))
        self.sm = TransactionStateMachine(self.store, self.prefix, 0)
        self.model[tid] = dataclasses.replace(self.model[tid], epoch=epoch, last=None)

    @rule()
    def restart(self) -> None:
        self.sm = TransactionStateMachine(self.store, self.prefix, 0)
        assert self.sm.last_applied == self.index

    @rule()
    def install_snapshot(self) -> None:
        buf = io.BytesIO()
        self.sm.write_snapshot(buf)
        self.prefix = b"C" + bytes([self.prefix[1] + 1])
        fresh = TransactionStateMachine(self.store, self.prefix, 0)
        fresh.read_snapshot(io.BytesIO(buf.getvalue()), self.index)
        self.sm = fresh

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def persisted_state_equals_the_model(self) -> None:
        for tid in TIDS:
            meta, m = self.sm.get(tid), self.model.get(tid)
            if m is None:
                assert meta is None
                continue
            last = m.last or (-1, -1)
            assert (meta.state, meta.producer_id, meta.producer_epoch, meta.partitions) == (
                m.state,
                m.pid,
                m.epoch,
                m.parts,
            )
            assert (meta.last_producer_id, meta.last_producer_epoch) == last
            assert (meta.next_partitions, meta.next_start_ms) == (m.next_parts, m.next_start)
            assert meta.carried == m.carried
            if meta.state is S.ONGOING:
                assert meta.txn_start_time_ms == m.start
            assert meta.next_producer_id == (m.next_pid if m.next_pid is not None else -1)
            assert meta.group_id == m.group and (meta.prepared is not None) == (meta.state is S.PREPARED)
            assert meta.state not in (S.PREPARE_EPOCH_FENCE, S.DEAD) and 0 <= meta.producer_epoch <= 32767

    @invariant()
    def pending_completions_are_the_prepare_states(self) -> None:
        got = {p.transactional_id: p for p in self.sm.pending_completions()}
        for tid in TIDS:
            m = self.model.get(tid)
            plan = m.plan() if m is not None else None
            if plan is None:
                assert tid not in got
            else:
                assert dataclasses.replace(got[tid], transactional_id="", coordinator_epoch=0) == plan


CoordinatorMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestCoordinatorAgainstModel = CoordinatorMachine.TestCase
