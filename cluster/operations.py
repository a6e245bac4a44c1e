"""Operating a cluster: register nodes, move partitions, decommission nodes (the controller's side).

Each request is validated against the controller's view on the controller
leader, then proposed as one membership command (``cluster.membership``),
whose transition checks again; a follower answers ``NOT_CONTROLLER`` and the
HTTP layer forwards the request to the leader. A move is then carried out by
the moving group's leader (``cluster.reassignment``); ``reassignments_json``
shows the controller's record of every move, merged with what the groups'
leaders report of their progress.

Internal partitions move the same way: ``__transaction_state`` and
``__consumer_offsets`` name them where a topic is expected.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from clients.protocol import BrokerError, ErrorCode

from .cluster_nodes import ClusterNodes
from .config import NodeConfig
from .controller_service import ControllerService
from .controller_view import NodeRecord, Reassignment
from .membership import (
    cancel_reassignment_command,
    decommission_command,
    plan_decommission,
    plan_reassignment,
    reassign_command,
    register_node_command,
    validate_replica_list,
)
from .seams import Clock
from .topics import group_id_for

__all__ = ["ClusterOperations"]

_HOST = re.compile(r"^[A-Za-z0-9.:_-]{1,253}$")


def _port(body: Mapping[str, Any], key: str) -> int:
    v = body.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"{key} must be a port number (1-65535)")
    return v


class ClusterOperations:
    def __init__(
        self,
        config: NodeConfig,
        controller: ControllerService,
        nodes: ClusterNodes,
        internal_kinds: Mapping[str, int],
        internal_placements: Callable[[], Mapping[str, tuple[int, ...]]],
        clock: Clock,
    ) -> None:
        self._config = config
        self._controller = controller
        self._nodes = nodes
        self._internal_kinds = dict(internal_kinds)  # kind -> partition count
        self._internal_placements = internal_placements
        self._clock = clock

    # ---- nodes ------------------------------------------------------------------------------------

    async def register_node(self, body: Mapping[str, Any]) -> NodeRecord:
        """``POST /v1/nodes``: register a node (``txbroker cluster add-node``); the id defaults to the next free."""
        self._controller.require_leader()
        view = self._controller.view
        known = set(view.nodes) | set(self._nodes.all_ids())
        node_id = body.get("node_id")
        if node_id is None:
            node_id = max(known, default=0) + 1
        if isinstance(node_id, bool) or not isinstance(node_id, int) or not 1 <= node_id <= 2**31 - 1:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "node_id must be a positive integer")
        host = body.get("host")
        if not isinstance(host, str) or not _HOST.match(host):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "host must be a host name or address")
        http_port, raft_port = _port(body, "http_port"), _port(body, "raft_port")
        kafka_port = _port(body, "kafka_port") if body.get("kafka_port") is not None else None
        if len({http_port, raft_port, kafka_port} - {None}) != 3 - (kafka_port is None):
            raise BrokerError(ErrorCode.INVALID_REQUEST, "http_port, raft_port and kafka_port must differ")
        scheme = self._config.self_address.scheme
        rec: NodeRecord = await self._controller.submit_command(
            register_node_command(NodeRecord(node_id, host, http_port, raft_port, scheme, kafka_port=kafka_port))
        )
        return rec

    def node_json(self, node_id: int) -> dict[str, Any]:
        if self._nodes.node(node_id) is None:
            raise BrokerError(ErrorCode.BROKER_ID_NOT_REGISTERED, f"node {node_id} is not registered")
        out = self._controller.node_json(node_id)
        view = self._controller.view
        internal = self._internal_placements()
        out["replicas"] = sum(
            1 for meta in view.topics.values() for a in meta.partitions if node_id in a.replicas
        ) + sum(1 for r in internal.values() if node_id in r)
        out["moving"] = sorted(m.group_id for m in view.reassignments.values() if node_id in m.involved)
        return out

    def nodes_json(self) -> list[dict[str, Any]]:
        return [self.node_json(n) for n in self._nodes.all_ids()]

    async def decommission(self, node_id: int) -> dict[str, Any]:
        """``POST /v1/nodes/{id}/decommission``: start moving every replica off the node."""
        self._controller.require_leader()
        view = self._controller.view
        moves = plan_decommission(view, node_id, self._internal_placements(), self._clock.now_ms())
        await self._controller.submit_command(decommission_command(node_id, moves))
        return {"node_id": node_id, "state": "decommissioning", "moves": [self._move_json(m) for m in moves]}

    # ---- moves ------------------------------------------------------------------------------------

    def _internal_move(self, kind: str, partition: int, replicas: object) -> Reassignment:
        count = self._internal_kinds[kind]
        if not 0 <= partition < count:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{kind} has no partition {partition}")
        view = self._controller.view
        target = validate_replica_list(view, replicas)
        gid = f"{kind}-{partition}"
        original = self._internal_placements()[gid]
        if len(target) < min(self._config.min_insync_replicas, len(original)):
            raise BrokerError(ErrorCode.INVALID_REPLICATION_FACTOR, f"{gid} needs at least {len(original)} replicas")
        if gid in view.reassignments:
            raise BrokerError(ErrorCode.REASSIGNMENT_IN_PROGRESS, f"{gid} is already moving")
        return Reassignment(gid, None, partition, original, target, self._clock.now_ms())

    async def reassign(self, topic: str, partition: int, replicas: object) -> dict[str, Any]:
        """``POST /v1/topics/{topic}/partitions/{p}/reassign``: start moving the partition's group."""
        self._controller.require_leader()
        if topic in self._internal_kinds:
            move = self._internal_move(topic, partition, replicas)
        else:
            view = self._controller.view
            move = plan_reassignment(
                view, topic, partition, replicas, self._config.min_insync_replicas, self._clock.now_ms()
            )
        await self._controller.submit_command(reassign_command([move]))
        return self._move_json(move)

    async def cancel(self, topic: str, partition: int) -> dict[str, Any]:
        """``DELETE /v1/topics/{topic}/partitions/{p}/reassign``: turn an unfinished move back."""
        self._controller.require_leader()
        gid = self._group_of(topic, partition)
        back: Reassignment = await self._controller.submit_command(cancel_reassignment_command(gid))
        return self._move_json(back)

    def _group_of(self, topic: str, partition: int) -> str:
        if topic in self._internal_kinds:
            return f"{topic}-{partition}"
        meta = self._controller.topic(topic)
        if not 0 <= partition < len(meta.partitions):
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
        return group_id_for(meta.topic_id, partition)

    def _move_json(self, m: Reassignment) -> dict[str, Any]:
        topic = m.topic if m.topic is not None else m.group_id.rpartition("-")[0]
        return {
            "topic": topic,
            "partition": m.partition,
            "group_id": m.group_id,
            "replicas": list(m.original),
            "target_replicas": list(m.target),
            "adding_replicas": list(m.adding),
            "removing_replicas": list(m.removing),
            "cancelled": m.cancelled,
            "started_ms": m.started_ms,
        }

    def reassignments_json(self, progress: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Every move in the controller's view, with its leader's report where one came (``progress``)."""
        out = []
        for m in sorted(self._controller.view.reassignments.values(), key=lambda m: m.group_id):
            item = self._move_json(m)
            item["state"] = "cancelling" if m.cancelled else "moving"
            report = progress.get(m.group_id)
            if report is not None:
                item.update(report)
            out.append(item)
        return out
