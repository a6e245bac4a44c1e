"""The server side of SCRAM and PLAIN (``cluster.security.scram_server``), against kafka-python's SCRAM client."""

from __future__ import annotations

import base64

import pytest
from kafka.net.sasl.scram import ScramClient

from clients.protocol import BrokerError, ErrorCode
from cluster.security.scram import MIN_ITERATIONS, ScramCredential, make_credential
from cluster.security.scram_server import ScramExchange, parse_plain

_CREDS = {("alice", m): make_credential("secret", m, MIN_ITERATIONS) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}


def _lookup(user: str, mechanism: str) -> ScramCredential | None:
    return _CREDS.get((user, mechanism))


def _exchange(user: str, password: str, mechanism: str) -> tuple[ScramExchange, ScramClient, bytes]:
    client = ScramClient(user, password, mechanism)
    server = ScramExchange(mechanism, _lookup)
    client.process_server_first_message(server.first(client.first_message()))
    return server, client, client.final_message()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_right_password_authenticates_and_the_server_proves_itself(mechanism: str) -> None:
    server, client, final = _exchange("alice", "secret", mechanism)
    client.process_server_final_message(server.final(final))  # raises if the server signature is wrong
    assert server.username == "alice"


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "secret")])
def test_a_wrong_password_or_unknown_user_fails_at_the_final_message(user: str, password: str) -> None:
    server, _client, final = _exchange(user, password, "SCRAM-SHA-256")
    with pytest.raises(BrokerError) as err:
        server.final(final)
    assert err.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert server.username is None


def test_an_unknown_user_gets_a_server_first_message_of_the_same_shape() -> None:
    known = ScramExchange("SCRAM-SHA-512", _lookup).first(b"n,,n=alice,r=abc").decode()
    unknown = ScramExchange("SCRAM-SHA-512", _lookup).first(b"n,,n=mallory,r=abc").decode()
    assert [p[:2] for p in known.split(",")] == [p[:2] for p in unknown.split(",")] == ["r=", "s=", "i="]
    again = ScramExchange("SCRAM-SHA-512", _lookup).first(b"n,,n=mallory,r=abc").decode()
    assert unknown.split(",")[1] == again.split(",")[1]  # the same salt each time, as a real user's


def test_a_tampered_nonce_or_proof_is_refused() -> None:
    server, _client, final = _exchange("alice", "secret", "SCRAM-SHA-256")
    with pytest.raises(BrokerError):
        server.final(final.replace(b",r=", b",r=x", 1))
    server, _client, final = _exchange("alice", "secret", "SCRAM-SHA-256")
    head, _, proof = final.rpartition(b",p=")
    flipped = bytearray(base64.b64decode(proof))
    flipped[0] ^= 1
    with pytest.raises(BrokerError):
        server.final(head + b",p=" + base64.b64encode(bytes(flipped)))


@pytest.mark.parametrize(
    "first",
    [b"p=tls-unique,,n=alice,r=abc", b"n,a=bob,n=alice,r=abc", b"n,,r=abc", b"n,,n=alice", b"n,,n=al=ZZice,r=abc",
     b"n,,n=alice,r=abc,m=ext", b"\xff\xfe", b"n,,n=alice,r=" + b"x" * 5000],
)  # fmt: skip
def test_malformed_first_messages_are_refused(first: bytes) -> None:
    with pytest.raises(BrokerError) as err:
        ScramExchange("SCRAM-SHA-256", _lookup).first(first)
    assert err.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED


def test_messages_out_of_order_are_illegal_sasl_state() -> None:
    server = ScramExchange("SCRAM-SHA-256", _lookup)
    with pytest.raises(BrokerError) as err:
        server.final(b"c=biws,r=abc,p=AAAA")
    assert err.value.error_code is ErrorCode.ILLEGAL_SASL_STATE
    server.first(b"n,,n=alice,r=abc")
    with pytest.raises(BrokerError) as err:
        server.first(b"n,,n=alice,r=abc")
    assert err.value.error_code is ErrorCode.ILLEGAL_SASL_STATE


def test_saslname_escapes_are_decoded() -> None:
    seen: list[str] = []
    ScramExchange("SCRAM-SHA-256", lambda u, _m: seen.append(u)).first(b"n,,n=a=2Cb=3Dc,r=abc")
    assert seen == ["a,b=c"]


def test_plain_messages() -> None:
    assert parse_plain(b"\x00alice\x00secret") == ("alice", "secret")
    assert parse_plain(b"alice\x00alice\x00secret") == ("alice", "secret")
    for bad in (b"alice\x00secret", b"bob\x00alice\x00secret", b"\x00\x00secret", b"\x00alice\x00", b"\x00\xff\x00x"):
        with pytest.raises(BrokerError) as err:
            parse_plain(bad)
        assert err.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
