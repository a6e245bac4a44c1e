"""The server side of node-to-node calls: verifying ``X-Txbroker-Node-Call``, and what a verified call may do.

A request that carries a node-call header (``cluster.security.node_calls``) is
verified against its method, raw path and query, and body; a bad, stale or
replayed one is refused with ``CLUSTER_AUTHORIZATION_FAILED`` (HTTP 403)
before any handler runs. The verified ``NodeCall`` is kept under
``NODE_CALL_KEY``:

- principal None: another node acting for itself -- the only caller internal
  endpoints (``/v1/internal/*``) accept (``require_internal``);
- a principal: a client request another node proxied here (``forwarded``),
  acting for that principal and never proxied again.

Headers no client may set -- ``X-Txbroker-Forwarded``, ``X-Txbroker-Auth`` --
are refused unless the request is a valid node call; they mean nothing.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from clients.protocol import BrokerError, ErrorCode

from ..security.node_calls import NODE_CALL_HEADER, NodeCall, NodeCallRejected, NodeCallVerifier, body_sha256_async
from ..security.principals import NODE_CALL_KEY

__all__ = ["RESERVED_HEADERS", "forwarded", "require_internal", "verify_node_call"]

log = logging.getLogger(__name__)

#: Headers only a node's signed call may carry; from a client they are refused, never honored.
RESERVED_HEADERS = ("X-Txbroker-Forwarded", "X-Txbroker-Auth")
_WARN_EVERY_S = 10.0
_last_warning = [-_WARN_EVERY_S]  # when a refusal was last logged (at most one warning per interval)


def _refuse(request: web.Request, reason: str) -> BrokerError:
    now = time.monotonic()
    if now - _last_warning[0] >= _WARN_EVERY_S:
        _last_warning[0] = now
        log.warning("node call refused from %s: %s %s: %s", request.remote, request.method, request.path, reason)
    return BrokerError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"node call refused: {reason}")


async def verify_node_call(request: web.Request, verifier: NodeCallVerifier) -> NodeCall | None:
    """The verified node call ``request`` is; None if it carries no node-call header.

    A header that does not verify (malformed, wrongly signed, stale, replayed), more than one of them, or a
    reserved header without one, is ``CLUSTER_AUTHORIZATION_FAILED``. The body is read (bounded by the
    application's ``client_max_size``; the handler reads the same, cached, bytes)."""
    values = request.headers.getall(NODE_CALL_HEADER, [])
    if not values:
        for name in RESERVED_HEADERS:
            if name in request.headers:
                raise _refuse(request, f"{name} is set by nodes only")
        return None
    if len(values) > 1:
        raise _refuse(request, f"more than one {NODE_CALL_HEADER} header")
    body = await request.read()
    digest = await body_sha256_async(body)
    try:
        return verifier.verify(request.method, request.rel_url.raw_path_qs, body, values[0], body_digest=digest)
    except NodeCallRejected as exc:
        raise _refuse(request, exc.reason) from None


def node_call(request: web.Request) -> NodeCall | None:
    call = request.get(NODE_CALL_KEY)
    return call if isinstance(call, NodeCall) else None


def forwarded(request: web.Request) -> bool:
    """The request is a client's, proxied here by another node (a verified node call acting for a principal)."""
    call = node_call(request)
    return call is not None and call.principal is not None


def require_internal(request: web.Request) -> None:
    """CLUSTER_AUTHORIZATION_FAILED unless ``request`` is a verified node call acting for the node itself."""
    call = node_call(request)
    if call is None or call.principal is not None:
        raise BrokerError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "internal endpoint: for nodes of the cluster only")
