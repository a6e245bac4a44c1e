"""AlterConfigs (key 33, versions 0-2): replacing a topic's config overrides as a whole.

The given keys become the topic's overrides and every other override is
removed (Kafka's non-incremental semantics; IncrementalAlterConfigs changes
single keys). Rights, checks and errors are IncrementalAlterConfigs': ALTER on
the topic, values as ``PATCH /v1/topics/{topic}/config`` checks them, a key
given twice INVALID_REQUEST, BROKER resources read-only.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kafka.protocol.admin import AlterConfigsRequest, AlterConfigsResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code, error_message
from ..configs import ConfigResourceType, alter_topic_config, refuse_broker_change

__all__ = ["API"]

_Result = AlterConfigsResponse.AlterConfigsResourceResponse


def _replacement(ctx: RequestContext, name: str, configs: Any) -> dict[str, int | str | None]:
    given: dict[str, int | str | None] = {}
    for c in configs:
        if c.name in given:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"config {c.name!r} is given twice")
        if c.value is None:
            raise BrokerError(ErrorCode.INVALID_CONFIG, f"config {c.name!r} has no value")
        given[c.name] = c.value
    ctx.guard.require(Operation.ALTER, ResourceType.TOPIC, name)
    current = ctx.services.controller.topic(name).config
    return {**{key: None for key in current if key not in given}, **given}


async def _alter(ctx: RequestContext, resource: Any, validate_only: bool) -> None:
    name = resource.resource_name
    if resource.resource_type == ConfigResourceType.TOPIC:
        await alter_topic_config(ctx, name, _replacement(ctx, name, resource.configs), validate_only)
    elif resource.resource_type == ConfigResourceType.BROKER:
        refuse_broker_change(ctx)
    else:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"config resource type {resource.resource_type} is not served")


async def handle(ctx: RequestContext, request: Any) -> Any:
    counts = Counter((r.resource_type, r.resource_name) for r in request.resources)
    results = []
    for r in request.resources:
        try:
            if counts[(r.resource_type, r.resource_name)] > 1:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "the resource is named more than once")
            await _alter(ctx, r, bool(request.validate_only))
        except BrokerError as exc:
            results.append(_Result(error_code=error_code(exc), error_message=error_message(exc),
                                   resource_type=r.resource_type, resource_name=r.resource_name))  # fmt: skip
            continue
        results.append(_Result(error_code=0, error_message=None, resource_type=r.resource_type,
                               resource_name=r.resource_name))  # fmt: skip
    return AlterConfigsResponse(throttle_time_ms=0, responses=results)


API = KafkaApi("AlterConfigs", AlterConfigsRequest, AlterConfigsResponse, 0, 2, handle)
