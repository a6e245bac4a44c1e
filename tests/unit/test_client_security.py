"""The clients' security options: consistency checks, the Basic header, error mapping of 401/403 answers."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from clients import AclBinding, Admin
from clients import _admin_calls as calls
from clients.aio import AsyncAdmin, AsyncProducer
from clients.aio._session import error_from_body
from clients.protocol import BrokerError, ErrorCode
from clients.security import ClientSecurity, basic_authorization, is_auth_failure

HTTP = ["http://127.0.0.1:9091"]
HTTPS = ["https://127.0.0.1:9091", "https://node-2:9092"]


def test_basic_header_is_built_once_from_utf8_credentials() -> None:
    sec = ClientSecurity.from_options(HTTP, sasl_plain_username="älice", sasl_plain_password="p:w ö")
    assert sec.authorization is not None
    assert base64.b64decode(sec.authorization.removeprefix("Basic ")).decode() == "älice:p:w ö"
    assert sec.headers() == {"Authorization": sec.authorization}
    assert sec.head_lines() == f"Authorization: {sec.authorization}\r\n".encode()
    assert ClientSecurity.from_options(HTTP).headers() == {}
    assert ClientSecurity.from_options(HTTP).head_lines() == b""


def test_password_stays_out_of_repr() -> None:
    sec = ClientSecurity.from_options(HTTP, sasl_plain_username="alice", sasl_plain_password="hunter2")
    assert "hunter2" not in repr(sec)
    assert base64.b64encode(b"alice:hunter2").decode() not in repr(sec)


@pytest.mark.parametrize(
    ("urls", "options", "fragment"),
    [
        (HTTP, {"security_protocol": "SSL"}, "needs https://"),
        (HTTP, {"security_protocol": "SASL_SSL", "sasl_plain_username": "a", "sasl_plain_password": "b"}, "https://"),
        (HTTPS, {"security_protocol": "PLAINTEXT"}, "contradicts"),
        (HTTPS, {"security_protocol": "SASL_SSL"}, "needs sasl_plain_username"),
        (HTTP, {"security_protocol": "SASL_PLAINTEXT"}, "needs sasl_plain_username"),
        (HTTP, {"security_protocol": "PLAINTEXT", "sasl_plain_username": "a", "sasl_plain_password": "b"}, "SASL_"),
        (HTTP, {"security_protocol": "TLS"}, "must be one of"),
        (HTTP, {"sasl_mechanism": "GSSAPI", "sasl_plain_username": "a", "sasl_plain_password": "b"}, "sasl_mechanism"),
        (HTTP, {"sasl_plain_username": "a"}, "together"),
        (HTTP, {"sasl_plain_password": "b"}, "together"),
        (HTTP, {"sasl_plain_username": "a:b", "sasl_plain_password": "c"}, "':'"),
        (HTTP, {"ssl_cafile": "ca.pem"}, "need https://"),
        (HTTPS, {"ssl_keyfile": "k.pem"}, "needs ssl_certfile"),
        (["http://a:1", "https://b:2"], {}, "mix"),
        (HTTPS, {"ssl_cafile": "/nonexistent/ca.pem"}, "ssl_cafile"),
        (HTTPS, {"ssl_certfile": "/nonexistent/c.pem"}, "ssl_certfile"),
    ],
)
def test_contradictions_are_value_errors(urls: list[str], options: dict[str, str], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ClientSecurity.from_options(urls, **options)  # type: ignore[arg-type]


def test_consistent_options_are_accepted() -> None:
    for proto in ("SASL_SSL", "sasl_ssl"):
        sec = ClientSecurity.from_options(
            HTTPS, sasl_plain_username="a", sasl_plain_password="b", security_protocol=proto,
            sasl_mechanism="SCRAM-SHA-512",
        )  # fmt: skip
        assert sec.tls and sec.ssl_context is not None
    assert not ClientSecurity.from_options(HTTP, security_protocol="PLAINTEXT").tls
    assert ClientSecurity.from_options(HTTP, security_protocol="PLAINTEXT").ssl_context is None
    ClientSecurity.from_options(HTTP, security_protocol="SASL_PLAINTEXT", sasl_plain_username="a",
                                sasl_plain_password="b", sasl_mechanism="PLAIN")  # fmt: skip
    assert ClientSecurity.from_options(HTTPS, security_protocol="SSL").authorization is None


def test_every_client_checks_its_options_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs https://"):
        Admin("http://127.0.0.1:1", security_protocol="SSL")
    with pytest.raises(ValueError, match="need https://"):
        AsyncAdmin("http://127.0.0.1:1", ssl_cafile=str(tmp_path / "ca.pem"))
    with pytest.raises(ValueError, match="together"):
        AsyncProducer("https://127.0.0.1:1", sasl_plain_username="a")


def test_401_and_403_answers_map_to_their_codes_and_are_not_retriable() -> None:
    err = error_from_body(401, b"", "u")
    assert err.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED and not err.retriable
    assert (
        error_from_body(401, b'{"error_code": "NOT_CONTROLLER"}', "u").error_code
        is ErrorCode.SASL_AUTHENTICATION_FAILED
    )
    assert error_from_body(403, b"<html>", "u").error_code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    body = b'{"error_code": "GROUP_AUTHORIZATION_FAILED", "message": "no"}'
    err = error_from_body(403, body, "u")
    assert err.error_code is ErrorCode.GROUP_AUTHORIZATION_FAILED and is_auth_failure(err) and not err.retriable
    assert not is_auth_failure(BrokerError(ErrorCode.NETWORK_EXCEPTION, "x"))
    assert not calls.should_try_next_node(err)


def test_acl_and_user_calls_build_their_requests() -> None:
    create = calls.create_acls([AclBinding("User:a", "TOPIC", "t", "READ"), {"principal": "User:b"}])
    assert create.method == "POST" and create.path == "/v1/acls"
    assert create.body["acls"][0] == {"principal": "User:a", "host": "*", "resource_type": "TOPIC",
                                      "resource_name": "t", "pattern_type": "LITERAL", "operation": "READ",
                                      "permission": "ALLOW"}  # fmt: skip
    desc = calls.describe_acls({"principal": "User:a b", "operation": None})
    assert desc.path == "/v1/acls?principal=User%3Aa%20b"
    assert calls.describe_acls({}).path == "/v1/acls"
    with pytest.raises(BrokerError, match="unknown ACL filter"):
        calls.describe_acls({"prinicpal": "User:a"})
    delete = calls.delete_acls({"resource_type": "TOPIC"})
    assert (delete.method, delete.path, delete.body) == ("DELETE", "/v1/acls", {"resource_type": "TOPIC"})
    assert len(calls.as_filters({"principal": "User:a"})) == 1
    with pytest.raises(BrokerError):
        calls.as_filters([])
    with pytest.raises(BrokerError):
        calls.create_acls([])
    put = calls.upsert_user("a/b", "pw", "SCRAM-SHA-256", None)
    assert (put.method, put.path, put.body) == (
        "PUT",
        "/v1/users/a%2Fb",
        {"password": "pw", "mechanism": "SCRAM-SHA-256"},
    )
    with pytest.raises(BrokerError):
        calls.upsert_user("a", "pw", "PLAIN", None)
    with pytest.raises(BrokerError):
        calls.upsert_user("", "pw", "SCRAM-SHA-256", None)
    assert calls.delete_user("x").path == "/v1/users/x"
    assert calls.whoami().parse({"principal": "User:x"}) == "User:x"
    assert AclBinding.from_json(create.body["acls"][0]) == AclBinding("User:a", "TOPIC", "t", "READ")


def test_basic_authorization_rejects_a_colon_in_the_name() -> None:
    with pytest.raises(ValueError, match="must not contain"):
        basic_authorization("a:b", "c")
