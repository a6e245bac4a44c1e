"""A real aiohttp server on loopback for the HTTP/1.1 transport tests (clients/aio/_http1.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from clients.aio._http1 import Http1Pool
from cluster.config import free_ports

__all__ = ["Handler", "echo", "open_pool", "run_with_server"]

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
