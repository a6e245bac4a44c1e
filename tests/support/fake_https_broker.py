"""A small HTTPS server that answers like a secured txbroker node, for the client-side TLS/credential tests.

It runs a real aiohttp server with TLS (``ThrowawayCA`` certificates) on a
thread of its own, so blocking clients (``Admin``) and asyncio clients can
both talk to it. It checks ``Authorization: Basic`` against one user, records
every request, and answers canned metadata, produce, admin, ACL and user
requests. ``deny`` makes every request other than metadata answer 403 with
that error code. Not a broker: only what the client plumbing needs to be seen.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import ssl
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from cluster.config import free_ports

from .throwaway_ca import ThrowawayCA

__all__ = ["FakeHttpsBroker", "Seen"]


@dataclass(frozen=True)
class Seen:
    method: str
    path_qs: str
    authorization: str | None
    body: bytes
    tls: bool
    peer_cn: str | None


@dataclass
class FakeHttpsBroker:
    directory: Path
    username: str = "alice"
    password: str = "s3cret"
    client_auth: bool = False
    deny: str | None = None
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ca = ThrowawayCA(self.directory, "fake")
        self.server_files = self.ca.issue("node", hosts=("127.0.0.1", "localhost"))
        self.port = free_ports(1)[0]
        self.url = f"https://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-https-broker", daemon=True)

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> FakeHttpsBroker:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def close(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        # asyncio's server side leaves the socket of a refused TLS handshake to the garbage collector
        # (CPython's sslproto); collect it here, with this server, not in whichever test runs next.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()

    async def _start(self) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.server_files.cert, self.server_files.key)
        if self.client_auth:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.ca.ca_file)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=ctx).start()

    # ---- what it saw -----------------------------------------------------------------------------

    def requests(self, path_prefix: str = "") -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.path_qs.startswith(path_prefix)]

    def expected_authorization(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    # ---- answers ---------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        peer_cn = None
        sslobj = request.transport.get_extra_info("ssl_object") if request.transport else None
        if sslobj is not None:
            cert = sslobj.getpeercert()
            if cert:
                peer_cn = next((v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"), None)
        auth = request.headers.get("Authorization")
        with self._lock:
            self.seen.append(Seen(request.method, request.raw_path, auth, body, sslobj is not None, peer_cn))
        if peer_cn is None and auth != self.expected_authorization():
            return _error(
                401, "SASL_AUTHENTICATION_FAILED", "wrong credentials", {"WWW-Authenticate": 'Basic realm="txbroker"'}
            )
        principal = f"User:{peer_cn or self.username}"
        path = request.path
        if path == "/v1/metadata":
            return web.json_response(self._metadata())
        if self.deny is not None:
            return _error(403, self.deny, f"{principal} may not do this")
        return await self._answer(request.method, path, body, principal)

    def _metadata(self) -> dict[str, Any]:
        part = {"partition": 0, "leader": 1, "leader_url": self.url, "replicas": [1], "high_watermark": 0,
                "last_stable_offset": 0, "log_start_offset": 0}  # fmt: skip
        return {"nodes": [{"id": 1, "url": self.url}], "topics": [{"name": "t", "partitions": [part]}]}

    async def _answer(self, method: str, path: str, body: bytes, principal: str) -> web.StreamResponse:
        if path == "/v1/topics" and method == "GET":
            return web.json_response({"topics": [{"name": "t", "partitions": 1, "replication_factor": 1}]})
        if path == "/v1/produce" and method == "POST":
            answer = {"topic": "t", "partition": 0, "error_code": "NONE", "base_offset": 0, "log_append_time": -1}
            return web.json_response({"partitions": [answer]})
        if path == "/v1/whoami":
            return web.json_response({"principal": principal})
        if path == "/v1/acls":
            if method == "POST":
                return web.json_response({}, status=201)
            return web.json_response({"deleted" if method == "DELETE" else "acls": [_BOB_READS_T]})
        if path == "/v1/users" and method == "GET":
            return web.json_response({"users": [{"name": "bob", "mechanisms": ["SCRAM-SHA-256"]}]})
        if path.startswith("/v1/users/") and method in ("PUT", "DELETE"):
            return web.json_response({})
        return _error(404, "UNKNOWN_SERVER_ERROR", f"no route {method} {path}")


_BOB_READS_T = {"principal": "User:bob", "host": "*", "resource_type": "TOPIC", "resource_name": "t",
                "pattern_type": "LITERAL", "operation": "READ", "permission": "ALLOW"}  # fmt: skip


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error_code": code, "message": message, "retriable": False}, status=status,
                             headers=headers)  # fmt: skip
