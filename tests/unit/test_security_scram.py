"""SCRAM credentials against RFC 7677's test vector, and the credential checker's cache (pure)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from clients.protocol import BrokerError, ErrorCode
from cluster.config import BootstrapUser
from cluster.security.credentials import CredentialChecker
from cluster.security.scram import (
    DEFAULT_ITERATIONS,
    MIN_ITERATIONS,
    ScramCredential,
    check_password,
    make_credential,
    salted_keys,
)

# RFC 7677 section 3: SCRAM-SHA-256, user "user", password "pencil"
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_FIRST_BARE = "n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL_WITHOUT_PROOF = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
CLIENT_PROOF = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_SIGNATURE = base64.b64decode("6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
AUTH_MESSAGE = f"{CLIENT_FIRST_BARE},{SERVER_FIRST},{CLIENT_FINAL_WITHOUT_PROOF}".encode()

FAST = MIN_ITERATIONS  # the cheapest legal iteration count keeps the tests quick


def test_rfc7677_vector() -> None:
    cred = make_credential("pencil", "SCRAM-SHA-256", 4096, SALT)
    # the server verifies the client's proof with StoredKey alone: ClientKey = proof XOR HMAC(StoredKey, AuthMessage)
    client_signature = hmac.digest(cred.stored_key, AUTH_MESSAGE, "sha256")
    client_key = bytes(a ^ b for a, b in zip(CLIENT_PROOF, client_signature, strict=True))
    assert hashlib.sha256(client_key).digest() == cred.stored_key
    assert hmac.digest(cred.server_key, AUTH_MESSAGE, "sha256") == SERVER_SIGNATURE
    derived_client_key, stored_key, server_key = salted_keys("pencil", "SCRAM-SHA-256", SALT, 4096)
    assert (derived_client_key, stored_key, server_key) == (client_key, cred.stored_key, cred.server_key)
    assert check_password(cred, "pencil")
    assert not check_password(cred, "pencil ")


def test_sha512_and_fresh_salts() -> None:
    a = make_credential("secret", "SCRAM-SHA-512", FAST)
    b = make_credential("secret", "SCRAM-SHA-512", FAST)
    assert len(a.stored_key) == len(a.server_key) == 64 and a.salt != b.salt and a.stored_key != b.stored_key
    assert check_password(a, "secret") and check_password(b, "secret") and not check_password(a, "Secret")
    assert make_credential("x", "SCRAM-SHA-256").iterations == DEFAULT_ITERATIONS


def test_json_and_bootstrap_forms() -> None:
    cred = make_credential("pw", "SCRAM-SHA-256", FAST)
    assert ScramCredential.from_json(cred.to_json()) == cred
    doc = cred.to_json()
    boot = BootstrapUser(
        "admin", doc["mechanism"], doc["salt"], doc["iterations"], doc["stored_key"], doc["server_key"]
    )
    assert ScramCredential.from_bootstrap(boot) == cred
    assert set(doc) == {"mechanism", "salt", "iterations", "stored_key", "server_key"}


@pytest.mark.parametrize(
    "over",
    [
        {"mechanism": "SCRAM-SHA-1"},
        {"iterations": 10},
        {"iterations": "4096"},
        {"salt": "not base64!"},
        {"salt": ""},
        {"stored_key": base64.b64encode(b"short").decode()},
        {"server_key": None},
    ],
)
def test_bad_credentials_are_invalid_request(over: dict[str, object]) -> None:
    doc = {**make_credential("pw", "SCRAM-SHA-256", FAST).to_json(), **over}
    with pytest.raises(BrokerError) as exc:
        ScramCredential.from_json(doc)
    assert exc.value.error_code is ErrorCode.INVALID_REQUEST


def test_unknown_mechanism_is_invalid_request() -> None:
    with pytest.raises(BrokerError) as exc:
        make_credential("pw", "PLAIN")
    assert exc.value.error_code is ErrorCode.INVALID_REQUEST


def test_checker_verifies_and_caches() -> None:
    alice = make_credential("wonderland", "SCRAM-SHA-256", FAST)
    checker = CredentialChecker({"alice": {"SCRAM-SHA-256": alice}})
    assert checker.cached("alice", "wonderland") is None
    assert checker.check("alice", "wonderland")
    assert checker.cached("alice", "wonderland") is True
    assert checker.cache_size() == 1
    # wrong passwords and unknown users are never cached
    assert not checker.check("alice", "wrong") and checker.cached("alice", "wrong") is None
    assert not checker.check("mallory", "wonderland") and checker.cached("mallory", "wonderland") is None
    assert checker.cache_size() == 1


def test_a_changed_credential_drops_the_cached_password() -> None:
    old = make_credential("old", "SCRAM-SHA-256", FAST)
    bob = make_credential("bobpw", "SCRAM-SHA-256", FAST)
    checker = CredentialChecker({"alice": {"SCRAM-SHA-256": old}, "bob": {"SCRAM-SHA-256": bob}})
    assert checker.check("alice", "old") and checker.check("bob", "bobpw")
    new = make_credential("new", "SCRAM-SHA-256", FAST)
    checker.replace_users({"alice": {"SCRAM-SHA-256": new}, "bob": {"SCRAM-SHA-256": bob}})
    assert checker.cached("alice", "old") is None and not checker.check("alice", "old")
    assert checker.check("alice", "new")
    assert checker.cached("bob", "bobpw") is True  # an unchanged user keeps its entry
    checker.replace_users({"alice": {"SCRAM-SHA-256": new}})
    assert checker.cached("bob", "bobpw") is None and not checker.check("bob", "bobpw")


def test_any_of_the_users_mechanisms_verifies() -> None:
    creds = {
        "SCRAM-SHA-256": make_credential("pw", "SCRAM-SHA-256", FAST),
        "SCRAM-SHA-512": make_credential("pw", "SCRAM-SHA-512", FAST),
    }
    checker = CredentialChecker({"carol": creds})
    assert checker.check("carol", "pw") and not checker.check("carol", "pw2")


def test_the_cache_is_bounded_lru() -> None:
    creds = {f"u{i}": {"SCRAM-SHA-256": make_credential(f"p{i}", "SCRAM-SHA-256", FAST)} for i in range(3)}
    checker = CredentialChecker(creds, cache_size=2)
    for i in range(3):
        assert checker.check(f"u{i}", f"p{i}")
    assert checker.cache_size() == 2
    assert checker.cached("u0", "p0") is None and checker.cached("u2", "p2") is True
