"""The ACL model's JSON: every field validated by name, Kafka's names out, filters (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from clients.protocol import BrokerError, ErrorCode
from cluster.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    describe,
)


def acl(**over: Any) -> dict[str, Any]:
    base = {
        "principal": "User:alice",
        "host": "*",
        "resource_type": "TOPIC",
        "resource_name": "orders",
        "pattern_type": "LITERAL",
        "operation": "READ",
        "permission": "ALLOW",
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def binding(**over: Any) -> AclBinding:
    return AclBinding.from_json(acl(**over))


def test_a_binding_round_trips_in_kafkas_upper_case_names() -> None:
    b = AclBinding.from_json(
        acl(resource_type="transactional_id", pattern_type="prefixed", operation="Idempotent_Write", permission="deny")
    )
    assert b == AclBinding(
        "User:alice",
        "*",
        ResourceType.TRANSACTIONAL_ID,
        "orders",
        PatternType.PREFIXED,
        Operation.IDEMPOTENT_WRITE,
        Permission.DENY,
    )
    assert b.to_json() == acl(
        resource_type="TRANSACTIONAL_ID", pattern_type="PREFIXED", operation="IDEMPOTENT_WRITE", permission="DENY"
    )
    assert AclBinding.from_json(b.to_json()) == b


def test_host_and_pattern_type_have_kafkas_defaults() -> None:
    b = AclBinding.from_json(acl(host=None, pattern_type=None))
    assert (b.host, b.pattern_type) == ("*", PatternType.LITERAL)


def test_wildcard_principal_and_cluster_resource_are_accepted() -> None:
    b = binding(principal="User:*", resource_type="CLUSTER", resource_name=CLUSTER_NAME, operation="ALTER")
    assert b.principal == "User:*" and b.resource_type is ResourceType.CLUSTER


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"principal": "alice"}, "principal"),
        ({"principal": "Group:x"}, "principal"),
        ({"principal": "User:"}, "principal"),
        ({"principal": "User:a:b"}, "principal"),
        ({"principal": "User:\x00"}, "principal"),
        ({"principal": 5}, "principal"),
        ({"host": ""}, "host"),
        ({"host": "a b"}, "host"),
        ({"host": "h" * 256}, "host"),
        ({"resource_type": "BROKER"}, "resource_type"),
        ({"resource_type": "ANY"}, "resource_type"),
        ({"resource_name": ""}, "resource_name"),
        ({"resource_name": "x" * 256}, "resource_name"),
        ({"resource_name": 7}, "resource_name"),
        ({"pattern_type": "ANY"}, "pattern_type"),
        ({"pattern_type": "MATCH"}, "pattern_type"),
        ({"pattern_type": "GLOB"}, "pattern_type"),
        ({"operation": "ANY"}, "operation"),
        ({"operation": "DESCRIBE_CONFIGS"}, "operation"),
        ({"operation": None}, "operation"),
        ({"permission": "MAYBE"}, "permission"),
        ({"resource_type": "CLUSTER", "resource_name": "my-cluster"}, "CLUSTER"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_fields_are_invalid_request_naming_them(over: dict[str, Any], field: str) -> None:
    with pytest.raises(BrokerError) as exc:
        AclBinding.from_json(acl(**over))
    assert exc.value.error_code is ErrorCode.INVALID_REQUEST
    assert field in str(exc.value)


@pytest.mark.parametrize("bad", [None, [], "x", 3])
def test_a_binding_is_a_json_object(bad: object) -> None:
    with pytest.raises(BrokerError) as exc:
        AclBinding.from_json(bad)
    assert exc.value.error_code is ErrorCode.INVALID_REQUEST


def test_an_empty_filter_matches_everything_and_any_means_absent() -> None:
    bindings = [binding(), binding(principal="User:bob", permission="DENY", pattern_type="PREFIXED")]
    assert all(AclFilter().matches(b) for b in bindings)
    any_filter = AclFilter.from_json({"resource_type": "any", "operation": "ANY", "permission": "Any", "host": None})
    assert any_filter == AclFilter()


def test_filters_match_fields_exactly() -> None:
    a = binding()
    assert AclFilter.from_json({"principal": "User:alice"}).matches(a)
    assert not AclFilter.from_json({"principal": "User:*"}).matches(a)
    assert not AclFilter.from_json({"operation": "ALL"}).matches(a)  # ALL in a filter is the ALL operation
    assert AclFilter.from_json({"resource_name": "orders", "pattern_type": "LITERAL"}).matches(a)
    assert not AclFilter.from_json({"resource_name": "orders", "pattern_type": "PREFIXED"}).matches(a)
    assert not AclFilter.from_json({"resource_name": "order"}).matches(a)


def test_match_filters_select_what_applies_to_a_name() -> None:
    literal = binding(resource_name="orders")
    wildcard = binding(resource_name="*")
    prefix = binding(resource_name="ord", pattern_type="PREFIXED")
    other = binding(resource_name="payments")
    other_prefix = binding(resource_name="orders-x", pattern_type="PREFIXED")
    flt = AclFilter.from_json({"resource_name": "orders", "pattern_type": "match"})
    assert flt.match
    assert describe([other_prefix, other, prefix, wildcard, literal], flt) == sorted(
        [literal, wildcard, prefix], key=lambda b: (b.resource_name, b.pattern_type.value)
    )
    assert AclFilter.from_json(flt.to_json()) == flt


def test_filters_from_query_parameters() -> None:
    flt = AclFilter.from_query({"principal": "User:alice", "resource_type": "topic"})
    assert flt == AclFilter(principal="User:alice", resource_type=ResourceType.TOPIC)
    with pytest.raises(BrokerError) as exc:
        AclFilter.from_query({"colour": "red"})
    assert exc.value.error_code is ErrorCode.INVALID_REQUEST and "colour" in str(exc.value)
    with pytest.raises(BrokerError):
        AclFilter.from_query({"operation": "JUMP"})


def test_filter_round_trip_through_json() -> None:
    flt = AclFilter.from_json(
        {"principal": "User:bob", "host": "10.0.0.1", "resource_type": "GROUP", "resource_name": "g",
         "pattern_type": "PREFIXED", "operation": "READ", "permission": "DENY"}
    )  # fmt: skip
    assert AclFilter.from_json(flt.to_json()) == flt
