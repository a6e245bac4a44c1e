"""Fetch per API.md "Fetch", on real node processes: leader reads by default, follower reads opted in.

A node that does not lead a partition answers ``421 NOT_LEADER_OR_FOLLOWER``
with ``leader_url`` instead of its own (possibly lagging) copy, so a fetch's
``high_watermark`` is never below what the partition acknowledged; with
``read_replica=any`` any replica answers from its own committed copy.
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from clients import Consumer, Producer
from tests.support.cluster import LocalCluster, http, samples, wait_for

pytestmark = pytest.mark.integration

NO_BALANCER = {"leader_balance_interval_s": 3600.0}  # leadership moves only when a test moves it


def fetch(c: LocalCluster, node: int, topic: str, query: str = "offset=0", timeout: float = 10) -> tuple[int, Any]:
    return http("GET", f"{c.url(node)}/v1/topics/{topic}/partitions/0/records?{query}", timeout=timeout)


def ready_leader(c: LocalCluster, topic: str) -> int:
    """The node whose leader read of partition 0 answers 200 (the partition's ready leader)."""

    def find() -> int | None:
        for n in c.procs:
            if c.procs[n].poll() is None:
                try:
                    if fetch(c, n, topic, timeout=2)[0] == 200:
                        return n
                except OSError:
                    continue
        return None

    return wait_for(find, 30, f"a ready leader of {topic}-0")


def produce(c: LocalCluster, topic: str, values: list[bytes]) -> None:
    """Send ``values`` to partition 0 and wait until every one is acknowledged."""
    p = Producer(bootstrap=c.urls, linger_ms=5)
    try:
        futures = [p.send(topic, value=v, partition=0) for v in values]
        p.flush()
        for f in futures:
            f.result(timeout=60)
    finally:
        p.close()


def consume_all(bootstrap: str | list[str], topic: str, n: int, **config: Any) -> list[tuple[int, bytes]]:
    c = Consumer(bootstrap=bootstrap, auto_offset_reset="earliest", **config)
    out: list[tuple[int, bytes]] = []
    try:
        c.assign([(topic, 0)])
        deadline = time.monotonic() + 60
        while len(out) < n and time.monotonic() < deadline:
            out += [(r.offset, r.value) for r in c.poll(timeout_ms=500)]
    finally:
        c.close()
    return out


def fetched_records(c: LocalCluster, node: int, topic: str) -> float:
    """Records node ``node`` returned to fetches of ``topic`` so far (its metrics)."""
    return sum(v for labels, v in samples(c.url(node), "txbroker_records_fetched_total") if labels["topic"] == topic)


def leader_answer_problem(status: int, body: Any, acked: int) -> str | None:
    """What is wrong with a leader read's answer: it must be the partition's data (never below what was
    acknowledged) or 421 with leader_url. (``wait_for`` retries a predicate that raises, so predicates
    collect these instead of asserting.)"""
    if status == 200:
        if body["high_watermark"] < acked or "served_by" in body:
            return f"200 below the {acked} acknowledged records: {body}"
        return None
    if status == 421:
        ok = body.get("error_code") == "NOT_LEADER_OR_FOLLOWER" and "leader_url" in body
        return None if ok else f"421 without NOT_LEADER_OR_FOLLOWER and leader_url: {body}"
    # 404/503: a node still loading its metadata or its replica
    return None if status in (404, 503) else f"unexpected answer {status}: {body}"


def test_no_lagging_answer_after_leadership_moves(make_cluster):
    # Given a partition with 2,000 acknowledged records
    c = make_cluster(**NO_BALANCER)
    c.create_topic("t", partitions=1, rf=3)
    values = [f"v{i}".encode() for i in range(6000)]
    produce(c, "t", values[:2000])
    old = ready_leader(c, "t")
    # When its leader stops (handing off), 2,000 more are acknowledged, and it comes back as a lagging follower
    assert c.stop_node(old) == 0
    produce(c, "t", values[2000:4000])
    acked = 4000
    c.start_node(old)
    # Then every answer of the previous leader while it catches up is the partition's data or a 421
    answers = 0
    problems: list[str] = []

    def caught_up() -> bool:
        nonlocal answers
        try:
            status, body = fetch(c, old, "t", timeout=5)
        except (OSError, urllib.error.URLError):
            return False  # not listening yet
        answers += 1
        problems.append(leader_answer_problem(status, body, acked) or "")
        s, replica = fetch(c, old, "t", f"offset={acked}&read_replica=any", timeout=5)
        return s == 200 and replica["replica_end_offset"] == acked

    wait_for(caught_up, 60, "the previous leader's replica caught up", interval=0.001)
    assert answers > 0
    # When that node, a follower now, misses 2,000 more writes (paused) and is asked the moment it resumes
    c.signal(old, signal.SIGSTOP)
    try:
        produce(c, "t", values[acked : acked + 2000])
        acked += 2000
        asked: list[tuple[int, Any]] = []
        threads = [
            threading.Thread(target=lambda q=q: asked.append(fetch(c, old, "t", q, timeout=30)))
            for q in ("offset=0", "offset=0&format=batches", "offset=0&read_replica=any")
        ]
        for th in threads:
            th.start()
    finally:
        c.signal(old, signal.SIGCONT)
    for th in threads:
        th.join(30)
    # Then its leader reads are 421 (a follower read shows its own copy's end, lagging or not)
    assert len(asked) == 3
    for status, body in asked:
        if "served_by" in body:
            assert status == 200 and body["served_by"] == old and body["replica_end_offset"] <= acked
        else:
            problems.append(leader_answer_problem(status, body, acked) or "")
    assert [p for p in problems if p] == []

    # And once the election its pause may have caused is over: the leader answers all of it, every other
    # node 421 with the leader's URL
    def settled() -> bool:
        answers = {
            (n, fmt): fetch(c, n, "t", f"offset=0&format={fmt}") for n in (1, 2, 3) for fmt in ("json", "batches")
        }
        problems.extend(leader_answer_problem(status, body, acked) or "" for status, body in answers.values())
        leaders = {n for (n, _), (status, _) in answers.items() if status == 200}
        if len(leaders) != 1:
            return False
        leader = leaders.pop()
        return all(body["high_watermark"] == acked for (n, _), (_, body) in answers.items() if n == leader) and all(
            status == 421 and body["leader_url"] == c.url(leader)
            for (n, _), (status, body) in answers.items()
            if n != leader
        )

    wait_for(settled, 30, "one leader answering, the others 421 with its URL")
    assert [p for p in problems if p] == []
    # And a consumer bootstrapped at the previous leader reads every record once, in order
    got = consume_all(c.url(old), "t", acked)
    assert acked == len(values)
    assert got == list(enumerate(values))


def test_follower_read_opt_in(make_cluster):
    c = make_cluster(**NO_BALANCER)
    c.create_topic("t", partitions=1, rf=3)
    c.create_topic("solo", partitions=1, rf=1)
    values = [f"r{i}".encode() for i in range(500)]
    produce(c, "t", values)
    leader = ready_leader(c, "t")
    follower = next(n for n in (1, 2, 3) if n != leader)
    wait_for(lambda: c.partition_meta("t", 0, follower)["high_watermark"] == 500, 10, "the follower caught up")
    # A follower read answers from that replica, saying whose copy it is and where that copy ends
    status, body = fetch(c, follower, "t", "offset=0&read_replica=any&max_bytes=4194304")
    assert status == 200, body
    assert body["served_by"] == follower
    assert body["replica_end_offset"] == 500
    assert body["high_watermark"] >= body["replica_end_offset"]
    assert [r["offset"] for r in body["records"]] == list(range(500))
    status, body = fetch(c, follower, "t", "offset=0&read_replica=any&format=batches")
    assert status == 200 and body["served_by"] == follower and body["replica_end_offset"] == 500
    req = urllib.request.Request(f"{c.url(follower)}/v1/topics/t/partitions/0/records?offset=0&read_replica=any"
                                 "&format=binary")  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["X-Txbroker-Served-By"] == str(follower)
        assert resp.headers["X-Txbroker-Replica-End-Offset"] == "500"
    # The same read at the leader names the leader; read_replica=leader at the follower is a leader read
    status, body = fetch(c, leader, "t", "offset=0&read_replica=any")
    assert status == 200 and body["served_by"] == leader
    status, body = fetch(c, follower, "t", "offset=0&read_replica=leader")
    assert status == 421 and body["leader_url"] == c.url(leader)
    # A node without a replica answers 421 with the leader's URL even to a follower read
    solo = ready_leader(c, "solo")
    other = next(n for n in (1, 2, 3) if n != solo)

    answers: list[tuple[int, Any]] = []

    def not_leader_with_url() -> bool:
        answers.append(fetch(c, other, "solo", "offset=0&read_replica=any"))
        return bool(answers[-1][1].get("leader_url") == c.url(solo))  # once its peer polling saw the leader

    wait_for(not_leader_with_url, 10, "421 with the leader's URL from a node without a replica")
    assert all(status == 421 and body["error_code"] == "NOT_LEADER_OR_FOLLOWER" for status, body in answers)
    # A lagging replica serves exactly what it has: stop a follower, write more, read it as it comes back
    assert c.stop_node(follower) == 0
    produce(c, "t", values)
    c.start_node(follower)

    problems: list[str] = []

    def follower_read_complete() -> bool:
        s, b = fetch(c, follower, "t", "offset=0&read_replica=any&max_bytes=4194304", timeout=5)
        if s != 200:
            if s not in (404, 421, 503):  # 404/421/503: still loading its metadata or starting its replica
                problems.append(f"{s}: {b}")
            return False
        offsets = [r["offset"] for r in b["records"]]
        end = b["replica_end_offset"]
        if b["served_by"] != follower or offsets != list(range(end)) or b["high_watermark"] < end:
            problems.append(f"not that replica's copy: {offsets[:3]}..{offsets[-3:]} {b | {'records': None}}")
        return bool(end == 1000)

    wait_for(follower_read_complete, 60, "the restarted follower's copy complete", interval=0.01)
    assert problems == []
    # And a Consumer opting in reads everything through its bootstrap node's replica
    before = sum(
        v for labels, v in samples(c.url(follower), "txbroker_records_fetched_total") if labels["topic"] == "t"
    )
    got = consume_all(c.url(follower), "t", 1000, read_replica="any")
    assert [v for _, v in got] == values + values
    after = fetched_records(c, follower, "t")
    assert after - before >= 1000


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the tests that stop no node (each uses a topic of its own)."""
    with LocalCluster(tmp_path_factory.mktemp("fetch-leader"), 3, **NO_BALANCER) as c:
        yield c.start()


@pytest.mark.parametrize("value", ["follower", "", "ANY", "any,leader"])
def test_bad_read_replica_is_invalid_request(shared_cluster, value):
    c = shared_cluster
    t = f"bad-{['follower', '', 'ANY', 'any,leader'].index(value)}"
    c.create_topic(t, partitions=1, rf=3)
    produce(c, t, [b"x"] * 10)
    leader = ready_leader(c, t)
    for n in (1, 2, 3):
        status, body = fetch(c, n, t, f"offset=0&read_replica={value}")
        assert status == 400, body
        assert body["error_code"] == "INVALID_REQUEST"
        assert "read_replica" in body["message"]
    # And nothing else happened: the partition is as it was
    status, body = fetch(c, leader, t)
    assert status == 200 and body["high_watermark"] == 10 and len(body["records"]) == 10


def test_long_poll_ends_when_leadership_moves(make_cluster):
    # Given a partition led by a node that is not its preferred replica, with the leader balancer on (handing
    # leadership back to a preferred replica as soon as it is caught up)
    c = make_cluster(leader_balance_interval_s=0.5, leader_balance_hold_s=0.5)
    c.create_topic("t", partitions=1, rf=3)
    preferred = c.partition_meta("t", 0, 1)["replicas"][0]
    wait_for(lambda: ready_leader(c, "t") == preferred, 30, "the preferred replica leads")
    assert c.stop_node(preferred) == 0
    leader = ready_leader(c, "t")
    assert leader != preferred
    # When a long-poll waits at that leader and the preferred replica comes back (the balancer moves leadership)
    result: dict[str, Any] = {}

    def poll() -> None:
        result["answer"] = fetch(c, leader, "t", "offset=0&max_wait_ms=60000", timeout=60)
        result["ended"] = time.monotonic()

    th = threading.Thread(target=poll)
    th.start()
    c.start_node(preferred)
    wait_for(lambda: ready_leader(c, "t") == preferred, 30, "leadership back at the preferred replica")
    moved = time.monotonic()
    th.join(40)
    # Then the long-poll ended with 421 right after the move, not at the end of its wait (30 s here)
    assert not th.is_alive()
    status, body = result["answer"]
    assert status == 421, body
    assert body["error_code"] == "NOT_LEADER_OR_FOLLOWER"
    # It names the new leader once this node has heard from it; a node that has not within the answer's hint
    # wait (a loaded host) names none, as the contract allows (null), and never a wrong one.
    assert body["leader_url"] in (c.url(preferred), None), body
    assert result["ended"] - moved < 3.0


def test_consumer_reads_across_leader_change_exactly_once(make_cluster):
    c = make_cluster(**NO_BALANCER)
    c.create_topic("t", partitions=1, rf=3)
    values = [f"e{i}".encode() for i in range(3000)]
    produce(c, "t", values[:1000])
    consumer = Consumer(bootstrap=c.urls, auto_offset_reset="earliest")
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([("t", 0)])
        deadline = time.monotonic() + 90
        while len(got) < 500 and time.monotonic() < deadline:
            got += [(r.offset, r.value) for r in consumer.poll(timeout_ms=200, max_records=100)]
        # When the leader stops in the middle of the read and more records arrive at the new leader
        old = ready_leader(c, "t")
        assert c.stop_node(old) == 0
        produce(c, "t", values[1000:2000])
        c.start_node(old)
        produce(c, "t", values[2000:])
        while len(got) < len(values) and time.monotonic() < deadline:
            got += [(r.offset, r.value) for r in consumer.poll(timeout_ms=200)]
        got += [(r.offset, r.value) for r in consumer.poll(timeout_ms=500)]  # nothing more may come
    finally:
        consumer.close()
    # Then every record came exactly once, in order
    assert got == list(enumerate(values))
