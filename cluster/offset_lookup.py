"""ListOffsets for the group tools: a partition's log start, high watermark and offset for a timestamp.

Answered by the partition's leader (here, or through a signed call to its
``/v1/internal/groups/list-offsets``): a follower's offsets may lag, and a
reset must not move a group past what the leader has. The timestamp lookup
scans the log (``storage.log_reader``) in a worker thread, never on the loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from clients.protocol import BrokerError, ErrorCode
from coordinator.group_admin import LogOffsets

from .replicas import LocalReplica
from .seams import NodeDirectory, PeerClient, TopicDirectory

__all__ = ["LIST_OFFSETS_PATH", "OffsetLookup", "ReplicaLookup", "log_offsets_json"]

LIST_OFFSETS_PATH = "/v1/internal/groups/list-offsets"


class ReplicaLookup(Protocol):
    def get(self, topic: str, partition: int) -> LocalReplica | None: ...


def log_offsets_json(o: LogOffsets) -> dict[str, Any]:
    return {
        "log_start_offset": o.log_start_offset,
        "high_watermark": o.high_watermark,
        "timestamp_offset": o.timestamp_offset,
    }


def _from_json(body: Any) -> LogOffsets:
    try:
        ts = body.get("timestamp_offset")
        return LogOffsets(int(body["log_start_offset"]), int(body["high_watermark"]), None if ts is None else int(ts))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"malformed list-offsets answer: {body!r}") from exc


class OffsetLookup:
    def __init__(
        self, replicas: ReplicaLookup, topics: TopicDirectory, nodes: NodeDirectory, peers: PeerClient
    ) -> None:
        self._replicas = replicas
        self._topics = topics
        self._nodes = nodes
        self._peers = peers

    def check_partition(self, topic: str, partition: int) -> None:
        """``UNKNOWN_TOPIC_OR_PARTITION`` unless the topic exists and has the partition."""
        meta = self._topics.topic(topic)
        if not 0 <= partition < len(meta.partitions):
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")

    async def log_offsets(self, topic: str, partition: int, timestamp_ms: int | None = None) -> LogOffsets:
        """The leader's offsets of ``topic-partition`` (and the first offset at or after ``timestamp_ms``)."""
        self.check_partition(topic, partition)
        rep = self._replicas.get(topic, partition)
        if rep is not None and rep.group.is_leader():
            return await self.local(topic, partition, timestamp_ms)
        leader = self._topics.partition_leader(self._topics.topic(topic), partition)
        if leader is None or leader == self._nodes.node_id:
            raise BrokerError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{partition} has no ready leader")
        body = await self._peers.call(
            leader, LIST_OFFSETS_PATH, {"topic": topic, "partition": partition, "timestamp": timestamp_ms}
        )
        return _from_json(body)

    async def local(self, topic: str, partition: int, timestamp_ms: int | None) -> LogOffsets:
        """This node's answer as the partition's leader; ``NOT_LEADER_OR_FOLLOWER`` when it is not."""
        self.check_partition(topic, partition)
        rep = self._replicas.get(topic, partition)
        if rep is None or not rep.group.is_leader():
            raise BrokerError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, f"node {self._nodes.node_id} does not lead {topic}-{partition}"
            )
        found = None
        if timestamp_ms is not None:
            found = await asyncio.to_thread(rep.log.offset_for_timestamp, timestamp_ms)
        # read after the scan: the high watermark only grows, so the answer lies within [log start, HW]
        return LogOffsets(rep.log.log_start_offset, rep.log.high_watermark, found)
