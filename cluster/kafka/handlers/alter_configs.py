"""AlterConfigs (key 33, versions 0-2): replacing a topic's config overrides as a whole.

The given keys become the topic's overrides and every other override is
removed (Kafka's non-incremental semantics; IncrementalAlterConfigs changes
single keys). Rights, checks and errors are IncrementalAlterConfigs': ALTER on
the topic, values as ``PATCH /v1/topics/{topic}/config`` checks them, a key
given twice INVALID_REQUEST, BROKER resources read-only.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import AlterConfigsRequest, AlterConfigsResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import Operation, ResourceType
from ..api import KafkaApi, RequestContext
from ..configs import alter_resources

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


async def handle(ctx: RequestContext, request: Any) -> Any:
    results = await alter_resources(ctx, request, lambda c, r: _replacement(c, r.resource_name, r.configs), _Result)
    return AlterConfigsResponse(throttle_time_ms=0, responses=results)


API = KafkaApi("AlterConfigs", AlterConfigsRequest, AlterConfigsResponse, 0, 2, handle)
