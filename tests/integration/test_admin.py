"""Admin and AsyncAdmin against three real node processes: topic lifecycle, cluster view, error codes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from clients import Admin
from clients.aio import AsyncAdmin
from clients.protocol import BrokerError, ErrorCode
from cluster.config import free_ports
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("admin"), 3)
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture(scope="module")
def dup_topic(cluster: LocalCluster) -> str:
    cluster.create_topic("dup", partitions=1, rf=3)
    return "dup"


def dead_url() -> str:
    """A loopback URL nothing listens on (a port just found free)."""
    return f"http://127.0.0.1:{free_ports(1)[0]}"


def test_topic_lifecycle_and_cluster_description(cluster):
    admin = Admin(cluster.url(2))
    created = admin.create_topic("orders", partitions=4, replication_factor=3, config={"retention.ms": 60_000})
    assert created["name"] == "orders"
    assert len(created["partitions"]) == 4
    assert created["replication_factor"] == 3
    desc = admin.wait_for_leaders("orders", timeout_s=30)
    assert [p["partition"] for p in desc["partitions"]] == [0, 1, 2, 3]
    assert all(sorted(p["replicas"]) == [1, 2, 3] for p in desc["partitions"])
    assert all(p["leader_url"] in cluster.urls for p in desc["partitions"])
    assert int(desc["config"]["retention.ms"]) == 60_000
    assert {"name": "orders", "partitions": 4, "replication_factor": 3} in admin.list_topics()
    meta = admin.metadata(["orders"])
    assert [t["name"] for t in meta["topics"]] == ["orders"]
    view = admin.describe_cluster()
    assert sorted(n["id"] for n in view["nodes"]) == [1, 2, 3]
    assert sorted(n["url"] for n in view["nodes"]) == sorted(cluster.urls)
    assert view["controller_leader"] in (1, 2, 3)
    admin.delete_topic("orders")
    # Deletion is committed by the controller; the answering node's view follows (as Kafka's metadata does)
    wait_for(lambda: "orders" not in [t["name"] for t in admin.list_topics()], 10, "deletion seen by node 2")
    with pytest.raises(BrokerError) as e:
        admin.describe_topic("orders")
    assert e.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"name": "dup", "partitions": 1, "replication_factor": 3}, ErrorCode.TOPIC_ALREADY_EXISTS),
        ({"name": "rf5", "partitions": 1, "replication_factor": 5}, ErrorCode.INVALID_REPLICATION_FACTOR),
        ({"name": "p0", "partitions": 0, "replication_factor": 3}, ErrorCode.INVALID_PARTITIONS),
        ({"name": "bad/name", "partitions": 1, "replication_factor": 3}, ErrorCode.INVALID_TOPIC),
        ({"name": "", "partitions": 1, "replication_factor": 3}, ErrorCode.INVALID_TOPIC),
        (
            {"name": "cfg", "partitions": 1, "replication_factor": 3, "config": {"retention.ms": "soon"}},
            ErrorCode.INVALID_CONFIG,
        ),
    ],
)
def test_create_topic_errors_carry_the_broker_error_code(cluster, dup_topic, kwargs, code):
    admin = Admin(cluster.urls)
    with pytest.raises(BrokerError) as e:
        admin.create_topic(**kwargs)
    assert e.value.error_code is code
    assert e.value.retriable is False
    if code is not ErrorCode.TOPIC_ALREADY_EXISTS:  # bad input changes nothing
        assert kwargs["name"] not in [t["name"] for t in admin.list_topics()]


def test_delete_unknown_topic_is_unknown_topic_or_partition(cluster):
    with pytest.raises(BrokerError) as e:
        Admin(cluster.urls).delete_topic("never-created")
    assert e.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_unreachable_bootstrap_urls_fail_over_then_raise_network_exception(cluster):
    # A dead first URL: the next one answers
    admin = Admin([dead_url(), cluster.url(3)])
    assert sorted(n["id"] for n in admin.describe_cluster()["nodes"]) == [1, 2, 3]
    # Nothing reachable: a retriable NETWORK_EXCEPTION, not an OSError
    with pytest.raises(BrokerError) as e:
        Admin([dead_url(), dead_url()], request_timeout_ms=2000).list_topics()
    assert e.value.error_code is ErrorCode.NETWORK_EXCEPTION
    assert e.value.retriable is True
    with pytest.raises(BrokerError) as e:
        Admin("not-a-url")
    assert e.value.error_code is ErrorCode.INVALID_REQUEST


def test_async_admin_is_a_twin_of_admin(cluster):
    async def run() -> None:
        async with AsyncAdmin([dead_url(), cluster.url(1)]) as admin:
            created = await admin.create_topic("async-t", partitions=2, replication_factor=3)
            assert len(created["partitions"]) == 2
            desc = await admin.wait_for_leaders("async-t", timeout_s=30)
            assert all(p["leader"] in (1, 2, 3) for p in desc["partitions"])
            assert "async-t" in [t["name"] for t in await admin.list_topics()]
            assert (await admin.describe_cluster())["controller_leader"] in (1, 2, 3)
            assert [t["name"] for t in (await admin.metadata(["async-t"]))["topics"]] == ["async-t"]
            with pytest.raises(BrokerError) as e:
                await admin.create_topic("async-t", partitions=2, replication_factor=3)
            assert e.value.error_code is ErrorCode.TOPIC_ALREADY_EXISTS
            await admin.delete_topic("async-t")
            async with asyncio.timeout(10):  # the answering node's view follows the controller
                while "async-t" in [t["name"] for t in await admin.list_topics()]:  # noqa: ASYNC110 - remote state
                    await asyncio.sleep(0.05)
            with pytest.raises(BrokerError) as e:
                await admin.describe_topic("async-t")
            assert e.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        async with AsyncAdmin([dead_url()], request_timeout_ms=2000) as dead:
            with pytest.raises(BrokerError) as e:
                await dead.list_topics()
            assert e.value.error_code is ErrorCode.NETWORK_EXCEPTION

    asyncio.run(run())
