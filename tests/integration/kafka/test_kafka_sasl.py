"""SASL over TLS on the Kafka listener of a secure cluster: PLAIN and SCRAM-SHA-512, the users' ACLs.

A 3-node cluster as ``txbroker cluster init --secure`` writes it (TLS, users,
ACLs; ``admin`` is a super user), reached by confluent-kafka and kafka-python
with ``SASL_SSL``. Users and ACLs are made through the HTTP API, so both doors
share them.
"""

from __future__ import annotations

import base64
import socket
import ssl
import struct
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.errors import KafkaError as KpKafkaError
from kafka.net.sasl.scram import ScramClient
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from tests.integration.kafka.conftest import unique
from tests.support.cluster import LocalCluster, cluster_init_secure, http, wait_for

pytestmark = pytest.mark.integration

_PASSWORD = "s3cret-for-tests"
#: READ on the consumer groups ``_consume`` makes (``unique("g")``: g-N)
_GROUPS = ("GROUP", "g-*", "READ")


class Secure:
    def __init__(self, cluster: LocalCluster, admin: dict[str, Any]) -> None:
        self.cluster = cluster
        self.admin = admin
        self.ca = str(cluster.dir / admin["ssl_cafile"])
        self.auth = "Basic " + base64.b64encode(f"admin:{admin['password']}".encode()).decode()

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return http(method, self.cluster.url(1) + path, body, headers={"Authorization": self.auth},
                    context=self.cluster.ssl_context, timeout=15)  # fmt: skip

    def conf(self, user: str, password: str, mechanism: str) -> dict[str, Any]:
        return {"bootstrap.servers": self.cluster.bootstrap_servers, "security.protocol": "SASL_SSL",
                "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
                "ssl.ca.location": self.ca, "socket.timeout.ms": 10000}  # fmt: skip

    def kp_conf(self, user: str, password: str, mechanism: str) -> dict[str, Any]:
        return {"bootstrap_servers": self.cluster.bootstrap_servers, "security_protocol": "SASL_SSL",
                "sasl_mechanism": mechanism, "sasl_plain_username": user, "sasl_plain_password": password,
                "ssl_cafile": self.ca, "request_timeout_ms": 15000}  # fmt: skip

    def user(self, prefix: str, *acls: tuple[str, str, str], mechanism: str = "SCRAM-SHA-512") -> str:
        """A new user with ``acls`` ((resource_type, resource_name, operation), prefixed names end in '*')."""
        name = unique(prefix)
        status, body = self.http("PUT", f"/v1/users/{name}", {"password": _PASSWORD, "mechanism": mechanism})
        assert status in (200, 201), body
        items = [{"principal": f"User:{name}", "resource_type": rt,
                  "resource_name": rn.rstrip("*") if rn.endswith("*") and rn != "*" else rn,
                  "pattern_type": "PREFIXED" if rn.endswith("*") and rn != "*" else "LITERAL",
                  "operation": op, "permission": "ALLOW"} for rt, rn, op in acls]  # fmt: skip
        if items:
            status, body = self.http("POST", "/v1/acls", {"acls": items})
            assert status == 201, body
        return name

    def topic(self) -> str:
        name = unique("sasl")
        status, body = self.http("POST", "/v1/topics", {"name": name, "partitions": 1, "replication_factor": 3})
        assert status == 201, body

        def led() -> bool:
            status, body = self.http("GET", f"/v1/topics/{name}")
            return status == 200 and body["partitions"][0]["leader"] is not None

        wait_for(led, 30, f"a leader of {name}")
        return name


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    d: Path = tmp_path_factory.mktemp("kafka-sasl")
    res = cluster_init_secure(d)
    assert res.returncode == 0, res.stderr
    cluster = LocalCluster.from_dir(d)
    try:
        cluster.start_live()
        s = Secure(cluster, tomllib.loads((d / "admin.toml").read_text()))
        wait_for(lambda: s.http("GET", "/v1/whoami")[0] == 200, 60, "the bootstrap admin user")
        yield s
    finally:
        cluster.close()


def _produce(conf: dict[str, Any], topic: str, values: list[bytes]) -> list[Any]:
    producer = Producer({**conf, "acks": "all", "linger.ms": 5, "enable.idempotence": False})
    errors: list[Any] = []
    for v in values:
        producer.produce(topic, value=v, partition=0, on_delivery=lambda err, _m: errors.append(err))
    assert producer.flush(20) == 0
    return errors


def _consume(conf: dict[str, Any], topic: str, n: int, timeout: float = 20) -> list[bytes]:
    consumer = Consumer({**conf, "group.id": unique("g"), "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            for m in consumer.consume(100, 0.5):
                assert m.error() is None, m.error()
                got.append(m.value())
        return got
    finally:
        consumer.close()


def test_confluent_kafka_plain_and_scram_sha_512(secure: Secure) -> None:
    topic = secure.topic()
    user = secure.user("alice", ("TOPIC", topic, "WRITE"), ("TOPIC", topic, "READ"), _GROUPS)
    values = [f"v{i}".encode() for i in range(20)]
    assert _produce(secure.conf(user, _PASSWORD, "PLAIN"), topic, values) == [None] * 20
    assert _consume(secure.conf(user, _PASSWORD, "SCRAM-SHA-512"), topic, 20) == values
    # the admin (a super user; its credential is SCRAM-SHA-256) creates a topic through the Kafka listener
    admin = AdminClient(secure.conf("admin", secure.admin["password"], "SCRAM-SHA-256"))
    name = unique("sasl")
    admin.create_topics([NewTopic(name, 1, 3)])[name].result(timeout=15)
    assert secure.http("GET", f"/v1/topics/{name}")[0] == 200


def test_kafka_python_plain_and_scram_sha_512(secure: Secure) -> None:
    topic = secure.topic()
    user = secure.user("kp", ("TOPIC", topic, "WRITE"), ("TOPIC", topic, "READ"))
    producer = KafkaProducer(**secure.kp_conf(user, _PASSWORD, "SCRAM-SHA-512"), acks="all")  # idempotent
    try:
        for i in range(5):
            producer.send(topic, value=f"kp{i}".encode(), partition=0).get(timeout=15)
    finally:
        producer.close()
    consumer = KafkaConsumer(**secure.kp_conf(user, _PASSWORD, "PLAIN"), enable_auto_commit=False)
    try:
        tp = KpTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(r.value for r in records)
        assert got == [f"kp{i}".encode() for i in range(5)]
    finally:
        consumer.close()


def _refused(producer: Any, errors: list[Any]) -> bool:
    producer.poll(0.1)
    return any(e.code() == KafkaError._AUTHENTICATION for e in errors)


# kafka-python's constructor leaves its wakeup socket pair open when the bootstrap fails
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_transactional_producer_needs_write_on_its_transactional_id(secure: Secure) -> None:
    topic = secure.topic()
    txn_id = unique("txn")
    user = secure.user(
        "tx", ("TOPIC", topic, "WRITE"), ("TOPIC", topic, "READ"), ("TRANSACTIONAL_ID", txn_id, "WRITE"), _GROUPS
    )
    conf = secure.conf(user, _PASSWORD, "SCRAM-SHA-512")
    producer = Producer({**conf, "transactional.id": txn_id, "transaction.timeout.ms": 10000})
    producer.init_transactions(15)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed", partition=0)
    producer.commit_transaction(15)
    assert _consume({**conf, "isolation.level": "read_committed"}, topic, 1) == [b"committed"]
    # another transactional id: TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    other = Producer({**conf, "transactional.id": unique("txn")})
    with pytest.raises(KafkaException) as err:
        other.init_transactions(15)
    assert err.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_a_consumer_group_over_sasl_ssl(secure: Secure) -> None:
    topic = secure.topic()
    user = secure.user("grp", ("TOPIC", topic, "WRITE"), ("TOPIC", topic, "READ"), _GROUPS)
    conf = secure.conf(user, _PASSWORD, "SCRAM-SHA-512")
    assert _produce(conf, topic, [b"a", b"b"]) == [None, None]
    group = unique("g")
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 6000})  # fmt: skip
    try:
        consumer.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            for m in consumer.consume(10, 0.5):
                assert m.error() is None, m.error()
                got.append(m.value())
        assert got == [b"a", b"b"]
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    status, body = secure.http("GET", f"/v1/groups/{group}")
    assert status == 200, body
    assert [(o["topic"], o["partition"], o["offset"]) for o in body["offsets"]] == [(topic, 0, 2)]


def test_wrong_password_is_refused(secure: Secure) -> None:
    user = secure.user("eve")
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        errors: list[Any] = []
        producer = Producer({**secure.conf(user, "wrong", mechanism), "error_cb": errors.append})
        try:
            wait_for(lambda p=producer, e=errors: _refused(p, e), 10, f"{mechanism} refused")
        finally:
            producer.flush(0)
    started = time.monotonic()
    with pytest.raises(KpKafkaError):
        KafkaConsumer(**secure.kp_conf(user, "wrong", "SCRAM-SHA-512"), api_version_auto_timeout_ms=5000)
    assert time.monotonic() - started < 10  # refused, not timed out
    # on the wire: SASL_AUTHENTICATION_FAILED, then the connection is closed
    with _tls_connection(secure) as s:
        assert _call(s, SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 1).error_code == 0
        answer = _call(s, SaslAuthenticateRequest(auth_bytes=f"\0{user}\0wrong".encode()), SaslAuthenticateResponse, 2)
        assert answer.error_code == KafkaError.SASL_AUTHENTICATION_FAILED
        assert _closed(s)
        # the right password works on a new connection
    with _tls_connection(secure) as s:
        assert _call(s, SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 1).error_code == 0
        answer = _call(s, SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{_PASSWORD}".encode()),
                       SaslAuthenticateResponse, 2)  # fmt: skip
        assert answer.error_code == 0


def test_acl_changes_hold_for_connections_already_open(secure: Secure) -> None:
    topic = secure.topic()
    user = secure.user("dave", mechanism="SCRAM-SHA-256")
    with _tls_connection(secure) as s:
        assert _call(s, SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 1).error_code == 0
        answer = _call(s, SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{_PASSWORD}".encode()),
                       SaslAuthenticateResponse, 2)  # fmt: skip
        assert answer.error_code == 0
        named = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)])
        [before] = _call(s, named, MetadataResponse, 12).topics
        assert before.error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED
        status, body = secure.http("POST", "/v1/acls", {"principal": f"User:{user}", "resource_type": "TOPIC",
                                                       "resource_name": topic, "operation": "DESCRIBE",
                                                       "permission": "ALLOW"})  # fmt: skip
        assert status == 201, body
        [after] = _call(s, named, MetadataResponse, 12).topics
        assert after.error_code == 0 and len(after.partitions) == 1


def test_sasl_handshake_v0_takes_raw_tokens(secure: Secure) -> None:
    user = secure.user("raw", mechanism="SCRAM-SHA-512")
    with _tls_connection(secure) as s:
        assert _call(s, SaslHandshakeRequest(mechanism="SCRAM-SHA-512"), SaslHandshakeResponse, 0).error_code == 0
        client = ScramClient(user, _PASSWORD, "SCRAM-SHA-512")
        client.process_server_first_message(_raw_token(s, client.first_message()))
        client.process_server_final_message(_raw_token(s, client.final_message()))  # checks the server's proof
        [meta] = _call(s, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="none")]),
                       MetadataResponse, 12).topics  # fmt: skip
        assert meta.error_code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.UNKNOWN_TOPIC_OR_PART)
    with _tls_connection(secure) as s:
        assert _call(s, SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 0).error_code == 0
        s.sendall(struct.pack(">i", len(f"\0{user}\0wrong")) + f"\0{user}\0wrong".encode())
        assert _closed(s)


def test_unauthenticated_connection_is_refused_before_any_other_api(secure: Secure) -> None:
    with _tls_connection(secure) as s:
        versions = _call(s, ApiVersionsRequest(client_software_name="t", client_software_version="1"),
                         ApiVersionsResponse, 3)  # fmt: skip
        assert versions.error_code == 0 and {17, 36} <= {k.api_key for k in versions.api_keys}
        s.sendall(_frame(MetadataRequest(topics=None), 12, version=12))
        assert _closed(s)
    # an unknown mechanism is refused with the ones offered
    with _tls_connection(secure) as s:
        answer = _call(s, SaslHandshakeRequest(mechanism="GSSAPI"), SaslHandshakeResponse, 1)
        assert answer.error_code == KafkaError.UNSUPPORTED_SASL_MECHANISM
        assert answer.mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    # plain TCP is no way in: the listener speaks TLS only
    host, port = secure.cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.settimeout(10)
        s.sendall(_frame(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3, version=3))
        assert _closed(s)


def test_a_user_without_write_gets_topic_authorization_failed(secure: Secure) -> None:
    topic = secure.topic()
    reader = secure.user("reader", ("TOPIC", topic, "READ"))
    conf = secure.conf(reader, _PASSWORD, "SCRAM-SHA-512")
    producer = Producer({**conf, "acks": "all", "enable.idempotence": False, "retries": 0})
    errors: list[Any] = []
    producer.produce(topic, value=b"nope", partition=0, on_delivery=lambda err, _m: errors.append(err))
    assert producer.flush(20) == 0
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    status, body = secure.http("GET", f"/v1/topics/{topic}")
    assert status == 200 and body["partitions"][0]["high_watermark"] == 0  # nothing written
    # once WRITE is granted the same user writes (a new producer: librdkafka remembers the topic's denial)
    status, body = secure.http("POST", "/v1/acls", {"principal": f"User:{reader}", "resource_type": "TOPIC",
                                                   "resource_name": topic, "operation": "WRITE",
                                                   "permission": "ALLOW"})  # fmt: skip
    assert status == 201, body
    assert _produce(conf, topic, [b"yes"]) == [None]
    # admin APIs are ACL-checked too: no CREATE on the cluster
    admin = AdminClient(conf)
    name = unique("denied")
    with pytest.raises(KafkaException) as err:
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=15)
    assert err.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert secure.http("GET", f"/v1/topics/{name}")[0] == 404


# ---- raw frames over TLS ----------------------------------------------------------------------


class _tls_connection:
    def __init__(self, secure: Secure) -> None:
        host, port = secure.cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
        ctx = ssl.create_default_context(cafile=secure.ca)
        raw = socket.create_connection((host, int(port)), timeout=10)
        self.sock = ctx.wrap_socket(raw, server_hostname=host)
        self.sock.settimeout(10)

    def __enter__(self) -> ssl.SSLSocket:
        return self.sock

    def __exit__(self, *_exc: object) -> None:
        self.sock.close()


def _frame(request: Any, correlation_id: int, version: int | None = None) -> bytes:
    if version is not None:
        request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id="sasl-test")
    return bytes(request.encode(header=True, framed=True))


def _recv(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _call(s: socket.socket, request: Any, response_class: Any, version: int) -> Any:
    request.API_VERSION = version
    s.sendall(_frame(request, 1))
    (size,) = struct.unpack(">i", _recv(s, 4))
    return response_class.decode(_recv(s, size), version=version, header=True)


def _raw_token(s: socket.socket, token: bytes) -> bytes:
    """A SASL token after SaslHandshake v0 (size-prefixed, no header) and the server's answer."""
    s.sendall(struct.pack(">i", len(token)) + token)
    (size,) = struct.unpack(">i", _recv(s, 4))
    return _recv(s, size)


def _closed(s: socket.socket) -> bool:
    """The peer closed the connection (within 10 s)."""
    try:
        return s.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True
