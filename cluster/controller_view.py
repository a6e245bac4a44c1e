"""The controller's replicated metadata as one immutable value (pure; no I/O).

``ControllerView`` holds the topics with their replica placement and config,
the cluster's registered nodes, the partition moves in progress, the replica
sets of internal partitions that were moved from their default placement, and
the counters the controller hands out. ``cluster.controller`` applies commands
to it and persists it; everything else reads it.

Nodes (``NodeRecord``): a node is *registered* by ``txbroker cluster init``
(the founders, recorded by the first controller leader) or ``txbroker cluster
add-node``; its ``state`` is ``active``, ``decommissioning`` (its replicas are
moving away) or ``decommissioned`` (it holds nothing and has no controller
vote; it can be stopped for good).

Moves (``Reassignment``): a Raft group (data partition or internal partition)
moving from ``original`` to ``target`` by single-server membership changes.
While it moves, every node of ``original`` and ``target`` runs the group; the
group's leader drives the changes (``cluster.reassignment``). A cancelled
move has ``target == original`` of the move it undoes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import NodeAddress
from .topics import TopicMetadata

NODE_ACTIVE = "active"
NODE_DECOMMISSIONING = "decommissioning"
NODE_DECOMMISSIONED = "decommissioned"
NODE_STATES = (NODE_ACTIVE, NODE_DECOMMISSIONING, NODE_DECOMMISSIONED)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    node_id: int
    host: str
    http_port: int
    raft_port: int
    scheme: str = "http"
    state: str = NODE_ACTIVE
    kafka_port: int | None = None

    @property
    def address(self) -> NodeAddress:
        return NodeAddress(self.node_id, self.host, self.http_port, self.raft_port, self.scheme, self.kafka_port)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.node_id,
            "host": self.host,
            "http_port": self.http_port,
            "raft_port": self.raft_port,
            "scheme": self.scheme,
            "state": self.state,
            "kafka_port": self.kafka_port,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeRecord:
        return cls(
            node_id=int(d["id"]),
            host=str(d["host"]),
            http_port=int(d["http_port"]),
            raft_port=int(d["raft_port"]),
            scheme=str(d.get("scheme", "http")),
            state=str(d.get("state", NODE_ACTIVE)),
            kafka_port=int(d["kafka_port"]) if d.get("kafka_port") is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Reassignment:
    """One Raft group moving from ``original`` to ``target`` (``topic`` None: an internal partition)."""

    group_id: str
    topic: str | None
    partition: int
    original: tuple[int, ...]
    target: tuple[int, ...]
    started_ms: int
    cancelled: bool = False

    @property
    def adding(self) -> tuple[int, ...]:
        return tuple(n for n in self.target if n not in self.original)

    @property
    def removing(self) -> tuple[int, ...]:
        return tuple(n for n in self.original if n not in self.target)

    @property
    def involved(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((*self.original, *self.target)))

    def to_json(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "topic": self.topic,
            "partition": self.partition,
            "original": list(self.original),
            "target": list(self.target),
            "started_ms": self.started_ms,
            "cancelled": self.cancelled,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Reassignment:
        topic = d.get("topic")
        return cls(
            group_id=str(d["group_id"]),
            topic=None if topic is None else str(topic),
            partition=int(d["partition"]),
            original=tuple(int(n) for n in d["original"]),
            target=tuple(int(n) for n in d["target"]),
            started_ms=int(d["started_ms"]),
            cancelled=bool(d.get("cancelled", False)),
        )


@dataclass(frozen=True, slots=True)
class ControllerView:
    topics: Mapping[str, TopicMetadata] = field(default_factory=dict)
    next_topic_id: int = 1
    next_producer_id: int = 0
    placement_cursor: int = 0
    nodes: Mapping[int, NodeRecord] = field(default_factory=dict)
    founders: tuple[int, ...] = ()
    reassignments: Mapping[str, Reassignment] = field(default_factory=dict)
    # group id of an internal partition -> its replica set, where it differs from the default placement
    internal_replicas: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def active_node_ids(self) -> list[int]:
        return sorted(n.node_id for n in self.nodes.values() if n.state == NODE_ACTIVE)

    def to_json(self) -> dict[str, Any]:
        return {
            "topics": [t.to_json() for t in self.topics.values()],
            "next_topic_id": self.next_topic_id,
            "next_producer_id": self.next_producer_id,
            "placement_cursor": self.placement_cursor,
            "nodes": [n.to_json() for n in self.nodes.values()],
            "founders": list(self.founders),
            "reassignments": [r.to_json() for r in self.reassignments.values()],
            "internal_replicas": {g: list(r) for g, r in self.internal_replicas.items()},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ControllerView:
        topics = {t.name: t for t in (TopicMetadata.from_json(x) for x in d["topics"])}
        nodes = {n.node_id: n for n in (NodeRecord.from_json(x) for x in d.get("nodes", []))}
        moves = {r.group_id: r for r in (Reassignment.from_json(x) for x in d.get("reassignments", []))}
        return cls(
            topics=topics,
            next_topic_id=int(d["next_topic_id"]),
            next_producer_id=int(d["next_producer_id"]),
            placement_cursor=int(d["placement_cursor"]),
            nodes=nodes,
            founders=tuple(int(n) for n in d.get("founders", [])),
            reassignments=moves,
            internal_replicas={str(g): tuple(int(n) for n in r) for g, r in d.get("internal_replicas", {}).items()},
        )
