"""Every route's rights on a secure 3-node cluster, in the shape of Kafka's AuthorizerIntegrationTest.

A table maps every route to the ACLs it needs; a guard test fails when a
route the node serves has no row. For every row, through every node (so also
through one that neither leads the partition nor coordinates the transaction
or group): no credentials 401; no ACLs 403 with the row's error code; near
misses (DESCRIBE only, another name, a PREFIXED pattern that does not match,
one ACL short, ALLOW together with DENY) 403; the exact ACLs, each listed
alternative and a matching PREFIXED pattern allowed; a super user allowed.
"Allowed" means the answer is not 401/403: the request may still fail for
its own reasons (an unknown member, a fenced epoch), after authorization.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cluster.config import BootstrapUser, SecurityConfig
from cluster.http import make_app
from cluster.http.access import ACCESS, Mode
from cluster.metrics import NodeMetrics
from cluster.security.scram import make_credential
from tests.support.cluster import LocalCluster, http, wait_for

pytestmark = pytest.mark.timeout(600)

ADMIN_PASSWORD = "admin-Secret-1"
ALICE_PASSWORD = "alice-Secret-1"
TOPIC = "t-auth"
TXN = "tx-auth"
GROUP = "g-auth"

Acl = tuple[str, str, str]  # (operation, resource type, resource name)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


ADMIN = basic("admin", ADMIN_PASSWORD)
ALICE = basic("alice", ALICE_PASSWORD)


def bootstrap_admin(password: str) -> BootstrapUser:
    cred = make_credential(password, "SCRAM-SHA-256", iterations=4096).to_json()
    return BootstrapUser("admin", cred["mechanism"], cred["salt"], int(cred["iterations"]), cred["stored_key"],
                         cred["server_key"])  # fmt: skip


def secure_config(**overrides: Any) -> SecurityConfig:
    base = SecurityConfig(
        authentication=("basic",),
        authorizer=True,
        super_users=("User:admin",),
        bootstrap_users=(bootstrap_admin(ADMIN_PASSWORD),),
    )
    return replace(base, **overrides)


class Secure:
    """A secure cluster and the calls the table makes on it."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self._names = itertools.count()

    def fresh(self, prefix: str) -> str:
        return f"{prefix}-{next(self._names)}"

    def admin(self, method: str, path: str, body: Any = None, via: int = 1) -> tuple[int, Any]:
        return http(method, self.cluster.url(via) + path, body, headers=ADMIN, timeout=30)

    def set_acls(self, principal: str, acls: list[dict[str, str]]) -> None:
        """``principal``'s ACLs (and no ACL for ``User:*``) become ``acls``."""
        for who in (principal, "User:*"):
            status, body = self.admin("DELETE", "/v1/acls", {"principal": who})
            assert status == 200, body
        if acls:
            status, body = self.admin("POST", "/v1/acls", {"acls": acls})
            assert status == 201, body


def acl(principal: str, a: Acl, *, pattern: str = "LITERAL", permission: str = "ALLOW") -> dict[str, str]:
    op, rtype, name = a
    return {"principal": principal, "host": "*", "resource_type": rtype, "resource_name": name,
            "pattern_type": pattern, "operation": op, "permission": permission}  # fmt: skip


@dataclass
class Row:
    """One route's rights: ``needs`` (every one), ``alternatives`` (other sets that suffice too)."""

    method: str
    route: str
    path: Callable[[dict[str, str]], str]
    needs: Callable[[dict[str, str]], list[Acl]]
    denied: str
    body: Callable[[dict[str, str]], Any] | None = None
    alternatives: Callable[[dict[str, str]], list[list[Acl]]] = lambda _c: []
    setup: Callable[[Secure, dict[str, str]], None] | None = None
    skip_near: frozenset[str] = field(default_factory=frozenset)


def _tp(c: dict[str, str]) -> list[dict[str, Any]]:
    return [{"topic": c["topic"], "partition": 0}]


def _record_batch(c: dict[str, str], *, tid: str | None) -> dict[str, Any]:
    part = {"topic": c["topic"], "partition": 0, "producer_id": 1 if tid else -1, "producer_epoch": 0 if tid else -1,
            "base_sequence": 0 if tid else -1, "records": [{"value": base64.b64encode(b"v").decode()}]}  # fmt: skip
    return {"acks": "all", "timeout_ms": 5000, "transactional_id": tid, "partitions": [part]}


def _create_fresh_topic(s: Secure, c: dict[str, str]) -> None:
    c["doomed"] = s.fresh("doomed")
    status, body = s.admin("POST", "/v1/topics", {"name": c["doomed"], "partitions": 1, "replication_factor": 3})
    assert status == 201, body


W, R, D = "WRITE", "READ", "DESCRIBE"
T, G, X, C = "TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER"
CL = "kafka-cluster"
IDENTITY = {"producer_id": 1, "producer_epoch": 0}

ROWS: list[Row] = [
    Row("GET", "/v1/metadata", lambda c: f"/v1/metadata?topics={c['topic']}", lambda c: [(D, T, c["topic"])],
        "TOPIC_AUTHORIZATION_FAILED"),
    Row("POST", "/v1/topics", lambda c: "/v1/topics", lambda c: [("CREATE", T, c["new"])],
        "CLUSTER_AUTHORIZATION_FAILED", body=lambda c: {"name": c["new"], "partitions": 1, "replication_factor": 1},
        alternatives=lambda c: [[("CREATE", C, CL)]]),
    Row("GET", "/v1/topics/{topic}", lambda c: f"/v1/topics/{c['topic']}", lambda c: [(D, T, c["topic"])],
        "TOPIC_AUTHORIZATION_FAILED", alternatives=lambda c: [[(W, T, c["topic"])], [(R, T, c["topic"])]]),
    Row("DELETE", "/v1/topics/{topic}", lambda c: f"/v1/topics/{c['doomed']}", lambda c: [("DELETE", T, c["doomed"])],
        "TOPIC_AUTHORIZATION_FAILED", setup=_create_fresh_topic),
    Row("POST", "/v1/topics/{topic}/partitions", lambda c: f"/v1/topics/{c['topic']}/partitions",
        lambda c: [("ALTER", T, c["topic"])], "TOPIC_AUTHORIZATION_FAILED", body=lambda c: {"count": 1}),
    Row("GET", "/v1/topics/{topic}/config", lambda c: f"/v1/topics/{c['topic']}/config", lambda c: [(D, T, c["topic"])],
        "TOPIC_AUTHORIZATION_FAILED", alternatives=lambda c: [[("ALTER", T, c["topic"])], [(R, T, c["topic"])]]),
    Row("PATCH", "/v1/topics/{topic}/config", lambda c: f"/v1/topics/{c['topic']}/config",
        lambda c: [("ALTER", T, c["topic"])], "TOPIC_AUTHORIZATION_FAILED", body=lambda c: {"retention.bytes": None}),
    Row("POST", "/v1/topics/{topic}/records", lambda c: f"/v1/topics/{c['topic']}/records",
        lambda c: [(W, T, c["topic"])], "TOPIC_AUTHORIZATION_FAILED",
        body=lambda c: {"records": [{"value": base64.b64encode(b"v").decode()}], "timeout_ms": 5000}),
    Row("GET", "/v1/topics/{topic}/partitions/{partition}/records",
        lambda c: f"/v1/topics/{c['topic']}/partitions/0/records?offset=0", lambda c: [(R, T, c["topic"])],
        "TOPIC_AUTHORIZATION_FAILED"),
    Row("POST", "/v1/producers/init", lambda c: "/v1/producers/init", lambda c: [(W, X, c["tid"])],
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", body=lambda c: {"transactional_id": c["tid"]}),
    Row("POST", "/v1/producers/init", lambda c: "/v1/producers/init", lambda c: [("IDEMPOTENT_WRITE", C, CL)],
        "CLUSTER_AUTHORIZATION_FAILED", body=lambda c: {"transactional_id": None},
        alternatives=lambda c: [[(W, T, "any-topic-at-all")]]),
    Row("POST", "/v1/produce", lambda c: "/v1/produce", lambda c: [(W, T, c["topic"])], "TOPIC_AUTHORIZATION_FAILED",
        body=lambda c: _record_batch(c, tid=None)),
    Row("POST", "/v1/produce", lambda c: "/v1/produce", lambda c: [(W, X, c["tid"]), (W, T, c["topic"])],
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", body=lambda c: _record_batch(c, tid=c["tid"])),
    Row("GET", "/v1/coordinators/transaction/{transactional_id}", lambda c: f"/v1/coordinators/transaction/{c['tid']}",
        lambda c: [(D, X, c["tid"])], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
    Row("GET", "/v1/topics/{topic}/partitions/{partition}/producers",
        lambda c: f"/v1/topics/{c['topic']}/partitions/0/producers", lambda c: [(R, T, c["topic"])],
        "TOPIC_AUTHORIZATION_FAILED"),
    Row("GET", "/v1/transactions/{transactional_id}", lambda c: f"/v1/transactions/{c['tid']}",
        lambda c: [(D, X, c["tid"])], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
    Row("POST", "/v1/transactions/{transactional_id}/partitions", lambda c: f"/v1/transactions/{c['tid']}/partitions",
        lambda c: [(W, X, c["tid"]), (W, T, c["topic"])], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        body=lambda c: {**IDENTITY, "partitions": _tp(c)}),
    Row("POST", "/v1/transactions/{transactional_id}/end", lambda c: f"/v1/transactions/{c['tid']}/end",
        lambda c: [(W, X, c["tid"])], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        body=lambda c: {**IDENTITY, "commit": False}),
    Row("POST", "/v1/transactions/{transactional_id}/prepare", lambda c: f"/v1/transactions/{c['tid']}/prepare",
        lambda c: [(W, X, c["tid"])], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", body=lambda c: dict(IDENTITY)),
    Row("POST", "/v1/transactions/{transactional_id}/release", lambda c: f"/v1/transactions/{c['tid']}/release",
        lambda c: [(W, X, c["tid"]), (W, T, c["topic"])], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        body=lambda c: {**IDENTITY, "partitions": _tp(c)}),
    Row("POST", "/v1/transactions/{transactional_id}/abort", lambda c: f"/v1/transactions/{c['tid']}/abort",
        lambda c: [(W, X, c["tid"])], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        alternatives=lambda c: [[("ALTER", C, CL)]]),
    Row("POST", "/v1/transaction-groups/{group_id}/end", lambda c: f"/v1/transaction-groups/{c['cg']}/end",
        lambda c: [(W, X, c["tid"])], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        body=lambda c: {"commit": False, "members": [{"transactional_id": c["tid"], **IDENTITY}]}),
    Row("POST", "/v1/transactions-by-prefix/abort", lambda c: "/v1/transactions-by-prefix/abort",
        lambda c: [("ALTER", C, CL)], "CLUSTER_AUTHORIZATION_FAILED", body=lambda c: {"prefix": c["tid"]}),
    Row("GET", "/v1/coordinators/group/{group_id}", lambda c: f"/v1/coordinators/group/{c['group']}",
        lambda c: [(D, G, c["group"])], "GROUP_AUTHORIZATION_FAILED"),
    Row("GET", "/v1/groups/{group_id}", lambda c: f"/v1/groups/{c['group']}", lambda c: [(D, G, c["group"])],
        "GROUP_AUTHORIZATION_FAILED"),
    Row("DELETE", "/v1/groups/{group_id}", lambda c: f"/v1/groups/{c['group']}",
        lambda c: [("DELETE", G, c["group"])], "GROUP_AUTHORIZATION_FAILED"),
    Row("POST", "/v1/groups/{group_id}/offsets/reset", lambda c: f"/v1/groups/{c['group']}/offsets/reset",
        lambda c: [(R, G, c["group"]), (R, T, c["topic"])], "GROUP_AUTHORIZATION_FAILED",
        body=lambda c: {"topic": c["topic"], "to": "earliest"}),
    Row("POST", "/v1/groups/{group_id}/join", lambda c: f"/v1/groups/{c['group']}/join", lambda c: [(R, G, c["group"])],
        "GROUP_AUTHORIZATION_FAILED", body=lambda c: {"topics": [c["topic"]], "member_id": "m-unknown",
                                                      "session_timeout_ms": 10_000, "rebalance_timeout_ms": 100}),
    Row("POST", "/v1/groups/{group_id}/heartbeat", lambda c: f"/v1/groups/{c['group']}/heartbeat",
        lambda c: [(R, G, c["group"])], "GROUP_AUTHORIZATION_FAILED",
        body=lambda c: {"member_id": "m-1", "generation_id": 1}),
    Row("POST", "/v1/groups/{group_id}/leave", lambda c: f"/v1/groups/{c['group']}/leave",
        lambda c: [(R, G, c["group"])], "GROUP_AUTHORIZATION_FAILED", body=lambda c: {"member_id": "m-1"}),
    Row("POST", "/v1/groups/{group_id}/offsets", lambda c: f"/v1/groups/{c['group']}/offsets",
        lambda c: [(R, G, c["group"]), (R, T, c["topic"])], "GROUP_AUTHORIZATION_FAILED",
        body=lambda c: {"offsets": [{"topic": c["topic"], "partition": 0, "offset": 0}]}),
    Row("POST", "/v1/groups/{group_id}/offsets", lambda c: f"/v1/groups/{c['group']}/offsets",
        lambda c: [(R, G, c["group"]), (W, X, c["tid"]), (R, T, c["topic"])], "GROUP_AUTHORIZATION_FAILED",
        body=lambda c: {"offsets": [{"topic": c["topic"], "partition": 0, "offset": 0}], "transactional_id": c["tid"],
                        **IDENTITY}),
    Row("GET", "/v1/groups/{group_id}/offsets", lambda c: f"/v1/groups/{c['group']}/offsets",
        lambda c: [(D, G, c["group"])], "GROUP_AUTHORIZATION_FAILED"),
    Row("POST", "/v1/transactions/{transactional_id}/offsets", lambda c: f"/v1/transactions/{c['tid']}/offsets",
        lambda c: [(W, X, c["tid"]), (R, G, c["group"])], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        body=lambda c: {**IDENTITY, "group_id": c["group"]}),
    Row("GET", "/metrics", lambda c: "/metrics", lambda c: [(D, C, CL)], "CLUSTER_AUTHORIZATION_FAILED",
        alternatives=lambda c: [[("ALTER", C, CL)]]),
    Row("GET", "/v1/users", lambda c: "/v1/users", lambda c: [(D, C, CL)], "CLUSTER_AUTHORIZATION_FAILED"),
    Row("PUT", "/v1/users/{name}", lambda c: f"/v1/users/{c['user']}", lambda c: [("ALTER", C, CL)],
        "CLUSTER_AUTHORIZATION_FAILED", body=lambda c: {"password": "pw-of-someone", "mechanism": "SCRAM-SHA-512"}),
    Row("DELETE", "/v1/users/{name}", lambda c: f"/v1/users/{c['user']}", lambda c: [("ALTER", C, CL)],
        "CLUSTER_AUTHORIZATION_FAILED"),
    Row("GET", "/v1/acls", lambda c: "/v1/acls", lambda c: [(D, C, CL)], "CLUSTER_AUTHORIZATION_FAILED"),
    Row("POST", "/v1/acls", lambda c: "/v1/acls", lambda c: [("ALTER", C, CL)], "CLUSTER_AUTHORIZATION_FAILED",
        body=lambda c: acl("User:carol", (R, T, c["topic"]))),
    Row("DELETE", "/v1/acls", lambda c: "/v1/acls", lambda c: [("ALTER", C, CL)], "CLUSTER_AUTHORIZATION_FAILED",
        body=lambda c: {"principal": "User:carol"}),
    # Operating a cluster: an allowed call is made to fail validation, so the shared cluster keeps its shape.
    Row("GET", "/v1/nodes", lambda c: "/v1/nodes", lambda c: [(D, C, CL)], "CLUSTER_AUTHORIZATION_FAILED"),
    Row("POST", "/v1/nodes", lambda c: "/v1/nodes", lambda c: [("ALTER", C, CL)], "CLUSTER_AUTHORIZATION_FAILED",
        body=lambda c: {"host": "127.0.0.1", "http_port": 0, "raft_port": 0}),
    Row("GET", "/v1/nodes/{node_id}", lambda c: "/v1/nodes/2", lambda c: [(D, C, CL)],
        "CLUSTER_AUTHORIZATION_FAILED"),
    Row("POST", "/v1/nodes/{node_id}/decommission", lambda c: "/v1/nodes/3/decommission",
        lambda c: [("ALTER", C, CL)], "CLUSTER_AUTHORIZATION_FAILED"),
    Row("POST", "/v1/topics/{topic}/partitions/{partition}/reassign",
        lambda c: f"/v1/topics/{c['topic']}/partitions/0/reassign", lambda c: [("ALTER", C, CL)],
        "CLUSTER_AUTHORIZATION_FAILED", body=lambda c: {"replicas": [1, 1]}),
    Row("DELETE", "/v1/topics/{topic}/partitions/{partition}/reassign",
        lambda c: f"/v1/topics/{c['topic']}/partitions/0/reassign", lambda c: [("ALTER", C, CL)],
        "CLUSTER_AUTHORIZATION_FAILED"),
    Row("GET", "/v1/reassignments", lambda c: "/v1/reassignments", lambda c: [(D, C, CL)],
        "CLUSTER_AUTHORIZATION_FAILED"),
]  # fmt: skip

#: Routes any authenticated principal may call (listings show only what the caller may DESCRIBE).
ANY_PRINCIPAL = {
    ("GET", "/v1/cluster"), ("GET", "/v1/whoami"), ("GET", "/v1/topics"), ("GET", "/v1/transactions"),
    ("GET", "/v1/groups"),
}  # fmt: skip
OPEN = {("GET", "/livez"), ("GET", "/readyz"), ("GET", "/v1/openapi.json")}


def declared_routes() -> dict[tuple[str, str], Mode]:
    services = SimpleNamespace(
        config=SimpleNamespace(max_request_bytes=1 << 20, request_timeout_ms=30_000, security=secure_config(),
                               cluster_secret="s" * 32, node_id=1),
        metrics=NodeMetrics(), txn=None, groups=None, controller=SimpleNamespace(security_view=lambda: None),
        nodes=SimpleNamespace(node_ids=lambda: [1]), peers=None, client_ssl=None, operations=None,
        reassignments=None,
    )  # fmt: skip
    app = make_app(services)  # type: ignore[arg-type]
    out = {}
    for route, access in app[ACCESS].items():
        if route.method == "HEAD" or route.resource is None:
            continue
        out[(route.method, route.resource.canonical)] = access.mode
    return out


def test_every_route_has_a_row_in_the_table() -> None:
    declared = declared_routes()
    user_routes = {k for k, mode in declared.items() if mode is Mode.USER}
    table = {(r.method, r.route) for r in ROWS}
    assert user_routes - table - ANY_PRINCIPAL == set(), "routes without a row in the authorization table"
    assert table - user_routes == set(), "rows for routes the node does not serve"
    assert {k for k, mode in declared.items() if mode is Mode.OPEN} == OPEN
    assert all(path.startswith("/v1/internal/") for (_m, path), mode in declared.items() if mode is Mode.NODE)
    assert all(not path.startswith("/v1/internal/") for (_m, path), mode in declared.items() if mode is not Mode.NODE)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    cluster = LocalCluster(tmp_path_factory.mktemp("authz"), 3, security=secure_config())
    try:
        cluster.start()
        s = Secure(cluster)
        for node in (1, 2, 3):
            wait_for(lambda n=node: s.admin("GET", "/v1/whoami", via=n)[0] == 200, 60, f"admin on node {node}")
        status, body = s.admin("PUT", "/v1/users/alice", {"password": ALICE_PASSWORD})
        assert status == 200, body
        status, body = s.admin("POST", "/v1/topics", {"name": TOPIC, "partitions": 1, "replication_factor": 3})
        assert status == 201, body

        def led() -> bool:
            status, body = s.admin("GET", f"/v1/metadata?topics={TOPIC}")
            return status == 200 and all(p["leader"] is not None for t in body["topics"] for p in t["partitions"])

        wait_for(led, 30, f"a leader of {TOPIC}")
        yield s
    finally:
        cluster.close()


def _context(s: Secure) -> dict[str, str]:
    return {"topic": TOPIC, "tid": s.fresh(TXN), "group": s.fresh(GROUP), "cg": s.fresh("cg"), "new": s.fresh("new"),
            "user": s.fresh("user")}  # fmt: skip


def _near_misses(needs: list[Acl], skip: frozenset[str]) -> Iterator[tuple[str, list[dict[str, str]]]]:
    me = "User:alice"
    if "describe" not in skip and any(op != D for op, _t, _n in needs):
        yield "DESCRIBE only", [acl(me, (D, t, n)) for _op, t, n in needs]
    named = [(op, t, n) for op, t, n in needs if t != C]
    if named:
        yield "another name", [acl(me, (op, t, n + "-other") if t != C else (op, t, n)) for op, t, n in needs]
        yield (
            "a PREFIXED pattern that does not match",
            [acl(me, (op, t, "zz-" + n), pattern="PREFIXED") if t != C else acl(me, (op, t, n)) for op, t, n in needs],
        )
    if len(needs) > 1:
        for i in range(len(needs)):
            yield f"without {needs[i]}", [acl(me, a) for j, a in enumerate(needs) if j != i]
    yield "ALLOW with DENY", [acl(me, a) for a in needs] + [acl(me, needs[0], permission="DENY")]
    yield "DENY for everyone", [acl(me, a) for a in needs] + [acl("User:*", needs[0], permission="DENY")]


def _allowed_sets(needs: list[Acl], alternatives: list[list[Acl]]) -> Iterator[tuple[str, list[dict[str, str]]]]:
    me = "User:alice"
    yield "the exact ACLs", [acl(me, a) for a in needs]
    for i, alt in enumerate(alternatives):
        yield f"alternative {i}", [acl(me, a) for a in alt]
    if any(t != C for _op, t, _n in needs):
        yield (
            "a matching PREFIXED pattern",
            [acl(me, (op, t, n[:3]), pattern="PREFIXED") if t != C else acl(me, (op, t, n)) for op, t, n in needs],
        )
        yield "ALL on the resources", [acl(me, ("ALL", t, n)) for _op, t, n in needs]


def _ask(s: Secure, row: Row, c: dict[str, str], via: int, headers: dict[str, str] | None) -> tuple[int, Any]:
    """The row's request as ``headers`` say; an allowed one may wait for what it asks at most 1 s (504 then)."""
    body = row.body(c) if row.body is not None else None
    bounded = {**(headers or {}), "X-Txbroker-Timeout-Ms": "1000"}
    return http(row.method, s.cluster.url(via) + row.path(c), body, headers=bounded, timeout=30)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.method} {r.route}")
def test_route_rights(secure: Secure, row: Row) -> None:
    s = secure
    c = _context(s)
    if row.setup is not None:
        row.setup(s, c)
    needs = row.needs(c)
    for via in (1, 2, 3):
        status, body = _ask(s, row, c, via, None)
        assert status == 401, (via, body)
        assert body["error_code"] == "SASL_AUTHENTICATION_FAILED"
        status, body = _ask(s, row, c, via, basic("alice", "wrong-password"))
        assert status == 401 and body["error_code"] == "SASL_AUTHENTICATION_FAILED", (via, body)
    s.set_acls("User:alice", [])
    for via in (1, 2, 3):
        status, body = _ask(s, row, c, via, ALICE)
        assert status == 403, (via, "no ACLs", body)
        assert body["error_code"] == row.denied, (via, "no ACLs", body)
    codes = {_DENIED[t] for _op, t, _n in needs} | {row.denied}
    for what, acls in _near_misses(needs, row.skip_near):
        s.set_acls("User:alice", acls)
        for via in (1, 2, 3):
            status, body = _ask(s, row, c, via, ALICE)
            assert status == 403, (via, what, body)
            assert body["error_code"] in codes, (via, what, body)
    for what, acls in _allowed_sets(needs, row.alternatives(c)):
        s.set_acls("User:alice", acls)
        for via in (1, 2, 3):
            status, body = _ask(s, row, c, via, ALICE)
            assert status not in (401, 403), (via, what, body)
    s.set_acls("User:alice", [])
    for via in (1, 2, 3):
        status, body = _ask(s, row, c, via, ADMIN)
        assert status not in (401, 403), (via, "super user", body)


_DENIED = {T: "TOPIC_AUTHORIZATION_FAILED", G: "GROUP_AUTHORIZATION_FAILED", C: "CLUSTER_AUTHORIZATION_FAILED",
           X: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"}  # fmt: skip


def test_listings_show_only_what_the_caller_may_describe(secure: Secure) -> None:
    s = secure
    hidden = s.fresh("hidden")
    status, body = s.admin("POST", "/v1/topics", {"name": hidden, "partitions": 1, "replication_factor": 1})
    assert status == 201, body
    s.set_acls("User:alice", [acl("User:alice", (D, T, TOPIC))])
    for via in (1, 2, 3):
        status, body = http("GET", s.cluster.url(via) + "/v1/topics", headers=ALICE)
        assert status == 200 and [t["name"] for t in body["topics"]] == [TOPIC], body
        status, body = http("GET", s.cluster.url(via) + "/v1/metadata", headers=ALICE)
        assert status == 200 and [t["name"] for t in body["topics"]] == [TOPIC], body
        status, body = http("GET", s.cluster.url(via) + "/v1/topics", headers=ADMIN)
        assert {TOPIC, hidden} <= {t["name"] for t in body["topics"]}
        status, body = http("GET", s.cluster.url(via) + "/v1/whoami", headers=ALICE)
        assert status == 200 and body == {"principal": "User:alice"}


def test_a_denied_request_about_a_missing_topic_is_a_topic_authorization_failure(secure: Secure) -> None:
    s = secure
    s.set_acls("User:alice", [])
    for via in (1, 2, 3):
        for method, path in (("GET", "/v1/topics/no-such-topic"), ("DELETE", "/v1/topics/no-such-topic"),
                             ("GET", "/v1/topics/no-such-topic/partitions/0/records?offset=0")):  # fmt: skip
            status, body = http(method, s.cluster.url(via) + path, headers=ALICE)
            assert (status, body["error_code"]) == (403, "TOPIC_AUTHORIZATION_FAILED"), (via, path, body)
        status, body = s.admin("GET", "/v1/topics/no-such-topic", via=via)
        assert (status, body["error_code"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_denied_requests_change_nothing(secure: Secure) -> None:
    s = secure
    s.set_acls("User:alice", [acl("User:alice", (D, T, TOPIC))])
    status, before = s.admin("GET", f"/v1/topics/{TOPIC}/partitions/0/records?offset=0")
    assert status == 200
    row = next(r for r in ROWS if r.route == "/v1/produce")
    for via in (1, 2, 3):
        status, body = _ask(s, row, _context(s), via, ALICE)
        assert (status, body["error_code"]) == (403, "TOPIC_AUTHORIZATION_FAILED")
        name = s.fresh("never")
        status, body = http("POST", s.cluster.url(via) + "/v1/topics", {"name": name, "partitions": 1},
                            headers=ALICE)  # fmt: skip
        assert status == 403, body
        assert s.admin("GET", f"/v1/topics/{name}")[0] == 404
        status, body = http("DELETE", s.cluster.url(via) + f"/v1/topics/{TOPIC}", headers=ALICE)
        assert (status, body["error_code"]) == (403, "TOPIC_AUTHORIZATION_FAILED")
        for method, path, change in (("POST", "partitions", {"count": 3}), ("PATCH", "config", {"retention.ms": 1})):
            status, body = http(method, s.cluster.url(via) + f"/v1/topics/{TOPIC}/{path}", change, headers=ALICE)
            assert (status, body["error_code"]) == (403, "TOPIC_AUTHORIZATION_FAILED")
    status, topic = s.admin("GET", f"/v1/topics/{TOPIC}")
    assert len(topic["partitions"]) == 1 and "retention.ms" not in topic["config"]
    status, after = s.admin("GET", f"/v1/topics/{TOPIC}/partitions/0/records?offset=0")
    assert after["high_watermark"] == before["high_watermark"]
    assert s.admin("GET", f"/v1/topics/{TOPIC}")[0] == 200


def test_a_password_change_and_an_acl_change_apply_on_every_node(secure: Secure) -> None:
    s = secure
    name = s.fresh("rotating")
    assert s.admin("PUT", f"/v1/users/{name}", {"password": "first-password"})[0] == 200
    old, new = basic(name, "first-password"), basic(name, "second-password")
    for via in (1, 2, 3):
        assert http("GET", s.cluster.url(via) + "/v1/whoami", headers=old)[0] == 200
    s.set_acls(f"User:{name}", [acl(f"User:{name}", (R, T, TOPIC))])
    for via in (1, 2, 3):  # cached credentials on every node, and the ACL in force
        path = f"/v1/topics/{TOPIC}/partitions/0/records?offset=0&read_replica=any"
        assert http("GET", s.cluster.url(via) + path, headers=old)[0] == 200
    assert s.admin("PUT", f"/v1/users/{name}", {"password": "second-password"}, via=2)[0] == 200
    s.set_acls(f"User:{name}", [])
    for via in (1, 2, 3):  # at once: the change answered only after every live node applied it
        status, body = http("GET", s.cluster.url(via) + "/v1/whoami", headers=old)
        assert (status, body["error_code"]) == (401, "SASL_AUTHENTICATION_FAILED"), via
        assert http("GET", s.cluster.url(via) + "/v1/whoami", headers=new)[0] == 200
        path = f"/v1/topics/{TOPIC}/partitions/0/records?offset=0&read_replica=any"
        assert http("GET", s.cluster.url(via) + path, headers=new)[0] == 403
    assert s.admin("DELETE", f"/v1/users/{name}", via=3)[0] == 200
    for via in (1, 2, 3):
        assert http("GET", s.cluster.url(via) + "/v1/whoami", headers=new)[0] == 401


def test_users_listing_never_shows_a_secret(secure: Secure) -> None:
    status, body = secure.admin("GET", "/v1/users")
    assert status == 200
    names = {u["name"]: u for u in body["users"]}
    assert "alice" in names and "admin" in names
    assert set(names["alice"]) == {"name", "mechanisms"}
    assert names["alice"]["mechanisms"] == ["SCRAM-SHA-256"]


def test_bad_credentials_and_acl_bodies_get_a_clear_4xx(secure: Secure) -> None:
    s = secure
    url = s.cluster.url(2)
    for header in (
        "Basic",
        "Basic !!!",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Bearer abc",
        "Digest x",
        "Basic " + "A" * 9000,
        "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),
    ):
        status, body = http("GET", url + "/v1/whoami", headers={"Authorization": header})
        assert status in (400, 401), (header[:20], body)
        if status == 401:
            assert body["error_code"] == "SASL_AUTHENTICATION_FAILED"
    status, before = s.admin("GET", "/v1/acls")
    bad_bodies = [
        {}, {"acls": []}, {"acls": "x"}, {"acls": [{"principal": "alice"}]},
        acl("User:x", ("FLY", T, "t")), acl("User:x", (R, "SHIP", "t")), acl("User:x", (R, T, "")),
        acl("User:x", (R, C, "not-the-cluster")), acl("User:x", (R, T, "t"), pattern="MATCH"),
        acl("User:x", (R, T, "t"), permission="MAYBE"), acl("nobody", (R, T, "t")),
        {"acls": [acl("User:x", (R, T, "ok")), acl("User:x", ("FLY", T, "t"))]},
    ]  # fmt: skip
    for bad in bad_bodies:
        status, body = http("POST", url + "/v1/acls", bad, headers=ADMIN)
        assert (status, body["error_code"]) == (400, "INVALID_REQUEST"), (bad, body)
    status, body = http("POST", url + "/v1/acls", raw=b"{not json", headers=ADMIN)
    assert status == 400
    assert s.admin("GET", "/v1/acls")[1] == before, "a refused ACL body changed the ACLs"
    for bad_user in ({"password": ""}, {"password": "x", "mechanism": "MD5"}, {"password": "x", "iterations": 10},
                     {"mechanism": "SCRAM-SHA-256"}):  # fmt: skip
        status, body = http("PUT", url + "/v1/users/someone", bad_user, headers=ADMIN)
        assert (status, body["error_code"]) == (400, "INVALID_REQUEST"), (bad_user, body)
    assert "someone" not in {u["name"] for u in s.admin("GET", "/v1/users")[1]["users"]}


def test_open_routes_stay_open(secure: Secure) -> None:
    for path in ("/livez", "/readyz", "/v1/openapi.json"):
        status, _ = http("GET", secure.cluster.url(3) + path)
        assert status == 200, path


def test_the_node_starts_without_credentials_in_its_config(secure: Secure) -> None:
    for p in secure.cluster.paths:
        text = Path(p).read_text()
        assert ADMIN_PASSWORD not in text and ALICE_PASSWORD not in text
