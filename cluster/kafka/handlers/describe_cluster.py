"""DescribeCluster (key 60, versions 0-2): the cluster id, the controller leader and the nodes' Kafka listeners.

Any authenticated caller may ask (as in Kafka); the cluster's authorized
operations are computed when asked for (Kafka's bit field of the ACL
operation codes the caller holds on CLUSTER, DESCRIBE_CONFIGS and
ALTER_CONFIGS following DESCRIBE and ALTER). Only the brokers endpoint type
is served (a controllers listing is INVALID_REQUEST: the controller is a
Raft group of the nodes, not separate servers). No node is fenced.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

from clients.protocol import ErrorCode

from ...security.acl import CLUSTER_NAME, Operation, ResourceType
from ..api import KafkaApi, RequestContext

__all__ = ["API", "authorized_operations"]

_Broker = DescribeClusterResponse.DescribeClusterBroker
#: Kafka's ``Integer.MIN_VALUE``: the authorized operations were not asked for
_NOT_ASKED = -(2**31)
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


def authorized_operations(ctx: RequestContext) -> int:
    bits = 0
    for code, op in _CLUSTER_OPERATIONS:
        if ctx.guard.allowed(op, ResourceType.CLUSTER, CLUSTER_NAME):
            bits |= 1 << code
    return bits


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
            cluster_authorized_operations=_NOT_ASKED,
        )
    brokers = []
    for node_id in ctx.services.nodes.node_ids():
        addr = ctx.services.nodes.node(node_id)
        if addr is not None and addr.kafka_port is not None:
            brokers.append(_Broker(broker_id=node_id, host=addr.host, port=addr.kafka_port, rack=None, is_fenced=False))
    ops = authorized_operations(ctx) if request.include_cluster_authorized_operations else _NOT_ASKED
    return DescribeClusterResponse(
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        endpoint_type=_BROKERS,
        cluster_id=ctx.services.config.cluster_id,
        controller_id=leader if leader is not None else -1,
        brokers=brokers,
        cluster_authorized_operations=ops,
    )


API = KafkaApi("DescribeCluster", DescribeClusterRequest, DescribeClusterResponse, 0, 2, handle)
