"""The DeleteRecords handler's ACL check and error mapping, with a fake partition service and authorizer.

DELETE on the topic is needed (else TOPIC_AUTHORIZATION_FAILED, and the
service is not called); each partition answers on its own, a failed one with
low watermark -1.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.admin import DeleteRecordsRequest

from clients.protocol import BrokerError, ErrorCode
from cluster.http.access import Guard
from cluster.kafka.api import Connection, RequestContext
from cluster.kafka.handlers import delete_records
from cluster.security.acl import Operation, ResourceType

_Topic = DeleteRecordsRequest.DeleteRecordsTopic
_Partition = _Topic.DeleteRecordsPartition


@dataclass
class FakeAuthorizer:
    allowed: set[tuple[Operation, ResourceType, str]]

    def authorize(self, principal: str, host: str, op: Operation, rt: ResourceType, name: str) -> bool:
        return (op, rt, name) in self.allowed


@dataclass
class FakePartitions:
    calls: list[tuple[str, int, int, int]] = field(default_factory=list)

    async def delete_records(self, topic: str, partition: int, before_offset: int, timeout_ms: int) -> int:
        self.calls.append((topic, partition, before_offset, timeout_ms))
        if partition == 1:
            raise BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "elsewhere")
        if before_offset > 100:
            raise BrokerError(ErrorCode.OFFSET_OUT_OF_RANGE, "past the high watermark")
        return 100 if before_offset == -1 else before_offset


@dataclass
class FakeServices:
    partitions: FakePartitions = field(default_factory=FakePartitions)


def test_delete_records_needs_delete_on_the_topic_and_answers_per_partition() -> None:
    services = FakeServices()
    guard = Guard("User:alice", "10.0.0.1", FakeAuthorizer({(Operation.DELETE, ResourceType.TOPIC, "a")}))  # type: ignore[arg-type]
    ctx = RequestContext(services, Connection("10.0.0.1", False, guard), 2, "client", 1)  # type: ignore[arg-type]
    request = DeleteRecordsRequest[2](topics=[
        _Topic(name="a", partitions=[_Partition(partition_index=i, offset=o) for i, o in ((0, 7), (1, 3), (2, 500),
                                                                                          (3, -1))]),
        _Topic(name="b", partitions=[_Partition(partition_index=0, offset=5)])], timeout_ms=2500)  # fmt: skip
    response: Any = asyncio.run(delete_records.handle(ctx, request))
    answers = {
        (t.name, p.partition_index): (p.error_code, p.low_watermark) for t in response.topics for p in t.partitions
    }
    assert answers == {
        ("a", 0): (0, 7),
        ("a", 1): (ErrorCode.NOT_LEADER_OR_FOLLOWER.code, -1),
        ("a", 2): (ErrorCode.OFFSET_OUT_OF_RANGE.code, -1),
        ("a", 3): (0, 100),
        ("b", 0): (ErrorCode.TOPIC_AUTHORIZATION_FAILED.code, -1),
    }
    calls = services.partitions.calls
    assert [c[0] for c in calls] == ["a"] * 4 and {c[3] for c in calls} == {2500}
