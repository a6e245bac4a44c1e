"""Who is calling, decided before the body is read: node-to-node calls, HTTP Basic, bearer JWTs, client certificates.

The ``Gatekeeper`` admits each request for the ``Access`` its route declares
(``cluster.http.access``):

- A node-to-node call (``cluster.security.node_calls``; verified by its
  signature over method, path, body, principal, time and nonce) acting for
  itself may call ``/v1/internal/*`` and nothing else; one forwarding a
  client's request acts as that client's principal (KIP-590's envelope) and
  is authorized again here. A client header never makes a request either.
- Anyone else authenticates on a node with a ``[security]`` section:
  ``Authorization: Basic`` against the user's SCRAM credential (a verified
  credential is cached, so PBKDF2 does not run per request; a miss runs in a
  thread, a few at a time), ``Authorization: Bearer`` (a JWT), or the
  verified client certificate (mTLS). Missing or wrong credentials: 401
  ``SASL_AUTHENTICATION_FAILED``, after a short delay when they were wrong.
- On a node without one every caller is ``User:ANONYMOUS`` and may do
  anything (local development), except call the internal routes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Callable
from typing import NoReturn, Protocol

from aiohttp import web

from clients.protocol import BrokerError, ErrorCode

from ..config import SecurityConfig
from ..security.authorizer import Authorizer
from ..security.credentials import CredentialChecker
from ..security.guard import Guard
from ..security.jwt_auth import JwtVerifier
from ..security.node_calls import NodeCallVerifier
from ..security.principals import ANONYMOUS, CLIENT_HOST_KEY, NODE_CALL_KEY, PRINCIPAL_KEY, user_principal
from ..security.tls import peer_principal
from .access import ACCESS, GUARD_KEY, Access, Mode, check_access
from .node_auth import verify_node_call

__all__ = ["FAILED_ATTEMPT_DELAY_S", "Gatekeeper", "SecurityState"]

log = logging.getLogger(__name__)

#: How long a wrong or malformed credential waits before its 401 (slows guessing; the loop is not blocked).
FAILED_ATTEMPT_DELAY_S = 0.1
#: Password checks that miss the cache run in threads, at most this many at once (PBKDF2 is CPU-bound).
_CONCURRENT_PASSWORD_CHECKS = 2
_MAX_AUTHORIZATION = 8192


class SecurityState(Protocol):
    """The users and ACLs the controller replicates, as this node last applied them."""

    @property
    def authorizer(self) -> Authorizer: ...

    @property
    def credentials(self) -> CredentialChecker: ...


class Gatekeeper:
    def __init__(
        self,
        security: SecurityConfig | None,
        state: Callable[[], SecurityState],
        node_calls: NodeCallVerifier,
        jwt: JwtVerifier | None = None,
    ) -> None:
        self._security = security
        self._state = state
        self._node_calls = node_calls
        self._jwt = jwt
        self._checks = asyncio.Semaphore(_CONCURRENT_PASSWORD_CHECKS)
        methods = security.authentication if security is not None else ()
        challenges = []
        if "basic" in methods:
            challenges.append('Basic realm="txbroker", charset="UTF-8"')
        if "bearer" in methods:
            challenges.append('Bearer realm="txbroker"')
        #: The ``WWW-Authenticate`` value of a 401.
        self.challenge = ", ".join(challenges) or 'Basic realm="txbroker"'

    @property
    def secure(self) -> bool:
        return self._security is not None

    def _authorizer(self) -> Authorizer | None:
        if self._security is None or not self._security.authorizer:
            return None
        return self._state().authorizer

    async def admit(self, request: web.Request) -> None:
        """Authenticate ``request`` and check its route's path-level rights; raises the 401/403 to answer."""
        access: Access | None = request.app[ACCESS].get(request.match_info.route)
        call = await verify_node_call(request, self._node_calls)
        host = request.remote or "*"
        if call is not None:
            request[NODE_CALL_KEY] = call
            if call.principal is None:  # a node acting for itself: the internal routes only
                if access is None or access.mode is not Mode.NODE:
                    raise BrokerError(
                        ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "a node's own call goes to an internal route"
                    )
                request[GUARD_KEY] = Guard(f"Node:{call.sender}", host)
                return
            principal = call.principal
            host = call.host or "*"
        elif access is not None and access.mode is Mode.OPEN:
            request[GUARD_KEY] = Guard(ANONYMOUS, host)
            return
        elif access is not None and access.mode is Mode.NODE:
            raise BrokerError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "internal endpoint: nodes of the cluster only")
        else:
            principal = await self.authenticate(request) if self.secure else ANONYMOUS
        if access is not None and access.mode is Mode.NODE:
            raise BrokerError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "internal endpoint: nodes of the cluster only")
        request[PRINCIPAL_KEY] = principal
        request[CLIENT_HOST_KEY] = host
        g = Guard(principal, host, self._authorizer())
        request[GUARD_KEY] = g
        if access is not None:
            check_access(g, access, request.match_info)

    async def authenticate(self, request: web.Request) -> str:
        """The caller's principal from its credentials; 401 ``SASL_AUTHENTICATION_FAILED`` without valid ones."""
        assert self._security is not None
        methods = self._security.authentication
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, value = header.strip().partition(" ")
            scheme = scheme.lower()
            if scheme == "basic" and "basic" in methods:
                return await self._basic(value.strip())
            if scheme == "bearer" and "bearer" in methods and self._jwt is not None:
                try:
                    return self._jwt.verify(value.strip())
                except BrokerError:
                    await asyncio.sleep(FAILED_ATTEMPT_DELAY_S)
                    raise
            await _fail(f"authorization scheme {scheme[:20]!r} is not accepted here")
        if "mtls" in methods:
            transport = request.transport
            ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
            principal = peer_principal(ssl_object) if ssl_object is not None else None
            if principal is not None:
                return principal
        raise BrokerError(ErrorCode.SASL_AUTHENTICATION_FAILED, "credentials required")

    async def _basic(self, value: str) -> str:
        if len(value) > _MAX_AUTHORIZATION:
            await _fail("malformed Basic credentials")
        try:
            text = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            await _fail("malformed Basic credentials")
        username, sep, password = text.partition(":")
        if not sep or not username or not password:
            await _fail("malformed Basic credentials")
        checker = self._state().credentials
        ok = checker.cached(username, password)
        if ok is None:
            async with self._checks:
                ok = await asyncio.to_thread(checker.check, username, password)
        if not ok:
            await _fail("wrong user name or password")
        return user_principal(username)


async def _fail(message: str) -> NoReturn:
    await asyncio.sleep(FAILED_ATTEMPT_DELAY_S)
    raise BrokerError(ErrorCode.SASL_AUTHENTICATION_FAILED, message)
