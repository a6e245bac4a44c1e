"""ControllerService's users and ACLs: validation, hashed proposals, NOT_CONTROLLER, the applied-everywhere
barrier, the rebuilt authorizer and credential checker, and the bootstrap -- over the real controller state
machine (real RocksDB) with a stand-in Raft group and peers (pure logic; real nodes are in integration tests)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from clients.protocol import BrokerError, ErrorCode
from cluster.cluster_nodes import ClusterNodes
from cluster.config import BootstrapUser, NodeConfig, SecurityConfig, make_cluster_configs
from cluster.controller import ControllerStateMachine
from cluster.controller_service import APPLIED_PATH, ControllerService
from cluster.security.acl import AclBinding, AclFilter, Operation, ResourceType
from cluster.security.scram import MIN_ITERATIONS, make_credential
from raft import NotLeaderError
from storage.store import NodeStore

FAST = MIN_ITERATIONS


class Group:
    """A Raft group of one: ``submit`` applies at the next index, on the caller's thread."""

    def __init__(self, sm: ControllerStateMachine) -> None:
        self.sm = sm
        self.leading = True
        self.leader_address: str | None = None
        self.commands: list[bytes] = []

    def is_leader(self) -> bool:
        return self.leading

    def leader(self) -> str | None:
        return self.leader_address

    async def submit(self, command: bytes, timeout: float) -> Any:
        if not self.leading:
            raise NotLeaderError(self.leader_address, "__controller")
        self.commands.append(command)
        return self.sm.apply(self.sm.last_applied + 1, command)


class PeerView:
    def __init__(self, alive: set[int]) -> None:
        self.alive = alive

    def is_alive(self, node_id: int) -> bool:
        return node_id in self.alive

    def controller_leader(self) -> int | None:
        return None


class Peers:
    """Answers the applied endpoint; ``answers[node]`` may be an error to raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, dict[str, Any]]] = []
        self.answers: dict[int, BrokerError] = {}

    async def call(self, node_id: int, path: str, body: dict[str, Any], *, relay: bool = True) -> Any:
        self.calls.append((node_id, path, body))
        if node_id in self.answers:
            raise self.answers[node_id]
        return {"applied": body["index"]}


def configs(tmp_path: Path, security: SecurityConfig | None = None) -> NodeConfig:
    cfg = make_cluster_configs(3, tmp_path, http_ports=[1001, 1002, 1003], raft_ports=[2001, 2002, 2003])[0]
    return dataclasses.replace(cfg, security=security)


class Harness:
    def __init__(self, cfg: NodeConfig, store: NodeStore, alive: set[int]) -> None:
        self.sm = ControllerStateMachine(store)
        self.group = Group(self.sm)
        self.peers = Peers()
        self.svc = ControllerService(
            cfg,
            self.sm,
            None,
            None,
            PeerView(alive),
            self.peers,
            ClusterNodes(cfg),
            None,  # type: ignore[arg-type]
        )
        self.svc.group = self.group  # type: ignore[assignment]
        self.sm.on_security_change = lambda _index: self.svc._security_changed()


@pytest.fixture
def h(tmp_path: Path, store: NodeStore) -> Harness:
    sec = SecurityConfig(super_users=("User:root",))
    return Harness(configs(tmp_path, sec), store, alive={2, 3})


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def acl(principal: str = "User:alice", name: str = "orders", op: str = "READ") -> AclBinding:
    return AclBinding.from_json(
        {
            "principal": principal,
            "resource_type": "TOPIC",
            "resource_name": name,
            "operation": op,
            "permission": "ALLOW",
        }
    )


@pytest.mark.parametrize(
    ("name", "mechanism", "password", "iterations"),
    [
        ("", "SCRAM-SHA-256", "pw", None),
        ("a:b", "SCRAM-SHA-256", "pw", None),
        ("a b", "SCRAM-SHA-256", "pw", None),
        ("x" * 257, "SCRAM-SHA-256", "pw", None),
        ("tab\t", "SCRAM-SHA-256", "pw", None),
        (5, "SCRAM-SHA-256", "pw", None),
        ("alice", "SCRAM-SHA-1", "pw", None),
        ("alice", None, "pw", None),
        ("alice", "SCRAM-SHA-256", "", None),
        ("alice", "SCRAM-SHA-256", None, None),
        ("alice", "SCRAM-SHA-256", "p" * 1025, None),
        ("alice", "SCRAM-SHA-256", "pw", 4095),
        ("alice", "SCRAM-SHA-256", "pw", 1_000_001),
        ("alice", "SCRAM-SHA-256", "pw", True),
        ("alice", "SCRAM-SHA-256", "pw", "8192"),
    ],
)
def test_bad_user_input_is_invalid_request_and_proposes_nothing(
    h: Harness, name: object, mechanism: object, password: object, iterations: object
) -> None:
    with pytest.raises(BrokerError) as exc:
        run(h.svc.upsert_user(name, mechanism, password, iterations))
    assert exc.value.error_code is ErrorCode.INVALID_REQUEST
    assert h.group.commands == [] and h.peers.calls == []


def test_a_user_change_holds_at_once_and_only_the_hash_is_proposed(h: Harness) -> None:
    out = run(h.svc.upsert_user("alice", "scram-sha-256", "first-password", FAST))
    assert out == {"name": "alice", "mechanisms": ["SCRAM-SHA-256"], "created": True}
    assert b"first-password" not in h.group.commands[0]
    index = h.sm.last_applied
    assert sorted(h.peers.calls) == [(2, APPLIED_PATH, {"index": index}), (3, APPLIED_PATH, {"index": index})]
    creds = h.svc.security_view().credentials
    assert creds.check("alice", "first-password")
    run(h.svc.upsert_user("alice", "SCRAM-SHA-256", "second-password", FAST))
    assert h.svc.security_view().credentials is creds  # one checker, its cache entries of alice dropped
    assert creds.cached("alice", "first-password") is None and not creds.check("alice", "first-password")
    assert creds.check("alice", "second-password")
    assert h.svc.users_json() == [{"name": "alice", "mechanisms": ["SCRAM-SHA-256"]}]


def test_a_password_change_drops_the_other_mechanisms_old_password(h: Harness) -> None:
    run(h.svc.upsert_user("bob", "SCRAM-SHA-256", "same", FAST))
    both = run(h.svc.upsert_user("bob", "SCRAM-SHA-512", "same", FAST))
    assert both["mechanisms"] == ["SCRAM-SHA-256", "SCRAM-SHA-512"] and not both["created"]
    changed = run(h.svc.upsert_user("bob", "SCRAM-SHA-256", "new", FAST))
    assert changed["mechanisms"] == ["SCRAM-SHA-256"]
    creds = h.svc.security_view().credentials
    assert not creds.check("bob", "same") and creds.check("bob", "new")


def test_deleting_users(h: Harness) -> None:
    run(h.svc.upsert_user("carol", "SCRAM-SHA-256", "pw", FAST))
    assert h.svc.security_view().credentials.check("carol", "pw")
    run(h.svc.delete_user("carol"))
    assert h.svc.users_json() == [] and not h.svc.security_view().credentials.check("carol", "pw")
    with pytest.raises(BrokerError) as exc:
        run(h.svc.delete_user("carol"))
    assert exc.value.error_code is ErrorCode.RESOURCE_NOT_FOUND and exc.value.error_code.http_status == 404


def test_acls_are_created_described_deleted_and_enforced(h: Harness) -> None:
    view = h.svc.security_view()
    assert not view.authorizer.authorize("User:alice", "h", Operation.READ, ResourceType.TOPIC, "orders")
    assert view.authorizer.authorize("User:root", "h", Operation.DELETE, ResourceType.TOPIC, "orders")
    run(h.svc.create_acls([acl(), acl("User:bob", "pay")]))
    authorizer = h.svc.security_view().authorizer
    assert authorizer.authorize("User:alice", "h", Operation.READ, ResourceType.TOPIC, "orders")
    assert h.svc.describe_acls(AclFilter(principal="User:bob")) == [acl("User:bob", "pay")]
    deleted = run(h.svc.delete_acls([AclFilter(principal="User:alice")]))
    assert deleted == [acl()]
    assert not h.svc.security_view().authorizer.authorize(
        "User:alice", "h", Operation.READ, ResourceType.TOPIC, "orders"
    )
    assert run(h.svc.delete_acls([AclFilter(principal="User:nobody")])) == []
    for bad in (h.svc.create_acls([]), h.svc.delete_acls([])):
        with pytest.raises(BrokerError) as exc:
            run(bad)
        assert exc.value.error_code is ErrorCode.INVALID_REQUEST


def test_a_user_change_is_rejected_early_on_a_follower(h: Harness) -> None:
    h.group.leading = False
    h.group.leader_address = h.svc.config.nodes[1].raft_address
    for call in (h.svc.upsert_user("dave", "SCRAM-SHA-256", "pw", FAST), h.svc.create_acls([acl()])):
        with pytest.raises(BrokerError) as exc:
            run(call)
        assert exc.value.error_code is ErrorCode.NOT_CONTROLLER
        assert exc.value.extra["leader_id"] == 2 and exc.value.extra["leader_url"] == h.svc.config.nodes[1].url
    assert h.group.commands == []


def test_the_barrier_waits_for_live_nodes_and_names_a_late_one(h: Harness) -> None:
    h.peers.answers[2] = BrokerError(ErrorCode.NETWORK_EXCEPTION, "gone")  # unreachable: not live, not waited for
    run(h.svc.create_acls([acl()]))
    h.peers.answers[3] = BrokerError(ErrorCode.REQUEST_TIMED_OUT, "node 3 applied to 1, not 2")
    with pytest.raises(BrokerError) as exc:
        run(h.svc.create_acls([acl("User:bob")]))
    assert exc.value.error_code is ErrorCode.REQUEST_TIMED_OUT and exc.value.extra["committed"] is True
    assert "node 3" in str(exc.value)
    assert h.svc.describe_acls(AclFilter(principal="User:bob")) == [acl("User:bob")]  # committed all the same


def test_dead_nodes_are_not_asked(tmp_path: Path, store: NodeStore) -> None:
    h = Harness(configs(tmp_path), store, alive={3})
    run(h.svc.create_acls([acl()]))
    assert [node for node, _, _ in h.peers.calls] == [3]


def test_wait_applied_returns_once_the_index_is_applied_and_is_bounded(h: Harness) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        assert await h.svc.wait_applied(0) == 0
        later = h.sm.last_applied + 1
        loop.call_later(0.1, h.sm.apply, later, json.dumps({"op": "allocate_producer_ids", "node_id": 1}).encode())
        assert await h.svc.wait_applied(later, timeout=5.0) == later
        started = loop.time()
        with pytest.raises(BrokerError) as exc:
            await h.svc.wait_applied(later + 10, timeout=0.2)
        assert exc.value.error_code is ErrorCode.REQUEST_TIMED_OUT
        assert 0.15 < loop.time() - started < 2.0

    run(scenario())


def test_the_leader_records_the_bootstrap_users_and_acls_once(tmp_path: Path, store: NodeStore) -> None:
    doc = make_credential("admin-secret", "SCRAM-SHA-512", FAST).to_json()
    admin = BootstrapUser("admin", doc["mechanism"], doc["salt"], doc["iterations"], doc["stored_key"],
                          doc["server_key"])  # fmt: skip
    metrics_acl = {"principal": "User:metrics", "resource_type": "CLUSTER", "resource_name": "kafka-cluster",
                   "operation": "DESCRIBE", "permission": "ALLOW"}  # fmt: skip
    sec = SecurityConfig(super_users=("User:admin",), bootstrap_users=(admin,), bootstrap_acls=(metrics_acl,))
    h = Harness(configs(tmp_path, sec), store, alive=set())

    async def scenario() -> None:
        h.svc._maybe_bootstrap()
        task = h.svc._bootstrap_task
        assert task is not None
        await task
        assert h.sm.security.bootstrapped
        view = h.svc.security_view()
        assert view.credentials.check("admin", "admin-secret")
        assert view.authorizer.authorize("User:metrics", "h", Operation.DESCRIBE, ResourceType.CLUSTER, "kafka-cluster")
        await h.svc.delete_user("admin")
        proposed = len(h.group.commands)
        h.svc._maybe_bootstrap()  # a new leadership: already recorded, never again
        assert len(h.group.commands) == proposed and "admin" not in h.sm.security.users

    run(scenario())
