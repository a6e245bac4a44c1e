"""Admin APIs through the Kafka listener: topics, partitions, configs, the cluster and ACLs.

confluent-kafka's AdminClient and kafka-python's KafkaAdminClient against a
real 3-node cluster; what they change is checked through the HTTP API too.
kafka-python sends config and ACL changes to any node, so the ones reaching a
node that does not lead the controller go through its forwarding.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ConfigResourceType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic
from kafka.admin import ResourceType as KpResourceType
from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.integration.kafka.conftest import unique
from tests.support.cluster import LocalCluster, http, wait_for

pytestmark = pytest.mark.integration

_TIMEOUT = 15


@pytest.fixture(scope="module")
def admin(kafka_cluster: LocalCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers, "socket.timeout.ms": 10000})


@pytest.fixture(scope="module")
def kp_admin(kafka_cluster: LocalCluster) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap_servers, request_timeout_ms=15000)
    try:
        yield client
    finally:
        client.close()


def _http_topic(cluster: LocalCluster, name: str) -> tuple[int, dict[str, Any]]:
    status, body = http("GET", f"{cluster.url(1)}/v1/topics/{name}")
    return status, body


def _error(future: Any) -> KafkaError | None:
    try:
        future.result(timeout=_TIMEOUT)
    except KafkaException as exc:
        err: KafkaError = exc.args[0]
        return err
    return None


def test_topic_round_trip_with_confluent_kafka(kafka_cluster: LocalCluster, admin: AdminClient) -> None:
    name = unique("adm")
    futures = admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=3,
                                            config={"retention.ms": "3600000"})], operation_timeout=10)  # fmt: skip
    assert _error(futures[name]) is None
    status, body = _http_topic(kafka_cluster, name)
    assert status == 200 and len(body["partitions"]) == 2 and body["config"] == {"retention.ms": 3600000}

    # the defaults: -1 partitions and replication factor
    default = unique("adm")
    assert _error(admin.create_topics([NewTopic(default)])[default]) is None
    status, body = _http_topic(kafka_cluster, default)
    assert status == 200 and len(body["partitions"]) == 1 and body["replication_factor"] == 3

    # validate_only creates nothing
    dry = unique("adm")
    assert _error(admin.create_topics([NewTopic(dry, 3, 1)], validate_only=True)[dry]) is None
    assert _http_topic(kafka_cluster, dry)[0] == 404

    # configs: described with their sources, then changed one key at a time
    res = ConfigResource(ResourceType.TOPIC, name)
    described = admin.describe_configs([res])[res].result(timeout=_TIMEOUT)
    assert described["retention.ms"].value == "3600000" and not described["retention.ms"].is_default
    assert described["retention.bytes"].value == "-1" and described["retention.bytes"].is_default
    change = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])  # fmt: skip
    assert _error(admin.incremental_alter_configs([change])[change]) is None
    status, body = http("GET", f"{kafka_cluster.url(1)}/v1/topics/{name}/config")
    assert body["overrides"] == {"retention.bytes": 1048576}

    # partitions only grow
    assert _error(admin.create_partitions([NewPartitions(name, 4)])[name]) is None
    assert len(_http_topic(kafka_cluster, name)[1]["partitions"]) == 4
    err = _error(admin.create_partitions([NewPartitions(name, 3)])[name])
    assert err is not None and err.code() == KafkaError.INVALID_PARTITIONS

    assert _error(admin.delete_topics([name, default])[name]) is None
    wait_for(lambda: _http_topic(kafka_cluster, name)[0] == 404, 10, "the topic gone")


def test_bad_input_gets_per_topic_errors_and_changes_nothing(kafka_cluster: LocalCluster, admin: AdminClient) -> None:
    good, existing = unique("adm"), unique("adm")
    kafka_cluster.create_topic(existing, partitions=1)
    futures = admin.create_topics([
        NewTopic(good, 1, 1),
        NewTopic(existing, 1, 1),
        NewTopic("bad name!", 1, 1),
        NewTopic(unique("adm"), 0, 1),
        NewTopic(unique("adm"), 1, 9),
        NewTopic(unique("adm"), 1, 1, config={"retention.ms": "soon"}),
        NewTopic(unique("adm"), 1, 1, config={"no.such.config": "1"}),
    ])  # fmt: skip
    codes = {name: (_error(f).code() if _error(f) else 0) for name, f in futures.items()}  # type: ignore[union-attr]
    assert codes.pop(good) == 0
    assert codes.pop(existing) == KafkaError.TOPIC_ALREADY_EXISTS
    assert codes.pop("bad name!") == KafkaError.TOPIC_EXCEPTION
    assert sorted(codes.values()) == sorted([KafkaError.INVALID_PARTITIONS, KafkaError.INVALID_REPLICATION_FACTOR,
                                             KafkaError.INVALID_CONFIG, KafkaError.INVALID_CONFIG])  # fmt: skip
    _status, body = http("GET", f"{kafka_cluster.url(1)}/v1/topics")
    names = {t["name"] for t in body["topics"]}
    assert good in names and not (set(codes) & names)

    # an unknown topic: deletion, config changes and descriptions say so per resource
    missing = unique("missing")
    assert _error(admin.delete_topics([missing])[missing]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART  # type: ignore[union-attr]
    res = ConfigResource(ResourceType.TOPIC, missing)
    assert _error(admin.describe_configs([res])[res]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART  # type: ignore[union-attr]
    bad = ConfigResource(ResourceType.TOPIC, good, incremental_configs=[
        ConfigEntry("retention.ms", "100", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("max.message.bytes", "1", incremental_operation=AlterConfigOpType.SET)])  # fmt: skip
    assert _error(admin.incremental_alter_configs([bad])[bad]).code() == KafkaError.INVALID_CONFIG  # type: ignore[union-attr]
    _status, body = http("GET", f"{kafka_cluster.url(1)}/v1/topics/{good}/config")
    assert body["overrides"] == {}  # nothing of the refused change was applied


def test_describe_cluster_and_broker_configs(kafka_cluster: LocalCluster, admin: AdminClient) -> None:
    desc = admin.describe_cluster(include_authorized_operations=True).result(timeout=_TIMEOUT)
    _status, cluster = http("GET", f"{kafka_cluster.url(1)}/v1/cluster")
    assert desc.cluster_id == cluster["cluster_id"]
    assert desc.controller.id == cluster["controller_leader"]
    assert sorted((n.id, f"{n.host}:{n.port}") for n in desc.nodes) == sorted(
        (n["id"], n["kafka"]) for n in cluster["nodes"]
    )
    assert AclOperation.ALTER in desc.authorized_operations  # an open cluster lets everyone do anything
    res = ConfigResource(ResourceType.BROKER, "2")
    configs = admin.describe_configs([res])[res].result(timeout=_TIMEOUT)
    assert configs["broker.id"].value == "2" and configs["broker.id"].is_read_only


def test_acl_round_trip_with_confluent_kafka(kafka_cluster: LocalCluster, admin: AdminClient) -> None:
    topic = unique("acl")
    user = f"User:{unique('alice')}"
    binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, user, "*", AclOperation.READ,
                         AclPermissionType.ALLOW)  # fmt: skip
    prefixed = AclBinding(ResourceType.GROUP, "grp-", ResourcePatternType.PREFIXED, user, "*", AclOperation.READ,
                          AclPermissionType.ALLOW)  # fmt: skip
    for f in admin.create_acls([binding, prefixed]).values():
        assert _error(f) is None
    _status, body = http("GET", f"{kafka_cluster.url(1)}/v1/acls?principal={user}")
    assert {(a["resource_type"], a["resource_name"], a["pattern_type"]) for a in body["acls"]} == {
        ("TOPIC", topic, "LITERAL"), ("GROUP", "grp-", "PREFIXED")}  # fmt: skip

    mine = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, user, None, AclOperation.ANY,
                            AclPermissionType.ANY)  # fmt: skip
    found = admin.describe_acls(mine).result(timeout=_TIMEOUT)
    assert sorted(str(b) for b in found) == sorted(str(b) for b in (binding, prefixed))
    # MATCH: the ACLs that apply to a group named grp-1
    match = AclBindingFilter(ResourceType.GROUP, "grp-1", ResourcePatternType.MATCH, user, None, AclOperation.ANY,
                             AclPermissionType.ANY)  # fmt: skip
    assert [b.name for b in admin.describe_acls(match).result(timeout=_TIMEOUT)] == ["grp-"]

    bad = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "Nobody", "*", AclOperation.READ,
                     AclPermissionType.ALLOW)  # fmt: skip
    err = _error(admin.create_acls([bad])[bad])
    assert err is not None and err.code() == KafkaError.INVALID_REQUEST

    deleted = admin.delete_acls([mine])[mine].result(timeout=_TIMEOUT)
    assert len(deleted) == 2
    assert admin.describe_acls(mine).result(timeout=_TIMEOUT) == []


def test_kafka_python_admin_round_trip(kafka_cluster: LocalCluster, kp_admin: KafkaAdminClient) -> None:
    name = unique("kp")
    kp_admin.create_topics([KpNewTopic(name, 1, 2, topic_configs={"max.message.bytes": "2000000"})])
    wait_for(lambda: _http_topic(kafka_cluster, name)[0] == 200, 10, "the topic")
    assert name in kp_admin.list_topics()
    configs = kp_admin.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, name)])
    assert configs["topic"][name]["max.message.bytes"]["value"] == "2000000"
    # config changes go to any node (followers forward them to the controller leader): each node in turn
    for value in ("100000", "200000", "300000"):
        kp_admin.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, name, {"retention.ms": value})])
        _status, body = http("GET", f"{kafka_cluster.url(1)}/v1/topics/{name}/config")
        assert body["overrides"] == {"max.message.bytes": 2000000, "retention.ms": int(value)}
    kp_admin.create_partitions({name: KpNewPartitions(3)})
    assert len(_http_topic(kafka_cluster, name)[1]["partitions"]) == 3

    user = f"User:{unique('bob')}"
    pattern = ResourcePattern(KpResourceType.TOPIC, name, ACLResourcePatternType.LITERAL)
    acl = ACL(user, "*", ACLOperation.WRITE, ACLPermissionType.ALLOW, pattern)
    result = kp_admin.create_acls([acl])
    assert result["succeeded"] == [acl] and not result["failed"]
    flt = ACLFilter(user, None, ACLOperation.ANY, ACLPermissionType.ANY,
                    ResourcePatternFilter(KpResourceType.ANY, None, ACLResourcePatternType.ANY))  # fmt: skip
    acls, _ = kp_admin.describe_acls(flt)
    assert acls == [acl]
    [(_, removed, error)] = kp_admin.delete_acls([flt])
    assert removed == [acl] and error.errno == 0
    assert kp_admin.describe_acls(flt)[0] == []

    cluster = kp_admin.describe_cluster()
    assert len(cluster["brokers"]) == 3
    kp_admin.delete_topics([name])
    wait_for(lambda: _http_topic(kafka_cluster, name)[0] == 404, 10, "the topic gone")


def test_delete_records_with_confluent_kafka(kafka_cluster: LocalCluster, admin: AdminClient) -> None:
    topic = unique("delrec")
    kafka_cluster.create_topic(topic, partitions=1)
    failed: list[Any] = []
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "enable.idempotence": True,
                         "message.timeout.ms": 10000})  # fmt: skip
    for i in range(10):
        producer.produce(topic, value=b"%d" % i, partition=0, on_delivery=lambda err, _m: err and failed.append(err))
    assert producer.flush(_TIMEOUT) == 0 and failed == []

    def delete(offset: int) -> Any:
        tp = TopicPartition(topic, 0, offset)
        return admin.delete_records([tp], operation_timeout=10)[tp]

    assert delete(4).result(timeout=_TIMEOUT).low_watermark == 4
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": unique("delrec"),
                         "enable.auto.commit": False})  # fmt: skip
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=_TIMEOUT) == (4, 10)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        msg = None
        deadline = _TIMEOUT
        while msg is None and deadline > 0:
            msg = consumer.poll(1.0)
            deadline -= 1
        assert msg is not None and msg.error() is None and (msg.offset(), msg.value()) == (4, b"4")
    finally:
        consumer.close()

    # the idempotent producer's sequences go on: its state outlives the deleted batches
    producer.produce(topic, value=b"10", partition=0, on_delivery=lambda err, _m: err and failed.append(err))
    assert producer.flush(_TIMEOUT) == 0 and failed == []

    # below the log start nothing changes; past the high watermark is out of range; -1 is the high watermark
    assert delete(2).result(timeout=_TIMEOUT).low_watermark == 4
    err = _error(delete(12))
    assert err is not None and err.code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert delete(OFFSET_END).result(timeout=_TIMEOUT).low_watermark == 11
    wait_for(lambda: _http_topic(kafka_cluster, topic)[1]["partitions"][0]["log_start_offset"] == 11, 10,
             "the HTTP API's log start offset")  # fmt: skip


def _raw(cluster: LocalCluster, node: int, request: Any, response_class: Any, version: int) -> Any:
    """One request to one node's Kafka listener; its decoded response."""
    host, port = cluster.configs[node - 1].self_address.kafka_address.rsplit(":", 1)  # type: ignore[union-attr]
    request.API_VERSION = version
    request.with_header(correlation_id=7, client_id="admin-test")
    with socket.create_connection((host, int(port)), timeout=15) as s:
        s.settimeout(15)
        s.sendall(bytes(request.encode(header=True, framed=True)))
        (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
        data = s.recv(size, socket.MSG_WAITALL)
    return response_class.decode(data, version=version, header=True)


def test_every_node_takes_admin_changes_followers_through_the_controller(kafka_cluster: LocalCluster) -> None:
    status, cluster = http("GET", f"{kafka_cluster.url(1)}/v1/cluster")
    followers = [n["id"] for n in cluster["nodes"] if n["id"] != cluster["controller_leader"]]
    assert len(followers) == 2
    user = f"User:{unique('carol')}"
    for node in followers:
        topic = unique("fwd")
        create = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=topic, num_partitions=2, replication_factor=2, assignments=[],
            configs=[CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(name="retention.ms", value="60000")])],
            timeout_ms=10000, validate_only=False)  # fmt: skip
        [result] = _raw(kafka_cluster, node, create, CreateTopicsResponse, 7).topics
        assert (result.error_code, result.num_partitions, result.replication_factor) == (0, 2, 2)
        status, body = _http_topic(kafka_cluster, topic)
        assert status == 200 and body["config"] == {"retention.ms": 60000}

        acl = CreateAclsRequest(creations=[CreateAclsRequest.AclCreation(
            resource_type=2, resource_name=topic, resource_pattern_type=3, principal=user, host="*", operation=3,
            permission_type=3)])  # fmt: skip
        assert [r.error_code for r in _raw(kafka_cluster, node, acl, CreateAclsResponse, 3).results] == [0]
        status, body = http("GET", f"{kafka_cluster.url(cluster['controller_leader'])}/v1/acls?resource_name={topic}")
        assert [a["principal"] for a in body["acls"]] == [user]

        change = IncrementalAlterConfigsRequest(resources=[IncrementalAlterConfigsRequest.AlterConfigsResource(
            resource_type=2, resource_name=topic, configs=[
                IncrementalAlterConfigsRequest.AlterConfigsResource.AlterableConfig(
                    name="retention.ms", config_operation=1, value=None),
                IncrementalAlterConfigsRequest.AlterConfigsResource.AlterableConfig(
                    name="retention.bytes", config_operation=0, value="4096")])], validate_only=False)  # fmt: skip
        answer = _raw(kafka_cluster, node, change, IncrementalAlterConfigsResponse, 1)
        assert [r.error_code for r in answer.responses] == [0]
        assert _http_topic(kafka_cluster, topic)[1]["config"] == {"retention.bytes": 4096}

        delete = DeleteTopicsRequest(topic_names=[topic, unique("missing")], timeout_ms=10000)
        results = _raw(kafka_cluster, node, delete, DeleteTopicsResponse, 5).responses
        assert [r.error_code for r in results] == [0, KafkaError.UNKNOWN_TOPIC_OR_PART]

    # a filter that names an UNKNOWN (0) code is refused; DeleteAcls at a follower removes the ACLs
    flt = DeleteAclsRequest.DeleteAclsFilter
    delete_acls = DeleteAclsRequest(filters=[
        flt(resource_type_filter=0, resource_name_filter=None, pattern_type_filter=1, principal_filter=user,
            host_filter=None, operation=1, permission_type=1),
        flt(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=user,
            host_filter=None, operation=1, permission_type=1)])  # fmt: skip
    bad, good = _raw(kafka_cluster, followers[0], delete_acls, DeleteAclsResponse, 3).filter_results
    assert bad.error_code == KafkaError.INVALID_REQUEST and bad.matching_acls == []
    assert good.error_code == 0 and len(good.matching_acls) == 2
    status, body = http("GET", f"{kafka_cluster.url(1)}/v1/acls?principal={user}")
    assert body["acls"] == []


def test_every_admin_api_answers_in_its_lowest_and_highest_version(kafka_cluster: LocalCluster) -> None:
    topic = unique("ver")
    kafka_cluster.create_topic(topic, partitions=1)
    _Creatable = CreateTopicsRequest.CreatableTopic
    describe_configs = DescribeConfigsRequest(resources=[
        DescribeConfigsRequest.DescribeConfigsResource(resource_type=2, resource_name=topic, configuration_keys=None),
        DescribeConfigsRequest.DescribeConfigsResource(resource_type=4, resource_name="", configuration_keys=None)],
        include_synonyms=True, include_documentation=True)  # fmt: skip
    alter = AlterConfigsRequest(resources=[AlterConfigsRequest.AlterConfigsResource(
        resource_type=2, resource_name=topic,
        configs=[AlterConfigsRequest.AlterConfigsResource.AlterableConfig(name="retention.ms", value="70000")])],
        validate_only=True)  # fmt: skip
    incremental = IncrementalAlterConfigsRequest(resources=[IncrementalAlterConfigsRequest.AlterConfigsResource(
        resource_type=2, resource_name=topic, configs=[
            IncrementalAlterConfigsRequest.AlterConfigsResource.AlterableConfig(
                name="retention.ms", config_operation=0, value="80000")])], validate_only=True)  # fmt: skip
    acl_filter = {"resource_type_filter": 2, "resource_name_filter": topic, "pattern_type_filter": 3,
                  "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}  # fmt: skip
    cases: list[tuple[Any, Any, tuple[int, int], Any]] = [
        (CreateTopicsRequest(topics=[_Creatable(name=topic, num_partitions=1, replication_factor=1, assignments=[],
                                                configs=[])], timeout_ms=5000, validate_only=True),
         CreateTopicsResponse, (2, 7), lambda r: [t.error_code for t in r.topics] == [KafkaError.TOPIC_ALREADY_EXISTS]),
        (DeleteTopicsRequest(topic_names=[unique("missing")], timeout_ms=5000), DeleteTopicsResponse, (1, 5),
         lambda r: [t.error_code for t in r.responses] == [KafkaError.UNKNOWN_TOPIC_OR_PART]),
        (CreatePartitionsRequest(topics=[CreatePartitionsRequest.CreatePartitionsTopic(
            name=topic, count=1, assignments=None)], timeout_ms=5000, validate_only=True),
         CreatePartitionsResponse, (0, 3),
         lambda r: [t.error_code for t in r.results] == [KafkaError.INVALID_PARTITIONS]),
        (describe_configs, DescribeConfigsResponse, (1, 4),
         lambda r: [x.error_code for x in r.results] == [0, 0] and len(r.results[0].configs) == 5),
        (alter, AlterConfigsResponse, (0, 2), lambda r: [x.error_code for x in r.responses] == [0]),
        (incremental, IncrementalAlterConfigsResponse, (0, 1), lambda r: [x.error_code for x in r.responses] == [0]),
        (DescribeClusterRequest(include_cluster_authorized_operations=True), DescribeClusterResponse, (0, 2),
         lambda r: r.error_code == 0 and len(r.brokers) == 3),
        (DescribeAclsRequest(**acl_filter), DescribeAclsResponse, (1, 3), lambda r: r.error_code == 0),
        (CreateAclsRequest(creations=[]), CreateAclsResponse, (1, 3), lambda r: r.results == []),
        (DeleteAclsRequest(filters=[DeleteAclsRequest.DeleteAclsFilter(**acl_filter)]), DeleteAclsResponse, (1, 3),
         lambda r: [f.error_code for f in r.filter_results] == [0]),
        (DeleteRecordsRequest(topics=[DeleteRecordsRequest.DeleteRecordsTopic(name=topic, partitions=[
            DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=0)])],
            timeout_ms=5000), DeleteRecordsResponse, (0, 2),
         lambda r: [p.error_code for p in r.topics[0].partitions] in ([0], [KafkaError.NOT_LEADER_FOR_PARTITION])),
    ]  # fmt: skip
    for request, response_class, versions, check in cases:
        for version in versions:
            answer = _raw(kafka_cluster, 1 + version % 3, request, response_class, version)
            assert check(answer), (type(request).__name__, version, answer)
    # validate_only changed nothing
    _status, body = http("GET", f"{kafka_cluster.url(1)}/v1/topics/{topic}/config")
    assert body["overrides"] == {}


def _partitions(cluster: LocalCluster, node: int, topic: str) -> dict[int, Any]:
    """What one node's Metadata (v12) says of each partition of ``topic``."""
    ask = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name=topic)],
                          allow_auto_topic_creation=False, include_topic_authorized_operations=False)  # fmt: skip
    [answer] = _raw(cluster, node, ask, MetadataResponse, 12).topics
    return {p.partition_index: p for p in answer.partitions}


def test_every_node_names_a_new_partitions_leader_once_its_replica_does(kafka_cluster: LocalCluster) -> None:
    """A node that does not replicate a partition asks its replica for the leader it knows none of, rather
    than answer LEADER_NOT_AVAILABLE from a peer poll up to a second old: checked the moment each replica
    first names itself leader (a client that bootstraps elsewhere than where it saw the topic made, as
    kafka-python's ``offsets_for_times`` does, otherwise skips the partition)."""
    topic = unique("fresh")
    create = CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
        name=topic, num_partitions=3, replication_factor=1, assignments=[], configs=[])],
        timeout_ms=10000, validate_only=False)  # fmt: skip
    assert [t.error_code for t in _raw(kafka_cluster, 1, create, CreateTopicsResponse, 7).topics] == [0]
    replicas = {index: p.replica_nodes for index, p in _partitions(kafka_cluster, 1, topic).items()}
    assert sorted(replicas) == [0, 1, 2] and all(len(r) == 1 for r in replicas.values())
    for partition, [replica] in sorted(replicas.items()):
        wait_for(lambda: _partitions(kafka_cluster, replica, topic)[partition].leader_id == replica,  # noqa: B023
                 15, f"partition {partition} led by its replica", interval=0.01)  # fmt: skip
        named = {n: _partitions(kafka_cluster, n, topic)[partition] for n in (1, 2, 3)}
        assert {n: (p.error_code, p.leader_id) for n, p in named.items()} == {n: (0, replica) for n in (1, 2, 3)}
