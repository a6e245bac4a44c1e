"""Growing a topic and changing its config on three real node processes (Kafka's CreatePartitions and
IncrementalAlterConfigs): new partitions get leaders and serve, clients pick them up, refusals change nothing,
altered configs hold on every node, and the CLI does the same."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from clients import Admin
from clients.aio import AsyncAdmin
from clients.consumer import Consumer
from clients.producer import Producer
from clients.protocol import BrokerError, ErrorCode
from cluster.topics import TOPIC_CONFIG_DEFAULTS
from tests.support.cluster import REPO, LocalCluster, http, wait_for

pytestmark = pytest.mark.integration

NODES = (1, 2, 3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("topic-admin"), 3, retention_check_interval_s=0.5)
    try:
        yield c.start()
    finally:
        c.close()


def counts(cluster: LocalCluster, topic: str) -> list[int]:
    """The topic's partition count as each node's metadata shows it."""
    out = []
    for node in NODES:
        status, body = http("GET", cluster.url(node) + f"/v1/metadata?topics={topic}", timeout=10)
        assert status == 200, body
        out.append(len(body["topics"][0]["partitions"]))
    return out


def produce(cluster: LocalCluster, topic: str, via: int, value: bytes, **fields: Any) -> tuple[int, Any]:
    """The convenience produce of one record (routed to its partition's leader)."""
    record = {"value": base64.b64encode(value).decode(), **fields}
    return http("POST", cluster.url(via) + f"/v1/topics/{topic}/records", {"records": [record], "timeout_ms": 10_000})


def txbroker(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "cluster", *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=REPO)  # fmt: skip


def test_a_grown_topic_places_leads_and_serves_every_new_partition(cluster: LocalCluster) -> None:
    cluster.create_topic("grow", partitions=2, rf=3)
    admin = Admin(cluster.url(2))  # not necessarily the controller leader: forwarded
    before = admin.describe_topic("grow")
    grown = admin.create_partitions("grow", 5)
    assert [p["partition"] for p in grown["partitions"]] == [0, 1, 2, 3, 4]
    assert grown["replication_factor"] == 3 and grown["topic_id"] == before["topic_id"]
    # every node knows the new partitions when the call returns
    assert counts(cluster, "grow") == [5, 5, 5]
    # the round-robin of creation goes on: preferred leaders keep rotating over the nodes
    leaders = [p["replicas"][0] for p in grown["partitions"]]
    assert all(leaders[i + 1] == leaders[i] % 3 + 1 for i in range(4)), leaders
    assert all(sorted(p["replicas"]) == [1, 2, 3] for p in grown["partitions"])
    assert admin.wait_for_leaders("grow", timeout_s=30)
    with Producer(cluster.urls) as producer:
        for p in range(5):
            for i in range(3):
                md = producer.send("grow", value=f"p{p}-{i}".encode(), partition=p).result(timeout=30)
                assert (md.partition, md.offset) == (p, i)
    consumer = Consumer(cluster.urls, auto_offset_reset="earliest")
    try:
        consumer.assign([("grow", p) for p in range(5)])
        got: dict[int, list[bytes]] = {}

        def all_read() -> bool:
            for r in consumer.poll(timeout_ms=500):
                got.setdefault(r.partition, []).append(r.value or b"")
            return sum(map(len, got.values())) >= 15

        wait_for(all_read, 30, "every record of every partition read back")
        assert got == {p: [f"p{p}-{i}".encode() for i in range(3)] for p in range(5)}
    finally:
        consumer.close()


def test_explicit_assignments_place_the_new_partitions(cluster: LocalCluster) -> None:
    cluster.create_topic("placed", partitions=1, rf=2)
    grown = Admin(cluster.url(3)).create_partitions("placed", 3, [[3, 1], [2, 3]])
    assert [p["replicas"] for p in grown["partitions"][1:]] == [[3, 1], [2, 3]]
    cluster.wait_leaders("placed", 3)


def test_a_keyless_producer_spreads_over_new_partitions_after_a_metadata_refresh(cluster: LocalCluster) -> None:
    cluster.create_topic("spread", partitions=2, rf=3)
    # small batches: the sticky partitioner moves on after every batch or two
    fast = Producer(cluster.urls, metadata_max_age_ms=1000, batch_size=256, linger_ms=0)
    slow = Producer(cluster.urls)  # metadata_max_age_ms of 5 minutes: learns the partition from the unknown one
    try:

        def burst() -> set[int]:  # a full batch makes the sticky partitioner move on
            futures = [fast.send("spread", value=b"v" * 100) for _ in range(40)]
            return {f.result(timeout=30).partition for f in futures}

        used = burst()
        assert used == {0, 1}
        assert slow.send("spread", value=b"x", partition=1).result(timeout=30).partition == 1
        Admin(cluster.url(1)).create_partitions("spread", 4)
        cluster.wait_leaders("spread", 4)
        md = slow.send("spread", value=b"x", partition=3).result(timeout=30)
        assert (md.partition, md.offset) == (3, 0)

        def spread_over_all() -> bool:
            used.update(burst())
            return used == {0, 1, 2, 3}

        wait_for(spread_over_all, 30, "key-less records on the new partitions", interval=0.2)
    finally:
        fast.close()
        slow.close()


def test_a_group_member_is_assigned_the_new_partitions_and_reads_them(cluster: LocalCluster) -> None:
    cluster.create_topic("grp-grow", partitions=2, rf=3)
    member = Consumer(cluster.urls, group_id="g-grow", auto_offset_reset="earliest", heartbeat_interval_ms=200,
                      enable_auto_commit=False)  # fmt: skip
    try:
        member.subscribe(["grp-grow"])
        wait_for(lambda: member.poll(50) is not None and len(member.assignment()) == 2, 30, "the first assignment")
        Admin(cluster.url(1)).create_partitions("grp-grow", 4)
        cluster.wait_leaders("grp-grow", 4)
        with Producer(cluster.urls) as producer:
            producer.send("grp-grow", value=b"on-3", partition=3).result(timeout=30)
        got: list[tuple[int, bytes]] = []

        def read_from_partition_3() -> bool:
            got.extend((r.partition, r.value or b"") for r in member.poll(50))
            return (3, b"on-3") in got

        wait_for(read_from_partition_3, 30, "the group's rebalance onto the new partitions", interval=0)
        assert member.assignment() == {("grp-grow", p) for p in range(4)}
    finally:
        member.close()


def test_a_decrease_an_equal_count_and_bad_input_are_refused_with_nothing_changed(cluster: LocalCluster) -> None:
    cluster.create_topic("fixed", partitions=3, rf=3)
    refusals = [
        ({"count": 3}, 400, "INVALID_PARTITIONS"),
        ({"count": 2}, 400, "INVALID_PARTITIONS"),
        ({"count": 0}, 400, "INVALID_PARTITIONS"),
        ({"count": 1_000_000}, 400, "INVALID_PARTITIONS"),  # above max_partitions_per_topic
        ({"count": "5"}, 400, "INVALID_PARTITIONS"),
        ({"count": 5.0}, 400, "INVALID_PARTITIONS"),
        ({"count": True}, 400, "INVALID_PARTITIONS"),
        ({}, 400, "INVALID_PARTITIONS"),
        ({"count": 5, "extra": 1}, 400, "INVALID_REQUEST"),
        ({"count": 5, "assignments": [[1, 2, 3]]}, 400, "INVALID_REPLICA_ASSIGNMENT"),  # one list for two
        ({"count": 4, "assignments": [[1, 2]]}, 400, "INVALID_REPLICA_ASSIGNMENT"),  # fewer than the RF
        ({"count": 4, "assignments": [[1, 1, 2]]}, 400, "INVALID_REPLICA_ASSIGNMENT"),
        ({"count": 4, "assignments": [[1, 2, 9]]}, 400, "INVALID_REPLICA_ASSIGNMENT"),
    ]
    for via in NODES:
        for body, status, code in refusals:
            got, answer = http("POST", cluster.url(via) + "/v1/topics/fixed/partitions", body)
            assert (got, answer.get("error_code")) == (status, code), (via, body, answer)
        got, answer = http("POST", cluster.url(via) + "/v1/topics/no-such-topic/partitions", {"count": 4})
        assert (got, answer["error_code"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION")
        got, answer = http("POST", cluster.url(via) + "/v1/topics/fixed/partitions", raw=b"{not json")
        assert (got, answer["error_code"]) == (400, "INVALID_REQUEST")
    admin = Admin(cluster.url(1))
    for count in (3, 2):
        with pytest.raises(BrokerError) as ei:
            admin.create_partitions("fixed", count)
        assert ei.value.error_code is ErrorCode.INVALID_PARTITIONS
    assert counts(cluster, "fixed") == [3, 3, 3]
    assert len(admin.describe_topic("fixed")["partitions"]) == 3


def test_altered_configs_hold_on_every_node_and_null_deletes_the_override(cluster: LocalCluster) -> None:
    cluster.create_topic("cfg", partitions=1, rf=3)
    admin = Admin(cluster.url(3))
    described = admin.describe_topic_config("cfg")
    assert described == {"topic": "cfg", "config": TOPIC_CONFIG_DEFAULTS, "overrides": {}}
    altered = admin.alter_topic_config("cfg", {"max.message.bytes": 2048, "retention.ms": "86400000"})
    assert altered["overrides"] == {"max.message.bytes": 2048, "retention.ms": 86_400_000}
    assert altered["config"] == {**TOPIC_CONFIG_DEFAULTS, **altered["overrides"]}
    for via in NODES:  # every node took the new limit when the call returned
        assert asyncio.run(_describe_async(cluster.url(via))) == altered
        status, body = produce(cluster, "cfg", via, b"x" * 4000)
        assert (status, body["error_code"]) == (413, "RECORD_TOO_LARGE"), body
        status, body = produce(cluster, "cfg", via, b"x" * 1000)
        assert status == 200, body
    # the binary/JSON produce path at the leader names it MESSAGE_TOO_LARGE
    leader = cluster.leader("cfg", 0)
    assert leader is not None
    big = {"topic": "cfg", "partition": 0, "producer_id": -1, "producer_epoch": -1, "base_sequence": -1,
           "records": [{"value": base64.b64encode(b"y" * 4000).decode()}]}  # fmt: skip
    status, body = http("POST", cluster.url(leader) + "/v1/produce", {"acks": "all", "timeout_ms": 10_000,
                                                                        "partitions": [big]})  # fmt: skip
    assert (status, body["error_code"]) == (413, "MESSAGE_TOO_LARGE"), body
    with Producer(cluster.urls, retries=0) as producer, pytest.raises(BrokerError) as ei:
        producer.send("cfg", value=b"z" * 4000).result(timeout=30)
    assert ei.value.error_code in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_TOO_LARGE)
    # null deletes the override: back to the default limit
    reverted = admin.alter_topic_config("cfg", {"max.message.bytes": None})
    assert reverted["overrides"] == {"retention.ms": 86_400_000}
    assert reverted["config"]["max.message.bytes"] == TOPIC_CONFIG_DEFAULTS["max.message.bytes"]
    for via in NODES:
        status, body = produce(cluster, "cfg", via, b"x" * 4000)
        assert status == 200, body
    assert admin.describe_topic("cfg")["config"] == {"retention.ms": 86_400_000}


async def _describe_async(url: str) -> dict[str, Any]:
    async with AsyncAdmin(url) as admin:
        return await admin.describe_topic_config("cfg")


def test_a_bad_config_change_is_refused_with_nothing_changed(cluster: LocalCluster) -> None:
    cluster.create_topic("cfg-bad", partitions=1, rf=3)
    admin = Admin(cluster.url(1))
    before = admin.alter_topic_config("cfg-bad", {"retention.ms": 60_000})
    refusals = [
        ({"no.such.key": 1}, "INVALID_CONFIG"),
        ({"no.such.key": None}, "INVALID_CONFIG"),
        ({"retention.ms": "soon"}, "INVALID_CONFIG"),
        ({"retention.ms": 1.5}, "INVALID_CONFIG"),
        ({"retention.ms": -2}, "INVALID_CONFIG"),
        ({"max.message.bytes": 10}, "INVALID_CONFIG"),
        ({"cleanup.policy": "compact"}, "INVALID_CONFIG"),
        ({"retention.ms": 5, "no.such.key": 1}, "INVALID_CONFIG"),  # the good key is not applied either
        ({"retention.ms": None, "max.message.bytes": 1}, "INVALID_CONFIG"),
        ({}, "INVALID_REQUEST"),
    ]
    for via in NODES:
        for body, code in refusals:
            status, answer = http("PATCH", cluster.url(via) + "/v1/topics/cfg-bad/config", body)
            assert (status, answer.get("error_code")) == (400, code), (via, body, answer)
        status, answer = http("PATCH", cluster.url(via) + "/v1/topics/cfg-bad/config", [1, 2])
        assert status == 400, answer
        status, answer = http("PATCH", cluster.url(via) + "/v1/topics/no-such-topic/config", {"retention.ms": 5})
        assert (status, answer["error_code"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION")
        status, answer = http("GET", cluster.url(via) + "/v1/topics/no-such-topic/config")
        assert (status, answer["error_code"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION")
        status, answer = http("GET", cluster.url(via) + "/v1/topics/cfg-bad/config")
        assert (status, answer) == (200, before)
    with pytest.raises(BrokerError) as ei:
        admin.alter_topic_config("cfg-bad", {"retention.ms": "soon"})
    assert ei.value.error_code is ErrorCode.INVALID_CONFIG


def test_a_shorter_retention_applies_on_every_replica(cluster: LocalCluster) -> None:
    cluster.create_topic("ret", partitions=1, rf=3)
    hour_ago = int(time.time() * 1000) - 3_600_000
    for i in range(3):
        status, body = produce(cluster, "ret", 1, b"old", timestamp=hour_ago + i)
        assert status == 200, body
    status, body = produce(cluster, "ret", 1, b"new")
    assert status == 200, body

    def starts() -> list[int]:
        return [cluster.partition_meta("ret", 0, via)["log_start_offset"] for via in NODES]

    assert starts() == [0, 0, 0]  # a week's retention keeps them
    Admin(cluster.url(2)).alter_topic_config("ret", {"retention.ms": 600_000})
    wait_for(lambda: starts() == [3, 3, 3], 30, "the hour-old batches removed on every replica")
    assert all(cluster.partition_meta("ret", 0, via)["high_watermark"] == 4 for via in NODES)


def test_the_cli_adds_partitions_and_alters_configs(cluster: LocalCluster) -> None:
    cluster.create_topic("cli-t", partitions=1, rf=3)
    url = cluster.url(2)
    res = txbroker("topic", "add-partitions", "cli-t", "--count", "3", "--bootstrap", url)
    assert res.returncode == 0, res.stderr
    assert "topic cli-t has 3 partitions" in res.stdout
    res = txbroker("topic", "add-partitions", "cli-t", "--count", "2", "--bootstrap", url)
    assert res.returncode == 1 and "INVALID_PARTITIONS" in res.stderr, res
    every = "1:2:3,2:3:1,3:1:2,2:1:3"  # kafka-topics.sh's form: every partition's, the existing ones' left out
    res = txbroker(
        "topic", "add-partitions", "cli-t", "--count", "4", "--replica-assignment", every, "--bootstrap", url
    )
    assert res.returncode == 0, res.stderr
    assert Admin(url).describe_topic("cli-t")["partitions"][3]["replicas"] == [2, 1, 3]
    res = txbroker("topic", "alter-config", "cli-t", "--set", "retention.ms=60000", "--set", "max.message.bytes=4096",
                   "--bootstrap", url)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "retention.ms=60000\t(override)" in res.stdout and "max.message.bytes=4096\t(override)" in res.stdout
    res = txbroker("topic", "alter-config", "cli-t", "--delete", "max.message.bytes", "--bootstrap", url)
    assert res.returncode == 0, res.stderr
    res = txbroker("topic", "describe-config", "cli-t", "--bootstrap", url)
    assert res.returncode == 0, res.stderr
    assert "retention.ms=60000\t(override)" in res.stdout
    assert f"max.message.bytes={TOPIC_CONFIG_DEFAULTS['max.message.bytes']}\t(default)" in res.stdout
    res = txbroker("topic", "alter-config", "cli-t", "--set", "bogus=1", "--bootstrap", url)
    assert res.returncode == 1 and "INVALID_CONFIG" in res.stderr, res
    res = txbroker("topic", "describe-config", "no-such-topic", "--bootstrap", url)
    assert res.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in res.stderr, res
    assert Admin(url).describe_topic_config("cli-t")["overrides"] == {"retention.ms": 60_000}
    assert counts(cluster, "cli-t") == [4, 4, 4]
