"""Periodic background work of a node's services (leader balance, retention, transaction timeouts)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

__all__ = ["every"]

log = logging.getLogger(__name__)


async def every(interval: float, fn: Callable[[], Awaitable[None]]) -> None:
    """Run ``fn()`` every ``interval`` seconds until cancelled; a failed round is logged, the next one runs."""
    while True:
        await asyncio.sleep(interval)
        try:
            await fn()
        except Exception:
            log.exception("background task %s failed", getattr(fn, "__qualname__", fn))
