"""Keep-alive HTTP/1.1 POSTs on an ``asyncio.Protocol``: the producer's hot path.

Why not aiohttp here: every produce request is one ~64 KiB POST, a producer
sends about a thousand of them per second, and it shares the machine's cores
with the brokers it writes to. aiohttp's client costs ~0.2-0.3 ms of CPU per
request (request/response objects, payload registry, a writer task, stream
readers); this costs a fraction of that (``txbroker bench clients`` measures
both). Everything else (metadata, transactions, fetches) stays on aiohttp.

What it speaks is deliberately small, and it refuses the rest:

* one request at a time per connection, connections pooled per (scheme, host, port);
* ``https://`` over TLS with the pool's ``ssl`` context (default: the system
  CAs), the URL's host as server name; a certificate that does not verify is
  ``SASL_AUTHENTICATION_FAILED`` (an authentication failure, as in Kafka: not
  retriable);
* ``Content-Length`` responses only (the broker never chunks an answer); a
  chunked or length-less answer is a protocol error that drops the connection;
* the response head is limited to 64 KiB and the body to ``max_body`` bytes;
* any transport failure, premature close or malformed answer raises
  ``BrokerError(NETWORK_EXCEPTION)`` and closes that connection; no answer
  within the timeout raises ``REQUEST_TIMED_OUT`` (both retriable).
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
import urllib.parse

from ..protocol import BrokerError, ErrorCode

__all__ = ["Http1Pool", "Http1Response", "certificate_error"]

MAX_HEAD = 64 * 1024
_MAX_IDLE_PER_HOST = 32
_CLOSE_WAIT_S = 1.0


class Http1Response:
    __slots__ = ("body", "content_type", "keep_alive", "status")

    def __init__(self, status: int, content_type: str, body: bytes, keep_alive: bool) -> None:
        self.status = status
        self.content_type = content_type
        self.body = body
        self.keep_alive = keep_alive


class _ProtocolError(Exception):
    pass


def certificate_error(what: str, exc: BaseException) -> BrokerError:
    """The node's TLS certificate did not verify: not retriable (another attempt meets the same certificate)."""
    return BrokerError(ErrorCode.SASL_AUTHENTICATION_FAILED, f"{what}: TLS certificate verification failed: {exc}")


def _parse_head(head: bytes) -> tuple[int, str, int, bool]:
    """(status, content type, content length, keep-alive) of a response head (without the blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise _ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    try:
        status = int(rest[:3])
    except ValueError:
        raise _ProtocolError(f"bad status line {lines[0][:80]!r}") from None
    length = -1
    ctype = ""
    keep = version == "HTTP/1.1"
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise _ProtocolError(f"bad header line {line[:80]!r}")
        name = name.strip().lower()
        if name == "content-length":
            try:
                length = int(value)
            except ValueError:
                raise _ProtocolError(f"bad Content-Length {value.strip()[:40]!r}") from None
            if length < 0:
                raise _ProtocolError("negative Content-Length")
        elif name == "content-type":
            ctype = value.split(";", 1)[0].strip().lower()
        elif name == "connection":
            keep = value.strip().lower() != "close"
        elif name == "transfer-encoding" and value.strip().lower() != "identity":
            raise _ProtocolError(f"unsupported Transfer-Encoding {value.strip()[:40]!r}")
    if length < 0:
        raise _ProtocolError("response without Content-Length")
    return status, ctype, length, keep


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request outstanding."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray()
        self._head: tuple[int, str, int, bool] | None = None
        self._waiter: asyncio.Future[Http1Response] | None = None
        self.lost = asyncio.Event()

    # ---- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._waiter is None or self._waiter.done():
            self._fail(_ProtocolError("bytes received with no request outstanding"))
            return
        try:
            self._parse()
        except _ProtocolError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost.set()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError(f"connection closed before the answer: {exc or 'EOF'}"))

    # ---- requests -----------------------------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> asyncio.Future[Http1Response]:
        assert self.transport is not None
        assert self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.writelines((head, body))
        return self._waiter

    def release(self) -> None:
        """The answer was consumed; the connection may take the next request."""
        self._waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _parse(self) -> None:
        if self._head is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    raise _ProtocolError(f"response head over {MAX_HEAD} bytes")
                return
            self._head = _parse_head(bytes(self._buf[:end]))
            if self._head[2] > self.max_body:
                raise _ProtocolError(f"response body of {self._head[2]} bytes over the {self.max_body} limit")
            del self._buf[: end + 4]
        status, ctype, length, keep = self._head
        if len(self._buf) < length:
            return
        if len(self._buf) > length:
            raise _ProtocolError("more bytes than the answer's Content-Length")
        body = bytes(self._buf)
        self._buf.clear()
        self._head = None
        assert self._waiter is not None
        self._waiter.set_result(Http1Response(status, ctype, body, keep))

    def _fail(self, exc: Exception) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()


class Http1Pool:
    """Pooled keep-alive connections; ``post`` raises ``BrokerError`` for transport failures only."""

    def __init__(self, *, max_body: int = 64 * 1024 * 1024, ssl: ssl_module.SSLContext | None = None) -> None:
        """``ssl``: the context of ``https://`` URLs (the system's default context without one)."""
        self.max_body = max_body
        self._ssl = ssl
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._heads: dict[tuple[str, str], tuple[str, int, bool, bytes]] = {}

    async def post(
        self, url: str, body: bytes, content_type: str, timeout: float, extra_head: bytes = b""
    ) -> Http1Response:
        """POST ``body``; ``extra_head`` is more header lines, each ending in CRLF."""
        host, port, tls, head_prefix = self._target(url, content_type)
        head = b"%s%sContent-Length: %d\r\n\r\n" % (head_prefix, extra_head, len(body))
        idle = self._idle.setdefault((host, port, tls), [])
        conn: _Connection | None = None
        while idle and conn is None:
            c = idle.pop()
            if c.closed:
                self._all.discard(c)
            else:
                conn = c
        try:
            async with asyncio.timeout(timeout):
                if conn is None:
                    loop = asyncio.get_running_loop()
                    _, conn = await loop.create_connection(
                        lambda: _Connection(self.max_body), host, port,
                        ssl=self._context() if tls else None, server_hostname=host if tls else None,
                    )  # fmt: skip
                    self._all.add(conn)
                answer = await conn.send(head, body)
        except TimeoutError:
            self._drop(conn)
            raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"POST {url}: no answer within {timeout:.3f}s") from None
        except ssl_module.SSLCertVerificationError as exc:
            self._drop(conn)
            raise certificate_error(f"POST {url}", exc) from exc
        except (OSError, _ProtocolError) as exc:
            self._drop(conn)
            raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"POST {url}: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            self._drop(conn)  # cancelled mid-request: the connection's state is unknown
            raise
        conn.release()
        if answer.keep_alive and not conn.closed and len(idle) < _MAX_IDLE_PER_HOST:
            idle.append(conn)
        else:
            self._drop(conn)
        return answer

    def _context(self) -> ssl_module.SSLContext:
        if self._ssl is None:
            self._ssl = ssl_module.create_default_context()
        return self._ssl

    def _target(self, url: str, content_type: str) -> tuple[str, int, bool, bytes]:
        key = (url, content_type)
        hit = self._heads.get(key)
        if hit is None:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise BrokerError(ErrorCode.INVALID_CONFIG, f"only http(s):// URLs are supported, got {url!r}")
            tls = parts.scheme == "https"
            host, port = parts.hostname, parts.port or (443 if tls else 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            prefix = (
                f"POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: {content_type}\r\n"
                "Accept: application/json\r\n"
            ).encode("latin-1")
            if len(self._heads) > 1024:
                self._heads.clear()
            hit = self._heads[key] = (host, port, tls, prefix)
        return hit

    def _drop(self, conn: _Connection | None) -> None:
        if conn is not None:
            conn.close()
            self._all.discard(conn)

    async def close(self) -> None:
        """Close every connection and wait (briefly) until they are gone: a TLS connection ends with a
        close_notify exchange, and the loop may stop right after this returns."""
        conns = [c for c in self._all if c.transport is not None]
        for conn in conns:
            conn.close()
        self._all.clear()
        self._idle.clear()
        try:
            async with asyncio.timeout(_CLOSE_WAIT_S):
                for conn in conns:
                    await conn.lost.wait()
        except TimeoutError:
            for conn in conns:
                if conn.transport is not None and not conn.lost.is_set():
                    conn.transport.abort()
