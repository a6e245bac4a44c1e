"""Bearer tokens (JWT): verified with PyJWT against keys from a JWKS file or URL.

Only the configured algorithms are accepted (never ``none``, never an HMAC
algorithm unless configured, and a key only verifies tokens of its own
algorithm, so an RSA public key can never serve as an HMAC secret); ``exp``,
``iss`` and ``aud`` are required and checked against ``jwt_issuer`` and
``jwt_audience`` (with 30 s of clock skew allowed, Kafka's OAUTHBEARER
default). The key is the JWKS entry named by the token's ``kid`` (a token
without ``kid`` is accepted only when the JWKS holds a single key). The
principal is ``User:`` + the ``jwt_principal_claim`` claim (``sub``).

A JWKS file is read at ``start``. A JWKS URL is fetched at ``start`` and then
in the background every ``REFRESH_S`` seconds, and sooner (at most every
``MIN_REFRESH_S``) when a token names a key the set does not hold, so a
rotated key is picked up without a restart. Fetching never blocks ``verify``:
it answers from the set at hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import aiohttp
import jwt

from clients.protocol import BrokerError, ErrorCode

from ..config import SecurityConfig
from .principals import is_valid_principal, user_principal

__all__ = ["LEEWAY_S", "MIN_REFRESH_S", "REFRESH_S", "JwtVerifier"]

log = logging.getLogger(__name__)

LEEWAY_S = 30
REFRESH_S = 300.0
MIN_REFRESH_S = 30.0
_MAX_JWKS_BYTES = 1024 * 1024
_MAX_TOKEN_CHARS = 16 * 1024


def _failed(message: str) -> BrokerError:
    return BrokerError(ErrorCode.SASL_AUTHENTICATION_FAILED, f"bearer token rejected: {message}")


def _parse_jwks(raw: bytes | str) -> jwt.PyJWKSet:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("a JWKS is a JSON object with 'keys'")
    return jwt.PyJWKSet.from_dict(data)


class JwtVerifier:
    """``verify(token) -> principal`` for the ``[security]`` section's JWT settings."""

    def __init__(self, sec: SecurityConfig) -> None:
        if sec.jwt_issuer is None or sec.jwt_audience is None:
            raise ValueError("bearer authentication needs security.jwt_issuer and security.jwt_audience")
        if (sec.jwt_jwks_file is None) == (sec.jwt_jwks_url is None):
            raise ValueError("bearer authentication needs one of security.jwt_jwks_file or security.jwt_jwks_url")
        self._sec = sec
        self._issuer: str = sec.jwt_issuer
        self._audience: str = sec.jwt_audience
        self._algorithms = list(sec.jwt_algorithms)
        self._keys: jwt.PyJWKSet | None = None
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._last_fetch = float("-inf")

    def set_keys(self, jwks: bytes | str) -> None:
        """Install a JWKS document (what ``start`` and the refresh do)."""
        self._keys = _parse_jwks(jwks)

    async def start(self) -> None:
        if self._sec.jwt_jwks_file is not None:
            path = self._sec.jwt_jwks_file
            self.set_keys(await asyncio.to_thread(path.read_bytes))
            return
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        await self._fetch()
        self._task = asyncio.get_running_loop().create_task(self._refresh_loop(), name="jwks-refresh")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _fetch(self) -> None:
        assert self._session is not None
        assert self._sec.jwt_jwks_url is not None
        self._last_fetch = time.monotonic()
        try:
            async with self._session.get(self._sec.jwt_jwks_url) as resp:
                resp.raise_for_status()
                body = await resp.content.read(_MAX_JWKS_BYTES + 1)
            if len(body) > _MAX_JWKS_BYTES:
                raise ValueError("JWKS larger than 1 MiB")
            self.set_keys(body)
        except (aiohttp.ClientError, TimeoutError, ValueError, jwt.PyJWTError) as exc:
            log.warning("could not fetch the JWKS from %s: %s", self._sec.jwt_jwks_url, exc)

    async def _refresh_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), REFRESH_S)
            self._wake.clear()
            wait = self._last_fetch + MIN_REFRESH_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await self._fetch()

    def _key_for(self, kid: object) -> jwt.PyJWK:
        keys = self._keys
        if keys is None:
            raise _failed("no signing keys are available")
        if kid is None:
            if len(keys.keys) == 1:
                return keys.keys[0]
            raise _failed("the token names no key (kid)")
        if isinstance(kid, str):
            for key in keys.keys:
                if key.key_id == kid:
                    return key
        if self._task is not None:
            self._wake.set()  # a rotated key: fetch the set again soon
        raise _failed(f"unknown key id {kid!r}")

    def verify(self, token: str) -> str:
        """The principal the token names; SASL_AUTHENTICATION_FAILED on any failure."""
        if not token or len(token) > _MAX_TOKEN_CHARS:
            raise _failed("empty or oversized token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise _failed(f"malformed token ({exc})") from exc
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self._algorithms:
            raise _failed(f"algorithm {alg!r} is not accepted")
        key = self._key_for(header.get("kid"))
        if key.algorithm_name != alg:
            raise _failed(f"the key is for {key.algorithm_name}, the token says {alg}")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise _failed(str(exc)) from exc
        subject = claims.get(self._sec.jwt_principal_claim)
        if not isinstance(subject, str):
            raise _failed(f"claim {self._sec.jwt_principal_claim!r} is missing or not a string")
        principal = user_principal(subject)
        if not is_valid_principal(principal):
            raise _failed(f"claim {self._sec.jwt_principal_claim!r} is not a valid user name")
        return principal
