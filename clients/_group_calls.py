"""Consumer-group admin requests (kafka-consumer-groups.sh over HTTP), shared by ``Admin`` and ``AsyncAdmin``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from ._admin_calls import AdminCall
from .protocol import BrokerError, ErrorCode

__all__ = [
    "delete_consumer_group",
    "describe_consumer_group",
    "group_ids",
    "list_consumer_groups",
    "reset_consumer_group_offsets",
]


def _group_path(group_id: str) -> str:
    if not isinstance(group_id, str) or not group_id:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"group id must be a non-empty string, not {group_id!r}")
    return f"/v1/groups/{quote(group_id, safe='')}"


def _dict(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"expected a JSON object, got {type(body).__name__}")
    return body


def group_ids(ids: Sequence[str]) -> list[str]:
    """The ids of a many-groups call: a list (a lone string is a common slip: refused, not split into letters)."""
    if isinstance(ids, str):
        raise BrokerError(ErrorCode.INVALID_REQUEST, "pass a list of group ids, not a string")
    out = list(ids)
    for g in out:
        _group_path(g)
    return out


def list_consumer_groups() -> AdminCall[list[dict[str, Any]]]:
    """Every group of the cluster: ``[{"group_id", "state", "members", ...}]`` (``members``: a count)."""
    return AdminCall("GET", "/v1/groups", None, lambda b: list(_dict(b)["groups"]))


def describe_consumer_group(group_id: str) -> AdminCall[dict[str, Any]]:
    """State, protocol, members with assignments, offsets with log end and lag (an unknown group: ``Dead``)."""
    return AdminCall("GET", _group_path(group_id), None, _dict)


def delete_consumer_group(group_id: str) -> AdminCall[dict[str, Any]]:
    return AdminCall("DELETE", _group_path(group_id), None, _dict)


def reset_consumer_group_offsets(
    group_id: str, topic: str, to: str | dict[str, int], partitions: Sequence[int] | None, execute: bool
) -> AdminCall[dict[str, Any]]:
    """``to``: ``"earliest"``, ``"latest"``, ``{"offset": N}`` or ``{"timestamp": ms}`` (checked by the broker)."""
    if not isinstance(topic, str) or not topic:
        raise BrokerError(ErrorCode.INVALID_TOPIC, f"topic name must be a non-empty string, not {topic!r}")
    body: dict[str, Any] = {"topic": topic, "to": to, "dry_run": not execute}
    if partitions is not None:
        body["partitions"] = list(partitions)
    return AdminCall("POST", _group_path(group_id) + "/offsets/reset", body, _dict)
