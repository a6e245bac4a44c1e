"""Bearer tokens: a valid token names its principal; every kind of bad token is SASL_AUTHENTICATION_FAILED."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from clients.protocol import BrokerError, ErrorCode
from cluster.config import SecurityConfig
from cluster.security.jwt_auth import JwtVerifier

ISS = "https://idp.example"
AUD = "txbroker"


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


KEY = _key()
OTHER_KEY = _key()


def jwk(key: rsa.RSAPrivateKey, kid: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    if kid is not None:
        doc["kid"] = kid
    return doc


def claims(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"sub": "alice", "iss": ISS, "aud": AUD, "exp": int(time.time()) + 300}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def token(payload: dict[str, Any] | None = None, key: rsa.RSAPrivateKey = KEY, kid: str | None = "k1") -> str:
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(payload or claims(), key, algorithm="RS256", headers=headers)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def handmade(header: dict[str, Any], payload: dict[str, Any], secret: bytes | None) -> str:
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    sig = b"" if secret is None else hmac.digest(secret, signing_input.encode(), hashlib.sha256)
    return f"{signing_input}.{_b64(sig)}"


def verifier(tmp_path: Path, keys: list[dict[str, Any]], **over: Any) -> JwtVerifier:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": keys}))
    sec = SecurityConfig(authentication=("bearer",), jwt_issuer=ISS, jwt_audience=AUD, jwt_jwks_file=path, **over)
    v = JwtVerifier(sec)
    asyncio.run(v.start())
    return v


def rejected(v: JwtVerifier, tok: str) -> str:
    with pytest.raises(BrokerError) as exc:
        v.verify(tok)
    assert exc.value.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
    return str(exc.value)


def test_a_valid_token_names_its_principal(tmp_path: Path) -> None:
    v = verifier(tmp_path, [jwk(KEY, "k1"), jwk(OTHER_KEY, "k2")])
    assert v.verify(token()) == "User:alice"
    assert v.verify(token(key=OTHER_KEY, kid="k2")) == "User:alice"


def test_the_principal_claim_is_configurable(tmp_path: Path) -> None:
    v = verifier(tmp_path, [jwk(KEY, "k1")], jwt_principal_claim="preferred_username")
    assert v.verify(token(claims(preferred_username="bob"))) == "User:bob"
    rejected(v, token())  # no such claim


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"exp": -3600}, "expired"),  # relative to now, when the test runs
        ({"iss": "https://evil.example"}, "issuer"),
        ({"aud": "someone-else"}, "audience"),
        ({"exp": None}, "exp"),
        ({"aud": None}, "aud"),
        ({"iss": None}, "iss"),
        ({"sub": "a:b"}, "user name"),
        ({"sub": 42}, "sub"),
    ],
)
def test_bad_claims_are_rejected(tmp_path: Path, changes: dict[str, Any], why: str) -> None:
    v = verifier(tmp_path, [jwk(KEY, "k1")])
    if isinstance(changes.get("exp"), int):
        changes = {**changes, "exp": int(time.time()) + changes["exp"]}
    assert why in rejected(v, token(claims(**changes))).lower()


def test_alg_none_is_rejected(tmp_path: Path) -> None:
    v = verifier(tmp_path, [jwk(KEY, "k1")])
    rejected(v, handmade({"alg": "none", "kid": "k1", "typ": "JWT"}, claims(), None))


@pytest.mark.parametrize("algorithms", [("RS256", "ES256"), ("RS256", "HS256")])
def test_hs256_signed_with_the_public_key_is_rejected(tmp_path: Path, algorithms: tuple[str, ...]) -> None:
    v = verifier(tmp_path, [jwk(KEY, "k1")], jwt_algorithms=algorithms)
    pem = KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for secret in (pem, json.dumps(jwk(KEY, "k1")).encode()):
        rejected(v, handmade({"alg": "HS256", "kid": "k1", "typ": "JWT"}, claims(), secret))


def test_key_ids(tmp_path: Path) -> None:
    v = verifier(tmp_path, [jwk(KEY, "k1"), jwk(OTHER_KEY, "k2")])
    assert "unknown key" in rejected(v, token(kid="k9"))
    assert "kid" in rejected(v, token(kid=None))  # two keys: the token must say which
    rejected(v, token(key=OTHER_KEY, kid="k1"))  # signed by another key than the one it names
    single = verifier(tmp_path, [jwk(KEY, None)])
    assert single.verify(token(kid=None)) == "User:alice"


@pytest.mark.parametrize("tok", ["", "abc", "a.b.c", "x" * 20_000])
def test_malformed_tokens_are_rejected(tmp_path: Path, tok: str) -> None:
    v = verifier(tmp_path, [jwk(KEY, "k1")])
    rejected(v, tok)


def test_keys_from_a_jwks_url() -> None:
    async def scenario() -> None:
        app = web.Application()

        async def jwks(_request: web.Request) -> web.Response:
            return web.json_response({"keys": [jwk(KEY, "k1")]})

        app.router.add_get("/jwks", jwks)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            port = runner.addresses[0][1]
            sec = SecurityConfig(
                authentication=("bearer",),
                jwt_issuer=ISS,
                jwt_audience=AUD,
                jwt_jwks_url=f"http://127.0.0.1:{port}/jwks",
            )
            v = JwtVerifier(sec)
            await v.start()
            try:
                assert v.verify(token()) == "User:alice"
                rejected(v, token(kid="k2"))
            finally:
                await v.close()
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def test_configuration_must_name_issuer_audience_and_keys() -> None:
    with pytest.raises(ValueError, match="jwt_issuer"):
        JwtVerifier(SecurityConfig(authentication=("bearer",), jwt_audience=AUD, jwt_jwks_url="https://x"))
    with pytest.raises(ValueError, match="jwks"):
        JwtVerifier(SecurityConfig(authentication=("bearer",), jwt_issuer=ISS, jwt_audience=AUD))
