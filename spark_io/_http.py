"""Keep-alive HTTP for Spark tasks and the driver: one connection per (thread, host), reused across requests.

Spark reuses Python workers (``spark.python.worker.reuse``), so a task that
reads a partition in hundreds of fetches, or the next task in the same
worker, pays for the TCP connection once. ``urllib`` opens a connection per
request; at 1 MiB fetches that costs more than the broker's answer.

Every failure becomes a ``BrokerError``: the broker's JSON error body keeps
its ``error_code`` (``extra`` fields such as ``leader_url`` included), a
transport failure is ``NETWORK_EXCEPTION`` (retriable); a 401 is
``SASL_AUTHENTICATION_FAILED`` and a certificate that does not verify too
(neither retriable).

``credentials`` (the ``username``/``password``/``ssl.*`` options) add the Basic
header to every request and the CA / client certificate to ``https://``
connections; each process builds their TLS context and header once.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit

from clients.protocol import BrokerError, ErrorCode
from clients.security import ClientSecurity

from .options import NO_CREDENTIALS, Credentials

_local = threading.local()
_security_lock = threading.Lock()
_security: dict[tuple[Credentials, bool], ClientSecurity] = {}


def _client_security(credentials: Credentials, tls: bool) -> ClientSecurity:
    key = (credentials, tls)
    with _security_lock:
        sec = _security.get(key)
        if sec is None:
            plain = dataclasses.replace(credentials, cafile=None, certfile=None, keyfile=None)
            sec = _security[key] = (credentials if tls else plain).client_security("https://x" if tls else "http://x")
    return sec


_ConnKey = tuple[str, str, Credentials]


def _connections() -> dict[_ConnKey, http.client.HTTPConnection]:
    conns: dict[_ConnKey, http.client.HTTPConnection] | None = getattr(_local, "conns", None)
    if conns is None:
        conns = {}
        _local.conns = conns
    return conns


def _connection(key: _ConnKey, timeout: float, sec: ClientSecurity) -> http.client.HTTPConnection:
    conns = _connections()
    conn = conns.get(key)
    if conn is None:
        scheme, netloc, _ = key
        if scheme == "https":
            conn = http.client.HTTPSConnection(netloc, timeout=timeout, context=sec.ssl_context)
        else:
            conn = http.client.HTTPConnection(netloc, timeout=timeout)
        conns[key] = conn
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
    credentials: Credentials = NO_CREDENTIALS,
) -> tuple[str, bytes]:
    """Send one request; return ``(content type, body)`` of a 2xx answer, raise ``BrokerError`` otherwise.

    A request on a reused connection that the server closed in the meantime
    fails before any byte is answered; it is sent once more on a fresh
    connection. Callers only send requests that are safe to repeat (fetches,
    idempotent produce with sequence numbers, idempotent coordinator calls).
    """
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    sec = _client_security(credentials, parts.scheme == "https")
    headers = {**sec.headers(), "Content-Type": content_type} if body is not None else sec.headers()
    key = (parts.scheme, parts.netloc, credentials)
    for attempt in (0, 1):
        conn = _connection(key, timeout, sec)
        reused = conn.sock is not None
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            status, ctype = resp.status, resp.getheader("Content-Type", "")
            if resp.will_close:
                conn.close()
            break
        except ssl.SSLCertVerificationError as exc:
            conn.close()
            _connections().pop(key, None)
            raise BrokerError(ErrorCode.SASL_AUTHENTICATION_FAILED,
                              f"{method} {url}: TLS certificate verification failed: {exc}") from exc  # fmt: skip
        except (http.client.HTTPException, OSError) as exc:
            conn.close()
            _connections().pop(key, None)
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
    if status == 401 and not (isinstance(err, dict) and err.get("error_code") == "SASL_AUTHENTICATION_FAILED"):
        return BrokerError(ErrorCode.SASL_AUTHENTICATION_FAILED, f"HTTP 401 from {url}")
    if not isinstance(err, dict) or "error_code" not in err:
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED if status == 403 else ErrorCode.UNKNOWN_SERVER_ERROR
        return BrokerError(code, f"HTTP {status} from {url}: {data[:200]!r}")
    extra = {k: v for k, v in err.items() if k not in ("error_code", "message", "retriable")}
    return BrokerError(ErrorCode.from_name(str(err["error_code"])), str(err.get("message", "")), **extra)


def request_json(
    method: str, url: str, body: Any = None, *, timeout: float = 30.0, credentials: Credentials = NO_CREDENTIALS
) -> Any:
    payload = json.dumps(body).encode() if body is not None else None
    _ctype, data = request(method, url, payload, timeout=timeout, credentials=credentials)
    return json.loads(data) if data else None
