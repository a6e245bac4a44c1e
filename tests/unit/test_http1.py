"""The producer's keep-alive HTTP/1.1 transport (clients/aio/_http1.py) against a real aiohttp server.

No test here depends on timing: a handler that must hold a request waits for
an event the scenario sets. The request timeout is tested in
tests/integration/test_http1_timeout.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from clients.aio._http1 import Http1Pool
from clients.aio._session import HttpSession
from clients.protocol import BrokerError, ErrorCode
from tests.support.http_server import echo, open_pool, run_with_server


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
    arrived: list[web.Request] = []
    all_arrived = asyncio.Event()

    async def together(request: web.Request) -> web.StreamResponse:
        # No answer until all four requests are in: posts that shared a connection would never get here.
        arrived.append(request)
        if len(arrived) == 4:
            all_arrived.set()
        await all_arrived.wait()
        return await echo(request)

    async def scenario(url: str, stats: dict[str, Any]) -> None:
        try:
            async with open_pool() as pool:
                answers = await asyncio.gather(*(pool.post(url, b"x" * i, "a/b", 5.0) for i in range(4)))
                assert sorted(json.loads(a.body)["len"] for a in answers) == [0, 1, 2, 3]
                assert len(stats["peers"]) == 4
        finally:
            all_arrived.set()  # a failed run must not leave handlers waiting

    run_with_server(together, scenario)


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
    client_done = asyncio.Event()

    async def big_or_drop(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if body == b"drop":
            assert request.transport is not None
            request.transport.close()
            await client_done.wait()  # the handler ends only after the client has seen the drop
        return web.Response(body=b"z" * 5000, content_type="application/json")

    async def scenario(url: str, _stats: dict[str, Any]) -> None:
        try:
            async with open_pool(max_body=4096) as pool:
                for body in (b"big", b"drop"):
                    with pytest.raises(BrokerError) as info:
                        await pool.post(url, body, "a/b", 5.0)
                    assert info.value.error_code is ErrorCode.NETWORK_EXCEPTION, body
        finally:
            client_done.set()

    run_with_server(big_or_drop, scenario)


def test_only_http_and_https_urls_are_accepted() -> None:
    async def scenario(url: str, _stats: dict[str, Any]) -> None:
        pool = Http1Pool()
        with pytest.raises(BrokerError) as info:
            await pool.post(url.replace("http://", "ftp://"), b"", "a/b", 1.0)
        assert info.value.error_code is ErrorCode.INVALID_CONFIG
        # https:// to a server that speaks plain HTTP: a TLS handshake failure (transport), never plain text
        with pytest.raises(BrokerError) as info:
            await pool.post(url.replace("http://", "https://"), b"", "a/b", 5.0)
        assert info.value.error_code is ErrorCode.NETWORK_EXCEPTION
        await pool.close()

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
