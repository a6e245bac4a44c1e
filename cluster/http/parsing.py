"""Strict parsing of untrusted request input into domain values.

Every function raises ``BrokerError(INVALID_REQUEST)`` (or a more specific
code) naming the offending field; nothing here touches state, so a bad
request changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from clients.protocol import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BrokerError,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    Record,
    decode_token,
    encode_batch,
)
from coordinator.commands import MAX_ID_BYTES

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
INT16_MAX = 2**15 - 1
MAX_RECORDS_PER_BATCH = 1_000_000
MAX_PARTITIONS_PER_REQUEST = 10_000
_MAX_TOKEN_CHARS = 344  # base64 of the binary form's 256-byte limit


def _bad(msg: str) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_REQUEST, msg)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    # json turns an out-of-range literal such as 1e400 into inf: reject it like Infinity
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text[:40]} is out of range")
    return v


# A \uD800-\uDFFF escape: json.loads accepts a lone surrogate, which no UTF-8 encoder will take.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _check_unicode(body: Any) -> None:
    """Reject strings (keys included) holding lone surrogates. Iterative: no recursion limit."""
    stack = [body]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _bad("malformed JSON: string with an unpaired surrogate escape") from exc
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A JSON object from a request body: UTF-8 text (RFC 8259), finite numbers, valid Unicode."""
    if not raw:
        raise _bad("request body must be a JSON object")
    try:
        text = raw.decode("utf-8")
        body = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except UnicodeDecodeError as exc:
        raise _bad("malformed JSON: the body is not UTF-8") from exc
    except (ValueError, RecursionError) as exc:
        raise _bad(f"malformed JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(text):
        _check_unicode(body)
    return body


def get_int(
    obj: Mapping[str, Any],
    key: str,
    *,
    default: int | None = None,
    lo: int = INT64_MIN,
    hi: int = INT64_MAX,
    code: ErrorCode = ErrorCode.INVALID_REQUEST,
) -> int:
    v = obj.get(key)
    if v is None:
        if default is None:
            raise BrokerError(code, f"missing field {key!r}")
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise BrokerError(code, f"field {key!r} must be an integer")
    if not lo <= v <= hi:
        raise BrokerError(code, f"field {key!r} must be between {lo} and {hi}")
    return v


def get_str(obj: Mapping[str, Any], key: str, *, required: bool = True, max_len: int = 4096) -> str | None:
    v = obj.get(key)
    if v is None:
        if required:
            raise _bad(f"missing field {key!r}")
        return None
    if not isinstance(v, str):
        raise _bad(f"field {key!r} must be a string")
    if len(v) > max_len:
        raise _bad(f"field {key!r} is longer than {max_len}")
    return v


def get_list(obj: Mapping[str, Any], key: str, *, max_len: int) -> list[Any]:
    v = obj.get(key)
    if not isinstance(v, list):
        raise _bad(f"field {key!r} must be a list")
    if len(v) > max_len:
        raise _bad(f"field {key!r} has more than {max_len} entries")
    return v


_DECIMAL = re.compile(r"-?[0-9]+")


def parse_decimal(raw: str, what: str, *, lo: int, hi: int) -> int:
    """A plain ASCII decimal integer (no sign '+', spaces, '_' or non-ASCII digits, as ``int()`` allows)."""
    if not _DECIMAL.fullmatch(raw):
        raise _bad(f"{what} must be a decimal integer")
    v = int(raw, 10) if len(raw) <= 40 else hi + 1  # int() of thousands of digits is slow, then refused
    if not lo <= v <= hi:
        raise _bad(f"{what} must be between {lo} and {hi}")
    return v


def query_int(query: Mapping[str, str], key: str, *, default: int | None, lo: int, hi: int) -> int:
    raw = query.get(key)
    if raw is None or raw == "":
        if default is None:
            raise _bad(f"missing query parameter {key!r}")
        return default
    return parse_decimal(raw, f"query parameter {key!r}", lo=lo, hi=hi)


def decode_binary(v: Any, field: str, *, fmt: str = "base64") -> bytes | None:
    """A binary field: base64 (default) or, with ``format: "string"``, UTF-8 text."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise _bad(f"{field} must be a {'base64 ' if fmt == 'base64' else ''}string or null")
    if fmt == "string":
        return v.encode("utf-8")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _bad(f"{field} is not valid base64") from exc


def parse_headers(v: Any, field: str, fmt: str) -> tuple[tuple[str, bytes | None], ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or len(v) > 10_000:
        raise _bad(f"{field} must be a list of {{key, value}}")
    out = []
    for i, h in enumerate(v):
        if not isinstance(h, dict):
            raise _bad(f"{field}[{i}] must be an object")
        key = h.get("key")
        if not isinstance(key, str) or len(key.encode("utf-8")) > INT16_MAX:
            raise _bad(f"{field}[{i}].key must be a string")
        out.append((key, decode_binary(h.get("value"), f"{field}[{i}].value", fmt=fmt)))
    return tuple(out)


def parse_record(r: Any, field: str, fmt: str, now: int) -> Record:
    if not isinstance(r, dict):
        raise _bad(f"{field} must be an object")
    ts = get_int(r, "timestamp", default=now, lo=-1, hi=INT64_MAX)
    return Record(
        value=decode_binary(r.get("value"), f"{field}.value", fmt=fmt),
        key=decode_binary(r.get("key"), f"{field}.key", fmt=fmt),
        headers=parse_headers(r.get("headers"), f"{field}.headers", fmt),
        timestamp=ts,
    )


def get_format(body: Mapping[str, Any]) -> str:
    fmt = body.get("format", "base64")
    if fmt not in ("base64", "string"):
        raise _bad("format must be 'base64' or 'string'")
    return str(fmt)


def parse_acks(v: Any) -> int:
    if v is None or v == "all":
        return -1
    if type(v) is int and v in (-1, 0):  # not bool, not float (0.0 == 0)
        return v
    raise BrokerError(ErrorCode.INVALID_REQUIRED_ACKS, 'acks must be "all" or 0')


def parse_json_produce(body: Mapping[str, Any]) -> ProduceRequest:
    """``POST /v1/produce`` JSON form -> the same ``ProduceRequest`` the binary form gives."""
    acks = parse_acks(body.get("acks"))
    timeout_ms = get_int(body, "timeout_ms", default=30_000, lo=1, hi=INT32_MAX)
    tid = get_str(body, "transactional_id", required=False, max_len=INT16_MAX)
    fmt = get_format(body)
    now = int(time.time() * 1000)
    parts = []
    for i, p in enumerate(get_list(body, "partitions", max_len=MAX_PARTITIONS_PER_REQUEST)):
        f = f"partitions[{i}]"
        if not isinstance(p, dict):
            raise _bad(f"{f} must be an object")
        topic = get_str(p, "topic", max_len=249)
        assert topic is not None
        partition = get_int(p, "partition", lo=0, hi=INT32_MAX)
        pid = get_int(p, "producer_id", default=NO_PRODUCER_ID, lo=-1, hi=INT64_MAX)
        epoch = get_int(p, "producer_epoch", default=NO_PRODUCER_EPOCH, lo=-1, hi=INT16_MAX)
        seq = get_int(p, "base_sequence", default=NO_SEQUENCE, lo=-1, hi=INT32_MAX)
        if pid >= 0 and (epoch < 0 or seq < 0):
            raise _bad(f"{f}: an idempotent write needs producer_epoch >= 0 and base_sequence >= 0")
        if pid < 0 and (epoch >= 0 or seq >= 0):
            raise _bad(f"{f}: producer_epoch/base_sequence need a producer_id")
        recs_raw = get_list(p, "records", max_len=MAX_RECORDS_PER_BATCH)
        if not recs_raw:
            raise _bad(f"{f}.records must not be empty")
        records = [parse_record(r, f"{f}.records[{j}]", fmt, now) for j, r in enumerate(recs_raw)]
        if tid is not None and pid < 0:
            raise _bad(f"{f}: a transactional write needs the producer_id/producer_epoch of init_transactions")
        batch = encode_batch(
            records,
            producer_id=pid,
            producer_epoch=epoch if pid >= 0 else -1,
            base_sequence=seq if pid >= 0 else -1,
            transactional=tid is not None,
        )
        token_text = get_str(p, "txn_token", required=False, max_len=_MAX_TOKEN_CHARS)
        if token_text is not None and tid is None:
            raise _bad(f"{f}: a txn_token is for transactional writes")
        token = decode_token(token_text, f"{f}.txn_token") if token_text is not None else None
        parts.append(ProducePartition(topic, partition, batch, token))
    return ProduceRequest(tuple(parts), acks=acks, timeout_ms=timeout_ms, transactional_id=tid)


# ---- identifiers and identities shared by the transaction and group routes ----------------------


def identifier(raw: str, what: str) -> str:
    """A transactional id, group id or member id: non-empty, at most ``MAX_ID_BYTES``, no control characters."""
    if not raw:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"{what} must not be empty")
    if len(raw.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"{what} is longer than {MAX_ID_BYTES} bytes")
    if any(ord(c) < 0x20 or 0xD800 <= ord(c) <= 0xDFFF for c in raw):
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"{what} contains control or surrogate characters")
    return raw


def producer_identity(body: Mapping[str, Any]) -> tuple[int, int]:
    """``(producer_id, producer_epoch)`` of a transactional request."""
    pid = get_int(body, "producer_id", lo=0, hi=INT64_MAX)
    return pid, get_int(body, "producer_epoch", lo=0, hi=32767)


def get_bool(body: Mapping[str, Any], key: str) -> bool:
    v = body.get(key)
    if not isinstance(v, bool):
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"field {key!r} must be true or false")
    return v
