"""The producer's keep-alive HTTP/1.1 transport (clients/aio/_http1.py) against a real aiohttp server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from clients.aio._http1 import Http1Pool
from clients.aio._session import HttpSession
from clients.protocol import BrokerError, ErrorCode
from cluster.config import free_ports

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def run_with_server(handler: Handler, scenario: Callable[[str, dict[str, Any]], Awaitable[None]]) -> None:
    """Serve ``handler`` on a free port and run ``scenario(url, stats)``; ``stats['peers']`` counts connections."""

    async def main() -> None:
        stats: dict[str, Any] = {"peers": set()}

        async def counting(request: web.Request) -> web.StreamResponse:
            stats["peers"].add(request.transport.get_extra_info("peername") if request.transport else None)
            return await handler(request)

        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", counting)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_ports(1)[0]
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        try:
            await scenario(f"http://127.0.0.1:{port}", stats)
        finally:
            await runner.cleanup()

    asyncio.run(main())


@asynccontextmanager
async def open_pool(**kwargs: Any) -> AsyncIterator[Http1Pool]:
    pool = Http1Pool(**kwargs)
    try:
        yield pool
    finally:
        await pool.close()


async def echo(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    return web.json_response({"len": len(body), "type": request.content_type, "path": request.path_qs})


def test_posts_reuse_one_keep_alive_connection() -> None:
    async def scenario(url: str, stats: dict[str, Any]) -> None:
        async with open_pool() as pool:
            for n in (0, 1, 70_000, 5):
                answer = await pool.post(url + "/v1/produce?x=1", b"a" * n, "application/x-test", 5.0)
                assert answer.status == 200
                assert answer.content_type == "application/json"
                assert json.loads(answer.body) == {"len": n, "type": "application/x-test", "path": "/v1/produce?x=1"}
            assert len(stats["peers"]) == 1

    run_with_server(echo, scenario)


def test_concurrent_posts_use_separate_connections() -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.05)
        return await echo(request)

    async def scenario(url: str, stats: dict[str, Any]) -> None:
        async with open_pool() as pool:
            answers = await asyncio.gather(*(pool.post(url, b"x" * i, "a/b", 5.0) for i in range(4)))
            assert sorted(json.loads(a.body)["len"] for a in answers) == [0, 1, 2, 3]
            assert len(stats["peers"]) == 4

    run_with_server(slow, scenario)


def test_error_answers_become_the_servers_broker_error() -> None:
    async def refuse(request: web.Request) -> web.StreamResponse:
        await request.read()
        body = {"error_code": "NOT_LEADER_OR_FOLLOWER", "message": "not me", "retriable": True, "leader_url": "u"}
        return web.json_response(body, status=421)

    async def scenario(url: str, _stats: dict[str, Any]) -> None:
        session = HttpSession(request_timeout_ms=5000)
        try:
            with pytest.raises(BrokerError) as info:
                await session.post_bytes(url + "/v1/produce", b"x", "a/b")
            assert info.value.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER
            assert info.value.extra["leader_url"] == "u"
        finally:
            await session.close()

    run_with_server(refuse, scenario)


def test_chunked_answer_is_refused_as_a_network_error() -> None:
    async def chunked(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"{}")
        await resp.write_eof()
        return resp

    async def scenario(url: str, _stats: dict[str, Any]) -> None:
        async with open_pool() as pool:
            with pytest.raises(BrokerError) as info:
                await pool.post(url, b"x", "a/b", 5.0)
            assert info.value.error_code is ErrorCode.NETWORK_EXCEPTION
            assert info.value.retriable

    run_with_server(chunked, scenario)


def test_oversized_answer_and_dropped_connection_are_network_errors() -> None:
    async def big_or_drop(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if body == b"drop":
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(1)
        return web.Response(body=b"z" * 5000, content_type="application/json")

    async def scenario(url: str, _stats: dict[str, Any]) -> None:
        async with open_pool(max_body=4096) as pool:
            for body in (b"big", b"drop"):
                with pytest.raises(BrokerError) as info:
                    await pool.post(url, body, "a/b", 5.0)
                assert info.value.error_code is ErrorCode.NETWORK_EXCEPTION, body

    run_with_server(big_or_drop, scenario)


def test_no_answer_within_the_timeout_is_request_timed_out_and_the_pool_recovers() -> None:
    async def maybe_slow(request: web.Request) -> web.StreamResponse:
        if await request.read() == b"slow":
            await asyncio.sleep(2)
        return await echo(request)

    async def scenario(url: str, _stats: dict[str, Any]) -> None:
        async with open_pool() as pool:
            with pytest.raises(BrokerError) as info:
                await pool.post(url, b"slow", "a/b", 0.2)
            assert info.value.error_code is ErrorCode.REQUEST_TIMED_OUT
            answer = await pool.post(url, b"ok", "a/b", 5.0)  # a fresh connection: the timed-out one was dropped
            assert json.loads(answer.body)["len"] == 2

    run_with_server(maybe_slow, scenario)


def test_only_http_urls_are_accepted() -> None:
    async def scenario(url: str, _stats: dict[str, Any]) -> None:
        pool = Http1Pool()
        with pytest.raises(BrokerError) as info:
            await pool.post(url.replace("http://", "https://"), b"", "a/b", 1.0)
        assert info.value.error_code is ErrorCode.INVALID_CONFIG

    run_with_server(echo, scenario)


def test_extra_head_lines_reach_the_server_and_differ_per_url() -> None:
    """The internal forward's signature header (``extra_head``) is sent, and each url keeps its own."""

    async def headers(request: web.Request) -> web.StreamResponse:
        return web.json_response({"sig": request.headers.get("X-Sig"), "path": request.path})

    async def scenario(url: str, stats: dict[str, Any]) -> None:
        async with open_pool() as pool:
            for path, sig in (("/a", b"one"), ("/b", b"two"), ("/a", b"one"), ("/a", b"")):
                extra = b"X-Sig: " + sig + b"\r\n" if sig else b""
                answer = await pool.post(url + path, b"{}", "application/json", 5.0, extra)
                assert json.loads(answer.body) == {"sig": sig.decode() or None, "path": path}
            assert len(stats["peers"]) == 1

    run_with_server(headers, scenario)
