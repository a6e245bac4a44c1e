"""Transactions through the client while nodes die (kafka_txn.md §14 items 19, 26, 27).

What "no partial visibility" means here (§7.2, §7.4): read_committed is
bounded by each partition's last stable offset, so within one partition a
transaction's records appear all at once or not at all, and once visible they
stay visible. Across partitions the COMMIT markers land one by one (Kafka
gives no cross-partition snapshot either); the promise is that a decided
commit reaches EVERY partition -- none is left out, whatever dies -- and an
aborted transaction reaches none. Each poll below reads every partition
completely through the server-filtered fetch and checks exactly that.
"""

from __future__ import annotations

import base64
import contextlib
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from clients import Producer
from clients.aio._transactions import TransactionAbortedError
from clients.protocol import BrokerError, ErrorCode
from clients.records import RecordMetadata
from tests.integration.test_transactions_http import TxnWriter, fetch
from tests.support.cluster import LocalCluster, http, wait_for
from tests.support.txn_reads import consume_all, http_read

pytestmark = [pytest.mark.integration, pytest.mark.fault]


def coordinator_of(c: LocalCluster, tid: str, via: int) -> int:
    status, body = http("GET", f"{c.url(via)}/v1/coordinators/transaction/{tid}", timeout=5)
    assert status == 200, body
    return int(body["node_id"])


def txn_state(c: LocalCluster, tid: str, via: int) -> str | None:
    status, body = http("GET", f"{c.url(via)}/v1/transactions/{tid}", timeout=5)
    return str(body["state"]) if status == 200 else None


def live(c: LocalCluster, *, skip: set[int] | frozenset[int] = frozenset()) -> list[int]:
    return [i for i, p in c.procs.items() if p.poll() is None and i not in skip]


class VisibilityWatch:
    """Reads every partition in a loop (server-filtered read_committed, any live node) and checks each snapshot.

    ``txn``: per partition, the transaction's values. Invariants per
    partition: all of its values or none; never a value twice; once a node
    showed all, that node always shows all (each node answers from its own
    replica, and a follower may lag the leader: switching nodes may go back
    in time, a consumer never does because it keeps its position). Records
    the first time each partition showed the txn.
    """

    def __init__(self, c: LocalCluster, topic_partitions: list[tuple[str, int]], txn: dict[tuple[str, int], set[bytes]],
                 stopped: set[int]) -> None:  # fmt: skip
        self.c = c
        self.tps = topic_partitions
        self.txn = txn
        self.stopped = stopped  # nodes not to ask (SIGSTOPped: a request would hang)
        self.visible: dict[tuple[str, int], float] = {}
        self._seen_by: set[tuple[int, tuple[str, int]]] = set()
        self.snapshots = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> VisibilityWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for tp in self.tps:
                nodes = live(self.c, skip=self.stopped)
                if not nodes:
                    continue
                node = nodes[self.snapshots % len(nodes)]
                try:
                    values = [v for _, v in http_read(self.c.url(node), tp[0], tp[1], read_replica="any")]
                except (OSError, AssertionError):
                    continue  # the node died or is not serving this partition yet
                self._check(node, tp, values)
            self.snapshots += 1

    def _check(self, node: int, tp: tuple[str, int], values: list[bytes]) -> None:
        mine = [v for v in values if v in self.txn[tp]]
        if len(mine) != len(set(mine)):
            self.errors.append(f"{tp} on node {node}: duplicate records {mine}")
        if mine and set(mine) != self.txn[tp]:
            self.errors.append(f"{tp} on node {node}: partial transaction: {len(set(mine))} of {len(self.txn[tp])}")
        if mine:
            self.visible.setdefault(tp, time.monotonic())
            self._seen_by.add((node, tp))
        elif (node, tp) in self._seen_by:
            self.errors.append(f"{tp} on node {node}: the transaction was visible, then it was not")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def commit_in_background(p: Producer) -> tuple[threading.Thread, list[BaseException | None]]:
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            p.commit_transaction(timeout=120)
            outcome.append(None)
        except BaseException as exc:  # reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@contextlib.contextmanager
def stopped(c: LocalCluster, *nodes: int) -> Iterator[None]:
    """``nodes`` SIGSTOPped for the block (no majority: a coordinator call times out), SIGCONTed after."""
    for n in nodes:
        c.signal(n, signal.SIGSTOP)
    try:
        yield
    finally:
        for n in nodes:
            c.signal(n, signal.SIGCONT)


def coordinator_apart_from(c: LocalCluster, prefix: str, leaders: dict[int, int]) -> tuple[str, int, int, int]:
    """A transactional id whose coordinator node is not the leader of some partition in ``leaders``.

    Returns (id, coordinator node, that other leader node, its partition).
    """
    for tid in (f"{prefix}-{i}" for i in range(200)):
        coord = coordinator_of(c, tid, next(iter(leaders.values())))
        for q, node in sorted(leaders.items()):
            if node != coord:
                return tid, coord, node, q
    raise AssertionError(f"no id has its coordinator apart from the leaders {leaders}")


def resumed_count(c: LocalCluster, nodes: list[int], offsets: dict[int, int]) -> int:
    """How many transactions new coordinator leaders resumed, from the node logs written after ``offsets``."""
    total = 0
    for n in nodes:
        text = c.log_text(n)[offsets.get(n, 0) :]
        total += sum(int(m) for m in re.findall(r"resuming (\d+) transaction", text))
    return total


def send_everywhere(
    p: Producer, tps: list[tuple[str, int]], n: int, tag: str
) -> dict[tuple[str, int], list[tuple[bytes, Future[RecordMetadata]]]]:
    """``n`` records to every partition of the open transaction, all acknowledged before it returns."""
    sent = {
        tp: [(v, p.send(tp[0], value=v, partition=tp[1])) for v in (f"{tag}-{tp[0]}-{tp[1]}-{i}".encode()
                                                                   for i in range(n))]
        for tp in tps
    }  # fmt: skip
    p.flush(60)
    assert all(f.result(timeout=30).offset >= 0 for futs in sent.values() for _, f in futs)
    return sent


# ---- the coordinator dies right after EndTxn answered, before CompleteCommit (§14 item 26) -----------------------


def test_coordinator_sigkill_right_after_end_txn_answered_completes_on_the_new_leader(make_cluster):
    c = make_cluster()
    c.create_topic("fk", partitions=3, rf=3)
    c.create_topic("fk1", partitions=3, rf=1)  # a partition with one replica: its markers wait while it is stopped
    # Given a transactional id whose coordinator C is not the node X holding some rf=1 partition
    tid, coord, x, xp = coordinator_apart_from(c, "fk", c.wait_leaders("fk1", 3))
    y = next(n for n in (1, 2, 3) if n not in (coord, x))
    tps = [("fk", q) for q in range(3)] + [("fk1", xp)]
    p = Producer(c.urls, transactional_id=tid)
    try:
        p.init_transactions()
        p.begin_transaction()
        sent = send_everywhere(p, tps, 5, "fk")
        txn = {tp: {v for v, _ in futs} for tp, futs in sent.items()}
        # When X is paused, commit_transaction returns as soon as the decision is durable -- the marker to X's
        # partition cannot have been written, so the transaction is still PrepareCommit -- and C is SIGKILLed
        c.signal(x, signal.SIGSTOP)
        stopped = {x}
        watch = VisibilityWatch(c, tps, txn, stopped).start()
        p.commit_transaction(timeout=60)
        assert txn_state(c, tid, via=y) == "PrepareCommit", "commit_transaction waited for the markers"
        logs = {n: len(c.log_text(n)) for n in (x, y)}
        c.kill(coord)
        stopped.add(coord)
        c.signal(x, signal.SIGCONT)
        stopped.discard(x)
        # Then the new coordinator leader resumes the decided commit: every partition gets it, all or nothing
        wait_for(lambda: len(watch.visible) == len(tps), 60, "the transaction on every partition")
        wait_for(lambda: txn_state(c, tid, via=y) == "CompleteCommit", 30, "CompleteCommit on the new leader")
        watch.stop()
        assert not watch.errors, watch.errors[:5]
        assert resumed_count(c, [x, y], logs) >= 1, "no new coordinator leader resumed the transaction"
        for tp in tps:
            # Each node answers from its own replica: y may follow fk's leader by a commit announcement (a lone
            # write's commit index reaches followers with the next write, or within 20 ms), so poll, briefly.
            want = [(f.result().offset, v) for v, f in sent[tp]]
            url = c.url(y if tp[0] == "fk" else x)
            wait_for(lambda url=url, tp=tp, want=want: http_read(url, *tp, read_replica="any") == want, 10,
                     f"{tp} complete on {url}")  # fmt: skip
        # And the producer goes on with the identity EndTxn handed back
        p.begin_transaction()
        nxt = p.send("fk", value=b"after", partition=0)
        p.commit_transaction(timeout=60)
        wait_for(lambda: (nxt.result().offset, b"after") in http_read(c.url(y), "fk", 0, read_replica="any"), 30,
                 "the next commit")  # fmt: skip
    finally:
        p.close(5)


# ---- pipelined adds: the next transaction begins while the previous one's markers are written ------------------


def test_next_transaction_writes_where_the_previous_markers_are_written_and_waits_where_they_are_not(
    make_cluster,
):
    # While a commit's markers are still owed, the next transaction's add of a partition is recorded at once
    # and answered as soon as that partition has the previous marker (pipelined adds); where the marker
    # cannot be written within the request timeout (its only replica is SIGSTOPped), the answer is
    # CONCURRENT_TRANSACTIONS (retriable). InitProducerId still waits for the whole commit. Once the markers
    # are written, CompleteCommit opens the next transaction with what it added.
    bound = 3.0
    c = make_cluster(request_timeout_ms=int(bound * 1000))
    c.create_topic("cw", partitions=3, rf=3)
    c.create_topic("cw1", partitions=3, rf=1)
    tid, coord, x, xp = coordinator_apart_from(c, "cw", c.wait_leaders("cw1", 3))
    q = 0
    w = TxnWriter(c, tid)

    def produce(value: bytes) -> tuple[int, Any, float]:
        """One produce of ``value`` to cw-q at its current leader (asked of C); (status, body, seconds)."""

        def attempt() -> tuple[int, Any, float] | None:
            leader = c.leader("cw", q, via=coord)
            if leader is None or leader == x:
                return None
            started = time.monotonic()
            status, body = w.send("cw", q, [value], via=leader)
            moved = status == 421 or body["partitions"][0]["error_code"] == "NOT_LEADER_OR_FOLLOWER"
            return None if moved else (status, body, time.monotonic() - started)

        return wait_for(attempt, 60, f"a produce to cw-{q} reaching its leader")

    def batches(topic: str, partition: int, via: int | None = None) -> list[str]:
        got = fetch(c, topic, partition, "read_uncommitted", fmt="batches", via=via)["batches"]
        return [("COMMIT" if b["is_control"] else base64.b64decode(b["records"][0]["value"]).decode()) for b in got]

    assert produce(b"first")[0] == 200
    # X may answer NOT_LEADER_OR_FOLLOWER until its single-replica partition's leadership is ready (nothing is
    # written then, and the writer keeps the sequence)
    wait_for(lambda: w.send("cw1", xp, [b"first-x"], via=x)[0] == 200, 30, f"the first produce to cw1-{xp} on X")
    c.signal(x, signal.SIGSTOP)
    try:
        # wait_for_completion: the markers cannot all be written, so it answers after the request timeout with
        # the decision durable (PrepareCommit), like an EndTxn that timed out waiting before
        started = time.monotonic()
        res = w.end(commit=True, wait_for_completion=True, via=coord)
        assert res["state"] == "PrepareCommit" and time.monotonic() - started >= 0.9 * bound, res
        ident = {"producer_id": w.pid, "producer_epoch": w.epoch}

        def add(topic: str, partition: int) -> tuple[int, Any]:
            body = {**ident, "partitions": [{"topic": topic, "partition": partition}]}
            return http("POST", c.url(coord) + f"/v1/transactions/{tid}/partitions", body)

        # cw-q has its COMMIT marker: the next transaction adds it and writes there while the commit is pending
        started = time.monotonic()
        status, body = add("cw", q)
        assert status == 200, body
        status, body, _ = produce(b"second")
        assert status == 200 and body["partitions"][0]["error_code"] == "NONE", body
        assert time.monotonic() - started < 0.9 * bound, "the pipelined add waited for the unreachable marker"
        # C's replica may trail the leader by a moment
        wait_for(lambda: batches("cw", q, via=coord) == ["first", "COMMIT", "second"], 10, "cw's log")
        assert txn_state(c, tid, via=coord) == "PrepareCommit"
        # cw1-xp still owes its marker (X is stopped): the add there, and InitProducerId, wait and give up
        calls = {
            "AddPartitionsToTxn of a partition owing a marker": lambda: add("cw1", xp),
            "InitProducerId": lambda: http("POST", c.url(coord) + "/v1/producers/init",
                                           {"transactional_id": tid, "transaction_timeout_ms": 60_000}),
        }  # fmt: skip
        for what, request in calls.items():
            started = time.monotonic()
            status, body = request()
            waited = time.monotonic() - started
            assert status == 409 and body["error_code"] == "CONCURRENT_TRANSACTIONS", (what, status, body)
            assert waited >= 0.9 * bound, f"{what} answered after {waited:.2f}s without waiting for the markers"
        assert txn_state(c, tid, via=coord) == "PrepareCommit"
        status, body = http("GET", f"{c.url(coord)}/v1/transactions/{tid}", timeout=5)
        assert {(t["topic"], t["partition"]) for t in body["next_transaction_partitions"]} == {("cw", q), ("cw1", xp)}
    finally:
        c.signal(x, signal.SIGCONT)
    # With X back, the markers are written and CompleteCommit opens the next transaction with both partitions
    wait_for(lambda: txn_state(c, tid, via=coord) == "Ongoing", 60, "the next transaction to open")
    status, body = http("GET", f"{c.url(coord)}/v1/transactions/{tid}", timeout=5)
    assert {(t["topic"], t["partition"]) for t in body["partitions"]} == {("cw", q), ("cw1", xp)}, body
    assert body["next_transaction_partitions"] == [], body
    assert [v for _, v in http_read(c.url(x), "cw1", xp)] == [b"first-x"]
    # read_committed stops before "second" (its transaction is open), then shows it once it commits
    wait_for(lambda: [v for _, v in http_read(c.url(coord), "cw", q)] == [b"first"], 10, "cw read_committed")
    w.end(commit=True)
    wait_for(lambda: [v for _, v in http_read(c.url(coord), "cw", q)] == [b"first", b"second"], 30, "second")
    wait_for(lambda: txn_state(c, tid, via=coord) == "CompleteCommit", 30, "the next transaction's commit")
    # cw1-xp was in the next transaction without data: its marker there closes nothing and takes no offset
    wait_for(lambda: batches("cw1", xp, via=x) == ["first-x", "COMMIT"], 30, "cw1's log")


# ---- a partition leader dies while the markers are in flight ----------------------------------------------------


def test_partition_leader_sigkill_while_markers_are_in_flight_shows_no_partial_transaction(make_cluster):
    c = make_cluster()
    c.create_topic("ml", partitions=6, rf=3)
    tid, coord, x, _ = coordinator_apart_from(c, "ml", c.wait_leaders("ml", 6))
    tps = [("ml", q) for q in range(6)]
    p = Producer(c.urls, transactional_id=tid)
    try:
        p.init_transactions()
        p.begin_transaction()
        sent = send_everywhere(p, tps, 20, "ml")
        txn = {tp: {v for v, _ in futs} for tp, futs in sent.items()}
        stopped = {x}
        c.signal(x, signal.SIGSTOP)  # X's partitions cannot take their markers...
        watch = VisibilityWatch(c, tps, txn, stopped).start()
        thread, outcome = commit_in_background(p)
        wait_for(lambda: txn_state(c, tid, via=coord) == "PrepareCommit", 20, "the commit decision")
        c.kill(x)  # ...and X dies with them pending (SIGKILL ends a stopped process)
        wait_for(lambda: len(watch.visible) == len(tps), 60, "the transaction on every partition")
        thread.join(120)
        watch.stop()
        assert outcome == [None], f"commit_transaction failed: {outcome}"
        assert not watch.errors, watch.errors[:5]
        assert watch.snapshots > 3
        expected = {tp: [(f.result().offset, v) for v, f in sent[tp]] for tp in tps}
        alive = [c.url(n) for n in live(c)]
        assert consume_all(alive, tps, "read_committed") == expected
        # The dead leader's replicas catch up with the markers once it is back
        c.start_node(x)
        c.wait_ready([x])
        for tp in tps:
            wait_for(lambda tp=tp: http_read(c.url(x), *tp, read_replica="any") == expected[tp], 60,
                     f"{tp} on the restarted node")  # fmt: skip
    finally:
        p.close(5)


# ---- leader change inside a transaction (§14 item 27) ----------------------------------------------------------


def test_leader_sigkill_inside_a_transaction_commits_every_record_once(make_cluster):
    c = make_cluster()
    c.create_topic("lk", partitions=3, rf=3)
    tid, _, victim, _ = coordinator_apart_from(c, "lk", c.wait_leaders("lk", 3))
    futs: list[tuple[bytes, Future[RecordMetadata]]] = []
    with Producer(c.urls, transactional_id=tid) as p:
        p.init_transactions()
        p.begin_transaction()
        for i in range(3000):
            v = f"lk-{i:05d}".encode()
            futs.append((v, p.send("lk", value=v, partition=i % 3)))
            if i == 1000:
                p.flush()
                c.kill(victim)  # batches keep coming; the client follows the new leaders
        p.commit_transaction(timeout=120)
    expected: dict[tuple[str, int], list[tuple[int, bytes]]] = {("lk", q): [] for q in range(3)}
    for i, (v, f) in enumerate(futs):
        expected[("lk", i % 3)].append((f.result().offset, v))
    alive = [c.url(n) for n in live(c)]
    wait_for(lambda: consume_all(alive, list(expected), "read_committed") == expected, 60, "the committed records")


# ---- transaction timeout (§14 item 19) ---------------------------------------------------------------------------


def test_transaction_past_its_timeout_is_aborted_and_the_producer_is_fenced(make_cluster):
    c = make_cluster(transaction_abort_scan_interval_ms=200)
    c.create_topic("slow", partitions=1, rf=3)
    with Producer(c.urls, transactional_id="slow-writer", transaction_timeout_ms=1000) as p:
        p.init_transactions()
        p.begin_transaction()
        first = p.send("slow", value=b"before the timeout")
        first.result(timeout=30)
        wait_for(lambda: txn_state(c, "slow-writer", via=1) == "CompleteAbort", 20, "the coordinator's abort")
        late = p.send("slow", value=b"after the timeout")
        with pytest.raises(BrokerError) as ei:
            late.result(timeout=30)
        assert ei.value.error_code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH)
        with pytest.raises(BrokerError) as ei:
            p.commit_transaction()
        assert ei.value.error_code is ErrorCode.PRODUCER_FENCED
    leader = c.leader("slow", 0)
    assert leader is not None
    assert http_read(c.url(leader), "slow", 0) == []
    assert [v for _, v in http_read(c.url(leader), "slow", 0, "read_uncommitted")] == [b"before the timeout"]


# ---- an ambiguous commit is resumed, never turned into an abort (§12, KAFKA-17754) ------------------------------


def test_commit_that_times_out_resumes_with_the_same_identity(make_cluster):
    c = make_cluster()
    c.create_topic("amb", partitions=3, rf=3)
    tid, coord, other, _ = coordinator_apart_from(c, "amb", c.wait_leaders("amb", 3))
    with Producer(c.urls, transactional_id=tid, request_timeout_ms=1000, delivery_timeout_ms=60_000) as p:
        p.init_transactions()
        p.begin_transaction()
        sent = send_everywhere(p, [("amb", q) for q in range(3)], 3, "amb")
        ident = (p.producer_id, p.producer_epoch)
        # When two of three nodes stop (no majority can elect another coordinator), the commit times out
        # with its outcome unknown
        with stopped(c, coord, other):
            with pytest.raises(BrokerError) as ei:
                p.commit_transaction(timeout=3)
            assert ei.value.error_code is ErrorCode.REQUEST_TIMED_OUT
            assert (p.producer_id, p.producer_epoch) == ident, "no new identity without an answer"
            with pytest.raises(BrokerError) as ei:
                p.abort_transaction()
            assert ei.value.error_code is ErrorCode.INVALID_TXN_STATE, "an unknown commit must not become an abort"
        # Then calling commit again finishes it (the coordinator answers the retried EndTxn idempotently)
        p.commit_transaction(timeout=60)
        assert p.producer_epoch > ident[1]
        p.begin_transaction()
        p.send("amb", value=b"next", partition=0)
        p.commit_transaction(timeout=60)
    assert_resumed_commit_then_next(c, "amb", sent)


def assert_resumed_commit_then_next(
    c: LocalCluster, topic: str, sent: dict[tuple[str, int], list[tuple[bytes, Future[RecordMetadata]]]]
) -> None:
    """The resumed commit's 3 records per partition, then only ``next`` on partition 0, read_committed."""
    expected = {(topic, q): [(f.result().offset, v) for v, f in sent[(topic, q)]] for q in range(3)}
    # The last commit answered at its decision: poll until its marker is there too
    got = wait_for(
        lambda: (g := consume_all(c.urls, list(expected), "read_committed"))[(topic, 0)][3:] and g,
        60,
        "the second transaction visible",
    )
    assert {tp: recs[: len(expected[tp])] for tp, recs in got.items()} == expected
    assert [v for _, v in got[(topic, 0)][3:]] == [b"next"], "one record after the resumed commit, no other"


def test_pipelined_commit_that_times_out_fails_the_held_records_and_resumes_as_a_commit(make_cluster):
    # docs/pipelined-commit.md: the next transaction never happened; the unknown commit stays a commit
    c = make_cluster()
    c.create_topic("ambp", partitions=3, rf=3)
    tid, coord, other, _ = coordinator_apart_from(c, "ambp", c.wait_leaders("ambp", 3))
    with Producer(c.urls, transactional_id=tid, request_timeout_ms=1000, delivery_timeout_ms=60_000) as p:
        p.init_transactions()
        p.begin_transaction()
        sent = send_everywhere(p, [("ambp", q) for q in range(3)], 3, "ambp")
        ident = (p.producer_id, p.producer_epoch)
        with stopped(c, coord, other):
            outcome = p.commit_and_begin(timeout=3)
            held = p.send("ambp", value=b"held", partition=0)  # the next transaction's: held behind the commit
            with pytest.raises(BrokerError) as ei:
                outcome.result(timeout=30)
            assert ei.value.error_code is ErrorCode.REQUEST_TIMED_OUT
            with pytest.raises(TransactionAbortedError, match="did not commit"):
                held.result(timeout=30)
            assert (p.producer_id, p.producer_epoch) == ident, "no new identity without an answer"
            for call in (p.abort_transaction, lambda: p.send("ambp", value=b"x"), p.commit_and_begin):
                with pytest.raises(BrokerError) as ei:
                    call()
                assert ei.value.error_code is ErrorCode.INVALID_TXN_STATE, "an unknown commit must stay a commit"
        p.commit_transaction(timeout=60)  # finishes the pipelined commit with the same identity
        assert p.producer_epoch > ident[1]
        p.begin_transaction()
        p.send("ambp", value=b"next", partition=0)
        p.commit_transaction(timeout=60)
    assert_resumed_commit_then_next(c, "ambp", sent)  # the held record was never written


def test_close_during_a_stuck_pipelined_commit_returns_within_its_timeout(make_cluster):
    # close(timeout) bounds the wait for a pending pipelined commit; the held records fail unsent
    c = make_cluster()
    c.create_topic("ambc", partitions=3, rf=3)
    tid, coord, other, _ = coordinator_apart_from(c, "ambc", c.wait_leaders("ambc", 3))
    p = Producer(c.urls, transactional_id=tid, request_timeout_ms=1000, delivery_timeout_ms=60_000)
    try:
        p.init_transactions()
        p.begin_transaction()
        send_everywhere(p, [("ambc", 0)], 2, "ambc")
        with stopped(c, coord, other):
            outcome = p.commit_and_begin(timeout=60)
            held = p.send("ambc", value=b"held", partition=0)
            t0 = time.monotonic()
            p.close(timeout=2)
            assert time.monotonic() - t0 < 10, "close waited for the commit's own 60 s deadline"
            with pytest.raises(TransactionAbortedError, match="did not commit"):
                held.result(timeout=5)
            assert outcome.cancelled(), "the commit's outcome is unknown, not a failure"
    finally:
        p.close()
