"""Node calls over real HTTP on loopback: what each client of ours sends is what the receiver verifies.

The receiver is an aiohttp application with the node's middleware (errors, then node-call verification);
the senders are the node's own clients: ``PeerHttpClient`` (``clients.aio.Http1Pool``), ``Forwarder.proxy``
and ``Forwarder.produce_on`` (aiohttp). Request targets carry %-escapes of every kind and non-ASCII topic
names, which must reach the receiver byte for byte as signed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import yarl
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from clients.protocol import BrokerError, ErrorCode, ProducePartition
from cluster.config import free_ports
from cluster.http.access import Access, RouteTable
from cluster.http.app import make_middlewares
from cluster.http.auth import Gatekeeper
from cluster.http.forwarding import Forwarder
from cluster.http.internal import PeerHttpClient
from cluster.http.node_auth import forwarded, require_internal
from cluster.metrics import NodeMetrics
from cluster.security.node_calls import NODE_CALL_HEADER, NodeCall, NodeCallSigner, NodeCallVerifier
from cluster.security.principals import ANONYMOUS, NODE_CALL_KEY, PRINCIPAL_KEY

SECRET = "wire-secret"
TARGETS = [
    "/v1/topics/%C3%A9t%C3%A9-%E4%B8%96%E7%95%8C/partitions/0?a=%2F%7E&b=%C3%A9+c&c=%25&d=%2f",
    "/v1/topics/a%2Fb?q=%7e%20&empty=&flag",
    "/v1/internal/echo?x=%2F%7E&t=%C3%A9",
    "/v1/topics/plain",
]


class Nodes:
    def __init__(self, urls: dict[int, str]) -> None:
        self.urls = urls

    @property
    def node_id(self) -> int:
        return 1  # the sender; the receiver is node 2

    def node_ids(self) -> list[int]:
        return sorted(self.urls)

    def node_url(self, node_id: int | None) -> str | None:
        return self.urls.get(node_id) if node_id is not None else None


async def echo(request: web.Request) -> web.Response:
    call = request.get(NODE_CALL_KEY)
    body = await request.read()
    return web.json_response(
        {
            "raw_path_qs": request.rel_url.raw_path_qs,
            "sender": call.sender if isinstance(call, NodeCall) else None,
            "principal": request.get(PRINCIPAL_KEY),
            "forwarded": forwarded(request),
            "body": body.decode("latin-1"),
        }
    )


async def internal(request: web.Request) -> web.Response:
    require_internal(request)
    return await echo(request)


PRODUCED: list[dict[str, Any]] = []


async def produce(request: web.Request) -> web.Response:
    seen = await echo(request)
    PRODUCED.append(json.loads(seen.body))  # type: ignore[arg-type]
    return web.json_response({"partitions": [{"error_code": "NONE", "base_offset": 7, "log_append_time": 1}]})


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_ports(1)[0]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def receiver(verifier: NodeCallVerifier) -> web.Application:
    gatekeeper = Gatekeeper(None, lambda: None, verifier)  # type: ignore[arg-type,return-value]
    app = web.Application(middlewares=make_middlewares(NodeMetrics(), gatekeeper))
    routes = RouteTable(app)
    routes.post("/v1/produce", produce, Access.user())
    routes.add("*", "/v1/internal/{tail:.*}", internal, Access.nodes())
    routes.add("*", "/{tail:.*}", echo, Access.user())
    return app


Scenario = Callable[[str, NodeCallVerifier], Awaitable[None]]


def run(scenario: Scenario) -> None:
    async def main() -> None:
        verifier = NodeCallVerifier(SECRET, node_id=2, senders=[1, 2])
        runner, url = await serve(receiver(verifier))
        try:
            await scenario(url, verifier)
        finally:
            await runner.cleanup()

    asyncio.run(main())


async def raw_request(url: str, request: bytes) -> tuple[int, dict[str, Any]]:
    """Send ``request`` bytes as they are; the status and JSON answer."""
    host, port = yarl.URL(url).host, yarl.URL(url).port
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_peer_client_calls_are_verified_with_their_query_and_body() -> None:
    async def scenario(url: str, _verifier: NodeCallVerifier) -> None:
        client = PeerHttpClient(Nodes({2: url}), SECRET)
        client.start()
        try:
            path = "/v1/internal/echo?x=%2F%7E&t=%C3%A9t%C3%A9&p=%2f"
            for i in range(3):
                body = {"n": i, "topic": "\u00e9t\u00e9"}
                answer = await client.direct(2, path, body)
                assert answer["raw_path_qs"] == path
                assert answer["sender"] == 1 and answer["principal"] is None and not answer["forwarded"]
                assert json.loads(answer["body"].encode("latin-1")) == body
            # a path no node serves (a relay carries its caller's) is a bad request, sent nowhere
            with pytest.raises(BrokerError) as err:
                await client.direct(2, "/v1/internal/\u00e9t\u00e9", {})
            assert err.value.error_code is ErrorCode.INVALID_REQUEST
        finally:
            await client.close()
        # another secret is refused
        stranger = PeerHttpClient(Nodes({2: url}), "not-the-secret")
        stranger.start()
        try:
            with pytest.raises(BrokerError) as err:
                await stranger.direct(2, "/v1/internal/echo", {})
            assert err.value.error_code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        finally:
            await stranger.close()

    run(scenario)


def test_forwarded_requests_arrive_byte_for_byte_as_signed_acting_for_the_principal() -> None:
    async def scenario(url: str, _verifier: NodeCallVerifier) -> None:
        forwarder = Forwarder(Nodes({2: url}), None, signer=NodeCallSigner(SECRET, 1))  # type: ignore[arg-type]
        await forwarder.start()

        async def front(request: web.Request) -> web.StreamResponse:
            if "X-Test-Principal" in request.headers:
                request[PRINCIPAL_KEY] = request.headers["X-Test-Principal"]
            raw = await request.read()
            return await forwarder.proxy(request, url, raw, ErrorCode.COORDINATOR_NOT_AVAILABLE)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", front)
        runner, front_url = await serve(app)
        try:
            async with aiohttp.ClientSession() as session:
                for target in TARGETS[:2] + TARGETS[3:]:
                    for method, body in (("POST", b'{"x": "\xc3\xa9"}'), ("GET", b""), ("DELETE", b"")):
                        for principal in (None, "User:\u00e9t\u00e9"):
                            headers = {"X-Test-Principal": principal} if principal else {}
                            async with session.request(
                                method, yarl.URL(front_url + target, encoded=True), data=body, headers=headers
                            ) as resp:
                                assert resp.status == 200, await resp.text()
                                seen = await resp.json()
                            assert seen["raw_path_qs"] == target
                            assert seen["body"].encode("latin-1") == body
                            assert seen["sender"] == 1 and seen["forwarded"] is True
                            assert seen["principal"] == (principal or ANONYMOUS)
                # a hint naming no node of the cluster is not followed
                request = make_mocked_request("GET", "/v1/topics/x")
                with pytest.raises(BrokerError) as err:
                    await forwarder.proxy(request, url + "0", b"", ErrorCode.COORDINATOR_NOT_AVAILABLE)
                assert err.value.error_code is ErrorCode.COORDINATOR_NOT_AVAILABLE
                # a client's unescaped non-ASCII target: aiohttp escapes it, the proxy sends that as it is
                async with session.get(front_url + "/v1/topics/\u00e9t\u00e9?k=\u4e16") as resp:
                    seen = await resp.json()
                assert seen["raw_path_qs"] == "/v1/topics/%C3%A9t%C3%A9?k=%E4%B8%96"
        finally:
            await runner.cleanup()
            await forwarder.close()

    run(scenario)


def test_produce_on_acts_for_the_requests_principal() -> None:
    async def scenario(url: str, _verifier: NodeCallVerifier) -> None:
        forwarder = Forwarder(Nodes({2: url}), None, signer=NodeCallSigner(SECRET, 1))  # type: ignore[arg-type]
        await forwarder.start()
        try:
            part = ProducePartition("t", 0, b"\x00" * 10)
            request = make_mocked_request("POST", "/v1/topics/t/records")
            request[PRINCIPAL_KEY] = "User:carol"
            PRODUCED.clear()
            result = await forwarder.acting_for(request).produce_on(url, part)
            assert result is not None and result.error is None and result.base_offset == 7
            result = await forwarder.acting_for(make_mocked_request("POST", "/")).produce_on(url, part)
            assert result is not None and result.error is None
            # a URL of no node of the cluster is sent nothing (a signed call goes to cluster nodes only)
            assert await forwarder.produce_on(url + "0", part) is None
            assert [(p["sender"], p["principal"], p["forwarded"]) for p in PRODUCED] == [
                (1, "User:carol", True), (1, ANONYMOUS, True)
            ]  # fmt: skip
        finally:
            await forwarder.close()

    run(scenario)


def test_internal_routes_refuse_forwarded_calls_and_clients() -> None:
    async def scenario(url: str, _verifier: NodeCallVerifier) -> None:
        signer = NodeCallSigner(SECRET, 2)
        async with aiohttp.ClientSession() as session:
            path = "/v1/internal/echo"
            header = signer.sign("POST", path, b"{}", "User:alice", receiver=2)
            async with session.post(url + path, data=b"{}", headers={NODE_CALL_HEADER: header}) as resp:
                assert resp.status == 403
                assert (await resp.json())["error_code"] == "CLUSTER_AUTHORIZATION_FAILED"
            async with session.post(url + path, data=b"{}") as resp:
                assert resp.status == 403
            header = signer.sign("POST", path, b"{}", None, receiver=2)
            async with session.post(url + path, data=b"{}", headers={NODE_CALL_HEADER: header}) as resp:
                assert resp.status == 200
            async with session.post(url + path, data=b"{}", headers={NODE_CALL_HEADER: header}) as resp:
                assert resp.status == 403  # the same call again
                assert "replayed" in (await resp.json())["message"]
            header = signer.sign("POST", path, b"{}", None, receiver=1)  # signed for another node
            async with session.post(url + path, data=b"{}", headers={NODE_CALL_HEADER: header}) as resp:
                assert resp.status == 403

    run(scenario)


def test_reserved_and_hostile_headers_are_refused_with_403_never_an_error() -> None:
    async def scenario(url: str, _verifier: NodeCallVerifier) -> None:
        signer = NodeCallSigner(SECRET, 2)
        valid = signer.sign("GET", "/v1/topics/x", b"", "User:alice", receiver=2).encode()
        for path in (b"/v1/topics/x", b"/v1/internal/echo"):
            for header in (
                b"X-Txbroker-Forwarded: 1",
                b"X-Txbroker-Auth: " + b"0" * 64,
                b"x-txbroker-forwarded: ",
                b"X-Txbroker-Node-Call: garbage",
                b"X-Txbroker-Node-Call: ",
                b"X-Txbroker-Node-Call: \xff\xfe\xc3\x28",
                b"X-Txbroker-Node-Call: " + valid[:-2] + b"\xc3\xa9",
                b"X-Txbroker-Node-Call: " + valid + b"\r\nX-Txbroker-Node-Call: " + valid,
                b"X-Txbroker-Auth: \xff\xfe",
                b"X-Txbroker-Node-Call: " + b"v1 " * 2000,
            ):
                request = b"GET %s HTTP/1.1\r\nHost: x\r\n%s\r\nConnection: close\r\n\r\n" % (path, header)
                status, body = await raw_request(url, request)
                assert status == 403, (header, body)
                assert body["error_code"] == "CLUSTER_AUTHORIZATION_FAILED", body
        # without any of them, a public route answers and is no node call
        status, body = await raw_request(url, b"GET /v1/topics/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert status == 200 and body["sender"] is None and body["forwarded"] is False

    run(scenario)
