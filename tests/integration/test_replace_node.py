"""Replacing a machine: a node started with its old id and config and an empty data directory rejoins.

API.md "Operating a cluster": such a node catches up from its peers. One
3-node cluster for the module: records from an idempotent producer and from
committed and aborted transactions (with offsets sent to a transaction),
plain committed group offsets, a user and an ACL. Node 2 is SIGKILLed, its data directory
removed, and the node started again with the same config file. Its Raft logs
start empty, and every group it belongs to -- the topic's partitions, the
``__transaction_state`` and ``__consumer_offsets`` partitions and the
controller group -- is installed from a leader's snapshot (the compaction
threshold is low, so the leaders' logs no longer start at entry 1).

The tests run in order: the node is ready and caught up; its peers' groups
kept their terms and leaders; its producer ids are new ones; then node 2 leads
every group and serves everything written before the replacement.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families

from clients import Consumer, Producer
from clients.records import OffsetAndMetadata, TopicPartition
from tests.support.cluster import LocalCluster, http, wait_for
from tests.support.txn_reads import http_read, wait_settled

pytestmark = pytest.mark.integration

TOPIC = "replaced"
PARTITIONS = 3
TXN_ID = "replace-txn"
PLAIN_GROUP = "g-plain"
TXN_GROUP = "g-txn"
REPLACED = 2
USER = "replace-user"
ACL = {"principal": f"User:{USER}", "host": "*", "resource_type": "TOPIC", "resource_name": TOPIC,
       "pattern_type": "LITERAL", "operation": "READ", "permission": "ALLOW"}  # fmt: skip
Key = tuple[str, str]  # (topic label, partition label) of a Raft group in /metrics


@dataclass
class World:
    cluster: LocalCluster
    committed: dict[int, list[bytes]] = field(default_factory=dict)  # values read_committed must return, in order
    aborted: set[bytes] = field(default_factory=set)
    plain_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    txn_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    txn_epoch: int = -1
    max_producer_id: int = -1
    terms_before: dict[Key, int] = field(default_factory=dict)  # each group's term once node 2 was gone
    leaders_before: dict[Key, int] = field(default_factory=dict)


def raft_gauges(c: LocalCluster, node: int) -> dict[str, dict[Key, float]]:
    """A node's ``txbroker_raft_{term,commit_index,is_leader}`` by (topic, partition) label, from one scrape."""
    status, text = http("GET", c.url(node) + "/metrics", timeout=10)
    assert status == 200
    out: dict[str, dict[Key, float]] = {"term": {}, "commit_index": {}, "is_leader": {}}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            name = s.name.removeprefix("txbroker_raft_")
            if name in out:
                out[name][(s.labels["topic"], s.labels["partition"])] = s.value
    return out


def leaders_and_terms(c: LocalCluster, nodes: list[int]) -> tuple[dict[Key, int], dict[Key, int]] | None:
    """Each group's leader among ``nodes`` and its term there, once every group has one (else None)."""
    gauges = {n: raft_gauges(c, n) for n in nodes}
    keys = set().union(*(g["term"] for g in gauges.values()))
    leaders: dict[Key, int] = {}
    terms: dict[Key, int] = {}
    for key in keys:
        led = [n for n in nodes if gauges[n]["is_leader"].get(key) == 1]
        if len(led) != 1:
            return None
        leaders[key], terms[key] = led[0], int(gauges[led[0]]["term"][key])
    return leaders, terms


def write_everything(c: LocalCluster, w: World) -> None:
    urls = c.urls
    w.committed = {p: [] for p in range(PARTITIONS)}
    pids = []
    with Producer(urls, acks="all", enable_idempotence=True, linger_ms=5) as p:
        for round_ in range(4):
            futs = [p.send(TOPIC, value=f"idem-{q}-{round_}-{i}".encode(), partition=q)
                    for q in range(PARTITIONS) for i in range(10)]  # fmt: skip
            p.flush()
            assert all(f.result(timeout=30).offset >= 0 for f in futs)
        for q in range(PARTITIONS):
            w.committed[q] += [f"idem-{q}-{r}-{i}".encode() for r in range(4) for i in range(10)]
        pids.append(p.producer_id)
    with Producer(urls, transactional_id=TXN_ID, linger_ms=5) as p:
        p.init_transactions()
        for round_ in range(5):
            p.begin_transaction()
            for q in range(PARTITIONS):
                for i in range(4):
                    value = f"txn-{q}-{round_}-{i}".encode()
                    p.send(TOPIC, value=value, partition=q)
                    w.committed[q].append(value)
            w.txn_offsets = {(TOPIC, q): 10 * (round_ + 1) + q for q in range(PARTITIONS)}
            p.send_offsets_to_transaction(w.txn_offsets, TXN_GROUP)
            p.commit_transaction()
            p.begin_transaction()
            for q in range(PARTITIONS):
                value = f"aborted-{q}-{round_}".encode()
                p.send(TOPIC, value=value, partition=q)
                w.aborted.add(value)
            p.send_offsets_to_transaction({(TOPIC, q): 999 for q in range(PARTITIONS)}, TXN_GROUP)
            p.flush()
            p.abort_transaction()
        w.txn_epoch = p.producer_epoch
        pids.append(p.producer_id)
    wait_settled(c, TOPIC, range(PARTITIONS))
    w.plain_offsets = {(TOPIC, q): 5 + q for q in range(PARTITIONS)}
    with Consumer(urls[0], group_id=PLAIN_GROUP, enable_auto_commit=False) as consumer:
        consumer.assign(list(w.plain_offsets))
        consumer.commit({tp: OffsetAndMetadata(o) for tp, o in w.plain_offsets.items()})
    # A user and an ACL: the controller's state (an open node takes them as a secure one does)
    status, res = http("PUT", c.url(1) + f"/v1/users/{USER}", {"password": "replace-secret", "iterations": 4096})
    assert status == 200, res
    status, res = http("POST", c.url(1) + "/v1/acls", ACL)
    assert status == 201, res
    for node in range(1, c.n + 1):  # a producer id from every node's current block
        status, res = http("POST", c.url(node) + "/v1/producers/init", {"transactional_id": None})
        assert status == 200, res
        pids.append(int(res["producer_id"]))
    w.max_producer_id = max(pids)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    c = LocalCluster(
        tmp_path_factory.mktemp("replace-node"),
        3,
        raft_log_compaction_min_entries=8,  # the leaders' logs move past entry 1: the replaced node needs snapshots
        leader_balance_hold_s=3600.0,  # leadership stays where elections put it (terms are compared)
        transaction_state_partitions=4,
        offsets_topic_partitions=2,
    )
    try:
        c.start()
        c.create_topic(TOPIC, partitions=PARTITIONS, rf=3)
        w = World(c)
        write_everything(c, w)
        c.kill(REPLACED)
        data_dir = c.configs[REPLACED - 1].data_dir
        shutil.rmtree(data_dir)
        assert not data_dir.exists()
        others = [n for n in range(1, c.n + 1) if n != REPLACED]
        w.leaders_before, w.terms_before = wait_for(
            lambda: leaders_and_terms(c, others), 30, "a leader on nodes 1 or 3 for every group"
        )
        c.start_node(REPLACED)  # the same config file: same id, ports and (now empty) data_dir
        yield w
    finally:
        c.close()


def group_lag(c: LocalCluster) -> dict[Key, tuple[float, float]]:
    """Groups whose commit index on the replaced node is below its leader's: key -> (node 2's, leader's)."""
    others = [n for n in range(1, c.n + 1) if n != REPLACED and c.procs[n].poll() is None]
    leader_commit: dict[Key, float] = {}
    for n in others:  # the leaders' first: node 2's figure, read after, must reach them
        g = raft_gauges(c, n)
        leader_commit.update({k: g["commit_index"][k] for k, v in g["is_leader"].items() if v == 1})
    mine = raft_gauges(c, REPLACED)["commit_index"]
    return {k: (mine.get(k, -1), v) for k, v in leader_commit.items() if mine.get(k, -1) < v}


def test_the_replaced_node_becomes_ready_and_catches_up_on_every_group(world: World) -> None:
    c = world.cluster
    c.wait_ready([REPLACED], timeout=60)
    assert (c.configs[REPLACED - 1].data_dir / "cluster_id").read_text().strip() == c.configs[0].cluster_id
    wait_for(lambda: not group_lag(c), 60, "node 2's commit index reaching its leaders' in every group")
    keys = set(raft_gauges(c, REPLACED)["term"])
    assert {t for t, _ in keys} >= {TOPIC, "__transaction_state", "__consumer_offsets", "__controller"}, keys
    assert len(keys) == PARTITIONS + 4 + 2 + 1

    def same_offsets() -> bool:
        # /v1/metadata on node 2 reports its own replica's offsets; the leader's come from the leader
        for q in range(PARTITIONS):
            mine = c.partition_meta(TOPIC, q, via=REPLACED)
            leader = c.leader(TOPIC, q)
            assert leader is not None and leader != REPLACED
            theirs = c.partition_meta(TOPIC, q, via=leader)
            fields = ("high_watermark", "last_stable_offset", "log_start_offset")
            if any(mine[f] != theirs[f] for f in fields):
                return False
        return True

    wait_for(same_offsets, 30, "node 2's replicas at their leaders' high watermark and last stable offset")
    for q in range(PARTITIONS):  # its own copy, read locally: every record, aborted ones filtered
        local = [v for _, v in http_read(c.url(REPLACED), TOPIC, q, "read_committed", read_replica="any")]
        assert local == world.committed[q]
    status, users = http("GET", c.url(REPLACED) + "/v1/users")  # node 2's own controller replica answers
    assert status == 200 and USER in [u["name"] for u in users["users"]], users
    status, acls = http("GET", c.url(REPLACED) + f"/v1/acls?principal=User:{USER}")
    assert status == 200 and acls["acls"] == [ACL], acls
    restored = c.log_text(REPLACED).count("restored state machine from snapshot")
    assert restored >= PARTITIONS + 1, "the leaders' logs were not compacted: the snapshot path went untested"


def test_the_peers_keep_their_leaders_and_terms_and_accept_the_node(world: World) -> None:
    c = world.cluster
    others = [n for n in range(1, c.n + 1) if n != REPLACED]
    now = leaders_and_terms(c, others)
    assert now is not None, "a group lost its leader while node 2 rejoined"
    leaders, terms = now
    assert leaders == world.leaders_before
    assert terms == world.terms_before, "the rejoining node disrupted an election"
    mine = raft_gauges(c, REPLACED)
    assert not any(v == 1 for v in mine["is_leader"].values()), "an empty log won an election"
    for n in others:
        assert "truncating already-applied" not in c.log_text(n)

        def all_alive(n: int = n) -> bool:  # the peer poll (once a second) sees the node back
            status, body = http("GET", c.url(n) + "/v1/cluster")
            return status == 200 and all(node["alive"] for node in body["nodes"])

        wait_for(all_alive, 10, f"node {n} seeing every node alive")
    # Node calls: node 2 routes a produce to a partition another node leads (a signed call it makes).
    q = next(q for q in range(PARTITIONS) if c.leader(TOPIC, q) != REPLACED)
    body = {"records": [{"partition": q, "value": base64.b64encode(b"routed").decode()}]}
    status, res = http("POST", c.url(REPLACED) + f"/v1/topics/{TOPIC}/records", body)
    assert status == 200, res
    world.committed[q].append(b"routed")
    assert "signed before this node started" not in c.log_text(REPLACED)


def test_the_replaced_node_hands_out_new_producer_ids(world: World) -> None:
    c = world.cluster
    status, res = http("POST", c.url(REPLACED) + "/v1/producers/init", {"transactional_id": None})
    assert status == 200, res
    assert int(res["producer_id"]) > world.max_producer_id, "a producer id of the old disk's block was reused"


def lead_everything_from(c: LocalCluster, node: int) -> None:
    """Move every group's leadership to ``node``: kill one peer, drain the other (it hands its groups to ``node``,
    the only peer left), restart the killed one -- it lacks the newest entry of every group, so it cannot win an
    election against ``node`` -- and then the drained one."""
    first, second = (n for n in range(1, c.n + 1) if n != node)
    c.kill(first)
    wait_for(lambda: leaders_and_terms(c, [node, second]), 30, f"leaders on nodes {node} and {second}")
    assert c.stop_node(second) == 0
    c.start_node(first)

    def all_led_by_node() -> bool:
        got = leaders_and_terms(c, [node, first])
        return got is not None and set(got[0].values()) == {node}

    wait_for(all_led_by_node, 60, f"node {node} leading every group")
    c.start_node(second)  # a follower again: pre-vote keeps it from deposing a leader it can reach
    c.wait_ready(timeout=60)
    assert leaders_and_terms(c, [node, first, second]) is not None


def test_the_replaced_node_serves_everything_as_leader(world: World) -> None:
    c = world.cluster
    lead_everything_from(c, REPLACED)
    url = c.url(REPLACED)
    for q in range(PARTITIONS):
        assert c.partition_meta(TOPIC, q, via=REPLACED)["leader"] == REPLACED
        committed = [v for _, v in http_read(url, TOPIC, q, "read_committed")]
        assert committed == world.committed[q], f"partition {q}: committed records lost, duplicated or reordered"
        everything = {v for _, v in http_read(url, TOPIC, q, "read_uncommitted")}
        assert {v for v in world.aborted if v.startswith(f"aborted-{q}-".encode())} <= everything
    with Consumer(url, group_id=PLAIN_GROUP, enable_auto_commit=False) as consumer:
        for tp, offset in world.plain_offsets.items():
            assert consumer.committed(tp) == offset
    with Consumer(url, group_id=TXN_GROUP, enable_auto_commit=False) as consumer:
        for tp, offset in world.txn_offsets.items():
            assert consumer.committed(tp) == offset, "the committed transaction's offsets (not the aborted 999)"
    with Producer(url, transactional_id=TXN_ID) as p:
        p.init_transactions()  # fences the old epoch: the coordinator (node 2) still knows the transactional id
        assert p.producer_epoch > world.txn_epoch
        p.begin_transaction()
        fut = p.send(TOPIC, value=b"after", partition=0)
        p.commit_transaction()
        assert fut.result(timeout=30).offset >= 0
    wait_settled(c, TOPIC, [0])
    assert [v for _, v in http_read(url, TOPIC, 0, "read_committed")] == [*world.committed[0], b"after"]
