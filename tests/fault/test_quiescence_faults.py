"""Quiescent groups under a network partition, each node in its own network namespace (verify.netns).

A follower of quiescent groups is cut off from their leader's node only (it still reaches the
third node). It stops hearing the leader's node heartbeats, wakes, and asks for pre-votes; the
third node, still hearing the leader's node, refuses. At no moment do two nodes lead one group
in one term, and every partition keeps taking writes through its one leader.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import http, samples, wait_for
from verify.netns import NamespacedCluster, unavailable_reason

pytestmark = [pytest.mark.fault, pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]

TOPIC = "quiet"
PARTITIONS = 4


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NamespacedCluster]:
    # No leader balancing: leadership moves only through the fault.
    with NamespacedCluster(tmp_path, 3, leader_balance_interval_s=3600.0) as c:
        c.start()
        yield c


def _quiescent(c: NamespacedCluster, node: int) -> int:
    return int(sum(v for _, v in samples(c.url(node), "txbroker_raft_quiescent_groups")))


def _leaders_by_term(c: NamespacedCluster, nodes: list[int]) -> dict[tuple[str, str, int], set[int]]:
    """(topic, partition, term) -> the nodes that report leading it in that term."""
    out: dict[tuple[str, str, int], set[int]] = {}
    for node in nodes:
        terms = {(lv["topic"], lv["partition"]): int(v) for lv, v in samples(c.url(node), "txbroker_raft_term")}
        for lv, v in samples(c.url(node), "txbroker_raft_is_leader"):
            key = (lv["topic"], lv["partition"])
            if v and key in terms:
                out.setdefault((*key, terms[key]), set()).add(node)
    return out


def test_a_follower_cut_off_from_a_quiescent_leader_never_makes_a_second_leader(cluster: NamespacedCluster) -> None:
    status, res = http("POST", cluster.url(1) + "/v1/topics", {"name": TOPIC, "partitions": PARTITIONS})
    assert status == 201, res
    for p in range(PARTITIONS):
        wait_for(lambda p=p: cluster.leader_of(TOPIC, p), 30, f"a leader of {TOPIC}-{p}")
    leader = wait_for(lambda: cluster.leader_of(TOPIC, 0), 30, "a leader of partition 0")
    follower = next(n for n in cluster.node_ids if n != leader)
    # Given: the groups quiescent on every node (the topic's, the coordinators', the controller).
    wait_for(
        lambda: all(_quiescent(cluster, n) >= PARTITIONS for n in cluster.node_ids), 60, "quiescent groups everywhere"
    )
    # When: the follower loses the leader's node (and only it) for several election timeouts.
    cluster.cut(leader, follower)
    seen: dict[tuple[str, str, int], set[int]] = {}
    until = time.monotonic() + 6.0
    while time.monotonic() < until:
        for key, nodes in _leaders_by_term(cluster, cluster.node_ids).items():
            seen.setdefault(key, set()).update(nodes)
        time.sleep(0.2)
    # Then: every partition takes a write through its one leader meanwhile.
    for p in range(PARTITIONS):

        def written(p: int = p) -> bool:
            owner = cluster.leader_of(TOPIC, p)
            if owner is None:
                return False
            record = {"value": base64.b64encode(b"cut").decode()}
            part = {"topic": TOPIC, "partition": p, "producer_id": -1, "producer_epoch": -1, "base_sequence": -1}
            body = {"acks": "all", "timeout_ms": 10_000, "partitions": [{**part, "records": [record]}]}
            status, res = http("POST", cluster.url(owner) + "/v1/produce", body, timeout=15)
            return status == 200 and isinstance(res, dict) and res["partitions"][0].get("error_code") in (None, "NONE")

        wait_for(written, 20, f"a write to {TOPIC}-{p} during the cut", interval=0.2)
    cluster.heal()
    until = time.monotonic() + 3.0
    while time.monotonic() < until:
        for key, nodes in _leaders_by_term(cluster, cluster.node_ids).items():
            seen.setdefault(key, set()).update(nodes)
        time.sleep(0.2)
    # Never two leaders of one group in one term (Raft's election safety, with quiescence on).
    doubled = {k: v for k, v in seen.items() if len(v) > 1}
    assert not doubled, doubled
