"""Run one node: the broker service plus its HTTP server, until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from typing import Any

from aiohttp import web

from .broker import Broker
from .config import NodeConfig
from .http_api import make_app
from .metrics import NodeMetrics

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 25.0


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        node = getattr(record, "node_id", None)
        if node is not None:
            out["node_id"] = node
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(fmt: str, level: str, node_id: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s node-{node_id} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # Malformed HTTP is answered 400 by aiohttp's parser; it would log each with a traceback
    # (a log flood anyone can trigger). Application errors are logged by our middleware.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)


class NodeServer:
    """A broker plus its HTTP listener, started and stopped together."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.metrics = NodeMetrics()
        self.broker: Broker | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self.broker = Broker(self.config, self.metrics)
        await self.broker.start()
        self.metrics.add_collector(self.broker.metrics_sample)
        self.metrics.start_loop_monitor()
        app = make_app(self.broker, self.metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.http_port, reuse_address=True)
        await site.start()
        log.info("node %d serving %s", self.config.node_id, self.config.url)

    async def stop(self) -> None:
        await self.metrics.stop_loop_monitor()
        if self.broker is not None:
            await self.broker.drain()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.broker is not None:
            await self.broker.close()


async def run_node(config: NodeConfig) -> int:
    server = NodeServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except Exception:
        log.exception("node %d failed to start", config.node_id)
        await server.stop()
        return 1
    await stop.wait()
    log.info("node %d shutting down", config.node_id)
    try:
        await asyncio.wait_for(server.stop(), SHUTDOWN_GRACE_S)
    except TimeoutError:
        log.error("graceful shutdown took longer than %.0fs", SHUTDOWN_GRACE_S)
        return 1
    log.info("node %d stopped", config.node_id)
    return 0


def main_node(config: NodeConfig) -> int:
    setup_logging(config.log_format, config.log_level, config.node_id)
    return asyncio.run(run_node(config))
