"""Client certificates and bearer tokens on a real secure cluster (mutual TLS between the nodes too).

The cluster is what ``cluster init --secure`` writes, switched to
``tls_client_auth = "required"`` with ``authentication = ["basic", "mtls",
"bearer"]`` and a JWKS file: every connection, the nodes' own calls to each
other included, presents a certificate the CA signed.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jwt
import pytest
from confluent_kafka.admin import AclOperation, AdminClient
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from cluster.config import load_config, write_configs
from cluster.security.certs import make_ca, make_client_certificate
from tests.support.cluster import LocalCluster, cluster_init_secure, http

pytestmark = pytest.mark.integration

ISSUER, AUDIENCE = "https://issuer.test", "txbroker"
SIGNING_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def bearer(payload: dict[str, Any], key: rsa.RSAPrivateKey = SIGNING_KEY, kid: str = "k1") -> dict[str, str]:
    token = jwt.encode(payload, key, algorithm="RS256", headers={"kid": kid})
    return {"Authorization": f"Bearer {token}"}


def claims(**over: Any) -> dict[str, Any]:
    return {"sub": "svc-orders", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 300, **over}


def context(d: Path, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(d / "certs" / "ca.pem"))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


class Mtls:
    def __init__(self, cluster: LocalCluster, d: Path) -> None:
        self.cluster, self.dir = cluster, d
        ca = (d / "certs" / "ca.pem", d / "certs" / "ca.key")
        clients = d / "clients"
        clients.mkdir()
        self.alice = make_client_certificate(*ca, clients, "alice")
        self.expired = make_client_certificate(
            *ca, clients, "old", not_after=dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
        )
        stranger_ca = make_ca(d / "stranger", "not our CA")
        self.stranger = make_client_certificate(*stranger_ca, d / "stranger", "alice")
        admin = tomllib.loads((d / "admin.toml").read_text())
        self.admin_auth = {"Authorization": "Basic " + base64.b64encode(
            f"{admin['username']}:{admin['password']}".encode()).decode()}  # fmt: skip

    def ask(self, node: int, path: str, cert: tuple[Path, Path] | None, headers: dict[str, str] | None = None,
            method: str = "GET", body: Any = None) -> tuple[int, Any]:  # fmt: skip
        return http(method, self.cluster.url(node) + path, body, headers=headers, context=context(self.dir, cert),
                    timeout=30)  # fmt: skip


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mtls]:
    d = tmp_path_factory.mktemp("mtls") / "secure"
    res = cluster_init_secure(d)
    assert res.returncode == 0, res.stderr
    jwks = d / "jwks.json"
    doc = json.loads(RSAAlgorithm.to_jwk(SIGNING_KEY.public_key()))
    jwks.write_text(json.dumps({"keys": [{**doc, "kid": "k1", "alg": "RS256", "use": "sig"}]}))
    configs = [load_config(p) for p in sorted(d.glob("node-*.toml"))]
    configs = [
        replace(c, security=replace(c.security, tls_client_auth="required", authentication=("basic", "mtls", "bearer"),
                                    jwt_issuer=ISSUER, jwt_audience=AUDIENCE, jwt_jwks_file=jwks))
        for c in configs if c.security is not None
    ]  # fmt: skip
    write_configs(configs, d)
    cluster = LocalCluster.from_dir(d)
    m = Mtls(cluster, d)
    probe = make_client_certificate(d / "certs" / "ca.pem", d / "certs" / "ca.key", d / "clients", "probe")
    assert cluster.ssl_context is not None
    cluster.ssl_context.load_cert_chain(str(probe[0]), str(probe[1]))
    try:
        cluster.start()  # /readyz over mutual TLS: the nodes' own calls to each other present their certificates
        yield m
    finally:
        cluster.close()


def test_a_client_certificate_is_the_principal(mtls: Mtls) -> None:
    for node in (1, 2, 3):
        status, body = mtls.ask(node, "/v1/whoami", mtls.alice)
        assert (status, body) == (200, {"principal": "User:alice"})
        # Basic credentials name the principal when given, over the same mutual TLS
        status, body = mtls.ask(node, "/v1/whoami", mtls.alice, mtls.admin_auth)
        assert (status, body) == (200, {"principal": "User:admin"})
        # the certificate is a principal like any other: no ACLs, no topics
        status, body = mtls.ask(node, "/v1/topics/anything", mtls.alice)
        assert (status, body["error_code"]) == (403, "TOPIC_AUTHORIZATION_FAILED")


@pytest.mark.parametrize("which", ["none", "expired", "stranger"])
def test_no_expired_or_foreign_certificate_gets_in(mtls: Mtls, which: str) -> None:
    cert = {"none": None, "expired": mtls.expired, "stranger": mtls.stranger}[which]
    for node in (1, 2):
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            mtls.ask(node, "/livez", cert)
    status, _ = mtls.ask(1, "/livez", mtls.alice)  # the node is unharmed
    assert status == 200


def test_bearer_tokens(mtls: Mtls) -> None:
    status, body = mtls.ask(2, "/v1/whoami", mtls.alice, bearer(claims()))
    assert (status, body) == (200, {"principal": "User:svc-orders"})
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refused = [
        bearer(claims(exp=int(time.time()) - 60)),
        bearer(claims(iss="https://elsewhere")),
        bearer(claims(aud="someone-else")),
        bearer(claims(), key=other_key),
        bearer(claims(), kid="unknown"),
        {"Authorization": "Bearer " + jwt.encode(claims(), "s" * 64, algorithm="HS256")},
        {"Authorization": "Bearer not-a-token"},
    ]
    for headers in refused:
        status, body = mtls.ask(2, "/v1/whoami", mtls.alice, headers)
        assert (status, body["error_code"]) == (401, "SASL_AUTHENTICATION_FAILED"), headers
    # an ACL for the token's principal applies to it on every node
    status, body = mtls.ask(1, "/v1/acls", mtls.alice, mtls.admin_auth, "POST", {
        "principal": "User:svc-orders", "resource_type": "CLUSTER", "resource_name": "kafka-cluster",
        "operation": "DESCRIBE", "permission": "ALLOW"})  # fmt: skip
    assert status == 201, body
    for node in (1, 2, 3):  # at once: the ACL change answered after every live node applied it
        status, body = mtls.ask(node, "/v1/users", mtls.alice, bearer(claims()))
        assert status == 200 and "admin" in {u["name"] for u in body["users"]}


def test_a_client_certificate_authenticates_on_the_kafka_listener(mtls: Mtls) -> None:
    """Kafka's SSL listener: the verified certificate is the connection's principal, no SASL needed."""
    conf = {"bootstrap.servers": mtls.cluster.bootstrap_servers, "security.protocol": "SSL",
            "ssl.ca.location": str(mtls.dir / "certs" / "ca.pem"), "ssl.certificate.location": str(mtls.alice[0]),
            "ssl.key.location": str(mtls.alice[1]), "socket.timeout.ms": 10000}  # fmt: skip
    admin = AdminClient(conf)
    before = admin.describe_cluster(include_authorized_operations=True).result(timeout=15)
    assert len(before.nodes) == 3 and not before.authorized_operations  # User:alice holds no ACL yet
    acl = {"principal": "User:alice", "resource_type": "CLUSTER", "resource_name": "kafka-cluster",
           "operation": "DESCRIBE", "permission": "ALLOW"}  # fmt: skip
    status, body = mtls.ask(1, "/v1/acls", mtls.alice, mtls.admin_auth, method="POST", body=acl)
    assert status == 201, body
    after = admin.describe_cluster(include_authorized_operations=True).result(timeout=15)
    assert (
        AclOperation.DESCRIBE in after.authorized_operations and AclOperation.ALTER not in after.authorized_operations
    )
