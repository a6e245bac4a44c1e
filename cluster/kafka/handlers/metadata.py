"""Metadata (key 3): the nodes' Kafka listeners, the controller, and each topic's partitions and leaders.

Only nodes with a Kafka listener are listed. A partition's leader is the node
this node knows leads its Raft group (-1 with LEADER_NOT_AVAILABLE while an
election runs). A partition this node names no leader for is asked of its
replicas before the answer (``ControllerService.refresh_leaders``, within half
a second): a node that does not replicate a partition made a moment ago
learns its leader from the peer polls, up to ``peer_poll_interval_s`` late,
and a client told LEADER_NOT_AVAILABLE by one node after another named the
leader may skip the partition (kafka-python's ``offsets_for_times`` answers
None for it). Its replicas are the group's voters, and all of them are
reported in sync (Raft commits on a majority, so ``min.insync.replicas`` is
what the controller enforces, not a shrinking ISR). Leader epochs are not
tracked (-1), so clients skip KIP-320's epoch checks. A topic's id is a UUID
derived from the cluster id and the controller's topic number. Topics the
caller may not DESCRIBE are left out of a listing and answered
TOPIC_AUTHORIZATION_FAILED when named. Asked for (versions 8 and up), the
cluster's and each topic's authorized operations come as DescribeCluster
computes them.
"""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import CLUSTER_NAME, Operation, ResourceType
from ...topics import TopicMetadata
from ..api import KafkaApi, RequestContext
from ..controller_calls import create_at_controller
from .describe_cluster import NOT_ASKED as _NOT_ASKED
from .describe_cluster import authorized_operations

__all__ = ["API", "topic_uuid"]

_Topic = MetadataResponse.MetadataResponseTopic
_Partition = _Topic.MetadataResponsePartition
_Broker = MetadataResponse.MetadataResponseBroker


def topic_uuid(cluster_id: str, topic_id: int) -> uuid.UUID:
    """The Kafka topic id of the controller's topic number ``topic_id`` (stable for the topic's life)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"txbroker:{cluster_id}:{topic_id}")


def brokers(ctx: RequestContext) -> list[Any]:
    out = []
    for node_id in ctx.services.nodes.node_ids():
        addr = ctx.services.nodes.node(node_id)
        if addr is not None and addr.kafka_port is not None:
            out.append(_Broker(node_id=node_id, host=addr.host, port=addr.kafka_port, rack=None))
    return out


def _topic(ctx: RequestContext, meta: TopicMetadata) -> Any:
    controller = ctx.services.controller
    parts = []
    for a in meta.partitions:
        leader = controller.partition_leader(meta, a.partition)
        parts.append(
            _Partition(
                error_code=0 if leader is not None else ErrorCode.LEADER_NOT_AVAILABLE.code,
                partition_index=a.partition,
                leader_id=leader if leader is not None else -1,
                leader_epoch=-1,
                replica_nodes=list(a.replicas),
                isr_nodes=list(a.replicas),
                offline_replicas=[],
            )
        )
    return _Topic(
        error_code=0,
        name=meta.name,
        topic_id=topic_uuid(ctx.services.config.cluster_id, meta.topic_id),
        is_internal=False,
        partitions=parts,
    )


async def _auto_create(ctx: RequestContext, name: str, request: Any) -> ErrorCode:
    """A topic a client named that does not exist: created with the defaults when the node's
    ``auto_create_topics_enable`` allows, the request asks for it (Metadata v4+; implied before) and
    the caller may CREATE it; answered LEADER_NOT_AVAILABLE while it gets its leaders (the client asks
    again), else UNKNOWN_TOPIC_OR_PARTITION, as Kafka does."""
    s = ctx.services
    wanted = ctx.api_version < 4 or bool(request.allow_auto_topic_creation)
    may = ctx.guard.allowed(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME) or ctx.guard.allowed(
        Operation.CREATE, ResourceType.TOPIC, name
    )
    if not (s.config.auto_create_topics_enable and wanted and may):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    partitions = s.config.default_partitions
    rf = min(s.config.default_replication_factor, len(s.nodes.node_ids()))
    try:
        await create_at_controller(ctx, name, partitions, rf, {})
    except BrokerError as exc:
        if exc.error_code is ErrorCode.INVALID_TOPIC:
            return ErrorCode.INVALID_TOPIC
        if exc.error_code is not ErrorCode.TOPIC_ALREADY_EXISTS:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return ErrorCode.LEADER_NOT_AVAILABLE


def _refused(name: str, code: ErrorCode) -> Any:
    return _Topic(error_code=code.code, name=name, topic_id=uuid.UUID(int=0), is_internal=False, partitions=[])


async def handle(ctx: RequestContext, request: Any) -> Any:
    view = ctx.services.controller.view
    guard = ctx.guard
    # each answer's slot: a listed topic (its partitions filled in below) or a refusal
    slots: list[TopicMetadata | Any] = []
    if request.topics is None or (ctx.api_version == 0 and not request.topics):
        slots = [view.topics[name] for name in sorted(view.topics) if guard.may_describe(ResourceType.TOPIC, name)]
    else:
        for requested in request.topics:
            name = requested.name
            if name is None:
                slots.append(_refused("", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            elif not guard.may_describe(ResourceType.TOPIC, name):
                slots.append(_refused(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            elif name not in view.topics:
                slots.append(_refused(name, await _auto_create(ctx, name, request)))
            else:
                slots.append(view.topics[name])
    await ctx.services.controller.refresh_leaders(s for s in slots if isinstance(s, TopicMetadata))
    topics = [_topic(ctx, s) if isinstance(s, TopicMetadata) else s for s in slots]
    if ctx.api_version >= 8 and request.include_topic_authorized_operations:
        for t in topics:
            if t.error_code == 0:
                t.authorized_operations = authorized_operations(ctx, t.name)
    cluster_ops: set[int] | None = _NOT_ASKED
    if 8 <= ctx.api_version <= 10 and request.include_cluster_authorized_operations:
        cluster_ops = authorized_operations(ctx)
    leader = ctx.services.controller.leader_id()
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=brokers(ctx),
        cluster_id=ctx.services.config.cluster_id,
        controller_id=leader if leader is not None else -1,
        topics=topics,
        authorized_operations=cluster_ops,
    )


API = KafkaApi("Metadata", MetadataRequest, MetadataResponse, 0, 12, handle)
