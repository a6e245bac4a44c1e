"""A lossy TCP proxy for fault tests: it forwards every request and drops some responses.

``LossyProxy(target_port, drop_rate=0.1)`` listens on a free loopback port and
relays bytes both ways. When the first bytes of a response (the server's first
bytes after the client sent something) arrive, it drops them with probability
``drop_rate`` and resets both connections instead of forwarding. The broker
has then received, and usually applied, a request whose answer the client
never sees -- exactly the case that makes a non-idempotent retry write twice.

It runs its own event loop on a daemon thread, so sync and async tests use it
alike; ``close()`` stops it and every connection. Draws come from a seeded
``random.Random`` (the schedule of drops still depends on timing).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from dataclasses import dataclass

from clients._loop_thread import LoopThread


@dataclass
class ProxyStats:
    connections: int = 0
    responses_forwarded: int = 0
    responses_dropped: int = 0


class LossyProxy:
    def __init__(
        self, target_port: int, *, drop_rate: float = 0.1, seed: int = 0, target_host: str = "127.0.0.1"
    ) -> None:
        self.target = (target_host, target_port)
        self.drop_rate = drop_rate
        self.stats = ProxyStats()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._lt = LoopThread(f"lossy-proxy-{target_port}")
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LossyProxy:
        self._lt.run(self._start(), timeout=10)
        return self

    async def _start(self) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._handle, sock=sock)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._lt.run(self._stop(), timeout=10)
        self._lt.stop()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()

    def _drop(self) -> bool:
        with self._lock:
            drop = self._rng.random() < self.drop_rate
            if drop:
                self.stats.responses_dropped += 1
            else:
                self.stats.responses_forwarded += 1
            return drop

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        try:
            sreader, swriter = await asyncio.open_connection(*self.target)
        except OSError:
            cwriter.transport.abort()
            return
        self._writers.update((cwriter, swriter))
        awaiting_response = False

        async def client_to_server() -> None:
            nonlocal awaiting_response
            while data := await creader.read(1 << 16):
                awaiting_response = True
                swriter.write(data)
                await swriter.drain()

        async def server_to_client() -> None:
            nonlocal awaiting_response
            while data := await sreader.read(1 << 16):
                if awaiting_response:
                    awaiting_response = False
                    if self._drop():
                        return
                cwriter.write(data)
                await cwriter.drain()

        tasks = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in (cwriter, swriter):
                w.transport.abort()  # a reset, not a clean close: the client must not mistake it for an answer
                self._writers.discard(w)
