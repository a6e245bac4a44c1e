"""SaslAuthenticate (key 36, versions 0-2): the SASL tokens of the mechanism SaslHandshake chose.

PLAIN: one token (``authzid NUL user NUL password``), checked against the
user's SCRAM credential as HTTP Basic is (a verified pair is cached; a miss
runs PBKDF2 in a worker thread, a few at a time). SCRAM-SHA-256/512: two
round trips (``cluster.security.scram_server``). Success makes the connection
``User:NAME``; every later request is authorized against the node's ACLs as
they are when it arrives. A failure answers SASL_AUTHENTICATION_FAILED after
a short delay and closes the connection (Kafka's behaviour); a token before a
handshake, or after the exchange finished, is ILLEGAL_SASL_STATE and closes it
too. Sessions do not expire (``session_lifetime_ms`` 0: no re-authentication).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.principals import user_principal
from ...security.scram_server import ScramExchange, parse_plain
from ..api import KafkaApi, RequestContext
from .sasl_handshake import PLAIN

__all__ = ["API", "FAILED_ATTEMPT_DELAY_S", "exchange"]

#: How long a failed authentication waits before its answer (slows guessing; the loop is not blocked).
FAILED_ATTEMPT_DELAY_S = 0.1
_CONCURRENT_PASSWORD_CHECKS = 2
_checks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
_SCRAM = "scram"


def _check_slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    slots = _checks.get(loop)
    if slots is None:
        slots = _checks[loop] = asyncio.Semaphore(_CONCURRENT_PASSWORD_CHECKS)
    return slots


async def _plain(ctx: RequestContext, token: bytes) -> tuple[str, bytes]:
    user, password = parse_plain(token)
    checker = ctx.services.controller.security_view().credentials
    ok = checker.cached(user, password)
    if ok is None:
        async with _check_slots():
            ok = await asyncio.to_thread(checker.check, user, password)
    if not ok:
        raise BrokerError(ErrorCode.SASL_AUTHENTICATION_FAILED, "wrong user name or password")
    return user, b""


def _scram(ctx: RequestContext, mechanism: str, token: bytes) -> tuple[str | None, bytes]:
    state = ctx.connection.sasl_state
    exchange = state.get(_SCRAM)
    if exchange is None:
        checker = ctx.services.controller.security_view().credentials
        exchange = state[_SCRAM] = ScramExchange(mechanism, checker.credential)
        return None, exchange.first(token)
    assert isinstance(exchange, ScramExchange)
    answer = exchange.final(token)
    return exchange.username, answer


def _answer(error: ErrorCode, message: str | None, auth_bytes: bytes = b"") -> Any:
    return SaslAuthenticateResponse(
        error_code=error.code, error_message=message, auth_bytes=auth_bytes, session_lifetime_ms=0
    )


async def exchange(ctx: RequestContext, token: bytes) -> tuple[BrokerError | None, bytes]:
    """One SASL token of the connection's mechanism: (None, the answer token) or (the error; the connection
    must close). Success of the last step makes the connection its user's."""
    conn = ctx.connection
    mechanism = conn.sasl_mechanism
    if mechanism is None or conn.principal is not None:
        return BrokerError(ErrorCode.ILLEGAL_SASL_STATE, "a SASL token needs a SaslHandshake first"), b""
    try:
        if mechanism == PLAIN:
            user: str | None
            user, answer = await _plain(ctx, token)
        else:
            user, answer = _scram(ctx, mechanism, token)
    except BrokerError as exc:
        conn.sasl_state.clear()
        if exc.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED:
            await asyncio.sleep(FAILED_ATTEMPT_DELAY_S)
            return BrokerError(exc.error_code, f"authentication failed: {exc.message}"), b""
        return exc, b""
    if user is not None:
        conn.sasl_state.clear()
        conn.principal = user_principal(user)
        conn.authenticated = True
    return None, answer


async def handle(ctx: RequestContext, request: Any) -> Any:
    error, answer = await exchange(ctx, bytes(request.auth_bytes or b""))
    if error is not None:
        ctx.connection.close_after_response = True
        return _answer(error.error_code, error.message)
    return _answer(ErrorCode.NONE, None, answer)


API = KafkaApi("SaslAuthenticate", SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 2, handle, authenticated=False)
