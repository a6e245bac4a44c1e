"""Node-to-node calls: the signed client side, and the check every internal endpoint makes.

Internal endpoints (``/v1/internal/*``) are authenticated with an HMAC under
the cluster secret (header ``X-Txbroker-Auth``, ``cluster.peers.sign``), so
only nodes of the cluster can call them. Every internal call -- verifications
and markers among them, several per transaction -- goes over a lean
keep-alive pool (``clients.aio.Http1Pool``: a fraction of aiohttp's client
CPU per request). A call takes at most what is left of the deadline it runs
under (``cluster.deadline``: the request's, or a marker attempt's), else the
node's ``request_timeout_ms``.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from clients.aio import Http1Pool
from clients.protocol import BrokerError, ErrorCode

from ..deadline import timeout_for
from ..peers import AUTH_HEADER, sign, verify
from ..seams import NodeDirectory

__all__ = ["PeerHttpClient", "require_internal"]

_MAX_INTERNAL_ANSWER = 16 * 1024 * 1024


class PeerHttpClient:
    """``PeerClient`` over HTTP/1.1: POST to another node's internal endpoint, signed."""

    def __init__(self, nodes: NodeDirectory, cluster_secret: str, request_timeout_s: float = 30.0) -> None:
        self._nodes = nodes
        self._secret = cluster_secret
        self._request_timeout_s = request_timeout_s
        self._pool: Http1Pool | None = None

    def start(self) -> None:
        self._pool = Http1Pool(max_body=_MAX_INTERNAL_ANSWER)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def call(self, node_id: int, path: str, body: dict[str, Any]) -> Any:
        url = self._nodes.node_url(node_id)
        if url is None or self._pool is None:
            raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"node {node_id} unknown")
        timeout = timeout_for(self._request_timeout_s)
        auth = f"{AUTH_HEADER}: {sign(self._secret, 'POST', path)}\r\n".encode("latin-1")
        try:
            resp = await self._pool.post(url + path, json.dumps(body).encode(), "application/json", timeout, auth)
            data = json.loads(resp.body)
        except BrokerError as exc:
            if exc.error_code is ErrorCode.REQUEST_TIMED_OUT:
                raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"node {node_id}: no answer in {timeout:.3f}s") from exc
            raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"node {node_id} unreachable: {exc}") from exc
        except ValueError as exc:
            raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"node {node_id} unreachable: {exc}") from exc
        if resp.status >= 400:
            if not isinstance(data, dict):
                raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"node {node_id}: HTTP {resp.status} without an error")
            extra = {k: v for k, v in data.items() if k not in ("error_code", "message", "retriable")}
            raise BrokerError(ErrorCode.from_name(data.get("error_code", "")), data.get("message", ""), **extra)
        return data


def require_internal(cluster_secret: str, request: web.Request) -> None:
    """CLUSTER_AUTHORIZATION_FAILED unless ``request`` carries the cluster's signature of its method and path."""
    signature = request.headers.get(AUTH_HEADER)
    # a valid signature is hex; hmac.compare_digest raises TypeError on non-ASCII str
    if signature is not None and not signature.isascii():
        signature = None
    if not verify(cluster_secret, request.method, request.path, signature):
        raise BrokerError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "internal endpoint")
