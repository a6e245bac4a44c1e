"""Producer ids for idempotent producers, from blocks the controller allocates.

The controller hands out blocks of 1000 ids through a replicated command, so
no id is ever issued twice, across any failover (KIP-730). This node takes ids
from its current block and fetches the next block when 90% of the current one
is used. Unused ids of a block are abandoned on restart, never reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .controller import ProducerIdBlock
from .deadline import background_task

PREFETCH_THRESHOLD = 0.9


class ProducerIdManager:
    def __init__(self, allocate: Callable[[], Awaitable[ProducerIdBlock]]) -> None:
        self._allocate = allocate
        self._current: ProducerIdBlock | None = None
        self._next = 0
        self._prefetched: ProducerIdBlock | None = None
        self._lock = asyncio.Lock()
        self._prefetch_task: asyncio.Task[None] | None = None

    async def next_producer_id(self) -> int:
        async with self._lock:
            if self._current is None or self._next > self._current.last:
                if self._prefetch_task is not None:
                    await asyncio.gather(self._prefetch_task, return_exceptions=True)
                    self._prefetch_task = None
                if self._prefetched is not None:
                    self._current, self._prefetched = self._prefetched, None
                else:
                    self._current = await self._allocate()
                self._next = self._current.first
            pid = self._next
            self._next += 1
            used = self._next - self._current.first
            if (
                used >= PREFETCH_THRESHOLD * self._current.size
                and self._prefetched is None
                and self._prefetch_task is None
            ):
                self._prefetch_task = background_task(self._prefetch())  # outlives the request
            return pid

    async def _prefetch(self) -> None:
        # A failed prefetch is retried synchronously when the block runs out.
        self._prefetched = await self._allocate()
