"""The Kafka group handlers' ACL checks and error mapping, with a fake group service and authorizer.

The checks mirror the HTTP group routes (cluster/http/groups.py): DESCRIBE on
the group for FindCoordinator, OffsetFetch and DescribeGroups; READ on the
group for membership and commits (READ on each committed topic); DELETE for
DeleteGroups and OffsetDelete. A refused request never reaches the service.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.admin import DeleteGroupsRequest, ListGroupsRequest
from kafka.protocol.consumer import (
    JoinGroupRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest

from clients.protocol import BrokerError, ErrorCode
from cluster.http.access import Guard
from cluster.kafka.api import Connection, RequestContext
from cluster.kafka.handlers import (
    delete_groups,
    find_coordinator,
    join_group,
    list_groups,
    offset_commit,
    offset_delete,
    offset_fetch,
)
from cluster.security.acl import Operation, ResourceType
from coordinator.group_metadata import CommittedOffset
from coordinator.group_rules import OffsetsDeleted
from coordinator.metadata import TopicPartition

READ, DESCRIBE, DELETE = Operation.READ, Operation.DESCRIBE, Operation.DELETE
GROUP, TOPIC, TXN = ResourceType.GROUP, ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID


@dataclass
class FakeAuthorizer:
    allowed: set[tuple[Operation, ResourceType, str]]

    def authorize(self, principal: str, host: str, op: Operation, rt: ResourceType, name: str) -> bool:
        return (op, rt, name) in self.allowed


@dataclass
class FakeGroups:
    calls: list[tuple[str, Any]] = field(default_factory=list)
    unstable: set[tuple[str, int]] = field(default_factory=set)

    def coordinator_json(self, key: str) -> dict[str, Any]:
        return {"node_id": 2}

    def new_member_id(self, group_id: str, client_id: str, session_timeout_ms: int) -> str:
        self.calls.append(("new_member_id", group_id))
        return f"{client_id}-1"

    async def join(self, *args: Any) -> Any:
        self.calls.append(("join", args))
        raise BrokerError(ErrorCode.NOT_COORDINATOR)

    async def commit_offsets(self, group_id: str, offsets: Any, generation: int, member_id: str) -> None:
        self.calls.append(("commit", tuple((o.topic, o.partition, o.offset, o.leader_epoch) for o in offsets)))

    def committed_offsets(self, group_id: str, topics: Any = None, *, partitions: Any = None,
                          require_stable: bool = False) -> list[CommittedOffset]:  # fmt: skip
        if require_stable and self.unstable:
            raise BrokerError(ErrorCode.UNSTABLE_OFFSET_COMMIT, "pending",
                              partitions=[{"topic": t, "partition": p} for t, p in self.unstable])  # fmt: skip
        rows = [("a", 0, 5, 2), ("b", 0, 6, -1)]
        return [CommittedOffset(group_id, t, p, o, "", 1, 1, e) for t, p, o, e in rows
                if partitions is None or TopicPartition(t, p) in partitions]  # fmt: skip

    async def delete_group(self, group_id: str) -> None:
        self.calls.append(("delete", group_id))

    async def delete_offsets(self, group_id: str, partitions: Any) -> OffsetsDeleted:
        self.calls.append(("delete_offsets", tuple(partitions)))
        return OffsetsDeleted(group_id, 0, tuple(tp for tp in partitions if tp.topic == "a"))

    def local_groups(self) -> list[dict[str, Any]]:
        return [{"group_id": g, "state": "Stable", "protocol_type": "consumer"} for g in ("g", "hidden")]


@dataclass
class FakeAddress:
    host: str = "node2.example"
    kafka_port: int | None = 9092


class FakeNodes:
    def node(self, node_id: int) -> FakeAddress:
        return FakeAddress()


@dataclass
class FakeServices:
    groups: FakeGroups = field(default_factory=FakeGroups)
    txn: FakeGroups = field(default_factory=FakeGroups)
    nodes: FakeNodes = field(default_factory=FakeNodes)


def call(handler: Any, request: Any, version: int, allowed: set[tuple[Operation, ResourceType, str]],
         services: FakeServices | None = None) -> Any:  # fmt: skip
    guard = Guard("User:alice", "10.0.0.1", FakeAuthorizer(allowed))  # type: ignore[arg-type]
    ctx = RequestContext(services or FakeServices(), Connection("10.0.0.1", False, guard), version,  # type: ignore[arg-type]
                         "client", 1)  # fmt: skip
    return asyncio.run(handler.handle(ctx, request))


def test_find_coordinator_needs_describe_on_the_group_or_transactional_id() -> None:
    req = FindCoordinatorRequest[4](key_type=0, coordinator_keys=["g", "other"])
    resp = call(find_coordinator.API, req, 4, {(DESCRIBE, GROUP, "g")})
    answers = {c.key: (c.error_code, c.node_id, c.host, c.port) for c in resp.coordinators}
    assert answers == {"g": (0, 2, "node2.example", 9092), "other": (ErrorCode.GROUP_AUTHORIZATION_FAILED.code,
                                                                    -1, "", -1)}  # fmt: skip
    txn = call(find_coordinator.API, FindCoordinatorRequest[3](key="t", key_type=1), 3, {(DESCRIBE, GROUP, "t")})
    assert txn.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code


def test_join_group_needs_read_on_a_valid_group_and_hands_out_member_ids() -> None:
    def join(group: str, member: str = "", version: int = 5) -> Any:
        svc = FakeServices()
        protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")
        req = JoinGroupRequest[version](group_id=group, session_timeout_ms=6000, rebalance_timeout_ms=6000,
                                        member_id=member, group_instance_id=None, protocol_type="consumer",
                                        protocols=[protocol])  # fmt: skip
        return call(join_group.API, req, version, {(READ, GROUP, "g")}, svc), svc

    denied, svc = join("other")
    assert denied.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED.code and not svc.groups.calls
    empty, svc = join("")
    assert empty.error_code == ErrorCode.INVALID_GROUP_ID.code and not svc.groups.calls
    first, svc = join("g")  # KIP-394
    assert (first.error_code, first.member_id) == (ErrorCode.MEMBER_ID_REQUIRED.code, "client-1")
    old, svc = join("g", version=3)  # before version 4 the join itself picks the id
    assert old.error_code == ErrorCode.NOT_COORDINATOR.code and svc.groups.calls[0][0] == "join"


def test_offset_commit_needs_read_on_the_group_and_on_each_topic() -> None:
    P = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    req = OffsetCommitRequest[8](group_id="g", generation_id_or_member_epoch=-1, member_id="",
                                 group_instance_id=None, topics=[
        OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=[P(partition_index=0, committed_offset=o,
                                                                          committed_leader_epoch=4,
                                                                          committed_metadata="")])
        for t, o in (("a", 5), ("b", 6), ("c", -3))])  # fmt: skip
    svc = FakeServices()
    allowed = {(READ, GROUP, "g"), (READ, TOPIC, "a"), (READ, TOPIC, "c")}
    resp = call(offset_commit.API, req, 8, allowed, svc)
    codes = {t.name: t.partitions[0].error_code for t in resp.topics}
    assert codes == {"a": 0, "b": ErrorCode.TOPIC_AUTHORIZATION_FAILED.code, "c": ErrorCode.INVALID_REQUEST.code}
    assert svc.groups.calls == [("commit", (("a", 0, 5, 4),))]  # the committed leader epoch is kept
    denied = call(offset_commit.API, req, 8, allowed - {(READ, GROUP, "g")}, svc)
    assert {t.partitions[0].error_code for t in denied.topics} == {ErrorCode.GROUP_AUTHORIZATION_FAILED.code}
    assert len(svc.groups.calls) == 1


def test_offset_fetch_shows_only_describable_topics_and_flags_unstable_partitions() -> None:
    allowed = {(DESCRIBE, GROUP, "g"), (DESCRIBE, TOPIC, "a")}
    every = call(offset_fetch.API, OffsetFetchRequest[6](group_id="g", topics=None), 6, allowed)
    assert [(t.name, t.partitions[0].committed_offset, t.partitions[0].committed_leader_epoch)
            for t in every.topics] == [("a", 5, 2)]  # fmt: skip
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    topics = [T(name="a", partition_indexes=[0, 1]), T(name="b", partition_indexes=[0])]
    named = OffsetFetchRequest[7](group_id="g", topics=topics, require_stable=True)
    svc = FakeServices()
    svc.groups.unstable = {("a", 0)}
    resp = call(offset_fetch.API, named, 7, allowed, svc)
    got = {(t.name, p.partition_index): (p.committed_offset, p.error_code) for t in resp.topics for p in t.partitions}
    assert got == {("a", 0): (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT.code), ("a", 1): (-1, 0),
                   ("b", 0): (-1, ErrorCode.TOPIC_AUTHORIZATION_FAILED.code)}  # fmt: skip
    denied = call(offset_fetch.API, OffsetFetchRequest[6](group_id="x", topics=None), 6, allowed)
    assert denied.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED.code


def test_admin_apis_need_delete_or_describe_on_each_group() -> None:
    svc = FakeServices()
    resp = call(delete_groups.API, DeleteGroupsRequest[2](groups_names=["g", "x"]), 2, {(DELETE, GROUP, "g")}, svc)
    assert {r.group_id: r.error_code for r in resp.results} == {"g": 0, "x": ErrorCode.GROUP_AUTHORIZATION_FAILED.code}
    assert svc.groups.calls == [("delete", "g")]
    listed = call(list_groups.API, ListGroupsRequest[4](states_filter=[]), 4, {(DESCRIBE, GROUP, "g")})
    assert [g.group_id for g in listed.groups] == ["g"]
    T = OffsetDeleteRequest.OffsetDeleteRequestTopic
    first = [T.OffsetDeleteRequestPartition(partition_index=0)]
    req = OffsetDeleteRequest[0](group_id="g", topics=[T(name=t, partitions=first) for t in ("a", "b", "c")])
    svc = FakeServices()
    resp = call(offset_delete.API, req, 0, {(DELETE, GROUP, "g"), (READ, TOPIC, "a"), (READ, TOPIC, "b")}, svc)
    assert {t.name: t.partitions[0].error_code for t in resp.topics} == {
        "a": ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC.code, "b": 0, "c": ErrorCode.TOPIC_AUTHORIZATION_FAILED.code,
    }  # fmt: skip
    assert svc.groups.calls == [("delete_offsets", (TopicPartition("a", 0), TopicPartition("b", 0)))]
