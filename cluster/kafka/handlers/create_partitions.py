"""CreatePartitions (key 37, versions 0-3): growing a topic, as ``POST /v1/topics/{topic}/partitions`` does it.

Per topic: ALTER on the topic (TOPIC_AUTHORIZATION_FAILED otherwise); a
topic named twice is INVALID_REQUEST; the count only increases
(INVALID_PARTITIONS); assignments, when given, name each new partition's
replicas (INVALID_REPLICA_ASSIGNMENT when they do not fit). ``validate_only``
checks against this node's view and changes nothing. A node that does not
lead the controller sends the change to the leader
(``cluster.kafka.controller_calls``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kafka.protocol.admin import CreatePartitionsRequest, CreatePartitionsResponse

from clients.protocol import BrokerError, ErrorCode

from ...membership import topic_placement_nodes
from ...security.acl import Operation, ResourceType
from ...topic_admin import new_partitions, validate_partition_count
from ..api import KafkaApi, RequestContext, error_code, error_message
from ..controller_calls import forward

__all__ = ["API"]

_Result = CreatePartitionsResponse.CreatePartitionsTopicResult


async def _grow(ctx: RequestContext, topic: Any, validate_only: bool) -> Any:
    name = topic.name
    if not ctx.guard.allowed(Operation.ALTER, ResourceType.TOPIC, name):
        return _Result(name=name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED.code,
                       error_message=f"{ctx.guard.principal} may not alter {name!r}")  # fmt: skip
    controller = ctx.services.controller
    assignments = None if topic.assignments is None else [list(a.broker_ids) for a in topic.assignments]
    try:
        if validate_only:
            meta = controller.topic(name)
            count = validate_partition_count(
                topic.count, len(meta.partitions), ctx.services.config.max_partitions_per_topic
            )
            new_partitions(meta, count, topic_placement_nodes(controller.view, ctx.services.nodes.node_ids()),
                           assignments)  # fmt: skip
        else:
            try:
                await controller.add_partitions(name, topic.count, assignments)
            except BrokerError as exc:
                body: dict[str, Any] = {"count": topic.count}
                if assignments is not None:
                    body["assignments"] = assignments
                await forward(ctx, exc, "POST", f"/v1/topics/{name}/partitions", body)
    except BrokerError as exc:
        return _Result(name=name, error_code=error_code(exc), error_message=error_message(exc))
    return _Result(name=name, error_code=0, error_message=None)


async def handle(ctx: RequestContext, request: Any) -> Any:
    counts = Counter(t.name for t in request.topics)
    results = []
    for topic in request.topics:
        if counts[topic.name] > 1:
            results.append(_Result(name=topic.name, error_code=ErrorCode.INVALID_REQUEST.code,
                                   error_message="the topic is named more than once"))  # fmt: skip
        else:
            results.append(await _grow(ctx, topic, bool(request.validate_only)))
    return CreatePartitionsResponse(throttle_time_ms=0, results=results)


API = KafkaApi("CreatePartitions", CreatePartitionsRequest, CreatePartitionsResponse, 0, 3, handle)
