"""The controller group of a node, and the metadata every request reads from it.

Kafka splits this between the controller (commands that change metadata) and
the ``MetadataCache`` (what every broker knows); here both are one small
class around the replicated ``ControllerView``: topics and their placement,
who leads each partition (this node's replicas, else what the peers report),
and the nodes' URLs. Controller commands (create/delete topic, producer-id
blocks) are proposed on this node's controller replica and answered
``NOT_CONTROLLER`` with the leader's URL when another node leads it.

Everything runs on the asyncio loop thread; the state machine's change
callback arrives on a Raft thread and only hands off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from clients.protocol import BrokerError, ErrorCode
from raft import LeadershipEvent, NotLeaderError, RaftError, RaftGroup, RaftNode, RaftTimeoutError

from .config import NodeConfig
from .controller import (
    ControllerStateMachine,
    ControllerView,
    ProducerIdBlock,
    allocate_producer_ids_command,
    create_topic_command,
    delete_topic_command,
)
from .deadline import Deadline, call_at_leader, current_deadline, loop_now
from .peers import PeerView
from .replicas import ReplicaManager
from .seams import Clock, NodeDirectory, PeerClient
from .topics import TopicMetadata, assign_replicas, group_id_for, validate_topic_config, validate_topic_name

__all__ = ["CONTROLLER_GROUP", "PRODUCER_IDS_PATH", "ControllerService"]

log = logging.getLogger(__name__)

CONTROLLER_GROUP = "__controller"
PRODUCER_IDS_PATH = "/v1/internal/producer-ids"


class ControllerService:
    """Cluster metadata (a ``TopicDirectory``) and the controller's commands."""

    def __init__(
        self,
        config: NodeConfig,
        sm: ControllerStateMachine,
        raft: RaftNode,
        replicas: ReplicaManager,
        peer_view: PeerView,
        peers: PeerClient,
        nodes: NodeDirectory,
        clock: Clock,
    ) -> None:
        self.config = config
        self.sm = sm
        self._raft = raft
        self._replicas = replicas
        self._peer_view = peer_view
        self._peers = peers
        self._nodes = nodes
        self._clock = clock
        self.group: RaftGroup | None = None

    def start(self, on_change: Callable[[ControllerView], None]) -> None:
        """Join the controller group; ``on_change`` runs on the loop after every metadata change."""
        loop = asyncio.get_running_loop()

        def changed(view: ControllerView) -> None:  # Raft ticker thread: hand off to the loop
            loop.call_soon_threadsafe(on_change, view)

        self.sm.on_change = changed
        members = [n.raft_address for n in self.config.nodes]
        self.group = self._raft.add_group(CONTROLLER_GROUP, members, self.sm, on_event=self._on_event)

    def _on_event(self, event: LeadershipEvent) -> None:
        log.info(
            "controller leader is now %s (term %d, this node leads: %s)", event.leader, event.term, event.is_leader
        )

    # ---- nodes ------------------------------------------------------------------------------

    def leader_id(self) -> int | None:
        """The controller leader as far as this node knows (its own replica, else its peers)."""
        if self.group is not None:
            addr = self.group.leader()
            if addr is not None:
                node = self.config.node_by_raft_address(addr)
                if node is not None:
                    return node.id
        return self._peer_view.controller_leader()

    def leader_known(self) -> bool:
        """This node's own controller replica knows a leader (the readiness condition)."""
        return self.group is not None and self.group.leader() is not None

    # ---- topics and partitions (TopicDirectory) --------------------------------------------------

    @property
    def view(self) -> ControllerView:
        return self.sm.view

    def topic(self, name: str) -> TopicMetadata:
        meta = self.view.topics.get(name)
        if meta is None:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        return meta

    def partition_counts(self) -> dict[str, int]:
        return {name: len(meta.partitions) for name, meta in self.view.topics.items()}

    def partition_state(self, meta: TopicMetadata, partition: int) -> dict[str, Any]:
        """Leader and offsets of a partition: the local replica's values if it has one."""
        rep = self._replicas.get(meta.name, partition)
        if rep is not None:
            leader = rep.leader_id
            if rep.group.is_leader():
                leader = self.config.node_id
            elif leader is None:
                # No news of a leader here (cut off from it): a live peer may follow one (non-transitive cuts).
                reported = (self._peer_view.remote_partition(group_id_for(meta.topic_id, partition)) or {}).get(
                    "leader"
                )
                leader = int(reported) if reported is not None and reported != self.config.node_id else None
            return {
                "leader": leader,
                "high_watermark": rep.log.high_watermark,
                "last_stable_offset": rep.log.last_stable_offset,
                "log_start_offset": rep.log.log_start_offset,
            }
        info = self._peer_view.remote_partition(group_id_for(meta.topic_id, partition)) or {}
        return {
            "leader": info.get("leader"),
            "high_watermark": info.get("high_watermark", -1),
            "last_stable_offset": info.get("last_stable_offset", -1),
            "log_start_offset": info.get("log_start_offset", -1),
        }

    def partition_leader(self, meta: TopicMetadata, partition: int) -> int | None:
        leader = self.partition_state(meta, partition)["leader"]
        return int(leader) if leader is not None else None

    def high_watermark(self, meta: TopicMetadata, partition: int) -> int:
        hw = self.partition_state(meta, partition).get("high_watermark")
        return hw if isinstance(hw, int) else -1

    # ---- JSON views ---------------------------------------------------------------------------

    def cluster_json(self) -> dict[str, Any]:
        return {
            "cluster_id": self.config.cluster_id,
            "nodes": [{"id": n.id, "url": n.url, "alive": self._peer_view.is_alive(n.id)} for n in self.config.nodes],
            "controller_leader": self.leader_id(),
        }

    def topic_json(self, meta: TopicMetadata) -> dict[str, Any]:
        parts = []
        for a in meta.partitions:
            st = self.partition_state(meta, a.partition)
            parts.append(
                {
                    "partition": a.partition,
                    "leader": st["leader"],
                    "leader_url": self._nodes.node_url(st["leader"]),
                    "replicas": list(a.replicas),
                    "high_watermark": st["high_watermark"],
                    "last_stable_offset": st["last_stable_offset"],
                    "log_start_offset": st["log_start_offset"],
                }
            )
        return {
            "name": meta.name,
            "topic_id": meta.topic_id,
            "partitions": parts,
            "replication_factor": len(meta.partitions[0].replicas) if meta.partitions else 0,
            "config": dict(meta.config),
        }

    def metadata_json(self, topics: Sequence[str] | None = None) -> dict[str, Any]:
        metas = [m for m in self.view.topics.values() if topics is None or m.name in topics]
        return {
            "nodes": self.cluster_json()["nodes"],
            "controller_leader": self.leader_id(),
            "topics": [self.topic_json(m) for m in sorted(metas, key=lambda m: m.name)],
        }

    def topics_json(self) -> list[dict[str, Any]]:
        """The topic listing: name, partition count, replication factor."""
        return [
            {
                "name": m.name,
                "partitions": len(m.partitions),
                "replication_factor": len(m.partitions[0].replicas) if m.partitions else 0,
            }
            for m in sorted(self.view.topics.values(), key=lambda m: m.name)
        ]

    # ---- controller commands ------------------------------------------------------------------

    async def _submit(self, command: bytes) -> Any:
        if self.group is None:
            raise BrokerError(ErrorCode.NOT_CONTROLLER, "controller not started")
        try:
            result = await self.group.submit(command, timeout=self.config.request_timeout_ms / 1000)
        except NotLeaderError as exc:
            node = self.config.node_by_raft_address(exc.leader) if exc.leader else None
            if node is None:  # our Raft has no leader yet; peers may know it
                known = self._peer_view.controller_leader()
                node = self.config.node(known) if known is not None and known != self.config.node_id else None
            raise BrokerError(
                ErrorCode.NOT_CONTROLLER,
                "this node is not the controller leader",
                leader_id=node.id if node else None,
                leader_url=node.url if node else None,
            ) from exc
        except RaftTimeoutError as exc:
            raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, "controller command timed out") from exc
        except RaftError as exc:
            raise BrokerError(ErrorCode.NOT_CONTROLLER, f"controller command failed: {exc}") from exc
        if isinstance(result, BrokerError):
            raise result
        return result

    async def create_topic(
        self, name: object, partitions: object, replication_factor: object, config: object
    ) -> TopicMetadata:
        name = validate_topic_name(name)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise BrokerError(ErrorCode.INVALID_PARTITIONS, "partitions must be an integer")
        if partitions < 1 or partitions > self.config.max_partitions_per_topic:
            raise BrokerError(
                ErrorCode.INVALID_PARTITIONS,
                f"partitions must be between 1 and {self.config.max_partitions_per_topic}",
            )
        if isinstance(replication_factor, bool) or not isinstance(replication_factor, int):
            raise BrokerError(ErrorCode.INVALID_REPLICATION_FACTOR, "replication_factor must be an integer")
        cfg = validate_topic_config(config)
        if name in self.view.topics:
            raise BrokerError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        assignment = assign_replicas(
            [n.id for n in self.config.nodes], partitions, replication_factor, self.view.placement_cursor
        )
        meta: TopicMetadata = await self._submit(create_topic_command(name, assignment, cfg, self._clock.now_ms()))
        return meta

    async def delete_topic(self, name: str) -> TopicMetadata:
        self.topic(name)
        meta: TopicMetadata = await self._submit(delete_topic_command(name))
        return meta

    async def allocate_producer_ids_local(self, node_id: int) -> ProducerIdBlock:
        """A producer-id block for ``node_id`` from this node's controller replica (NOT_CONTROLLER elsewhere)."""
        block: ProducerIdBlock = await self._submit(allocate_producer_ids_command(node_id))
        return block

    async def allocate_producer_ids(self) -> ProducerIdBlock:
        """A producer-id block for this node: from its own controller replica, else from the leader's.

        Within the deadline of the request that needs it (``cluster.deadline``), retried at the controller
        leader as then known while the answer says it moved (an unanswered block is never reissued).
        """
        me = self.config.node_id

        def resolve(last: BrokerError | None) -> int | None:
            hint = last.extra.get("leader_id") if last is not None else None
            return int(hint) if isinstance(hint, int) else (self.leader_id() or me)

        async def attempt(node: int) -> ProducerIdBlock:
            if node == me:
                return await self.allocate_producer_ids_local(me)
            body = await self._peers.call(node, PRODUCER_IDS_PATH, {"node_id": me})
            return ProducerIdBlock(int(body["first"]), int(body["size"]))

        deadline = current_deadline() or Deadline.after(loop_now(), self.config.request_timeout_ms / 1000)
        return await call_at_leader(resolve, attempt, deadline, what="producer-id block from the controller")
