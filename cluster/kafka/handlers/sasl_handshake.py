"""SaslHandshake (key 17, versions 0-1): the client names its SASL mechanism.

A listener of a node with ``[security]`` whose ``authentication`` includes
``basic`` (the users' SCRAM credentials) offers PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512. Any other mechanism, or a listener without security, answers
UNSUPPORTED_SASL_MECHANISM with the mechanisms it offers; a second handshake
on a connection is ILLEGAL_SASL_STATE. After version 1 the tokens come in
SaslAuthenticate requests; after version 0 they come as raw size-prefixed
frames without a request header, answered the same way (the server reads them
until the exchange ends; a failure closes the connection).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

from clients.protocol import ErrorCode

from ...security.scram import MECHANISMS
from ..api import KafkaApi, RequestContext

__all__ = ["API", "offered_mechanisms"]

PLAIN = "PLAIN"


def offered_mechanisms(ctx: RequestContext) -> list[str]:
    """The SASL mechanisms this listener accepts (none on a node without security)."""
    sec = ctx.services.config.security
    if sec is None or "basic" not in sec.authentication:
        return []
    return [PLAIN, *MECHANISMS]


async def handle(ctx: RequestContext, request: Any) -> Any:
    offered = offered_mechanisms(ctx)
    conn = ctx.connection
    if conn.sasl_mechanism is not None or conn.principal is not None:
        return SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE.code, mechanisms=offered)
    if request.mechanism not in offered:
        return SaslHandshakeResponse(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM.code, mechanisms=offered)
    conn.sasl_mechanism = request.mechanism
    conn.sasl_state.clear()
    conn.sasl_raw_tokens = ctx.api_version == 0
    return SaslHandshakeResponse(error_code=0, mechanisms=offered)


API = KafkaApi("SaslHandshake", SaslHandshakeRequest, SaslHandshakeResponse, 0, 1, handle, authenticated=False)
