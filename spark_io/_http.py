"""Keep-alive HTTP for Spark tasks and the driver: one connection per (thread, host), reused across requests.

Spark reuses Python workers (``spark.python.worker.reuse``), so a task that
reads a partition in hundreds of fetches, or the next task in the same
worker, pays for the TCP connection once. ``urllib`` opens a connection per
request; at 1 MiB fetches that costs more than the broker's answer.

Every failure becomes a ``BrokerError``: the broker's JSON error body keeps
its ``error_code`` (``extra`` fields such as ``leader_url`` included), a
transport failure is ``NETWORK_EXCEPTION`` (retriable).
"""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any
from urllib.parse import urlsplit

from clients.protocol import BrokerError, ErrorCode

_local = threading.local()


def _connections() -> dict[tuple[str, str], http.client.HTTPConnection]:
    conns: dict[tuple[str, str], http.client.HTTPConnection] | None = getattr(_local, "conns", None)
    if conns is None:
        conns = {}
        _local.conns = conns
    return conns


def _connection(scheme: str, netloc: str, timeout: float) -> http.client.HTTPConnection:
    conns = _connections()
    conn = conns.get((scheme, netloc))
    if conn is None:
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        conn = cls(netloc, timeout=timeout)
        conns[(scheme, netloc)] = conn
    conn.timeout = timeout
    if conn.sock is not None:
        conn.sock.settimeout(timeout)
    return conn


def close_all() -> None:
    """Close this thread's connections (a task's ``finally``; the next request reconnects)."""
    conns = _connections()
    for conn in conns.values():
        conn.close()
    conns.clear()


def request(
    method: str,
    url: str,
    body: bytes | None = None,
    *,
    content_type: str = "application/json",
    timeout: float = 30.0,
) -> tuple[str, bytes]:
    """Send one request; return ``(content type, body)`` of a 2xx answer, raise ``BrokerError`` otherwise.

    A request on a reused connection that the server closed in the meantime
    fails before any byte is answered; it is sent once more on a fresh
    connection. Callers only send requests that are safe to repeat (fetches,
    idempotent produce with sequence numbers, idempotent coordinator calls).
    """
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = {"Content-Type": content_type} if body is not None else {}
    for attempt in (0, 1):
        conn = _connection(parts.scheme, parts.netloc, timeout)
        reused = conn.sock is not None
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            status, ctype = resp.status, resp.getheader("Content-Type", "")
            if resp.will_close:
                conn.close()
            break
        except (http.client.HTTPException, OSError) as exc:
            conn.close()
            _connections().pop((parts.scheme, parts.netloc), None)
            if attempt == 0 and reused and not isinstance(exc, TimeoutError):
                continue
            raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"{method} {url}: {exc!r}") from exc
    if 200 <= status < 300:
        return ctype, data
    raise _error(status, data, url)


def _error(status: int, data: bytes, url: str) -> BrokerError:
    try:
        err = json.loads(data)
    except ValueError:
        err = None
    if not isinstance(err, dict) or "error_code" not in err:
        return BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"HTTP {status} from {url}: {data[:200]!r}")
    extra = {k: v for k, v in err.items() if k not in ("error_code", "message", "retriable")}
    return BrokerError(ErrorCode.from_name(str(err["error_code"])), str(err.get("message", "")), **extra)


def request_json(method: str, url: str, body: Any = None, *, timeout: float = 30.0) -> Any:
    payload = json.dumps(body).encode() if body is not None else None
    _ctype, data = request(method, url, payload, timeout=timeout)
    return json.loads(data) if data else None
