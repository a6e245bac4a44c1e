"""Requests one node answers for another: proxied once, never twice.

A request for a transactional id or group that another node coordinates, or
an admin request reaching a node that does not lead the controller, is
proxied once to the right node (marked ``X-Txbroker-Forwarded``, so it is
never proxied again). Listings fan out to every other node's internal
endpoint. ``LeaderForwarder`` sends one partition's batch to its leader for
the convenience produce (``cluster.routed_produce``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from clients.protocol import (
    PRODUCE_CONTENT_TYPE,
    BrokerError,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    encode_produce_request,
)

from ..partitions import PartitionProduceResult
from ..peers import FORWARDED_HEADER
from ..seams import NodeDirectory, PeerClient
from .internal import FORWARD_TIMEOUT_S

__all__ = ["Forwarder", "forwarded"]


def forwarded(request: web.Request) -> bool:
    """The request was proxied here by another node (and so is not proxied again)."""
    return bool(request.headers.get(FORWARDED_HEADER))


class Forwarder:
    """Proxies requests to the node that can answer them, and fans listings out to every node."""

    def __init__(self, nodes: NodeDirectory, peers: PeerClient) -> None:
        self._nodes = nodes
        self._peers = peers
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def proxy(self, request: web.Request, url: str, raw: bytes, unreachable: ErrorCode) -> web.Response:
        """Send ``request`` once to the node at ``url`` (marked forwarded, so it is never proxied again)."""
        if self._session is None:
            raise BrokerError(unreachable, "node is starting")
        try:
            async with self._session.request(
                request.method,
                url + request.rel_url.path_qs,
                data=raw,
                headers={FORWARDED_HEADER: "1", "Content-Type": "application/json"},
            ) as resp:
                body = await resp.read()
                return web.Response(body=body, status=resp.status, content_type="application/json")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise BrokerError(unreachable, f"{url} unreachable: {e}") from e

    async def to_controller(self, request: web.Request, exc: BrokerError, raw: bytes) -> web.Response:
        """An admin request that reached a follower: proxied once to the controller leader."""
        leader_url = exc.extra.get("leader_url")
        if forwarded(request) or not leader_url or self._session is None:
            raise exc
        return await self.proxy(request, str(leader_url), raw, ErrorCode.NOT_CONTROLLER)

    async def to_leader(self, request: web.Request, exc: BrokerError, raw: bytes) -> web.Response:
        """A partition-leader request (DescribeProducers) that reached a follower: proxied once to the leader."""
        url = exc.extra.get("leader_url")
        if exc.error_code is not ErrorCode.NOT_LEADER_OR_FOLLOWER or not url or forwarded(request):
            raise exc
        return await self.proxy(request, str(url), raw, ErrorCode.COORDINATOR_NOT_AVAILABLE)

    async def routed(
        self, request: web.Request, raw: bytes, call: Callable[[], Awaitable[dict[str, Any]]]
    ) -> web.Response:
        """Run ``call()`` here; on NOT_COORDINATOR proxy the request once to the coordinator."""
        try:
            return web.json_response(await call())
        except BrokerError as exc:
            url = exc.extra.get("coordinator_url")
            if exc.error_code is not ErrorCode.NOT_COORDINATOR or not url or forwarded(request):
                raise
            return await self.proxy(request, str(url), raw, ErrorCode.COORDINATOR_NOT_AVAILABLE)

    async def fan_out(self, path: str, body: dict[str, Any]) -> list[Any]:
        """Ask every other node's internal endpoint; unreachable nodes are reported, not fatal."""
        peers = [n for n in self._nodes.node_ids() if n != self._nodes.node_id]

        async def one(node_id: int) -> Any:
            try:
                return await self._peers.call(node_id, path, body)
            except BrokerError as exc:
                return {"error": {"node_id": node_id, **exc.to_json()}}

        return list(await asyncio.gather(*(one(n) for n in peers)))

    async def produce_on(self, url: str, part: ProducePartition) -> PartitionProduceResult | None:
        """Write ``part`` on the node at ``url`` (its leader); None if the request never left this node."""
        if self._session is None:
            return None
        try:
            async with self._session.post(
                url + "/v1/produce",
                data=encode_produce_request(ProduceRequest((part,))),
                headers={FORWARDED_HEADER: "1", "Content-Type": PRODUCE_CONTENT_TYPE},
            ) as resp:
                data = (await resp.json())["partitions"][0]
            err = None
            if data.get("error_code", "NONE") != "NONE":
                extra = {k: data[k] for k in ("leader_id", "leader_url") if k in data}
                err = BrokerError(ErrorCode.from_name(data["error_code"]), data.get("message") or "", **extra)
            return PartitionProduceResult(
                part.topic, part.partition, int(data["base_offset"]), int(data["log_append_time"]), err
            )
        except aiohttp.ClientConnectorError:
            return None  # the request never left: nothing was written, the caller may retry
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError) as exc:
            err = BrokerError(ErrorCode.NETWORK_EXCEPTION, f"forward to the leader failed ({exc!r}); it may be written")
            return PartitionProduceResult(part.topic, part.partition, -1, -1, err)
