"""Node-to-node calls: the signed client side of internal endpoints.

Internal endpoints (``/v1/internal/*``) accept only calls another node signed
(``X-Txbroker-Node-Call``, ``cluster.security.node_calls``: method, path and
query, body, sender, time and a nonce, under a key derived from the cluster
secret; checked by ``cluster.http.node_auth.require_internal``). Every call is
signed afresh, so a captured one cannot be replayed. Every internal call -- verifications
and markers among them, several per transaction -- goes over a lean
keep-alive pool (``clients.aio.Http1Pool``: a fraction of aiohttp's client
CPU per request). A call takes at most what is left of the deadline it runs
under (``cluster.deadline``: the request's, or a marker attempt's), else the
node's ``request_timeout_ms``.

**Relay.** Connectivity between nodes need not be transitive (a link between
two nodes down, both still reaching a third). A call to a node this node
cannot reach -- the peer poll sees it dead, or the call fails to connect --
goes through another live node instead: ``POST /v1/internal/relay`` there,
which makes the call directly (never relaying again), signed with its own
identity, and answers with its answer. Without it a transaction coordinator cut off from one partition
leader could not write that partition's markers, and every later transaction
of the producer would wait for them.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from clients.aio import Http1Pool
from clients.protocol import BrokerError, ErrorCode

from ..deadline import timeout_for
from ..seams import NodeDirectory
from ..security.node_calls import NODE_CALL_HEADER, NodeCallSigner, body_sha256_async

__all__ = ["RELAY_PATH", "PeerHttpClient"]

_MAX_INTERNAL_ANSWER = 16 * 1024 * 1024
RELAY_PATH = "/v1/internal/relay"
#: A direct call without an answer for this long is sent through a relay too (a connection into a silent
#: network never answers; the peer poll takes a few seconds to see the node dead).
RELAY_AFTER_S = 1.0
_UNREACHABLE = frozenset({ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT})


class PeerHttpClient:
    """``PeerClient`` over HTTP/1.1: POST to another node's internal endpoint, each call signed.

    ``ssl_context``: for ``https://`` node URLs (node-to-node TLS; the node's client certificate)."""

    def __init__(
        self,
        nodes: NodeDirectory,
        cluster_secret: str,
        request_timeout_s: float = 30.0,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._nodes = nodes
        self._signer = NodeCallSigner(cluster_secret, nodes.node_id)
        self._ssl = ssl_context
        self._request_timeout_s = request_timeout_s
        self._pool: Http1Pool | None = None
        #: Whether a node looks reachable from here (the peer poll), and which nodes may relay to it.
        self.reachable: Callable[[int], bool] = lambda _node: True
        self.relays: Callable[[int], list[int]] = lambda _node: []

    def start(self) -> None:
        self._pool = Http1Pool(max_body=_MAX_INTERNAL_ANSWER, ssl=self._ssl)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def call(self, node_id: int, path: str, body: dict[str, Any], *, relay: bool = True) -> Any:
        """POST ``body`` to ``path`` on ``node_id``; through a relay when the node is out of this one's reach.

        With a live peer to relay through: a node the peer poll sees dead is asked through the relay first;
        otherwise directly, and if no answer came within ``RELAY_AFTER_S`` the same call also goes through
        the relay, and the first answer wins (internal calls are retried by design, so a call made twice
        is harmless). ``relay=False``: directly only (what a relaying node does)."""
        via = self.relays(node_id) if relay else []
        if not via:
            return await self.direct(node_id, path, body)
        if not self.reachable(node_id):
            try:
                return await self._through(via, node_id, path, body)
            except BrokerError as exc:
                if exc.error_code not in _UNREACHABLE:
                    raise
        attempts = [asyncio.ensure_future(self.direct(node_id, path, body))]
        try:
            done, _ = await asyncio.wait(attempts, timeout=RELAY_AFTER_S)
            if done:
                try:
                    return attempts[0].result()
                except BrokerError as exc:
                    if exc.error_code is not ErrorCode.NETWORK_EXCEPTION:
                        raise
                return await self._through(via, node_id, path, body)
            attempts.append(asyncio.ensure_future(self._through(via, node_id, path, body)))
            return await _first_answer(attempts)
        finally:
            for attempt in attempts:
                attempt.cancel()

    async def _through(self, via: list[int], node_id: int, path: str, body: dict[str, Any]) -> Any:
        last: BrokerError | None = None
        for relay in via:
            try:
                return await self.direct(relay, RELAY_PATH, {"node_id": node_id, "path": path, "body": body})
            except BrokerError as exc:
                if exc.error_code not in _UNREACHABLE:
                    raise
                last = exc
        assert last is not None
        raise last

    async def direct(self, node_id: int, path: str, body: dict[str, Any]) -> Any:
        url = self._nodes.node_url(node_id)
        if url is None or self._pool is None:
            raise BrokerError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"node {node_id} unknown")
        timeout = timeout_for(self._request_timeout_s)
        raw = json.dumps(body).encode()
        digest = await body_sha256_async(raw)
        try:
            signature = self._signer.sign("POST", path, raw, None, receiver=node_id, body_digest=digest)
        except ValueError as exc:  # a path no node serves (a relay's is the caller's)
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"cannot call {path[:80]!r}: {exc}") from None
        auth = f"{NODE_CALL_HEADER}: {signature}\r\n".encode("ascii")
        try:
            resp = await self._pool.post(url + path, raw, "application/json", timeout, auth)
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


async def _first_answer(attempts: Sequence[asyncio.Future[Any]]) -> Any:
    """The first answer of ``attempts`` (an error answer counts; being unreachable does not)."""
    pending = set(attempts)
    last: BaseException | None = None
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for attempt in done:
            exc = attempt.exception()
            if exc is None:
                return attempt.result()
            if not (isinstance(exc, BrokerError) and exc.error_code in _UNREACHABLE):
                raise exc
            last = exc
    assert last is not None
    raise last
