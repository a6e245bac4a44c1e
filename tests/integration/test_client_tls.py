"""The clients over HTTPS with credentials, against a real TLS server (a fake broker with a throwaway CA).

TLS on the nodes themselves is tested with the node; this covers the client
plumbing on every transport: the blocking ``Admin`` (urllib), the aiohttp
session (``AsyncAdmin``, metadata, consumers) and the producer's lean HTTP/1.1
pool (``POST /v1/produce``): the CA file is what makes the server trusted,
the Basic header reaches the server on every request, a client certificate is
presented, and a 401/403 is raised at once, never retried.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clients import AclBinding, Admin, Producer
from clients.aio import AsyncAdmin, AsyncConsumer, AsyncProducer, Http1Pool
from clients.protocol import BrokerError, ErrorCode
from tests.support.fake_https_broker import FakeHttpsBroker

pytestmark = pytest.mark.integration

Factory = Callable[..., FakeHttpsBroker]


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Factory]:
    made: list[FakeHttpsBroker] = []

    def make(**kwargs: object) -> FakeHttpsBroker:
        d = tmp_path / f"broker-{len(made)}"
        d.mkdir()
        b = FakeHttpsBroker(d, **kwargs).start()  # type: ignore[arg-type]
        made.append(b)
        return b

    try:
        yield make
    finally:
        for b in made:
            b.close()


@pytest.fixture
def broker(broker_factory: Factory) -> FakeHttpsBroker:
    return broker_factory()


def creds(b: FakeHttpsBroker, password: str | None = None) -> dict[str, str]:
    return {"sasl_plain_username": b.username, "sasl_plain_password": password or b.password,
            "ssl_cafile": str(b.ca.ca_file)}  # fmt: skip


def test_sync_admin_over_https_sends_basic_credentials_on_every_request(broker: FakeHttpsBroker) -> None:
    admin = Admin(broker.url, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", **creds(broker))
    assert [t["name"] for t in admin.list_topics()] == ["t"]
    assert admin.whoami() == "User:alice"
    admin.upsert_user("b o/b", "pw", mechanism="SCRAM-SHA-512", iterations=8192)
    assert admin.list_users() == [{"name": "bob", "mechanisms": ["SCRAM-SHA-256"]}]
    admin.delete_user("bob")
    seen = broker.requests()
    assert len(seen) == 5
    assert all(s.tls and s.authorization == broker.expected_authorization() for s in seen)
    put = broker.requests("/v1/users/b")[0]
    assert put.method == "PUT" and put.path_qs == "/v1/users/b%20o%2Fb"
    assert b'"mechanism": "SCRAM-SHA-512"' in put.body and b'"iterations": 8192' in put.body


def test_async_admin_acl_calls(broker: FakeHttpsBroker) -> None:
    async def main() -> None:
        async with AsyncAdmin(broker.url, **creds(broker)) as admin:
            await admin.create_acls([AclBinding("User:bob", "TOPIC", "t", "READ"),
                                     {"principal": "User:*", "resource_type": "GROUP", "resource_name": "g",
                                      "operation": "READ", "permission": "ALLOW"}])  # fmt: skip
            listed = await admin.describe_acls(principal="User:bob", resource_type="TOPIC", operation=None)
            assert listed[0]["resource_name"] == "t"
            deleted = await admin.delete_acls([{"principal": "User:bob"}, AclBinding("User:c", "TOPIC", "x", "ALL")])
            assert [d["principal"] for d in deleted] == ["User:bob", "User:bob"]  # one request per filter
            assert await admin.whoami() == "User:alice"

    asyncio.run(main())
    seen = broker.requests("/v1/acls")
    assert [s.method for s in seen] == ["POST", "GET", "DELETE", "DELETE"]
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(seen[1].path_qs).query)
    assert query == {"principal": ["User:bob"], "resource_type": ["TOPIC"]}
    assert b'"acls": [{"principal": "User:bob", "host": "*", "resource_type": "TOPIC"' in seen[0].body
    assert json.loads(seen[2].body) == {"principal": "User:bob"}
    assert json.loads(seen[3].body) == AclBinding("User:c", "TOPIC", "x", "ALL").to_json()
    assert all(s.authorization == broker.expected_authorization() for s in broker.requests())


def test_producer_over_https_uses_the_lean_pool_with_credentials(broker: FakeHttpsBroker) -> None:
    async def main() -> None:
        producer = AsyncProducer(broker.url, enable_idempotence=False, linger_ms=0, **creds(broker))
        try:
            md = await (await producer.send("t", b"v", partition=0))
            assert (md.topic, md.partition, md.offset) == ("t", 0, 0)
        finally:
            await producer.close()

    asyncio.run(main())
    produce = broker.requests("/v1/produce")
    assert len(produce) == 1 and produce[0].tls
    assert produce[0].authorization == broker.expected_authorization()
    # the thread-friendly Producer takes the same arguments
    p = Producer(broker.url, enable_idempotence=False, linger_ms=0, **creds(broker))
    try:
        assert p.send("t", b"w", partition=0).result(10).offset == 0
    finally:
        p.close()
    assert len(broker.requests("/v1/produce")) == 2


def test_without_the_ca_file_the_server_is_not_trusted(broker: FakeHttpsBroker) -> None:
    no_ca = {"sasl_plain_username": broker.username, "sasl_plain_password": broker.password}
    with pytest.raises(BrokerError) as info:
        Admin(broker.url, **no_ca).list_topics()
    assert info.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "certificate" in info.value.message

    async def main() -> None:
        async with AsyncAdmin(broker.url, **no_ca) as admin:
            with pytest.raises(BrokerError) as ainfo:
                await admin.list_topics()
            assert ainfo.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
        pool = Http1Pool()
        try:
            with pytest.raises(BrokerError) as pinfo:
                await pool.post(broker.url + "/v1/produce", b"", "application/x-test", 5.0)
            assert pinfo.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
        finally:
            await pool.close()

    asyncio.run(main())
    assert broker.requests() == []  # no request got past the handshake


def test_wrong_password_raises_sasl_authentication_failed_once(broker: FakeHttpsBroker) -> None:
    """Two bootstrap URLs (both the same server): a 401 is neither retried nor asked of the next node."""
    urls = [broker.url, broker.url.replace("127.0.0.1", "localhost")]
    bad = creds(broker, password="wrong")
    with pytest.raises(BrokerError) as info:
        Admin(urls, **bad).list_topics()
    assert info.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert len(broker.requests()) == 1

    async def produce() -> None:
        producer = AsyncProducer(urls, retry_backoff_ms=10, **bad)
        try:
            with pytest.raises(BrokerError) as pinfo:
                await producer.send("t", b"v")
            assert pinfo.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
        finally:
            await producer.close()

    asyncio.run(produce())
    # one metadata request (and the idempotent producer's id request, sent in the background): none repeated
    assert len(broker.requests("/v1/metadata")) == 1
    assert len(broker.requests("/v1/producers/init")) <= 1

    async def consume() -> None:
        consumer = AsyncConsumer(urls, **bad)
        try:
            with pytest.raises(BrokerError) as cinfo:
                await consumer.partitions_for_topic("t")
            assert cinfo.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
        finally:
            await consumer.close()

    asyncio.run(consume())
    assert len(broker.requests("/v1/metadata")) == 2  # the producer's one and the consumer's one
    assert {s.path_qs.split("?")[0] for s in broker.requests()} <= {"/v1/topics", "/v1/metadata", "/v1/producers/init"}


def test_forbidden_raises_its_authorization_code_without_retry(broker_factory: Factory) -> None:
    broker = broker_factory(deny="TOPIC_AUTHORIZATION_FAILED")

    async def main() -> None:
        producer = AsyncProducer(broker.url, enable_idempotence=False, linger_ms=0, retry_backoff_ms=10,
                                 **creds(broker))  # fmt: skip
        try:
            fut = await producer.send("t", b"v", partition=0)
            with pytest.raises(BrokerError) as info:
                await asyncio.wait_for(fut, 10)
            assert info.value.error_code is ErrorCode.TOPIC_AUTHORIZATION_FAILED
        finally:
            await producer.close()

    asyncio.run(main())
    assert len(broker.requests("/v1/produce")) == 1
    with pytest.raises(BrokerError) as info:
        Admin(broker.url, **creds(broker)).create_acls([AclBinding("User:x", "TOPIC", "t", "READ")])
    assert info.value.error_code is ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert len(broker.requests("/v1/acls")) == 1


def test_client_certificate_is_presented(broker_factory: Factory) -> None:
    broker = broker_factory(client_auth=True)
    alice = broker.ca.issue("alice-client", client=True)
    admin = Admin(broker.url, ssl_cafile=str(broker.ca.ca_file), ssl_certfile=str(alice.cert),
                  ssl_keyfile=str(alice.key), security_protocol="SSL")  # fmt: skip
    assert admin.whoami() == "User:alice-client"
    assert broker.requests()[0].authorization is None
    with pytest.raises(BrokerError):  # without a certificate the handshake fails
        Admin(broker.url, ssl_cafile=str(broker.ca.ca_file)).whoami()


def test_spark_http_sends_credentials_over_tls_and_stops_at_401(broker: FakeHttpsBroker) -> None:
    from spark_io import _http
    from spark_io.broker import BrokerClient
    from spark_io.options import Credentials

    good = Credentials(broker.username, broker.password, str(broker.ca.ca_file))
    try:
        client = BrokerClient(broker.url, credentials=good)
        assert client.partition_count("t") == 1
        assert broker.requests()[-1].authorization == broker.expected_authorization()
        bad = BrokerClient([broker.url, broker.url.replace("127.0.0.1", "localhost")],
                           credentials=Credentials(broker.username, "wrong", str(broker.ca.ca_file)))  # fmt: skip
        before = len(broker.requests())
        with pytest.raises(BrokerError) as info:
            bad.retrying(lambda: bad.partition_count("t"), "metadata")
        assert info.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
        assert len(broker.requests()) == before + 1
        with pytest.raises(BrokerError) as info:
            BrokerClient(broker.url, credentials=Credentials(broker.username, broker.password)).partition_count("t")
        assert info.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED  # no CA: not trusted
    finally:
        _http.close_all()
