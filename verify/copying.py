"""The exactly-once copier (``cluster.copier``, what ``txbroker copy`` runs) inside a verify run.

It copies the first workload topic into the copy topic while the writers run; a copier that dies
(fenced, or any error) is started again under the same transactional id and group, as an operator
would restart ``txbroker copy``. After the writers stop, a last instance runs until the group has
committed the whole input (``idle_exit_ms``), so the checker can require every source record to be in
the copy exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import replace

from cluster.copier import CopierConfig, CopierStats, copy

__all__ = ["CopierRunner"]

log = logging.getLogger("verify.copying")


class CopierRunner:
    def __init__(self, config: CopierConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarts = 0
        self.copied = 0

    # ---- one copier instance on a private event loop ------------------------------------------

    def _run_once(self, config: CopierConfig, deadline: float | None = None) -> CopierStats:
        async def main() -> CopierStats:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            with self._lock:
                self._loop, self._stop = loop, stop
                if self._stopping.is_set() and deadline is None:
                    stop.set()
            if deadline is not None:
                loop.call_later(max(0.0, deadline - time.monotonic()), stop.set)
            try:
                return await copy(config, stop, emit=lambda _progress: None)
            finally:
                with self._lock:
                    self._loop = self._stop = None

        return asyncio.run(main())

    def _signal_stop(self) -> None:
        with self._lock:
            if self._loop is not None and self._stop is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    self._loop.call_soon_threadsafe(self._stop.set)

    # ---- while the writers run ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._live, name="verify-copier", daemon=True)
        self._thread.start()

    def _live(self) -> None:
        while not self._stopping.is_set():
            try:
                stats = self._run_once(self.config)
                self.copied += stats.copied
            except Exception as exc:  # fenced, or the cluster refused it: an operator restarts the copier
                log.info("copier: %s", exc)
                self.restarts += 1
                self._stopping.wait(1.0)

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._signal_stop()
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- after the writers stopped -------------------------------------------------------------------

    def finish(self, deadline: float) -> bool:
        """Run instances until the group has committed the whole input; False when ``deadline`` passes first."""
        config = replace(self.config, idle_exit_ms=2_000)
        while time.monotonic() < deadline:
            try:
                stats = self._run_once(config, deadline)
            except Exception as exc:
                log.info("copier: %s", exc)
                time.sleep(1.0)
                continue
            self.copied += stats.copied
            if stats.group_remaining == 0:
                return True
        return False
