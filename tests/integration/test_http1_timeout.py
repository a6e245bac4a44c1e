"""The HTTP/1.1 transport's request timeout (clients/aio/_http1.py) against a real aiohttp server.

Real sockets and a real 0.2 s deadline: the server holds the request until the
client has given up, then the pool must answer the next request on a fresh
connection.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from clients.protocol import BrokerError, ErrorCode
from tests.support.http_server import echo, open_pool, run_with_server

pytestmark = pytest.mark.integration


def test_no_answer_within_the_timeout_is_request_timed_out_and_the_pool_recovers() -> None:
    client_gave_up = asyncio.Event()

    async def maybe_slow(request: web.Request) -> web.StreamResponse:
        if await request.read() == b"slow":
            await client_gave_up.wait()
        return await echo(request)

    async def scenario(url: str, _stats: dict[str, Any]) -> None:
        try:
            async with open_pool() as pool:
                with pytest.raises(BrokerError) as info:
                    await pool.post(url, b"slow", "a/b", 0.2)
                assert info.value.error_code is ErrorCode.REQUEST_TIMED_OUT
                client_gave_up.set()
                answer = await pool.post(url, b"ok", "a/b", 5.0)  # a fresh connection: the timed-out one was dropped
                assert json.loads(answer.body)["len"] == 2
        finally:
            client_gave_up.set()

    run_with_server(maybe_slow, scenario)
