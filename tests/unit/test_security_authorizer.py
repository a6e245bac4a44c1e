"""Kafka's authorization rules, as a table (pure): DENY wins, implications, patterns, principals, hosts,
super users, allow_everyone_if_no_acl_found, and authorize_any (Kafka's authorizeByResourceType)."""

from __future__ import annotations

import random

import pytest

from cluster.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from cluster.security.authorizer import Authorizer

TOPIC, GROUP, CLUSTER, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
O = Operation
ALICE, BOB = "User:alice", "User:bob"


def acl(
    principal: str,
    op: Operation,
    name: str = "orders",
    *,
    rt: ResourceType = TOPIC,
    deny: bool = False,
    prefixed: bool = False,
    host: str = "*",
) -> AclBinding:
    return AclBinding(
        principal,
        host,
        rt,
        name,
        PatternType.PREFIXED if prefixed else PatternType.LITERAL,
        op,
        Permission.DENY if deny else Permission.ALLOW,
    )


# (case id, ACLs, allow_everyone_if_no_acl_found, principal, host, operation, resource type, name, expected)
CASES = [
    ("no ACLs, default deny", [], False, ALICE, "1.2.3.4", O.READ, TOPIC, "orders", False),
    ("no ACLs, allow everyone", [], True, ALICE, "1.2.3.4", O.READ, TOPIC, "orders", True),
    ("exact allow", [acl(ALICE, O.READ)], False, ALICE, "h", O.READ, TOPIC, "orders", True),
    ("allow is per operation", [acl(ALICE, O.READ)], False, ALICE, "h", O.WRITE, TOPIC, "orders", False),
    ("allow is per principal", [acl(ALICE, O.READ)], False, BOB, "h", O.READ, TOPIC, "orders", False),
    # an ACL of anyone on the resource turns off the no-ACL fallback
    ("ACLs exist: no fallback", [acl(ALICE, O.READ)], True, BOB, "h", O.READ, TOPIC, "orders", False),
    ("ACLs elsewhere: fallback", [acl(ALICE, O.READ, "payments")], True, BOB, "h", O.READ, TOPIC, "orders", True),
    ("ACLs elsewhere: default deny", [acl(ALICE, O.READ, "payments")], False, ALICE, "h", O.READ, TOPIC, "orders",
     False),
    ("another type's ACLs: fallback", [acl(ALICE, O.READ, rt=GROUP)], True, BOB, "h", O.READ, TOPIC, "orders", True),
    ("another type's ACL does not allow", [acl(ALICE, O.READ, rt=GROUP)], False, ALICE, "h", O.READ, TOPIC, "orders",
     False),
    ("a prefixed DENY of someone else counts as an ACL", [acl(BOB, O.READ, "or", deny=True, prefixed=True)], True,
     ALICE, "h", O.READ, TOPIC, "orders", False),
    # DENY wins
    ("deny beats allow", [acl(ALICE, O.READ), acl(ALICE, O.READ, deny=True)], False, ALICE, "h", O.READ, TOPIC,
     "orders", False),
    ("deny of User:* beats allow", [acl(ALICE, O.READ), acl("User:*", O.READ, deny=True)], False, ALICE, "h", O.READ,
     TOPIC, "orders", False),
    ("deny ALL beats allow", [acl(ALICE, O.READ), acl(ALICE, O.ALL, deny=True)], False, ALICE, "h", O.READ, TOPIC,
     "orders", False),
    ("deny on * beats literal allow", [acl(ALICE, O.READ), acl(ALICE, O.READ, "*", deny=True)], False, ALICE, "h",
     O.READ, TOPIC, "orders", False),
    ("prefixed deny beats literal allow", [acl(ALICE, O.READ), acl(ALICE, O.READ, "ord", deny=True, prefixed=True)],
     False, ALICE, "h", O.READ, TOPIC, "orders", False),
    ("deny of another op does not deny", [acl(ALICE, O.READ), acl(ALICE, O.WRITE, deny=True)], False, ALICE, "h",
     O.READ, TOPIC, "orders", True),
    ("deny READ does not deny DESCRIBE", [acl(ALICE, O.READ), acl(ALICE, O.READ, deny=True)], False, ALICE, "h",
     O.DESCRIBE, TOPIC, "orders", True),
    ("deny DESCRIBE beats implied DESCRIBE", [acl(ALICE, O.READ), acl(ALICE, O.DESCRIBE, deny=True)], False, ALICE,
     "h", O.DESCRIBE, TOPIC, "orders", False),
    ("deny of another principal does not deny", [acl(ALICE, O.READ), acl(BOB, O.READ, deny=True)], False, ALICE, "h",
     O.READ, TOPIC, "orders", True),
    # implications: READ, WRITE, DELETE, ALTER imply DESCRIBE; nothing else does
    *[
        (f"{op.name} implies DESCRIBE", [acl(ALICE, op)], False, ALICE, "h", O.DESCRIBE, TOPIC, "orders", True)
        for op in (O.READ, O.WRITE, O.DELETE, O.ALTER)
    ],
    *[
        (f"{op.name} does not imply DESCRIBE", [acl(ALICE, op)], False, ALICE, "h", O.DESCRIBE, TOPIC, "orders", False)
        for op in (O.CREATE, O.IDEMPOTENT_WRITE)
    ],
    ("DESCRIBE implies nothing", [acl(ALICE, O.DESCRIBE)], False, ALICE, "h", O.READ, TOPIC, "orders", False),
    ("WRITE does not imply READ", [acl(ALICE, O.WRITE)], False, ALICE, "h", O.READ, TOPIC, "orders", False),
    *[
        (f"ALL allows {op.name}", [acl(ALICE, O.ALL)], False, ALICE, "h", op, TOPIC, "orders", True)
        for op in Operation
    ],
    # patterns
    ("literal * matches every name", [acl(ALICE, O.READ, "*")], False, ALICE, "h", O.READ, TOPIC, "anything", True),
    ("literal does not match a longer name", [acl(ALICE, O.READ)], False, ALICE, "h", O.READ, TOPIC, "orders2",
     False),
    ("prefix matches", [acl(ALICE, O.READ, "ord", prefixed=True)], False, ALICE, "h", O.READ, TOPIC, "orders", True),
    ("prefix matches the whole name", [acl(ALICE, O.READ, "orders", prefixed=True)], False, ALICE, "h", O.READ,
     TOPIC, "orders", True),
    ("prefix longer than the name", [acl(ALICE, O.READ, "orders-eu", prefixed=True)], False, ALICE, "h", O.READ,
     TOPIC, "orders", False),
    ("prefix that does not match", [acl(ALICE, O.READ, "pay", prefixed=True)], False, ALICE, "h", O.READ, TOPIC,
     "orders", False),
    ("prefixed * is not a wildcard", [acl(ALICE, O.READ, "*", prefixed=True)], False, ALICE, "h", O.READ, TOPIC,
     "orders", False),
    ("a longer prefixed deny carves out", [acl(ALICE, O.READ, "o", prefixed=True),
                                           acl(ALICE, O.READ, "orders-", deny=True, prefixed=True)],
     False, ALICE, "h", O.READ, TOPIC, "orders-eu", False),
    ("outside the carve-out", [acl(ALICE, O.READ, "o", prefixed=True),
                               acl(ALICE, O.READ, "orders-", deny=True, prefixed=True)],
     False, ALICE, "h", O.READ, TOPIC, "orders", True),
    # principals
    ("User:* allows everyone", [acl("User:*", O.READ)], False, BOB, "h", O.READ, TOPIC, "orders", True),
    # hosts
    ("exact host", [acl(ALICE, O.READ, host="10.0.0.1")], False, ALICE, "10.0.0.1", O.READ, TOPIC, "orders", True),
    ("another host", [acl(ALICE, O.READ, host="10.0.0.1")], False, ALICE, "10.0.0.2", O.READ, TOPIC, "orders",
     False),
    ("deny from one host only", [acl(ALICE, O.READ), acl(ALICE, O.READ, deny=True, host="10.0.0.2")], False, ALICE,
     "10.0.0.1", O.READ, TOPIC, "orders", True),
    ("deny from that host", [acl(ALICE, O.READ), acl(ALICE, O.READ, deny=True, host="10.0.0.2")], False, ALICE,
     "10.0.0.2", O.READ, TOPIC, "orders", False),
    # other resource types
    ("cluster", [acl(ALICE, O.IDEMPOTENT_WRITE, "kafka-cluster", rt=CLUSTER)], False, ALICE, "h", O.IDEMPOTENT_WRITE,
     CLUSTER, "kafka-cluster", True),
    ("transactional id prefix", [acl(ALICE, O.WRITE, "app-", rt=TXN, prefixed=True)], False, ALICE, "h", O.WRITE,
     TXN, "app-1", True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("acls", "allow_everyone", "principal", "host", "op", "rt", "name", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_authorize(
    acls: list[AclBinding],
    allow_everyone: bool,
    principal: str,
    host: str,
    op: Operation,
    rt: ResourceType,
    name: str,
    expected: bool,
) -> None:
    authorizer = Authorizer(acls, allow_everyone_if_no_acl_found=allow_everyone)
    assert authorizer.authorize(principal, host, op, rt, name) is expected


@pytest.mark.parametrize("acls", [[], [acl("User:*", O.ALL, deny=True)], [acl("User:admin", O.ALL, "*", deny=True)]])
def test_super_users_bypass_acls(acls: list[AclBinding]) -> None:
    authorizer = Authorizer(acls, super_users=frozenset({"User:admin"}))
    assert authorizer.authorize("User:admin", "h", O.DELETE, TOPIC, "orders")
    assert authorizer.authorize_any("User:admin", "h", O.WRITE, TOPIC)
    assert not authorizer.authorize("User:admin2", "h", O.DELETE, TOPIC, "orders")


# (case id, ACLs, allow_everyone_if_no_acl_found, principal, host, operation, expected) -- WRITE on any TOPIC
ANY_CASES = [
    ("no ACLs", [], False, ALICE, "h", O.WRITE, False),
    ("no ACLs, allow everyone", [], True, ALICE, "h", O.WRITE, True),
    ("one literal allow", [acl(ALICE, O.WRITE, "t1")], False, ALICE, "h", O.WRITE, True),
    ("ALL allows", [acl(ALICE, O.ALL, "t1")], False, ALICE, "h", O.WRITE, True),
    ("another operation", [acl(ALICE, O.READ, "t1")], False, ALICE, "h", O.WRITE, False),
    ("no implication here", [acl(ALICE, O.READ, "t1")], False, ALICE, "h", O.DESCRIBE, False),
    ("another principal", [acl(BOB, O.WRITE, "t1")], False, ALICE, "h", O.WRITE, False),
    ("User:*", [acl("User:*", O.WRITE, "t1")], False, ALICE, "h", O.WRITE, True),
    ("another host", [acl(ALICE, O.WRITE, "t1", host="10.0.0.9")], False, ALICE, "10.0.0.1", O.WRITE, False),
    ("literal denied by the same literal", [acl(ALICE, O.WRITE, "t1"), acl(ALICE, O.WRITE, "t1", deny=True)], False,
     ALICE, "h", O.WRITE, False),
    ("literal denied by a prefix", [acl(ALICE, O.WRITE, "t1"), acl(ALICE, O.WRITE, "t", deny=True, prefixed=True)],
     False, ALICE, "h", O.WRITE, False),
    ("one of two literals denied", [acl(ALICE, O.WRITE, "t1"), acl(ALICE, O.WRITE, "u1"),
                                    acl(ALICE, O.WRITE, "t", deny=True, prefixed=True)], False, ALICE, "h", O.WRITE,
     True),
    ("prefix denied by the same prefix", [acl(ALICE, O.WRITE, "t", prefixed=True),
                                          acl(ALICE, O.WRITE, "t", deny=True, prefixed=True)], False, ALICE, "h",
     O.WRITE, False),
    ("prefix not dominated by a longer deny", [acl(ALICE, O.WRITE, "t", prefixed=True),
                                               acl(ALICE, O.WRITE, "tx", deny=True, prefixed=True)], False, ALICE,
     "h", O.WRITE, True),
    ("a literal deny does not dominate a prefix", [acl(ALICE, O.WRITE, "t", prefixed=True),
                                                   acl(ALICE, O.WRITE, "t", deny=True)], False, ALICE, "h", O.WRITE,
     True),
    ("wildcard allow", [acl(ALICE, O.WRITE, "*")], False, ALICE, "h", O.WRITE, True),
    ("wildcard deny wins", [acl(ALICE, O.WRITE, "t1"), acl("User:*", O.WRITE, "*", deny=True)], False, ALICE, "h",
     O.WRITE, False),
    ("deny of another principal does not dominate", [acl(ALICE, O.WRITE, "t1"),
                                                     acl(BOB, O.WRITE, "t", deny=True, prefixed=True)], False, ALICE,
     "h", O.WRITE, True),
    ("another resource type", [acl(ALICE, O.WRITE, "t1", rt=TXN)], False, ALICE, "h", O.WRITE, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("acls", "allow_everyone", "principal", "host", "op", "expected"),
    [c[1:] for c in ANY_CASES],
    ids=[c[0] for c in ANY_CASES],
)
def test_authorize_any(
    acls: list[AclBinding], allow_everyone: bool, principal: str, host: str, op: Operation, expected: bool
) -> None:
    authorizer = Authorizer(acls, allow_everyone_if_no_acl_found=allow_everyone)
    assert authorizer.authorize_any(principal, host, op, TOPIC) is expected


def _linear(acls: list[AclBinding], allow_everyone: bool, principal: str, host: str, op: Operation, name: str) -> bool:
    """The rules spelled out as a scan of every ACL (the reference the index must agree with)."""
    matching = [a for a in acls if a.applies_to(TOPIC, name)]
    if not matching:
        return allow_everyone
    mine = [a for a in matching if a.principal in (principal, "User:*") and a.host in (host, "*")]
    if any(a.permission is Permission.DENY and a.operation in (op, O.ALL) for a in mine):
        return False
    implied = {op, O.ALL} | ({O.READ, O.WRITE, O.DELETE, O.ALTER} if op is O.DESCRIBE else set())
    return any(a.permission is Permission.ALLOW and a.operation in implied for a in mine)


def test_the_index_agrees_with_a_scan_of_every_acl() -> None:
    rng = random.Random(7)
    names = ["a", "ab", "abc", "abd", "b", "ba", "*", "xyz"]
    principals = [ALICE, BOB, "User:*"]
    hosts = ["*", "10.0.0.1"]
    for _round in range(60):
        acls = [
            AclBinding(
                rng.choice(principals),
                rng.choice(hosts),
                TOPIC,
                rng.choice(names),
                rng.choice(list(PatternType)),
                rng.choice(list(Operation)),
                rng.choice(list(Permission)),
            )
            for _ in range(rng.randint(0, 12))
        ]
        allow_everyone = rng.random() < 0.5
        authorizer = Authorizer(acls, allow_everyone_if_no_acl_found=allow_everyone)
        for name in ["a", "abc", "abz", "b", "c", "xyz", "*"]:
            for principal in (ALICE, BOB):
                for host in ("10.0.0.1", "10.0.0.2"):
                    for op in Operation:
                        want = _linear(acls, allow_everyone, principal, host, op, name)
                        got = authorizer.authorize(principal, host, op, TOPIC, name)
                        assert got is want, (acls, allow_everyone, principal, host, op, name)


def test_duplicate_acls_count_once() -> None:
    authorizer = Authorizer([acl(ALICE, O.READ), acl(ALICE, O.READ)])
    assert len(authorizer) == 1
