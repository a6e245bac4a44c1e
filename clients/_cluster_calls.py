"""Operating a cluster as admin calls: nodes, partition moves, decommission (``Admin``/``AsyncAdmin``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from ._admin_calls import AdminCall
from .protocol import BrokerError, ErrorCode


def _dict(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"expected a JSON object, got {type(body).__name__}")
    return body


def _node_id(node_id: int) -> int:
    if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id < 0:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"node id must be a non-negative integer, not {node_id!r}")
    return node_id


def _reassign_path(topic: str, partition: int) -> str:
    if not isinstance(topic, str) or not topic:
        raise BrokerError(ErrorCode.INVALID_TOPIC, f"topic name must be a non-empty string, not {topic!r}")
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"partition must be a non-negative integer, not {partition!r}")
    return f"/v1/topics/{quote(topic, safe='')}/partitions/{partition}/reassign"


def list_nodes() -> AdminCall[list[dict[str, Any]]]:
    return AdminCall("GET", "/v1/nodes", None, lambda b: list(_dict(b)["nodes"]))


def describe_node(node_id: int) -> AdminCall[dict[str, Any]]:
    return AdminCall("GET", f"/v1/nodes/{_node_id(node_id)}", None, _dict)


def register_node(
    host: str, http_port: int, raft_port: int, node_id: int | None, kafka_port: int | None = None
) -> AdminCall[dict[str, Any]]:
    body: dict[str, Any] = {"host": host, "http_port": http_port, "raft_port": raft_port}
    if node_id is not None:
        body["node_id"] = _node_id(node_id)
    if kafka_port is not None:
        body["kafka_port"] = kafka_port
    return AdminCall("POST", "/v1/nodes", body, _dict)


def decommission_node(node_id: int) -> AdminCall[dict[str, Any]]:
    return AdminCall("POST", f"/v1/nodes/{_node_id(node_id)}/decommission", None, _dict)


def reassign_partition(topic: str, partition: int, replicas: Sequence[int]) -> AdminCall[dict[str, Any]]:
    return AdminCall("POST", _reassign_path(topic, partition), {"replicas": list(replicas)}, _dict)


def cancel_reassignment(topic: str, partition: int) -> AdminCall[dict[str, Any]]:
    return AdminCall("DELETE", _reassign_path(topic, partition), None, _dict)


def list_reassignments() -> AdminCall[list[dict[str, Any]]]:
    return AdminCall("GET", "/v1/reassignments", None, lambda b: list(_dict(b)["reassignments"]))
