"""The HTTP layer every asyncio client shares: one aiohttp session, errors as ``BrokerError``.

The broker answers every failure with ``{"error_code", "message", "retriable", ...}``
(API.md "Errors"); this module turns such a body back into the ``BrokerError``
the server raised, so client code branches on ``ErrorCode`` only. Transport
failures map to Kafka's names: a refused/reset connection is
``NETWORK_EXCEPTION`` and a request that outlived its timeout is
``REQUEST_TIMED_OUT``; both are retriable. A 401 is always
``SASL_AUTHENTICATION_FAILED`` and a 403 without a broker body
``CLUSTER_AUTHORIZATION_FAILED`` (neither retriable).

``https://`` URLs use the ``ClientSecurity``'s TLS context (the system CAs when
it has none); its credentials go on every request, on both transports.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from ..protocol import BrokerError, ErrorCode
from ..security import ClientSecurity
from ._http1 import Http1Pool, certificate_error

JSON_TYPE = "application/json"


def error_from_body(status: int, raw: bytes, url: str) -> BrokerError:
    """Rebuild the server's ``BrokerError`` from an error response body."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if status == 401 and not (isinstance(body, dict) and body.get("error_code") == "SASL_AUTHENTICATION_FAILED"):
        message = body.get("message") if isinstance(body, dict) else None
        return BrokerError(ErrorCode.SASL_AUTHENTICATION_FAILED, str(message or f"HTTP 401 from {url}"))
    if not isinstance(body, dict) or "error_code" not in body:
        if status == 403:
            return BrokerError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"HTTP 403 from {url}")
        code = ErrorCode.NETWORK_EXCEPTION if status >= 502 else ErrorCode.UNKNOWN_SERVER_ERROR
        return BrokerError(code, f"HTTP {status} from {url}")
    extra = {k: v for k, v in body.items() if k not in ("error_code", "message", "retriable")}
    return BrokerError(ErrorCode.from_name(str(body["error_code"])), str(body.get("message", "")), **extra)


class HttpSession:
    """A pooled aiohttp session bound to the loop it is first used on.

    ``request_timeout_ms`` bounds each request as Kafka's ``request.timeout.ms``
    does; a per-call ``timeout`` (seconds) overrides it, e.g. for long-polls.
    """

    def __init__(
        self,
        *,
        request_timeout_ms: int = 30000,
        max_connections: int = 64,
        security: ClientSecurity | None = None,
    ) -> None:
        self.request_timeout = request_timeout_ms / 1000
        self._max_connections = max_connections
        self.security = security if security is not None else ClientSecurity()
        self._headers = self.security.headers()
        self._head_lines = self.security.head_lines()
        self._session: aiohttp.ClientSession | None = None
        self._lean = Http1Pool(ssl=self.security.ssl_context)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            ctx = self.security.ssl_context
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=self._max_connections, ssl=ctx if ctx is not None else True
            )
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        data: bytes | None = None,
        content_type: str = JSON_TYPE,
        timeout: float | None = None,
    ) -> tuple[str, bytes]:
        """Send one request; return ``(content_type, body)`` of a 2xx answer, raise ``BrokerError`` otherwise."""
        if json_body is not None:
            data = json.dumps(json_body).encode()
            content_type = JSON_TYPE
        headers = {"Content-Type": content_type, **self._headers} if data is not None else self._headers
        limit = self.request_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                async with self._client().request(method, url, data=data, headers=headers) as resp:
                    raw = await resp.read()
                    if resp.status >= 300:
                        raise error_from_body(resp.status, raw, url)
                    return resp.content_type, raw
        except TimeoutError as exc:
            raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"{method} {url}: no answer within {limit:.3f}s") from exc
        except aiohttp.ClientConnectorCertificateError as exc:
            raise certificate_error(f"{method} {url}", exc.certificate_error) from exc
        except aiohttp.ClientError as exc:
            raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"{method} {url}: {exc}") from exc

    async def post_bytes(self, url: str, data: bytes, content_type: str) -> tuple[str, bytes]:
        """``request("POST", ...)`` for the hot path (produce): same answers and errors, a leaner transport."""
        resp = await self._lean.post(url, data, content_type, self.request_timeout, self._head_lines)
        if resp.status >= 300:
            raise error_from_body(resp.status, resp.body, url)
        return resp.content_type, resp.body

    async def request_json(self, method: str, url: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """A JSON request; returns the decoded JSON answer (``None`` for an empty body)."""
        _, raw = await self.request(method, url, json_body=body, timeout=timeout)
        return json.loads(raw) if raw else None

    async def close(self) -> None:
        await self._lean.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
