"""A bridge: two nodes cannot reach each other, a third reaches both (each node in its own network namespace).

Raft keeps every group's leader (pre-vote: the cut-off pair cannot depose anyone), so the transaction
coordinator and a partition leader may sit on the two nodes that cannot talk. Node-to-node calls then go
through the bridge node (``POST /v1/internal/relay``), and transactions keep committing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import Producer
from tests.support.cluster import http, node_call, wait_for
from verify.netns import NamespacedCluster, unavailable_reason

pytestmark = [pytest.mark.fault, pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]

TOPIC = "bridged"
RELAY = "/v1/internal/relay"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NamespacedCluster]:
    # Leaders move to their preferred replicas quickly, so every node leads one partition; a call into the cut
    # gives up after 10 s (the request timeout).
    with NamespacedCluster(
        tmp_path, 3, leader_balance_interval_s=1.0, leader_balance_hold_s=1.0, request_timeout_ms=10_000
    ) as c:
        c.start()
        status, res = http("POST", c.url(1) + "/v1/topics", {"name": TOPIC, "partitions": 3, "replication_factor": 3})
        assert status == 201, res
        wait_for(lambda: {c.leader_of(TOPIC, p) for p in range(3)} == {1, 2, 3}, 60, "one partition led by each node")
        yield c


def _signed(c: NamespacedCluster, via: int, body: object, timeout_ms: int | None = None) -> tuple[int, object]:
    """A relay call signed as node 1 would; ``timeout_ms``: the caller's timeout (``X-Txbroker-Timeout-Ms``)."""
    headers = node_call(c.configs[0], via, "POST", RELAY, body)
    if timeout_ms is not None:
        headers["X-Txbroker-Timeout-Ms"] = str(timeout_ms)
    return http("POST", c.url(via) + RELAY, body, headers=headers)


def test_the_relay_endpoint_carries_a_call_only_where_the_bridge_reaches(cluster: NamespacedCluster) -> None:
    cluster.cut(1, 3)
    call = {"node_id": 3, "path": "/v1/internal/groups/list", "body": {}}
    status, res = _signed(cluster, 2, call)
    assert status == 200, res
    # Node 1 cannot reach node 3 itself: the relay there answers that node 3 is unreachable (within the 2 s
    # the caller gives it, not the cluster's 10 s request timeout).
    asked = time.monotonic()
    status, res = _signed(cluster, 1, {**call, "body": {}}, timeout_ms=2000)
    assert time.monotonic() - asked < 8, "the relay waited past the caller's timeout"
    assert status >= 500 and res["error_code"] in ("NETWORK_EXCEPTION", "REQUEST_TIMED_OUT"), res  # type: ignore[index]
    # Only nodes may ask, only for internal paths, never for another relay.
    status, res = http("POST", cluster.url(2) + RELAY, call)
    assert status == 403 and res["error_code"] == "CLUSTER_AUTHORIZATION_FAILED", res  # type: ignore[index]
    for bad in ({**call, "path": "/v1/topics"}, {**call, "path": RELAY}, {**call, "node_id": 2}, {**call, "body": []}):
        status, res = _signed(cluster, 2, bad)
        assert status == 400 and res["error_code"] == "INVALID_REQUEST", (bad, res)  # type: ignore[index]


def test_transactions_keep_committing_across_a_bridge(cluster: NamespacedCluster) -> None:
    tid = "bridge-txn"
    with Producer(cluster.urls, transactional_id=tid) as producer:
        producer.init_transactions()
        coordinator = wait_for(lambda: cluster.coordinator_of(tid), 30, "the coordinator")
        far = next(n for n in cluster.node_ids if n != coordinator)  # leads a partition, as every node does
        cluster.cut(coordinator, far)
        cut_at = time.monotonic()
        commits: list[float] = []
        while time.monotonic() - cut_at < 10.0:
            producer.begin_transaction()
            for p in range(3):  # every partition: one is led by the node the coordinator cannot reach
                producer.send(TOPIC, f"v{len(commits)}-{p}".encode(), partition=p)
            producer.commit_transaction(timeout=30)
            commits.append(time.monotonic())
        gaps = [b - a for a, b in zip([cut_at, *commits], commits, strict=False)]
        assert len(commits) >= 3 and max(gaps) < 5.0, f"{len(commits)} commits, longest gap {max(gaps):.1f}s"
