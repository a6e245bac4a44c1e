"""DescribeCluster (key 60, versions 0-2): the cluster id, the controller leader and the nodes' Kafka listeners.

Any authenticated caller may ask (as in Kafka); the cluster's authorized
operations are computed when asked for (Kafka's bit field of the ACL
operation codes the caller holds on CLUSTER, DESCRIBE_CONFIGS and
ALTER_CONFIGS following DESCRIBE and ALTER; Metadata answers the same field
for the cluster and its topics). Only the brokers endpoint type
is served (a controllers listing is INVALID_REQUEST: the controller is a
Raft group of the nodes, not separate servers). No node is fenced.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

from clients.protocol import ErrorCode

from ...security.acl import CLUSTER_NAME, Operation, ResourceType
from ..api import KafkaApi, RequestContext

__all__ = ["API", "NOT_ASKED", "authorized_operations"]

_Broker = DescribeClusterResponse.DescribeClusterBroker
#: The authorized operations were not asked for (kafka-python encodes it as Kafka's ``Integer.MIN_VALUE``)
NOT_ASKED = None
_BROKERS = 1
#: Kafka's ACL operation codes on CLUSTER, and the operation of txbroker's model each one needs
_CLUSTER_OPERATIONS: tuple[tuple[int, Operation], ...] = (
    (5, Operation.CREATE),
    (7, Operation.ALTER),
    (8, Operation.DESCRIBE),
    (10, Operation.DESCRIBE),  # DESCRIBE_CONFIGS
    (11, Operation.ALTER),  # ALTER_CONFIGS
    (12, Operation.IDEMPOTENT_WRITE),
)


#: the same for a topic
_TOPIC_OPERATIONS: tuple[tuple[int, Operation], ...] = (
    (3, Operation.READ),
    (4, Operation.WRITE),
    (5, Operation.CREATE),
    (6, Operation.DELETE),
    (7, Operation.ALTER),
    (8, Operation.DESCRIBE),
    (10, Operation.DESCRIBE),
    (11, Operation.ALTER),
)


def authorized_operations(ctx: RequestContext, topic: str | None = None) -> set[int]:
    """The ACL operation codes the caller holds on the cluster, or on ``topic`` (the bits of Kafka's field)."""
    table, rtype, name = (
        (_CLUSTER_OPERATIONS, ResourceType.CLUSTER, CLUSTER_NAME)
        if topic is None
        else (_TOPIC_OPERATIONS, ResourceType.TOPIC, topic)
    )
    return {code for code, op in table if ctx.guard.allowed(op, rtype, name)}


async def handle(ctx: RequestContext, request: Any) -> Any:
    endpoint_type = request.endpoint_type if ctx.api_version >= 1 else _BROKERS
    leader = ctx.services.controller.leader_id()
    if endpoint_type != _BROKERS:
        return DescribeClusterResponse(
            throttle_time_ms=0,
            error_code=ErrorCode.INVALID_REQUEST.code,
            error_message="only the brokers endpoint type is served",
            endpoint_type=endpoint_type,
            cluster_id=ctx.services.config.cluster_id,
            controller_id=-1,
            brokers=[],
            authorized_operations=NOT_ASKED,
        )
    brokers = []
    for node_id in ctx.services.nodes.node_ids():
        addr = ctx.services.nodes.node(node_id)
        if addr is not None and addr.kafka_port is not None:
            brokers.append(_Broker(broker_id=node_id, host=addr.host, port=addr.kafka_port, rack=None, is_fenced=False))
    ops = authorized_operations(ctx) if request.include_cluster_authorized_operations else NOT_ASKED
    return DescribeClusterResponse(
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        endpoint_type=_BROKERS,
        cluster_id=ctx.services.config.cluster_id,
        controller_id=leader if leader is not None else -1,
        brokers=brokers,
        authorized_operations=ops,
    )


API = KafkaApi("DescribeCluster", DescribeClusterRequest, DescribeClusterResponse, 0, 2, handle)
