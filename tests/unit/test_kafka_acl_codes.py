"""Kafka's ACL codes as txbroker's ACL model (``cluster.kafka.acl_codes``): creations and filters."""

from __future__ import annotations

import pytest
from kafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest

from clients.protocol import BrokerError, ErrorCode
from cluster.kafka.acl_codes import binding_of, filter_of
from cluster.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType

_Create = CreateAclsRequest.AclCreation
_Filter = DeleteAclsRequest.DeleteAclsFilter


def _creation(**over: object) -> object:
    fields: dict[str, object] = {
        "resource_type": 2,
        "resource_name": "orders",
        "resource_pattern_type": 3,
        "principal": "User:alice",
        "host": "*",
        "operation": 4,
        "permission_type": 3,
    }
    return _Create(**{**fields, **over})


def _filter(**over: object) -> object:
    fields: dict[str, object] = {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
                                 "principal_filter": None, "host_filter": None, "operation": 1,
                                 "permission_type": 1}  # fmt: skip
    return _Filter(**{**fields, **over})


def test_a_creation_becomes_a_binding() -> None:
    assert binding_of(_creation()) == AclBinding("User:alice", "*", ResourceType.TOPIC, "orders", PatternType.LITERAL,
                                                 Operation.WRITE, Permission.ALLOW)  # fmt: skip
    prefixed = binding_of(_creation(resource_type=3, resource_name="copier-", resource_pattern_type=4, operation=3))
    assert (prefixed.resource_type, prefixed.pattern_type, prefixed.operation) == (
        ResourceType.GROUP, PatternType.PREFIXED, Operation.READ)  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [{"resource_type": 7}, {"resource_type": 1}, {"resource_pattern_type": 1}, {"resource_pattern_type": 2},
     {"operation": 10}, {"operation": 1}, {"permission_type": 1}, {"principal": "alice"},
     {"resource_type": 4, "resource_name": "other"}, {"resource_name": ""}],
)  # fmt: skip
def test_creations_outside_the_model_are_invalid_request(bad: dict[str, object]) -> None:
    with pytest.raises(BrokerError) as err:
        binding_of(_creation(**bad))
    assert err.value.error_code is ErrorCode.INVALID_REQUEST


def test_filters() -> None:
    alice = AclBinding("User:alice", "*", ResourceType.GROUP, "copier-", PatternType.PREFIXED, Operation.READ,
                       Permission.ALLOW)  # fmt: skip
    any_filter = filter_of(_filter())
    assert any_filter is not None and any_filter.matches(alice)
    match = filter_of(_filter(resource_type_filter=3, resource_name_filter="copier-1", pattern_type_filter=2))
    assert match is not None and match.matches(alice)
    literal = filter_of(_filter(resource_name_filter="copier-1", pattern_type_filter=3))
    assert literal is not None and not literal.matches(alice)
    assert filter_of(_filter(operation=10)) is None  # DESCRIBE_CONFIGS: no ACL of the model has it
    assert filter_of(_filter(resource_type_filter=7)) is None  # USER resources
    with pytest.raises(BrokerError) as err:
        filter_of(_filter(permission_type=0))
    assert err.value.error_code is ErrorCode.INVALID_REQUEST
