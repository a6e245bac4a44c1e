"""Run an asyncio client on a private event-loop thread so the sync classes can wrap it.

The sync ``Producer``/``Consumer`` are thin facades over their ``clients.aio``
twins: one implementation of the protocol logic, two calling conventions.
Each facade owns one daemon thread running one event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # A connection aborted while the client closed (a TLS handshake cut short) releases its socket in
        # a callback of a later iteration: run those before the loop is closed.
        for _ in range(3):
            self.loop.run_until_complete(asyncio.sleep(0))
        # A TLS connection whose graceful shutdown still waits for the node's close_notify is aborted now:
        # its socket is closed here, not left to the garbage collector once the loop is gone. (The selector
        # loop keeps its open transports by file descriptor; the client is done with every one of them.)
        leftover: Any = getattr(self.loop, "_transports", None)
        if leftover:
            for transport in list(leftover.values()):
                transport.abort()
            self.loop.run_until_complete(asyncio.sleep(0))  # abort closes the socket in a callback

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the returned future is safe to wait on from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (its exceptions propagate)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a sync client method was called from its own loop thread (e.g. a callback)")
        return self.submit(coro).result(timeout)

    def call_soon(self, fn: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        """Stop the loop and join the thread (idempotent)."""
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
