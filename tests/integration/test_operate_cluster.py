"""Growing and shrinking a running cluster: add a node, move partitions under load, decommission a node.

One cluster goes through the phases in order (the module's tests share it):
3 nodes -> ``txbroker cluster add-node`` + ``node start`` -> a partition moves
onto the new node while an idempotent producer, a transactional producer and
a read_committed consumer keep working -> a node of the new replica set is
killed -> bad requests change nothing -> the leader of a moving partition is
killed mid-move -> a node is decommissioned under load and stopped.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from clients import Consumer, Producer
from clients.records import RecordMetadata

from ..support.cluster import REPO, LocalCluster, http, wait_for
from ..support.exactly_once import assert_exactly_once_in_order, read_log

TOPIC = "moving"
OTHER = "steady"


class Load:
    """An idempotent producer writing unique values to one partition from a thread, until stopped."""

    def __init__(self, cluster: LocalCluster, topic: str, partition: int) -> None:
        self.sent: list[bytes] = []
        self.acked: dict[bytes, RecordMetadata] = {}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._producer = Producer(cluster.urls, enable_idempotence=True, request_timeout_ms=20_000)
        self._thread = threading.Thread(target=self._run, args=(topic, partition), daemon=True)
        self._thread.start()

    def _run(self, topic: str, partition: int) -> None:
        i = 0
        while not self._stop.is_set():
            value = f"idem-{i}".encode()
            i += 1
            self.sent.append(value)
            fut = self._producer.send(topic, value=value, partition=partition)
            try:
                self.acked[value] = fut.result(timeout=60)
            except Exception as exc:  # a record may fail; it must then be in the log at most once
                self.errors.append(exc)
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)
        self._producer.close()


class OperatedCluster:
    def __init__(self, directory: Path) -> None:
        self.c = LocalCluster(directory, 3)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cluster", *args, "--bootstrap", ",".join(self.c.urls)],
            capture_output=True, text=True, timeout=200, cwd=str(REPO), check=False,
        )  # fmt: skip

    def get(self, path: str, via: int = 1) -> Any:
        status, body = http("GET", self.c.url(via) + path, timeout=10)
        assert status == 200, body
        return body

    def replicas(self, topic: str, partition: int, via: int = 1) -> list[int]:
        return list(self.c.partition_meta(topic, partition, via)["replicas"])

    def moves(self, via: int = 1) -> list[dict[str, Any]]:
        return list(self.get("/v1/reassignments", via)["reassignments"])


@pytest.fixture(scope="module")
def oc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatedCluster]:
    oc = OperatedCluster(tmp_path_factory.mktemp("operate"))
    try:
        oc.c.start()
        oc.c.create_topic(TOPIC, partitions=1, rf=3)
        oc.c.create_topic(OTHER, partitions=2, rf=3)
        yield oc
    finally:
        oc.c.close()


def test_a_new_node_registers_starts_and_gets_a_controller_vote(oc: OperatedCluster) -> None:
    out = oc.cli("cluster", "add-node", "--dir", str(oc.c.dir))
    assert out.returncode == 0, out.stderr
    node_id = oc.c.adopt(oc.c.dir / "node-4.toml")
    assert node_id == 4
    # registered before it ever ran: every node lists it from the controller's registry
    for via in (1, 2, 3):
        assert 4 in [n["id"] for n in oc.get("/v1/cluster", via)["nodes"]]
    oc.c.start_node(4)
    oc.c.wait_ready([4], timeout=60)
    wait_for(lambda: oc.get("/v1/nodes/4")["controller_voter"], 30, "node 4's controller vote")
    node = oc.get("/v1/nodes/4", via=4)
    assert node["state"] == "active" and node["alive"]
    # it got a Kafka listener too: Kafka clients bootstrapping from it see all four nodes
    kafka = oc.c.configs[3].self_address.kafka_address
    assert kafka is not None and f"kafka {kafka}" in out.stdout and node["kafka"] == kafka
    brokers = AdminClient({"bootstrap.servers": kafka}).list_topics(timeout=10).brokers
    assert sorted(brokers) == [1, 2, 3, 4]


def test_a_partition_moves_onto_the_new_node_under_load(oc: OperatedCluster) -> None:
    c = oc.c
    assert oc.replicas(TOPIC, 0) == [1, 2, 3] or sorted(oc.replicas(TOPIC, 0)) == [1, 2, 3]
    idem = Load(c, TOPIC, 0)
    txn = Producer(c.urls, transactional_id="mover")
    txn.init_transactions()
    txn.begin_transaction()
    open_values = [f"open-{i}".encode() for i in range(20)]
    for v in open_values:
        txn.send(TOPIC, value=v, partition=0)
    txn.flush()
    consumer = Consumer(c.urls, isolation_level="read_committed")
    consumer.assign([(TOPIC, 0)])
    consumer.seek_to_beginning()
    seen: list[bytes] = []
    wait_for(lambda: len(idem.acked) >= 20, 30, "records before the move")

    out = oc.cli("partitions", "reassign", "--topic", TOPIC, "--partition", "0", "--replicas", "4,2,3")
    assert out.returncode == 0, out.stderr
    moving = oc.moves()
    assert [m["target_replicas"] for m in moving] == [[4, 2, 3]] or not moving  # may already be done

    def done() -> bool:
        seen.extend(r.value for r in consumer.poll(200))
        return not oc.moves() and sorted(oc.replicas(TOPIC, 0)) == [2, 3, 4]

    wait_for(done, 90, "the move to complete", interval=0.2)
    # the transaction that was open across the move commits exactly once
    for i in range(5):
        txn.send(TOPIC, value=f"after-{i}".encode(), partition=0)
    txn.commit_transaction()
    # a node of the new replica set dies: the partition keeps serving
    c.kill(2)
    before = len(idem.acked)
    wait_for(lambda: len(idem.acked) >= before + 20, 60, "writes with node 2 down")
    c.start_node(2)
    c.wait_ready([2], timeout=60)
    idem.stop()
    txn.close()
    assert not idem.errors, idem.errors[:3]
    log = read_log(c, TOPIC, 0, at_least=len(idem.acked) + 25)
    idem_log = [(o, v) for o, v in log if v.startswith(b"idem-")]
    assert_exactly_once_in_order(idem.sent, idem.acked, idem_log, f"{TOPIC}-0")
    txn_values = [v for _, v in log if not v.startswith(b"idem-")]
    assert txn_values == open_values + [f"after-{i}".encode() for i in range(5)]

    def consumed_all() -> bool:
        seen.extend(r.value for r in consumer.poll(200))
        return len([v for v in seen if not v.startswith(b"idem-")]) >= 25

    wait_for(consumed_all, 30, "the committed transaction read_committed")
    consumer.close()
    assert len(seen) == len(set(seen)), "read_committed saw a record twice"
    assert [v for v in seen if not v.startswith(b"idem-")] == txn_values
    # the leaving node keeps nothing of the partition
    assert 1 not in oc.replicas(TOPIC, 0, via=1)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"replicas": [9, 2, 3]}, 400, "INVALID_REPLICA_ASSIGNMENT"),
        ({"replicas": [2, 2, 3]}, 400, "INVALID_REPLICA_ASSIGNMENT"),
        ({"replicas": [4]}, 400, "INVALID_REPLICATION_FACTOR"),
        ({"replicas": "2,3"}, 400, "INVALID_REPLICA_ASSIGNMENT"),
        ({}, 400, "INVALID_REPLICA_ASSIGNMENT"),
    ],
)
def test_a_bad_move_is_refused_and_changes_nothing(oc: OperatedCluster, body: Any, status: int, code: str) -> None:
    before = oc.replicas(OTHER, 0)
    got, res = http("POST", oc.c.url(3) + f"/v1/topics/{OTHER}/partitions/0/reassign", body)
    assert (got, res.get("error_code")) == (status, code), res
    assert oc.replicas(OTHER, 0) == before and oc.moves() == []


def test_bad_node_requests_are_refused(oc: OperatedCluster) -> None:
    got, res = http("POST", oc.c.url(1) + "/v1/nodes/9/decommission", None)
    assert (got, res["error_code"]) == (404, "BROKER_ID_NOT_REGISTERED")
    got, res = http("DELETE", oc.c.url(1) + f"/v1/topics/{OTHER}/partitions/0/reassign", None)
    assert (got, res["error_code"]) == (409, "NO_REASSIGNMENT_IN_PROGRESS")
    got, res = http("POST", oc.c.url(1) + "/v1/nodes", {"host": "127.0.0.1", "http_port": 1, "raft_port": 1})
    assert (got, res["error_code"]) == (400, "INVALID_REQUEST")
    got, res = http(
        "POST", oc.c.url(1) + "/v1/nodes", {"node_id": 2, "host": "10.9.9.9", "http_port": 5, "raft_port": 6}
    )
    assert (got, res["error_code"]) == (409, "DUPLICATE_BROKER_REGISTRATION")
    assert [n["id"] for n in oc.get("/v1/nodes")["nodes"]] == [1, 2, 3, 4]


def test_an_unfinished_move_is_cancelled_back_to_its_replicas(oc: OperatedCluster) -> None:
    c = oc.c
    # node 5 is registered but never started: a move onto it cannot finish
    status, res = http("POST", c.url(1) + "/v1/nodes", {"host": "127.0.0.1", "http_port": 1, "raft_port": 2})
    assert status == 201, res
    five = int(res["id"])
    start = oc.replicas(OTHER, 0)
    status, res = http("POST", c.url(2) + f"/v1/topics/{OTHER}/partitions/0/reassign", {"replicas": [five, *start[1:]]})
    assert status == 202, res

    def stuck() -> dict[str, Any] | None:
        moves = oc.moves(via=3)
        return moves[0] if moves and (moves[0].get("roles") or {}).get(str(five)) == "learner" else None

    move = wait_for(stuck, 30, f"node {five} a learner, as the move's leader reports")
    assert move["state"] == "moving" and move["adding_replicas"] == [five]
    # node 5 never answers: it stays a learner (counted for nothing), and its replica reports no offsets
    assert five not in move["voters"]
    assert move["offsets_behind"][str(five)] is None
    others = [n for n in start[1:] if n != move["leader"]]
    assert all(move["roles"][str(n)] == "voter" and move["offsets_behind"][str(n)] is not None for n in others)
    out = oc.cli("partitions", "reassign", "--topic", OTHER, "--partition", "0", "--cancel", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    assert oc.replicas(OTHER, 0) == start and oc.moves() == []
    # an internal partition moves the same way
    internal = oc.get("/v1/nodes/4")["replicas"]
    status, res = http(
        "POST", c.url(1) + "/v1/topics/__consumer_offsets/partitions/1/reassign", {"replicas": [4, 2, 3]}
    )
    assert status == 202, res
    wait_for(lambda: not oc.moves(), 60, "the move of __consumer_offsets-1")
    assert oc.get("/v1/nodes/4")["replicas"] == internal + (0 if 4 in res["replicas"] else 1)
    # (a node learns a moved coordinator's readiness from its peers' next reports)
    c.wait_ready([1, 2, 3, 4], timeout=30)
    # a node that holds nothing is decommissioned at once, down or not
    status, res = http("POST", c.url(1) + f"/v1/nodes/{five}/decommission", None)
    assert status == 202 and res["moves"] == [], res
    wait_for(lambda: oc.get(f"/v1/nodes/{five}")["state"] == "decommissioned", 30, f"node {five} decommissioned")


def test_killing_the_leader_mid_move_completes_or_rolls_back(oc: OperatedCluster) -> None:
    c = oc.c
    writer = Load(c, OTHER, 1)
    wait_for(lambda: len(writer.acked) >= 10, 30, "records before the move")
    start = oc.replicas(OTHER, 1)
    target = [n for n in (1, 2, 3, 4) if n not in start] + start[1:]
    status, res = http("POST", c.url(1) + f"/v1/topics/{OTHER}/partitions/1/reassign", {"replicas": target})
    assert status == 202, res
    leader = c.leader(OTHER, 1)
    assert leader is not None
    c.kill(leader)
    wait_for(lambda: not oc.moves(via=next(i for i in (1, 2, 3, 4) if i != leader)), 120, "the move to settle")
    c.start_node(leader)
    c.wait_ready([leader], timeout=60)
    writer.stop()
    assert sorted(oc.replicas(OTHER, 1)) in (sorted(target), sorted(start))
    log = read_log(c, OTHER, 1, at_least=len(writer.acked))
    assert_exactly_once_in_order(writer.sent, writer.acked, log, f"{OTHER}-1")


def test_decommission_under_load_leaves_nothing_behind(oc: OperatedCluster) -> None:
    c = oc.c
    writer = Load(c, OTHER, 0)
    wait_for(lambda: len(writer.acked) >= 10, 30, "records before the decommission")
    # committed offsets of every offsets partition node 1 holds must survive their moves
    groups = [f"kept-{i}" for i in range(8)]
    for i, g in enumerate(groups):
        with Consumer(c.urls, group_id=g) as cons:
            cons.commit({(OTHER, 1): 100 + i})
    out = oc.cli("cluster", "decommission", "--node", "1", "--wait", "--timeout", "150")
    assert out.returncode == 0, out.stdout + out.stderr
    node = oc.get("/v1/nodes/1", via=2)
    assert node["state"] == "decommissioned" and node["replicas"] == 0
    # its controller vote goes right after (it needs nothing from the node: it may be stopped already)
    wait_for(lambda: not oc.get("/v1/nodes/1", via=2)["controller_voter"], 30, "node 1's controller vote removed")
    # a second one would leave 2 nodes for replication factor 3: refused, nothing changes
    got, res = http("POST", c.url(2) + "/v1/nodes/2/decommission", None)
    assert (got, res["error_code"]) == (400, "INVALID_REPLICATION_FACTOR")
    assert oc.get("/v1/nodes/2", via=3)["state"] == "active"
    assert c.stop_node(1) == 0
    writer.stop()
    for topic, parts in ((TOPIC, 1), (OTHER, 2)):
        for p in range(parts):
            assert sorted(oc.replicas(topic, p, via=2)) == [2, 3, 4]
    log = read_log(c, OTHER, 0, at_least=len(writer.acked))
    assert_exactly_once_in_order(writer.sent, writer.acked, log, f"{OTHER}-0")
    # transactions and groups still work without node 1
    with Producer([c.url(2), c.url(3), c.url(4)], transactional_id="after-decommission") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send(OTHER, value=b"txn-after", partition=0)
        p.commit_transaction()
    for i, g in enumerate(groups):
        with Consumer([c.url(3)], group_id=g) as cons:
            assert cons.committed((OTHER, 1)) == 100 + i, g
    cons = Consumer([c.url(2)], group_id="after-decommission", isolation_level="read_committed")
    cons.assign([(OTHER, 0)])
    cons.commit({(OTHER, 0): 3})
    assert cons.committed((OTHER, 0)) == 3
    cons.close()
    assert c.is_ready(2) and c.is_ready(3) and c.is_ready(4)
