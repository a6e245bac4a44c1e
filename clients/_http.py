"""A small synchronous JSON-over-HTTP helper (stdlib only) for the sync clients and CLI."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from .aio._http1 import certificate_error
from .aio._session import error_from_body
from .protocol import BrokerError, ErrorCode
from .security import ClientSecurity


def request_json(
    method: str,
    url: str,
    body: Any = None,
    *,
    timeout: float = 30.0,
    data: bytes | None = None,
    content_type: str = "application/json",
    security: ClientSecurity | None = None,
) -> Any:
    """Send a request and return the decoded JSON body; errors raise ``BrokerError``.

    Error bodies carry ``error_code`` (a 401 is ``SASL_AUTHENTICATION_FAILED``);
    transport failures become ``NETWORK_EXCEPTION`` (retriable). ``security``
    adds its credentials to the request and its TLS context to ``https://``.
    """
    payload = data if data is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=payload, method=method)
    if payload is not None:
        req.add_header("Content-Type", content_type)
    context: ssl.SSLContext | None = None
    if security is not None:
        for name, value in security.headers().items():
            req.add_header(name, value)
        context = security.ssl_context
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raise error_from_body(exc.code, exc.read(), url) from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLCertVerificationError):
            raise certificate_error(f"{method} {url}", exc.reason) from exc
        raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"{url}: {exc}") from exc
    except ssl.SSLCertVerificationError as exc:
        raise certificate_error(f"{method} {url}", exc) from exc
    except OSError as exc:
        raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"{url}: {exc}") from exc
    return json.loads(raw) if raw else None
