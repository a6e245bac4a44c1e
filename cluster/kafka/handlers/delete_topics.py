"""DeleteTopics (key 20, versions 1-6): the controller's topic deletion, as ``DELETE /v1/topics/{topic}`` does it.

Per topic: DELETE on the topic (TOPIC_AUTHORIZATION_FAILED otherwise, also
for a topic that does not exist); an unknown topic is
UNKNOWN_TOPIC_OR_PARTITION (UNKNOWN_TOPIC_ID for an unknown id in version
6). A node that does not lead the controller sends the deletion to the
leader (``cluster.kafka.controller_calls``).
"""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.admin import DeleteTopicsRequest, DeleteTopicsResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code, error_message
from ..controller_calls import forward
from .metadata import topic_uuid

__all__ = ["API"]

_Result = DeleteTopicsResponse.DeletableTopicResult
_ZERO = uuid.UUID(int=0)


def _by_id(ctx: RequestContext, topic_id: uuid.UUID) -> str | None:
    cluster_id = ctx.services.config.cluster_id
    for meta in ctx.services.controller.view.topics.values():
        if topic_uuid(cluster_id, meta.topic_id) == topic_id:
            return meta.name
    return None


async def _delete(ctx: RequestContext, name: str, topic_id: uuid.UUID) -> Any:
    if not ctx.guard.allowed(Operation.DELETE, ResourceType.TOPIC, name):
        denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        return _Result(name=name, topic_id=topic_id, error_code=denied.code,
                       error_message=f"{ctx.guard.principal} may not delete {name!r}")  # fmt: skip
    try:
        try:
            meta = await ctx.services.controller.delete_topic(name)
            topic_id = topic_uuid(ctx.services.config.cluster_id, meta.topic_id)
        except BrokerError as exc:
            await forward(ctx, exc, "DELETE", f"/v1/topics/{name}")
    except BrokerError as exc:
        return _Result(name=name, topic_id=topic_id, error_code=error_code(exc), error_message=error_message(exc))
    return _Result(name=name, topic_id=topic_id, error_code=0, error_message=None)


async def handle(ctx: RequestContext, request: Any) -> Any:
    results = []
    if ctx.api_version >= 6:
        for t in request.topics:
            if t.name is not None:
                results.append(await _delete(ctx, t.name, t.topic_id or _ZERO))
                continue
            name = _by_id(ctx, t.topic_id) if t.topic_id not in (None, _ZERO) else None
            if name is None:
                unknown = ErrorCode.UNKNOWN_TOPIC_ID.code
                results.append(_Result(name=None, topic_id=t.topic_id or _ZERO, error_code=unknown,
                                       error_message="no topic has this id"))  # fmt: skip
            else:
                results.append(await _delete(ctx, name, t.topic_id))
    else:
        for name in request.topic_names:
            results.append(await _delete(ctx, name, _ZERO))
    return DeleteTopicsResponse(throttle_time_ms=0, responses=results)


API = KafkaApi("DeleteTopics", DeleteTopicsRequest, DeleteTopicsResponse, 1, 6, handle)
