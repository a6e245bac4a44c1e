"""Three real node processes on loopback: produce/fetch exactness and routing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import LocalCluster, http, wait_for
from tests.support.writer import IdempotentWriter, read_partition

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the tests that stop no node and use topics of their own."""
    c = LocalCluster(tmp_path_factory.mktemp("replication"), 3)
    try:
        yield c.start()
    finally:
        c.close()


def test_produce_fetch_exact_across_three_partitions(shared: LocalCluster) -> None:
    # Given a 3-node cluster and a topic with 3 partitions replicated 3 ways
    c = shared
    c.create_topic("orders", partitions=3, rf=3)
    w = IdempotentWriter(c, "orders")
    expected: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    # When 30 batches of 50 distinct records are written round-robin
    for i in range(30):
        p = i % 3
        values = [f"{i}-{j}".encode() for j in range(50)]
        base = w.send(p, values)
        assert base == len(expected[p])
        expected[p].extend(values)
    # Then every replica on every node holds exactly those records at consecutive offsets
    for p in range(3):
        for node in (1, 2, 3):
            wait_for(
                lambda p=p, node=node: c.partition_meta("orders", p, node)["high_watermark"] == 500,
                10,
                f"replica of orders-{p} on node {node} caught up",
            )
            got = read_partition(c, "orders", p, node)
            assert [o for o, _ in got] == list(range(500))
            assert [v for _, v in got] == expected[p]


def test_produce_to_follower_answers_not_leader_with_leader_url(shared: LocalCluster) -> None:
    c = shared
    c.create_topic("routed", partitions=1, rf=3)
    leader = c.leader("routed", 0)
    follower = next(i for i in (1, 2, 3) if i != leader)
    body = {"partitions": [{"topic": "routed", "partition": 0, "records": [{"value": "eA=="}]}]}
    status, res = http("POST", c.url(follower) + "/v1/produce", body)
    assert status == 421
    assert res["error_code"] == "NOT_LEADER_OR_FOLLOWER"
    assert res["retriable"] is True
    assert res["partitions"][0]["leader_url"] == c.url(leader)
    # And nothing was written
    assert c.partition_meta("routed", 0, leader)["high_watermark"] == 0


def test_duplicate_retry_returns_original_offset_and_gap_is_rejected(shared: LocalCluster) -> None:
    c = shared
    c.create_topic("dedup", partitions=1, rf=3)
    leader = c.leader("dedup", 0)
    _, init = http("POST", c.url(leader) + "/v1/producers/init", {})

    def produce(seq: int, epoch: int = 0):
        body = {
            "partitions": [
                {
                    "topic": "dedup",
                    "partition": 0,
                    "producer_id": init["producer_id"],
                    "producer_epoch": epoch,
                    "base_sequence": seq,
                    "records": [{"value": "YQ=="}, {"value": "Yg=="}],
                }
            ]
        }
        return http("POST", c.url(leader) + "/v1/produce", body)

    assert produce(0)[1]["partitions"][0]["base_offset"] == 0
    assert produce(2)[1]["partitions"][0]["base_offset"] == 2
    status, res = produce(0)  # a retry of the first batch
    assert status == 200 and res["partitions"][0]["base_offset"] == 0
    status, res = produce(7)
    assert status == 409 and res["error_code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert c.partition_meta("dedup", 0, leader)["high_watermark"] == 4


def test_producer_ids_are_unique_across_nodes(shared: LocalCluster) -> None:
    c = shared
    ids = set()
    for i in range(30):
        status, res = http("POST", c.url(1 + i % 3) + "/v1/producers/init", {})
        assert status == 200
        ids.add(res["producer_id"])
    assert len(ids) == 30


def test_topic_lifecycle_and_metadata_on_every_node(make_cluster):
    c = make_cluster()
    status, res = http("POST", c.url(2) + "/v1/topics", {"name": "a", "partitions": 6, "replication_factor": 2})
    assert status == 201, res
    assert sorted(len(p["replicas"]) for p in res["partitions"]) == [2] * 6
    # leaders spread: every node is the preferred leader of 2 partitions
    firsts = [p["replicas"][0] for p in res["partitions"]]
    assert sorted(firsts) == [1, 1, 2, 2, 3, 3]
    c.wait_leaders("a", 6)
    status, res = http("POST", c.url(3) + "/v1/topics", {"name": "a", "partitions": 1, "replication_factor": 1})
    assert status == 409 and res["error_code"] == "TOPIC_ALREADY_EXISTS"
    for node in (1, 2, 3):
        wait_for(lambda node=node: any(t["name"] == "a" for t in c.metadata(node)["topics"]), 10, "metadata")
    status, _ = http("DELETE", c.url(3) + "/v1/topics/a")
    assert status == 200
    for node in (1, 2, 3):
        wait_for(lambda node=node: not c.metadata(node)["topics"], 10, "topic gone everywhere")
    status, res = http("GET", c.url(1) + "/v1/topics/a")
    assert status == 404 and res["error_code"] == "UNKNOWN_TOPIC_OR_PARTITION"


def test_fetch_long_poll_returns_when_data_arrives(shared: LocalCluster) -> None:
    import threading
    import time

    c = shared
    c.create_topic("polled", partitions=1, rf=3)
    leader = c.leader("polled", 0)
    result = {}

    def poll():
        t0 = time.monotonic()
        result["res"] = http("GET", c.url(leader) + "/v1/topics/polled/partitions/0/records?offset=0&max_wait_ms=10000")
        result["elapsed"] = time.monotonic() - t0

    th = threading.Thread(target=poll)
    th.start()
    time.sleep(0.3)  # let the long-poll park before the write (the assertion below is on the result)
    IdempotentWriter(c, "polled").send(0, [b"wake"])
    th.join(15)
    status, res = result["res"]
    assert status == 200 and len(res["records"]) == 1
    assert result["elapsed"] < 9
