"""A small synchronous JSON-over-HTTP helper (stdlib only) for the sync clients and CLI."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from .protocol import BrokerError, ErrorCode


def request_json(
    method: str,
    url: str,
    body: Any = None,
    *,
    timeout: float = 30.0,
    data: bytes | None = None,
    content_type: str = "application/json",
) -> Any:
    """Send a request and return the decoded JSON body; errors raise ``BrokerError``.

    Error bodies carry ``error_code``; transport failures become
    ``NETWORK_EXCEPTION`` (retriable).
    """
    payload = data if data is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=payload, method=method)
    if payload is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            err = json.loads(raw)
        except ValueError:
            raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"HTTP {exc.code} from {url}") from exc
        extra = {k: v for k, v in err.items() if k not in ("error_code", "message", "retriable")}
        raise BrokerError(
            ErrorCode.from_name(str(err.get("error_code", ""))), str(err.get("message", "")), **extra
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"{url}: {exc}") from exc
    return json.loads(raw) if raw else None
