"""The Kafka listener: Kafka's binary protocol on ``kafka_port``, one asyncio connection handler per client.

Framing (Kafka's): a 4-byte size, then the request header and body. A size
below the fixed header or above ``kafka_max_frame_bytes`` closes the
connection before anything is allocated for it (Kafka's
``socket.request.max.bytes``). The header's first eight bytes (api key,
version, correlation id) pick the handler; kafka-python's generated messages
decode the rest. A connection's requests run concurrently, up to
``kafka_max_inflight_per_connection`` at a time, and their responses go back
in request order, as Kafka requires; reading stops while that many are in
flight, so a fast client cannot queue unbounded work. Produce handlers reach
their partition's Raft queue in the order their requests arrived (nothing
before the proposal waits unless the batch needs the coordinator's
verification, and those batches are sequenced by idempotence).

SASL: on a node with ``[security]`` a connection is served ApiVersions,
SaslHandshake and SaslAuthenticate only until it authenticates (any other
request closes it); after SaslHandshake v0 its frames are raw SASL tokens
until the exchange ends. Each request is authorized with the node's ACLs as
they are when it arrives (the connection's ``Guard`` is rebuilt per request).

Errors: ApiVersions in a version it does not know is answered in version 0
with UNSUPPORTED_VERSION and the supported ranges (KIP-511), so a client can
downgrade. Any other unknown API key or version, a frame that does not decode,
or a client that stays silent for ``kafka_connections_max_idle_ms`` closes
that connection only; the node and its other connections carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import ssl
import struct
import time
from collections.abc import Iterable

from kafka.protocol.api_header import RequestHeader
from kafka.protocol.metadata import ApiVersionsResponse

from clients.protocol import BrokerError

from ..http.services import Services
from ..metrics import KafkaMetrics
from ..security.guard import Guard
from ..security.principals import ANONYMOUS
from ..security.tls import peer_principal
from .api import Connection, KafkaApi, RequestContext
from .controller_calls import ControllerCalls
from .handlers.api_versions import api_version_entries
from .handlers.sasl_authenticate import exchange

__all__ = ["UNSUPPORTED_VERSION", "KafkaServer"]

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id
API_VERSIONS_KEY = 18
_FINISH_S = 5.0  # a closing connection's requests in flight get this long to answer
UNSUPPORTED_VERSION = 35
_MAX_RAW_TOKEN = 64 * 1024  # a raw SASL token (after SaslHandshake v0) larger than this is no token


class _Close(Exception):
    """The connection must close (a frame that cannot be answered)."""


class KafkaServer:
    """Serves the registered ``KafkaApi`` handlers to Kafka clients on one port."""

    def __init__(
        self,
        services: Services,
        apis: Iterable[KafkaApi],
        metrics: KafkaMetrics,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``ssl_context``: TLS on the port (the node's server context when its security has TLS)."""
        self._services = services
        self._config = services.config
        self._apis: dict[int, KafkaApi] = {}
        for api in apis:
            if api.api_key in self._apis:
                raise ValueError(f"two handlers for api key {api.api_key}")
            self._apis[api.api_key] = api
        self._metrics = metrics
        self._ssl = ssl_context
        self._controller_calls = ControllerCalls(services)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        await self._controller_calls.start()
        self._server = await asyncio.start_server(
            self._serve, host, port, ssl=self._ssl, reuse_address=True, limit=64 * 1024
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        await self._controller_calls.close()

    # ---- one connection ---------------------------------------------------------------------------

    def _new_connection(self, writer: asyncio.StreamWriter) -> Connection:
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "*"
        sec = self._config.security
        conn = Connection(peer_host=host, tls=self._ssl is not None, guard=Guard(host=host), authenticated=sec is None)
        if sec is not None and "mtls" in sec.authentication:
            # Kafka's SSL listener: a verified client certificate is the connection's principal, no SASL needed
            principal = peer_principal(writer.get_extra_info("ssl_object"))
            if principal is not None:
                conn.principal = principal
                conn.authenticated = True
        conn.guard = self._guard(conn)
        return conn

    def _guard(self, conn: Connection) -> Guard:
        """The connection's rights under the node's ACLs as they are now (read per request: ACLs change)."""
        sec = self._config.security
        principal = conn.principal or ANONYMOUS
        if sec is None or not sec.authorizer:
            return Guard(principal, conn.peer_host)
        return Guard(principal, conn.peer_host, self._services.controller.security_view().authorizer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._metrics.connections.inc()
        conn = self._new_connection(writer)
        pending: asyncio.Queue[asyncio.Task[bytes | None] | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self._config.kafka_max_inflight_per_connection)
        responder = asyncio.create_task(self._respond(pending, slots, writer, conn))
        try:
            await self._read_requests(reader, conn, pending, slots)
        except (_Close, asyncio.IncompleteReadError, ConnectionError, TimeoutError, ssl.SSLError) as exc:
            log.debug("kafka connection from %s closed: %s", conn.peer_host, exc)
        finally:
            try:
                # The requests already read are answered (the responder drains the queue), then the end.
                await asyncio.wait_for(_finish(pending, responder), _FINISH_S)
            except (TimeoutError, asyncio.CancelledError, ConnectionError, ssl.SSLError):
                responder.cancel()  # out of time, or the client is gone: nothing more to answer
            self._metrics.connections.dec()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._connections.discard(task)

    async def _read_requests(
        self,
        reader: asyncio.StreamReader,
        conn: Connection,
        pending: asyncio.Queue[asyncio.Task[bytes | None] | None],
        slots: asyncio.Semaphore,
    ) -> None:
        """Read frames and start their handlers, at most ``slots`` unanswered at a time (then stop reading)."""
        idle_s = self._config.kafka_connections_max_idle_ms / 1000
        max_frame = self._config.kafka_max_frame_bytes
        while True:
            await slots.acquire()  # released by the responder once the request is answered
            try:
                head = await asyncio.wait_for(reader.readexactly(4), idle_s)
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    return  # the client closed between requests
                raise
            (size,) = _SIZE.unpack(head)
            if conn.sasl_raw_tokens and not conn.authenticated and 0 <= size <= _MAX_RAW_TOKEN:
                token = await asyncio.wait_for(reader.readexactly(size), idle_s)
                self._metrics.bytes_received.inc(4 + size)
                await pending.put(asyncio.create_task(self._raw_sasl_token(token, conn)))
                continue
            if size < _HEAD.size or size > max_frame:
                self._metrics.rejected_frames.labels("size").inc()
                raise _Close(f"frame of {size} bytes (limit {max_frame})")
            frame = await asyncio.wait_for(reader.readexactly(size), idle_s)
            self._metrics.bytes_received.inc(4 + size)
            api_key, version, correlation_id = _HEAD.unpack_from(frame, 0)
            api = self._apis.get(api_key)
            if api_key == API_VERSIONS_KEY and api is not None and not api.serves(version):
                answer: bytes | None = self._api_versions_downgrade(correlation_id)
                await pending.put(asyncio.create_task(_ready(answer)))
                continue
            if api is None or not api.serves(version):
                # Bounded labels: an unknown key is "unknown", a known API's unserved version "unsupported".
                name = api.name if api is not None else "unknown"
                self._metrics.requests.labels(name, "unsupported", "unsupported").inc()
                raise _Close(f"api key {api_key} version {version} is not served")
            if api.authenticated and not conn.authenticated:
                self._metrics.requests.labels(api.name, str(version), "unauthenticated").inc()
                raise _Close(f"{api.name} before SASL authentication")
            await pending.put(asyncio.create_task(self._handle(api, version, correlation_id, frame, conn)))

    async def _respond(
        self,
        pending: asyncio.Queue[asyncio.Task[bytes | None] | None],
        slots: asyncio.Semaphore,
        writer: asyncio.StreamWriter,
        conn: Connection,
    ) -> None:
        while True:
            task = await pending.get()
            if task is None:
                return
            try:
                answer = await task
            except _Close:
                writer.close()  # the reader sees the end of the stream and stops
                return
            finally:
                slots.release()
            if answer is None:
                continue  # Produce with acks=0: Kafka sends no response
            writer.write(answer)
            self._metrics.bytes_sent.inc(len(answer))
            await writer.drain()
            if conn.close_after_response:  # a failed authentication: its answer is the last
                writer.close()
                return

    async def _handle(
        self, api: KafkaApi, version: int, correlation_id: int, frame: bytes, conn: Connection
    ) -> bytes | None:
        started = time.perf_counter()
        outcome = "ok"
        try:
            flexible = api.request.flexible_version_q(version)
            buf = io.BytesIO(frame)
            header = RequestHeader.decode(buf, flexible=flexible)
            request = api.request.decode(memoryview(frame)[buf.tell() :], version=version)
        except Exception as exc:
            self._metrics.requests.labels(api.name, str(version), "malformed").inc()
            log.info("malformed %s v%d request: %s", api.name, version, exc)
            raise _Close("malformed request") from exc
        conn.guard = self._guard(conn)
        ctx = RequestContext(
            self._services, conn, version, header.client_id, correlation_id, controller_calls=self._controller_calls
        )
        try:
            response = await api.handle(ctx, request)
        except BrokerError as exc:
            outcome = exc.error_code.name
            log.info("%s v%d failed: %s", api.name, version, exc)
            raise _Close(f"{api.name} failed: {exc}") from exc
        except Exception as exc:
            outcome = "error"
            log.exception("%s v%d failed", api.name, version)
            raise _Close(f"{api.name} failed") from exc
        finally:
            self._metrics.requests.labels(api.name, str(version), outcome).inc()
            self._metrics.request_duration.labels(api.name).observe(time.perf_counter() - started)
        if response is None:
            return None
        try:
            response.API_VERSION = version
            response.with_header(correlation_id=correlation_id)
            return bytes(response.encode(header=True, framed=True))
        except Exception as exc:
            log.exception("%s v%d: the response does not encode", api.name, version)
            raise _Close(f"{api.name} response does not encode") from exc

    async def _raw_sasl_token(self, token: bytes, conn: Connection) -> bytes:
        """A SASL token after SaslHandshake v0: its answer as a size-prefixed frame; a failure closes."""
        conn.guard = self._guard(conn)
        ctx = RequestContext(self._services, conn, 0, None, 0, controller_calls=self._controller_calls)
        error, answer = await exchange(ctx, token)
        outcome = "ok" if error is None else error.error_code.name
        self._metrics.requests.labels("SaslAuthenticate", "raw", outcome).inc()
        if error is not None:
            log.info("raw SASL token from %s refused: %s", conn.peer_host, error)
            raise _Close("SASL authentication failed")
        if conn.authenticated:
            conn.sasl_raw_tokens = False
        return _SIZE.pack(len(answer)) + answer

    def _api_versions_downgrade(self, correlation_id: int) -> bytes:
        self._metrics.requests.labels("ApiVersions", "unsupported", "UNSUPPORTED_VERSION").inc()
        resp = ApiVersionsResponse(
            version=0, error_code=UNSUPPORTED_VERSION, api_keys=api_version_entries(self._apis.values())
        )
        resp.with_header(correlation_id=correlation_id)
        return bytes(resp.encode(header=True, framed=True))


async def _ready(answer: bytes | None) -> bytes | None:
    return answer


async def _finish(pending: asyncio.Queue[asyncio.Task[bytes | None] | None], responder: asyncio.Task[None]) -> None:
    if not responder.done():
        await pending.put(None)
        await responder
    while not pending.empty():  # what the responder left when it closed the connection
        task = pending.get_nowait()
        if task is not None:
            task.cancel()
