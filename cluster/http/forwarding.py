"""Requests one node answers for another: proxied once, never twice, within the request's deadline.

A request for a transactional id or group that another node coordinates, or
an admin request reaching a node that does not lead the controller, is
proxied once to the right node. The proxied request is a node call
(``X-Txbroker-Node-Call``, ``cluster.security.node_calls``): signed by this
node over its method, path and query, body, and the principal of the request
it serves, which the target acts for; a forwarded request is never proxied
again (``cluster.http.node_auth.forwarded``). Listings fan out to every other
node's internal endpoint. ``Forwarder.produce_on`` sends one partition's batch
to its leader for the convenience produce (``cluster.routed_produce``), acting
for the producing principal too.

Every proxied request is bounded by the deadline of the request it serves
(``cluster.deadline``: the caller's ``X-Txbroker-Timeout-Ms`` or produce
``timeout_ms``, else the node's ``request_timeout_ms``, from its arrival),
and carries what is left of it to the target in ``X-Txbroker-Timeout-Ms``.
An answer that says the target does not lead (``NOT_COORDINATOR``,
``NOT_LEADER_OR_FOLLOWER``, ``NOT_CONTROLLER``, loading, unavailable), a
connection failure, or this node learning of a new leader while the
attempt waits, sends the request again to the leader as then known
(``call_at_leader``), until the deadline.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import yarl
from aiohttp import web

from clients.protocol import (
    PRODUCE_CONTENT_TYPE,
    BrokerError,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    encode_produce_request,
)

from ..deadline import MOVED, Deadline, call_at_leader, current_deadline, loop_now
from ..partitions import PartitionProduceResult
from ..routed_produce import LeaderForwarder
from ..seams import NodeDirectory, PeerClient
from ..security.node_calls import NODE_CALL_HEADER, NodeCallSigner, body_sha256_async
from ..security.principals import ANONYMOUS, CLIENT_HOST_KEY, PRINCIPAL_KEY
from .node_auth import forwarded

__all__ = ["TIMEOUT_HEADER", "Forwarder", "Locate", "forwarded"]

#: The caller's timeout for this request in milliseconds (a client's, or what a forwarding node has left).
TIMEOUT_HEADER = "X-Txbroker-Timeout-Ms"

_PRODUCE_PATH = "/v1/produce"

#: Where the node that can answer is now, as this node knows it (a URL), or None.
Locate = Callable[[], str | None]


def principal_of(request: web.Request) -> str:
    """The principal a request is served for (what a call made for it acts for)."""
    principal = request.get(PRINCIPAL_KEY, ANONYMOUS)
    return principal if isinstance(principal, str) and principal else ANONYMOUS


def client_host_of(request: web.Request) -> str:
    """The client's address as its ACLs match it (what a call made for it carries)."""
    host = request.get(CLIENT_HOST_KEY, "*")
    return host if isinstance(host, str) and host and " " not in host else "*"


class Forwarder:
    """Proxies requests to the node that can answer them, and fans listings out to every node.

    Every proxied request is signed by ``signer`` (this node) for the principal it serves.
    ``ssl_context``: for ``https://`` node URLs (node-to-node TLS; the node's client certificate)."""

    def __init__(
        self,
        nodes: NodeDirectory,
        peers: PeerClient,
        request_timeout_s: float = 30.0,
        *,
        signer: NodeCallSigner,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._nodes = nodes
        self._peers = peers
        self._request_timeout_s = request_timeout_s
        self._signer = signer
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True)
        self._session = aiohttp.ClientSession(connector=connector)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def node_at(self, url: str) -> int | None:
        """The id of the node whose URL ``url`` is; None if it is no node of this cluster."""
        url = url.rstrip("/")
        for node_id in self._nodes.node_ids():
            known = self._nodes.node_url(node_id)
            if known is not None and known.rstrip("/") == url:
                return node_id
        return None

    def deadline(self) -> Deadline:
        """The deadline of the request being served (the node's request timeout from now outside one)."""
        return current_deadline() or Deadline.after(loop_now(), self._request_timeout_s)

    async def proxy(
        self, request: web.Request, url: str, raw: bytes, unreachable: ErrorCode, locate: Locate | None = None
    ) -> web.Response:
        """Send ``request`` to the node at ``url``: a node call for its principal, so it is never proxied again.

        Retried where the leader went until the request's deadline (``call_at_leader``): ``locate()``
        tells where this node now believes the answering node is; an answer's ``leader_url`` /
        ``coordinator_url`` hint is followed too. An unreachable node in the end is ``unreachable``.
        """
        # The target exactly as received (ASCII: the HTTP parser refuses anything else), sent and signed as is.
        status, body = await self.call_as(
            request.method, request.rel_url.raw_path_qs, raw, principal_of(request), client_host_of(request),
            url, unreachable, locate,
        )  # fmt: skip
        return web.Response(body=body, status=status, content_type="application/json")

    async def call_as(
        self,
        method: str,
        path_qs: str,
        raw: bytes,
        principal: str,
        host: str,
        url: str,
        unreachable: ErrorCode,
        locate: Locate | None = None,
    ) -> tuple[int, bytes]:
        """``method path_qs`` with body ``raw`` on the node at ``url``, acting for ``principal`` (a node call);
        the answer's status and body. Retried and bounded as ``proxy`` says."""
        if self._session is None:
            raise BrokerError(unreachable, "node is starting")
        if self.node_at(url) is None:  # a node call goes to nodes of the cluster only
            raise BrokerError(unreachable, f"{url} is no node of this cluster")
        session = self._session
        deadline = self.deadline()
        digest = await body_sha256_async(raw)

        def resolve(last: BrokerError | None) -> str | None:
            if last is None:
                return (locate() if locate is not None else None) or url
            hint = last.extra.get("coordinator_url") or last.extra.get("leader_url")
            if isinstance(hint, str) and hint and self.node_at(hint) is not None:
                return hint.rstrip("/")
            return (locate() if locate is not None else None) or url

        async def attempt(target: str) -> tuple[int, bytes]:
            left = deadline.remaining(loop_now())
            timeout_ms = str(max(1, int(left * 1000)))
            receiver = self.node_at(target)
            if receiver is None:  # locate() named no node of the cluster
                raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"{target} is no node of this cluster")
            try:
                signature = self._signer.sign(
                    method, path_qs, raw, principal, receiver=receiver, body_digest=digest, host=host
                )
            except ValueError as exc:  # a method or target the HTTP parser let through but no node serves
                raise BrokerError(ErrorCode.INVALID_REQUEST, f"cannot forward this request: {exc}") from None
            headers = {NODE_CALL_HEADER: signature, "Content-Type": "application/json", TIMEOUT_HEADER: timeout_ms}
            try:
                async with session.request(
                    method, yarl.URL(target + path_qs, encoded=True), data=raw, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=max(0.001, left)),
                ) as resp:  # fmt: skip
                    body = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, OSError) as e:
                raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"{target} unreachable: {e}") from e
            except TimeoutError as e:
                raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"{target}: no answer in time") from e
            if status in (421, 503):
                err = _error_of(body)
                if err is not None and err.error_code in MOVED:
                    raise err  # not served there: the policy retries where the leader is now
            return status, body

        try:
            return await call_at_leader(resolve, attempt, deadline, what=f"{method} {path_qs.partition('?')[0]}")
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NETWORK_EXCEPTION:
                raise BrokerError(unreachable, exc.message) from exc
            raise

    async def to_controller(
        self, request: web.Request, exc: BrokerError, raw: bytes, locate: Locate | None = None
    ) -> web.Response:
        """An admin request that reached a follower: proxied once to the controller leader."""
        leader_url = exc.extra.get("leader_url")
        if forwarded(request) or not leader_url or self._session is None:
            raise exc
        return await self.proxy(request, str(leader_url), raw, ErrorCode.NOT_CONTROLLER, locate)

    async def to_leader(
        self, request: web.Request, exc: BrokerError, raw: bytes, locate: Locate | None = None
    ) -> web.Response:
        """A partition-leader request (DescribeProducers) that reached a follower: proxied once to the leader."""
        url = exc.extra.get("leader_url")
        if exc.error_code is not ErrorCode.NOT_LEADER_OR_FOLLOWER or not url or forwarded(request):
            raise exc
        return await self.proxy(request, str(url), raw, ErrorCode.COORDINATOR_NOT_AVAILABLE, locate)

    async def routed(
        self,
        request: web.Request,
        raw: bytes,
        call: Callable[[], Awaitable[dict[str, Any]]],
        locate: Locate | None = None,
    ) -> web.Response:
        """Run ``call()`` here; on NOT_COORDINATOR proxy the request once to the coordinator."""
        try:
            return web.json_response(await call())
        except BrokerError as exc:
            url = exc.extra.get("coordinator_url")
            if exc.error_code is not ErrorCode.NOT_COORDINATOR or not url or forwarded(request):
                raise
            return await self.proxy(request, str(url), raw, ErrorCode.COORDINATOR_NOT_AVAILABLE, locate)

    async def fan_out(self, path: str, body: dict[str, Any]) -> list[Any]:
        """Ask every other node's internal endpoint; unreachable nodes are reported, not fatal."""
        peers = [n for n in self._nodes.node_ids() if n != self._nodes.node_id]

        async def one(node_id: int) -> Any:
            try:
                return await self._peers.call(node_id, path, body)
            except BrokerError as exc:
                return {"error": {"node_id": node_id, **exc.to_json()}}

        return list(await asyncio.gather(*(one(n) for n in peers)))

    def acting_for(self, request: web.Request) -> LeaderForwarder:
        """``produce_on`` for the routed produce of ``request``: writes on a leader act for its principal."""
        return _ProduceAs(self, principal_of(request), client_host_of(request))

    async def produce_on(
        self, url: str, part: ProducePartition, principal: str = ANONYMOUS, host: str = "*"
    ) -> PartitionProduceResult | None:
        """Write ``part`` on the node at ``url`` (its leader), for ``principal``; None if the request never left.

        Bounded by the request's deadline; not retried here (a plain write must not be duplicated).
        """
        receiver = self.node_at(url)
        if self._session is None or receiver is None:
            return None
        left = self.deadline().remaining(loop_now())
        if left <= 0:
            return None
        body = encode_produce_request(ProduceRequest((part,), timeout_ms=max(1, int(left * 1000))))
        digest = await body_sha256_async(body)
        signature = self._signer.sign(
            "POST", _PRODUCE_PATH, body, principal, receiver=receiver, body_digest=digest, host=host
        )
        try:
            async with self._session.post(
                url + _PRODUCE_PATH,
                data=body,
                headers={NODE_CALL_HEADER: signature, "Content-Type": PRODUCE_CONTENT_TYPE},
                timeout=aiohttp.ClientTimeout(total=left),
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


class _ProduceAs:
    """A ``LeaderForwarder`` acting for one principal (at its client's address)."""

    def __init__(self, forwarder: Forwarder, principal: str, host: str) -> None:
        self._forwarder = forwarder
        self._principal = principal
        self._host = host

    async def produce_on(self, url: str, part: ProducePartition) -> PartitionProduceResult | None:
        return await self._forwarder.produce_on(url, part, self._principal, self._host)


def _error_of(body: bytes) -> BrokerError | None:
    """The error an answer's JSON body names, with its extra fields; None if it names none."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("error_code"), str):
        return None
    extra = {k: v for k, v in data.items() if k not in ("error_code", "message", "retriable")}
    return BrokerError(ErrorCode.from_name(data["error_code"]), str(data.get("message") or ""), **extra)
