"""Node-to-node calls: the signed client side, and the check every internal endpoint makes.

Internal endpoints (``/v1/internal/*``) are authenticated with an HMAC under
the cluster secret (header ``X-Txbroker-Auth``, ``cluster.peers.sign``), so
only nodes of the cluster can call them. Every internal call -- verifications
and markers among them, several per transaction -- goes over a lean
keep-alive pool (``clients.aio.Http1Pool``: a fraction of aiohttp's client
CPU per request).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from clients.aio import Http1Pool
from clients.protocol import BrokerError, ErrorCode

from ..peers import AUTH_HEADER, sign, verify
from ..seams import NodeDirectory

__all__ = ["FORWARD_TIMEOUT_S", "PeerHttpClient", "require_internal"]

FORWARD_TIMEOUT_S = 35.0  # an internal call: longer than any wait a node does before answering one
_MAX_INTERNAL_ANSWER = 16 * 1024 * 1024


class PeerHttpClient:
    """``PeerClient`` over HTTP/1.1: POST to another node's internal endpoint, signed."""

    def __init__(self, nodes: NodeDirectory, cluster_secret: str) -> None:
        self._nodes = nodes
        self._secret = cluster_secret
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
        auth = f"{AUTH_HEADER}: {sign(self._secret, 'POST', path)}\r\n".encode("latin-1")
        try:
            resp = await self._pool.post(url + path, json.dumps(body).encode(), "application/json",
                                         FORWARD_TIMEOUT_S, auth)  # fmt: skip
            data = json.loads(resp.body)
        except (BrokerError, ValueError) as exc:
            raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"node {node_id} unreachable: {exc}") from exc
        if resp.status >= 400:
            if not isinstance(data, dict):
                raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"node {node_id}: HTTP {resp.status} without an error")
            raise BrokerError(ErrorCode.from_name(data.get("error_code", "")), data.get("message", ""))
        return data


def require_internal(cluster_secret: str, request: web.Request) -> None:
    """CLUSTER_AUTHORIZATION_FAILED unless ``request`` carries the cluster's signature of its method and path."""
    signature = request.headers.get(AUTH_HEADER)
    # a valid signature is hex; hmac.compare_digest raises TypeError on non-ASCII str
    if signature is not None and not signature.isascii():
        signature = None
    if not verify(cluster_secret, request.method, request.path, signature):
        raise BrokerError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "internal endpoint")
