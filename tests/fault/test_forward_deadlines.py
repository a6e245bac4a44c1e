"""Node-to-node calls bounded by the caller's deadline, and retried where the leader went (real node processes).

A request forwarded to a coordinator that is SIGSTOPped answers within the caller's own timeout, not a
fixed internal one; once the coordinator's partition has elected a new leader, the forward is retried
there and succeeds. A COMMIT marker whose partition leader is SIGSTOPped reaches the new leader about an
election later. Every stopped process is resumed in ``finally``.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from clients import Producer
from cluster.security.principals import ANONYMOUS
from tests.support.cluster import LocalCluster, http, node_call, wait_for

TIMEOUT_HEADER = "X-Txbroker-Timeout-Ms"


def coordinator_of(c: LocalCluster, tid: str, via: int = 1) -> int:
    def ask() -> int | None:
        status, body = http("GET", f"{c.url(via)}/v1/coordinators/transaction/{tid}", timeout=5)
        return int(body["node_id"]) if status == 200 else None

    return wait_for(ask, 30, f"the coordinator of {tid}")


def init_via(c: LocalCluster, node: int, tid: str, timeout_ms: int) -> tuple[float, int, Any]:
    """InitProducerId for ``tid`` sent to ``node``, with the caller's timeout; (seconds taken, status, body)."""
    started = time.monotonic()
    status, body = http(
        "POST", c.url(node) + "/v1/producers/init", {"transactional_id": tid, "transaction_timeout_ms": 60_000},
        headers={TIMEOUT_HEADER: str(timeout_ms)}, timeout=60,
    )  # fmt: skip
    return time.monotonic() - started, status, body


def test_a_forward_to_a_sigstopped_coordinator_answers_within_the_callers_timeout(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    c = make_cluster()
    tid = "deadline-a"
    x = coordinator_of(c, tid)
    y = next(n for n in (1, 2, 3) if n != x)
    first = init_via(c, y, tid, 10_000)
    assert first[1] == 200, first  # forwarded to x and served
    c.signal(x, signal.SIGSTOP)
    try:
        took, status, body = init_via(c, y, tid, 3_000)  # y still believes x coordinates tid
    finally:
        c.signal(x, signal.SIGCONT)
    assert took < 3.0 + 1.0, f"answered after {took:.1f}s ({status} {body}), not within the caller's 3 s"
    assert status == 200 or body.get("retriable"), (status, body)


def test_a_forward_to_a_coordinator_that_lost_its_leadership_is_retried_at_the_new_one(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    c = make_cluster()
    tid = "deadline-b"
    x = coordinator_of(c, tid)
    y = next(n for n in (1, 2, 3) if n != x)
    c.signal(x, signal.SIGSTOP)
    try:
        took, status, body = init_via(c, y, tid, 20_000)
        assert status == 200, (status, body)  # retried at the new coordinator, not failed
        assert took < 12.0, f"took {took:.1f}s: waited out a fixed timeout instead of following the new leader"
        assert coordinator_of(c, tid, via=y) != x
    finally:
        c.signal(x, signal.SIGCONT)


def test_a_marker_to_a_sigstopped_partition_leader_reaches_the_new_leader_about_an_election_later(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    c = make_cluster(txn_carried_markers=False)  # every marker is written at EndTxn
    c.create_topic("mk", partitions=1, rf=3)
    p_leader = c.wait_leaders("mk", 1)[0]
    tid = next(t for t in (f"deadline-m{i}" for i in range(200)) if coordinator_of(c, t) != p_leader)
    coord = coordinator_of(c, tid)
    producer = Producer(c.urls, transactional_id=tid)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("mk", value=b"v", partition=0).result(30)
        producer.flush()
        c.signal(p_leader, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            producer.commit_transaction(timeout=30)  # answers once PrepareCommit is durable

            def state() -> str | None:
                status, body = http("GET", f"{c.url(coord)}/v1/transactions/{tid}", timeout=5)
                return str(body.get("state")) if status == 200 else None

            wait_for(lambda: state() == "CompleteCommit", 30, "CompleteCommit")
            took = time.monotonic() - stopped_at
        finally:
            c.signal(p_leader, signal.SIGCONT)
        assert took < 10.0, f"the marker took {took:.1f}s: it waited out a timeout at the stopped leader"
    finally:
        producer.close(5)


def test_a_coordinator_that_loses_its_leadership_answers_the_requests_it_holds_at_once(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    c = make_cluster(txn_carried_markers=False)
    c.create_topic("hold", partitions=3, rf=1)  # one replica per partition: its marker waits while it is stopped
    leaders = c.wait_leaders("hold", 3)
    # A transactional id whose coordinator C is not the node X of some rf=1 partition; Z is the third node
    tid, coord, x, xp = next(
        (t, co, x, q)
        for t in (f"deadline-h{i}" for i in range(200))
        for q, x in leaders.items()
        if (co := coordinator_of(c, t)) != x
    )
    z = next(n for n in (1, 2, 3) if n not in (coord, x))
    producer = Producer(c.urls, transactional_id=tid)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("hold", value=b"v", partition=xp).result(30)
        producer.flush()
        c.signal(x, signal.SIGSTOP)
        stopped = [x]
        try:
            producer.commit_transaction(timeout=30)  # PrepareCommit is durable; the marker to X cannot be written
            # An InitProducerId now waits on C for the previous transaction's markers (bounded by its timeout)...
            held: dict[str, Any] = {}

            def ask() -> None:
                started = time.monotonic()
                body = {"transactional_id": tid, "transaction_timeout_ms": 60_000}
                # forwarded by another node (so C answers itself, never proxies): a node call for a client
                forward = node_call(c.configs[x - 1], coord, "POST", "/v1/producers/init", body, principal=ANONYMOUS)
                held["answer"] = http(
                    "POST", c.url(coord) + "/v1/producers/init", body,
                    headers={TIMEOUT_HEADER: "25000", **forward}, timeout=60,
                )  # fmt: skip
                held["took"] = time.monotonic() - started

            thread = threading.Thread(target=ask, daemon=True)
            thread.start()
            time.sleep(1.0)
            assert "answer" not in held, held  # still waiting for the markers
            # ...when C loses its majority (Z stopped as well) and steps down, it answers the held request at once
            c.signal(z, signal.SIGSTOP)
            stopped.append(z)
            thread.join(30)
        finally:
            for n in stopped:
                c.signal(n, signal.SIGCONT)
        status, body = held["answer"]
        assert body.get("error_code") in ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE"), (status, body)
        assert held["took"] < 1.0 + 8.0, f"answered after {held['took']:.1f}s, not when the leadership was lost"
    finally:
        producer.close(5)
