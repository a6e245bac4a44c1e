"""Forging node-to-node calls against 3 real node processes (cluster/security/node_calls.py).

A node call is signed here exactly as a node signs it (``tests.support.cluster.node_call``: the
cluster secret from the test's config, the node's signer). What a captured call lets an attacker do:
replay it unchanged, to the same node or another, with another body, late, or after the receiver
restarted -- each is refused with 403 ``CLUSTER_AUTHORIZATION_FAILED`` and changes nothing (the
partition's high watermark is checked before and after). Headers a client sets never make it a node.
Requests the nodes forward among themselves keep working.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cluster.security.node_calls import NODE_CALL_HEADER
from tests.support.cluster import LocalCluster, http, node_call, wait_for

pytestmark = pytest.mark.integration

TOPIC = "forged"
MARKER = "/v1/internal/txn/marker"
PIDS = "/v1/internal/producer-ids"
REFUSED = "CLUSTER_AUTHORIZATION_FAILED"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(Path(tmp_path_factory.mktemp("node-calls")), 3)
    try:
        cluster.start()
        cluster.create_topic(TOPIC, partitions=1, rf=3)
        yield cluster
    finally:
        cluster.close()


def high_watermark(c: LocalCluster, node: int) -> int:
    return int(c.partition_meta(TOPIC, 0, node)["high_watermark"])


def marker(pid: int) -> dict[str, Any]:
    return {"topic": TOPIC, "partition": 0, "producer_id": pid, "producer_epoch": 0, "coordinator_epoch": 0,
            "control_type": "ABORT"}  # fmt: skip


def refused(answer: tuple[int, Any]) -> str:
    status, body = answer
    assert status == 403, answer
    assert isinstance(body, dict) and body["error_code"] == REFUSED, answer
    return str(body["message"])


def settled_hw(c: LocalCluster, leader: int, want: int) -> None:
    wait_for(lambda: high_watermark(c, leader) == want, 30, f"high watermark {want}")


def controller_leader(c: LocalCluster) -> int:
    status, cluster = http("GET", c.url(1) + "/v1/cluster")
    assert status == 200 and cluster["controller_leader"] is not None, cluster
    return int(cluster["controller_leader"])


def test_a_captured_internal_call_replayed_is_refused_and_changes_nothing(c: LocalCluster) -> None:
    # A producer-id block allocation changes the controller's state at every call: the next block follows.
    ctrl = controller_leader(c)
    sender = next(n for n in (1, 2, 3) if n != ctrl)
    body = {"node_id": sender}
    captured = node_call(c.configs[sender - 1], ctrl, "POST", PIDS, body)
    status, first = http("POST", c.url(ctrl) + PIDS, body, headers=captured)
    assert status == 200, first

    # the same bytes again, to the node it was sent to and to every other node
    assert "replayed" in refused(http("POST", c.url(ctrl) + PIDS, body, headers=captured))
    for n in (1, 2, 3):
        refused(http("POST", c.url(n) + PIDS, body, headers=captured))
    # the signature with another body, query or route
    for other in ({"node_id": ctrl}, {"node_id": sender, "x": 1}, {}):
        refused(http("POST", c.url(ctrl) + PIDS, other, headers=captured))
    refused(http("POST", c.url(ctrl) + PIDS + "?x=1", body, headers=captured))
    refused(http("POST", c.url(ctrl) + "/v1/internal/relay", body, headers=captured))
    # a fresh call signed 60 s ago (outside the freshness window), 60 s ahead, or with another secret
    for shift, why in ((-60, "stale"), (60, "future")):
        late = node_call(c.configs[sender - 1], ctrl, "POST", PIDS, body, signed_at=time.time() + shift)
        assert why in refused(http("POST", c.url(ctrl) + PIDS, body, headers=late))
    stranger = replace(c.configs[sender - 1], cluster_secret="not-the-cluster-secret")
    refused(http("POST", c.url(ctrl) + PIDS, body, headers=node_call(stranger, ctrl, "POST", PIDS, body)))
    # a forwarded call (acting for a principal) is no internal call
    as_user = node_call(c.configs[sender - 1], ctrl, "POST", PIDS, body, principal="User:ANONYMOUS")
    refused(http("POST", c.url(ctrl) + PIDS, body, headers=as_user))

    # nothing was allocated in between: a call signed afresh gets the very next block
    fresh = node_call(c.configs[sender - 1], ctrl, "POST", PIDS, body)
    status, second = http("POST", c.url(ctrl) + PIDS, body, headers=fresh)
    assert status == 200, second
    assert second["first"] == first["first"] + first["size"], (first, second)


def _old_scheme(secret: str, method: str, path: str) -> str:
    return hmac.new(secret.encode(), f"{method} {path}".encode(), hashlib.sha256).hexdigest()


def test_client_set_node_headers_are_refused_on_internal_and_public_routes(c: LocalCluster) -> None:
    leader = c.wait_leaders(TOPIC, 1)[0]
    secret = c.configs[0].cluster_secret
    before = high_watermark(c, leader)
    hostile = [
        {"X-Txbroker-Forwarded": "1"},
        {"X-Txbroker-Auth": _old_scheme(secret, "POST", MARKER)},  # the old per-path signature: now nothing
        {NODE_CALL_HEADER: "garbage"},
        {NODE_CALL_HEADER: "v1 n=1,t=1,c=0000000000000000.1,p=,s=" + "0" * 64},
        {NODE_CALL_HEADER: "\u00e9\u00ff" * 20},
    ]
    records = {"records": [{"value": "aGk=", "partition": 0}]}
    for headers in hostile:
        for node in (1, 2, 3):
            refused(http("POST", c.url(node) + MARKER, marker(777), headers=headers))
            refused(http("GET", c.url(node) + "/v1/internal/state", headers=headers))
            refused(http("POST", c.url(node) + "/v1/topics", {"name": "never-made", "partitions": 1}, headers=headers))
            refused(http("POST", c.url(node) + f"/v1/topics/{TOPIC}/records", records, headers=headers))
            refused(http("POST", c.url(node) + "/v1/producers/init", {}, headers=headers))
    # the same internal calls without any header are refused too
    refused(http("POST", c.url(leader) + MARKER, marker(777)))
    refused(http("GET", c.url(leader) + "/v1/internal/state"))
    time.sleep(0.5)
    assert high_watermark(c, leader) == before
    status, topics = http("GET", c.url(1) + "/v1/metadata")
    assert status == 200 and "never-made" not in {t["name"] for t in topics["topics"]}


def test_a_call_captured_before_the_receiver_restarted_is_refused_after(c: LocalCluster) -> None:
    target = 3
    path = "/v1/internal/state"
    captured = node_call(c.configs[0], target, "GET", path)
    status, _ = http("GET", c.url(target) + path, headers=captured)
    assert status == 200
    assert c.stop_node(target) == 0
    c.start_node(target)
    c.wait_ready([target])
    # within the freshness window still, but signed before node 3 started: its replay memory cannot know it
    assert "before this node started" in refused(http("GET", c.url(target) + path, headers=captured))
    status, _ = http("GET", c.url(target) + path, headers=node_call(c.configs[0], target, "GET", path))
    assert status == 200


def test_requests_the_nodes_forward_still_work(c: LocalCluster) -> None:
    # InitProducerId at a node that does not coordinate the transactional id: proxied to the coordinator
    for i in range(50):
        tid = f"forwarded-{i}"
        status, coord = http("GET", c.url(1) + f"/v1/coordinators/transaction/{tid}")
        assert status == 200, coord
        if coord["node_id"] != 1:
            break
    else:
        pytest.fail("no transactional id coordinated off node 1")
    status, res = http("POST", c.url(1) + "/v1/producers/init", {"transactional_id": tid})
    assert status == 200, res
    assert res["producer_id"] >= 0
    # a topic create at a node that is not the controller leader: proxied to it
    status, cluster = http("GET", c.url(1) + "/v1/cluster")
    assert status == 200, cluster
    follower = next(n for n in (1, 2, 3) if n != cluster["controller_leader"])
    status, res = http("POST", c.url(follower) + "/v1/topics", {"name": "made-by-forward", "partitions": 1})
    assert status == 201, res
    # a routed produce at a node that does not lead the partition: its batch is written on the leader
    leader = c.wait_leaders(TOPIC, 1)[0]
    other = next(n for n in (1, 2, 3) if n != leader)
    before = high_watermark(c, leader)
    status, res = http("POST", c.url(other) + f"/v1/topics/{TOPIC}/records", {"records": [{"value": "aGk="}]})
    assert status == 200, res
    assert res["offsets"][0].get("error_code", "NONE") == "NONE", res
    settled_hw(c, leader, before + 1)


def test_a_peer_polling_the_state_gets_what_changed_since_the_version_it_holds(c: LocalCluster) -> None:
    leader = int(c.partition_meta(TOPIC, 0, 1)["leader"])
    me = c.configs[0] if leader != 1 else c.configs[1]

    def state(query: str = "") -> tuple[int, Any]:
        path = "/v1/internal/state" + query
        return http("GET", c.url(leader) + path, headers=node_call(me, leader, "GET", path))

    # A first poll gets every group the node replicates, with the epoch and version it stands at
    status, first = state()
    assert status == 200 and first["full"], first
    gid = next(g for g, v in first["partitions"].items() if v.get("topic") == TOPIC and v["partition"] == 0)
    epoch, version, hw = first["epoch"], first["version"], first["partitions"][gid]["high_watermark"]
    # When a record is written to the node's partition
    status, res = http("POST", c.url(leader) + f"/v1/topics/{TOPIC}/records", {"records": [{"value": "eA=="}]})
    assert status == 200, res

    # Then a poll naming the version it holds gets that partition with its new high watermark, not everything
    def delta() -> dict[str, Any] | None:
        status, body = state(f"?epoch={epoch}&since={version}")
        assert status == 200 and not body["full"] and body["epoch"] == epoch, body
        entry = body["partitions"].get(gid)
        return body if entry is not None and entry["high_watermark"] > hw else None

    body = wait_for(delta, 10, "the written partition in a delta")
    assert len(body["partitions"]) < len(first["partitions"]) and body["version"] > version
    # A version of another epoch (the node restarted since) gets the whole state again
    status, other = state(f"?epoch=0ther{epoch}&since={version}")
    assert status == 200 and other["full"] and set(other["partitions"]) >= {gid}
    # Malformed versions are refused
    for query in ("?epoch=not-an-epoch&since=1", f"?epoch={epoch}&since=-1", f"?epoch={epoch}&since=x"):
        status, bad = state(query)
        assert status == 400 and bad["error_code"] == "INVALID_REQUEST", (query, bad)
