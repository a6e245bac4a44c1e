"""Kafka's authorization rules, as a table (pure): DENY wins, implications, patterns, principals, hosts,
super users, allow_everyone_if_no_acl_found, and authorize_any (Kafka's authorizeByResourceType)."""

from __future__ import annotations

import random

import pytest

from cluster.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from cluster.security.authorizer import Authorizer

TOPIC, GROUP, CLUSTER, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
Op = Operation
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
    ("no ACLs, default deny", [], False, ALICE, "1.2.3.4", Op.READ, TOPIC, "orders", False),
    ("no ACLs, allow everyone", [], True, ALICE, "1.2.3.4", Op.READ, TOPIC, "orders", True),
    ("exact allow", [acl(ALICE, Op.READ)], False, ALICE, "h", Op.READ, TOPIC, "orders", True),
    ("allow is per operation", [acl(ALICE, Op.READ)], False, ALICE, "h", Op.WRITE, TOPIC, "orders", False),
    ("allow is per principal", [acl(ALICE, Op.READ)], False, BOB, "h", Op.READ, TOPIC, "orders", False),
    # an ACL of anyone on the resource turns off the no-ACL fallback
    ("ACLs exist: no fallback", [acl(ALICE, Op.READ)], True, BOB, "h", Op.READ, TOPIC, "orders", False),
    ("ACLs elsewhere: fallback", [acl(ALICE, Op.READ, "payments")], True, BOB, "h", Op.READ, TOPIC, "orders", True),
    ("ACLs elsewhere: default deny", [acl(ALICE, Op.READ, "payments")], False, ALICE, "h", Op.READ, TOPIC, "orders",
     False),
    ("another type's ACLs: fallback", [acl(ALICE, Op.READ, rt=GROUP)], True, BOB, "h", Op.READ, TOPIC, "orders", True),
    ("another type's ACL does not allow", [acl(ALICE, Op.READ, rt=GROUP)], False, ALICE, "h", Op.READ, TOPIC, "orders",
     False),
    ("a prefixed DENY of someone else counts as an ACL", [acl(BOB, Op.READ, "or", deny=True, prefixed=True)], True,
     ALICE, "h", Op.READ, TOPIC, "orders", False),
    # DENY wins
    ("deny beats allow", [acl(ALICE, Op.READ), acl(ALICE, Op.READ, deny=True)], False, ALICE, "h", Op.READ, TOPIC,
     "orders", False),
    ("deny of User:* beats allow", [acl(ALICE, Op.READ), acl("User:*", Op.READ, deny=True)], False, ALICE, "h", Op.READ,
     TOPIC, "orders", False),
    ("deny ALL beats allow", [acl(ALICE, Op.READ), acl(ALICE, Op.ALL, deny=True)], False, ALICE, "h", Op.READ, TOPIC,
     "orders", False),
    ("deny on * beats literal allow", [acl(ALICE, Op.READ), acl(ALICE, Op.READ, "*", deny=True)], False, ALICE, "h",
     Op.READ, TOPIC, "orders", False),
    ("prefixed deny beats literal allow", [acl(ALICE, Op.READ), acl(ALICE, Op.READ, "ord", deny=True, prefixed=True)],
     False, ALICE, "h", Op.READ, TOPIC, "orders", False),
    ("deny of another op does not deny", [acl(ALICE, Op.READ), acl(ALICE, Op.WRITE, deny=True)], False, ALICE, "h",
     Op.READ, TOPIC, "orders", True),
    ("deny READ does not deny DESCRIBE", [acl(ALICE, Op.READ), acl(ALICE, Op.READ, deny=True)], False, ALICE, "h",
     Op.DESCRIBE, TOPIC, "orders", True),
    ("deny DESCRIBE beats implied DESCRIBE", [acl(ALICE, Op.READ), acl(ALICE, Op.DESCRIBE, deny=True)], False, ALICE,
     "h", Op.DESCRIBE, TOPIC, "orders", False),
    ("deny of another principal does not deny", [acl(ALICE, Op.READ), acl(BOB, Op.READ, deny=True)], False, ALICE, "h",
     Op.READ, TOPIC, "orders", True),
    # implications: READ, WRITE, DELETE, ALTER imply DESCRIBE; nothing else does
    *[
        (f"{op.name} implies DESCRIBE", [acl(ALICE, op)], False, ALICE, "h", Op.DESCRIBE, TOPIC, "orders", True)
        for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER)
    ],
    *[
        (f"{op.name} does not imply DESCRIBE", [acl(ALICE, op)], False, ALICE, "h", Op.DESCRIBE, TOPIC, "orders", False)
        for op in (Op.CREATE, Op.IDEMPOTENT_WRITE)
    ],
    ("DESCRIBE implies nothing", [acl(ALICE, Op.DESCRIBE)], False, ALICE, "h", Op.READ, TOPIC, "orders", False),
    ("WRITE does not imply READ", [acl(ALICE, Op.WRITE)], False, ALICE, "h", Op.READ, TOPIC, "orders", False),
    *[
        (f"ALL allows {op.name}", [acl(ALICE, Op.ALL)], False, ALICE, "h", op, TOPIC, "orders", True)
        for op in Operation
    ],
    # patterns
    ("literal * matches every name", [acl(ALICE, Op.READ, "*")], False, ALICE, "h", Op.READ, TOPIC, "anything", True),
    ("literal does not match a longer name", [acl(ALICE, Op.READ)], False, ALICE, "h", Op.READ, TOPIC, "orders2",
     False),
    ("prefix matches", [acl(ALICE, Op.READ, "ord", prefixed=True)], False, ALICE, "h", Op.READ, TOPIC, "orders", True),
    ("prefix matches the whole name", [acl(ALICE, Op.READ, "orders", prefixed=True)], False, ALICE, "h", Op.READ,
     TOPIC, "orders", True),
    ("prefix longer than the name", [acl(ALICE, Op.READ, "orders-eu", prefixed=True)], False, ALICE, "h", Op.READ,
     TOPIC, "orders", False),
    ("prefix that does not match", [acl(ALICE, Op.READ, "pay", prefixed=True)], False, ALICE, "h", Op.READ, TOPIC,
     "orders", False),
    ("prefixed * is not a wildcard", [acl(ALICE, Op.READ, "*", prefixed=True)], False, ALICE, "h", Op.READ, TOPIC,
     "orders", False),
    ("a longer prefixed deny carves out", [acl(ALICE, Op.READ, "o", prefixed=True),
                                           acl(ALICE, Op.READ, "orders-", deny=True, prefixed=True)],
     False, ALICE, "h", Op.READ, TOPIC, "orders-eu", False),
    ("outside the carve-out", [acl(ALICE, Op.READ, "o", prefixed=True),
                               acl(ALICE, Op.READ, "orders-", deny=True, prefixed=True)],
     False, ALICE, "h", Op.READ, TOPIC, "orders", True),
    # principals
    ("User:* allows everyone", [acl("User:*", Op.READ)], False, BOB, "h", Op.READ, TOPIC, "orders", True),
    # hosts
    ("exact host", [acl(ALICE, Op.READ, host="10.0.0.1")], False, ALICE, "10.0.0.1", Op.READ, TOPIC, "orders", True),
    ("another host", [acl(ALICE, Op.READ, host="10.0.0.1")], False, ALICE, "10.0.0.2", Op.READ, TOPIC, "orders",
     False),
    ("deny from one host only", [acl(ALICE, Op.READ), acl(ALICE, Op.READ, deny=True, host="10.0.0.2")], False, ALICE,
     "10.0.0.1", Op.READ, TOPIC, "orders", True),
    ("deny from that host", [acl(ALICE, Op.READ), acl(ALICE, Op.READ, deny=True, host="10.0.0.2")], False, ALICE,
     "10.0.0.2", Op.READ, TOPIC, "orders", False),
    # other resource types
    ("cluster", [acl(ALICE, Op.IDEMPOTENT_WRITE, "kafka-cluster", rt=CLUSTER)], False, ALICE, "h", Op.IDEMPOTENT_WRITE,
     CLUSTER, "kafka-cluster", True),
    ("transactional id prefix", [acl(ALICE, Op.WRITE, "app-", rt=TXN, prefixed=True)], False, ALICE, "h", Op.WRITE,
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


@pytest.mark.parametrize("acls", [[], [acl("User:*", Op.ALL, deny=True)], [acl("User:admin", Op.ALL, "*", deny=True)]])
def test_super_users_bypass_acls(acls: list[AclBinding]) -> None:
    authorizer = Authorizer(acls, super_users=frozenset({"User:admin"}))
    assert authorizer.authorize("User:admin", "h", Op.DELETE, TOPIC, "orders")
    assert authorizer.authorize_any("User:admin", "h", Op.WRITE, TOPIC)
    assert not authorizer.authorize("User:admin2", "h", Op.DELETE, TOPIC, "orders")


# (case id, ACLs, allow_everyone_if_no_acl_found, principal, host, operation, expected) -- WRITE on any TOPIC
ANY_CASES = [
    ("no ACLs", [], False, ALICE, "h", Op.WRITE, False),
    ("no ACLs, allow everyone", [], True, ALICE, "h", Op.WRITE, True),
    ("one literal allow", [acl(ALICE, Op.WRITE, "t1")], False, ALICE, "h", Op.WRITE, True),
    ("ALL allows", [acl(ALICE, Op.ALL, "t1")], False, ALICE, "h", Op.WRITE, True),
    ("another operation", [acl(ALICE, Op.READ, "t1")], False, ALICE, "h", Op.WRITE, False),
    ("no implication here", [acl(ALICE, Op.READ, "t1")], False, ALICE, "h", Op.DESCRIBE, False),
    ("another principal", [acl(BOB, Op.WRITE, "t1")], False, ALICE, "h", Op.WRITE, False),
    ("User:*", [acl("User:*", Op.WRITE, "t1")], False, ALICE, "h", Op.WRITE, True),
    ("another host", [acl(ALICE, Op.WRITE, "t1", host="10.0.0.9")], False, ALICE, "10.0.0.1", Op.WRITE, False),
    ("literal denied by the same literal", [acl(ALICE, Op.WRITE, "t1"), acl(ALICE, Op.WRITE, "t1", deny=True)], False,
     ALICE, "h", Op.WRITE, False),
    ("literal denied by a prefix", [acl(ALICE, Op.WRITE, "t1"), acl(ALICE, Op.WRITE, "t", deny=True, prefixed=True)],
     False, ALICE, "h", Op.WRITE, False),
    ("one of two literals denied", [acl(ALICE, Op.WRITE, "t1"), acl(ALICE, Op.WRITE, "u1"),
                                    acl(ALICE, Op.WRITE, "t", deny=True, prefixed=True)], False, ALICE, "h", Op.WRITE,
     True),
    ("prefix denied by the same prefix", [acl(ALICE, Op.WRITE, "t", prefixed=True),
                                          acl(ALICE, Op.WRITE, "t", deny=True, prefixed=True)], False, ALICE, "h",
     Op.WRITE, False),
    ("prefix not dominated by a longer deny", [acl(ALICE, Op.WRITE, "t", prefixed=True),
                                               acl(ALICE, Op.WRITE, "tx", deny=True, prefixed=True)], False, ALICE,
     "h", Op.WRITE, True),
    ("a literal deny does not dominate a prefix", [acl(ALICE, Op.WRITE, "t", prefixed=True),
                                                   acl(ALICE, Op.WRITE, "t", deny=True)], False, ALICE, "h", Op.WRITE,
     True),
    ("wildcard allow", [acl(ALICE, Op.WRITE, "*")], False, ALICE, "h", Op.WRITE, True),
    ("wildcard deny wins", [acl(ALICE, Op.WRITE, "t1"), acl("User:*", Op.WRITE, "*", deny=True)], False, ALICE, "h",
     Op.WRITE, False),
    ("deny of another principal does not dominate", [acl(ALICE, Op.WRITE, "t1"),
                                                     acl(BOB, Op.WRITE, "t", deny=True, prefixed=True)], False, ALICE,
     "h", Op.WRITE, True),
    ("another resource type", [acl(ALICE, Op.WRITE, "t1", rt=TXN)], False, ALICE, "h", Op.WRITE, False),
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
    if any(a.permission is Permission.DENY and a.operation in (op, Op.ALL) for a in mine):
        return False
    implied = {op, Op.ALL} | ({Op.READ, Op.WRITE, Op.DELETE, Op.ALTER} if op is Op.DESCRIBE else set())
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
    authorizer = Authorizer([acl(ALICE, Op.READ), acl(ALICE, Op.READ)])
    assert len(authorizer) == 1
