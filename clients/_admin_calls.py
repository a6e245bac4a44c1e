"""The admin operations as data: which request each one sends and how its answer is read.

``Admin`` (stdlib HTTP, no thread) and ``AsyncAdmin`` (aiohttp) only move
these requests; the paths, bodies, client-side checks and result shapes live
here once. Any node answers admin requests (the broker forwards topic changes
to the controller), so a transport tries the bootstrap URLs in turn while a
node is unreachable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from .protocol import BrokerError, ErrorCode

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AdminCall(Generic[T]):
    method: str
    path: str
    body: Any
    parse: Callable[[Any], T]


def _dict(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"expected a JSON object, got {type(body).__name__}")
    return body


def _topic_path(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise BrokerError(ErrorCode.INVALID_TOPIC, f"topic name must be a non-empty string, not {name!r}")
    return f"/v1/topics/{quote(name, safe='')}"


def create_topic(
    name: str, partitions: int, replication_factor: int, config: dict[str, Any] | None
) -> AdminCall[dict[str, Any]]:
    _topic_path(name)
    body: dict[str, Any] = {"name": name, "partitions": partitions, "replication_factor": replication_factor}
    if config:
        body["config"] = {str(k): v for k, v in config.items()}
    return AdminCall("POST", "/v1/topics", body, _dict)


def delete_topic(name: str) -> AdminCall[None]:
    return AdminCall("DELETE", _topic_path(name), None, lambda _b: None)


def list_topics() -> AdminCall[list[dict[str, Any]]]:
    return AdminCall("GET", "/v1/topics", None, lambda b: list(_dict(b)["topics"]))


def describe_topic(name: str) -> AdminCall[dict[str, Any]]:
    return AdminCall("GET", _topic_path(name), None, _dict)


def describe_cluster() -> AdminCall[dict[str, Any]]:
    return AdminCall("GET", "/v1/cluster", None, _dict)


def metadata(topics: Sequence[str] | None = None) -> AdminCall[dict[str, Any]]:
    query = "" if topics is None else "?topics=" + ",".join(quote(t, safe="") for t in topics)
    return AdminCall("GET", "/v1/metadata" + query, None, _dict)


def leaders_elected(description: dict[str, Any]) -> bool:
    """Whether every partition of a ``describe_topic`` answer (``{}``: not known yet) has a leader."""
    parts = description.get("partitions") or []
    return bool(parts) and all(p.get("leader") is not None and p.get("leader_url") for p in parts)


def topic_may_be_propagating(exc: BrokerError) -> bool:
    """An unknown topic right after creation: the answering node has not applied the controller's record yet."""
    return exc.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def leaders_timeout_error(name: str, timeout_s: float) -> BrokerError:
    return BrokerError(
        ErrorCode.LEADER_NOT_AVAILABLE, f"not every partition of {name!r} has a leader after {timeout_s}s"
    )


def should_try_next_node(exc: BrokerError) -> bool:
    """A transport failure: the request did not reach a broker, so another node may answer it."""
    return exc.error_code is ErrorCode.NETWORK_EXCEPTION
