"""A scripted socket for unit tests of Raft connections and node links (no kernel socket)."""

from __future__ import annotations

import errno
from typing import Any


class FakeSocket:
    """Scripted recv chunks; records sends (at most ``max_send`` bytes per call)."""

    def __init__(self, chunks: list[bytes] | None = None, max_send: int = 1 << 30) -> None:
        self.chunks = list(chunks or [])
        self.sent = bytearray()
        self.closed = False
        self.max_send = max_send

    def fileno(self) -> int:
        return 42

    def recv_into(self, view: memoryview, n: int) -> int:
        if not self.chunks:
            raise BlockingIOError(errno.EAGAIN, "again")
        c = self.chunks.pop(0)
        if len(c) > n:
            self.chunks.insert(0, c[n:])
            c = c[:n]
        view[: len(c)] = c
        return len(c)

    def send(self, data: Any) -> int:
        n = min(len(data), self.max_send)
        if n == 0:
            raise BlockingIOError(errno.EAGAIN, "again")
        self.sent += bytes(data[:n])
        return n

    def setblocking(self, flag: bool) -> None:
        pass

    def setsockopt(self, *args: Any) -> None:
        pass

    def getsockopt(self, *args: Any) -> int:
        return 0

    def close(self) -> None:
        self.closed = True
