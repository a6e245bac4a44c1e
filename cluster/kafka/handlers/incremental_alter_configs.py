"""IncrementalAlterConfigs (key 44, versions 0-1): changing a topic's config overrides, one key at a time.

Per resource: a TOPIC needs ALTER on it (TOPIC_AUTHORIZATION_FAILED); SET
sets a key, DELETE removes its override (back to the default); APPEND and
SUBTRACT are for list configs, and txbroker's only one (``cleanup.policy``)
has a single value: INVALID_CONFIG. Values are checked as ``PATCH
/v1/topics/{topic}/config`` checks them (INVALID_CONFIG), a key given twice
is INVALID_REQUEST, and a resource that fails changes nothing. BROKER
resources are read-only (INVALID_REQUEST after the ALTER on CLUSTER check).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kafka.protocol.admin import IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse

from clients.protocol import BrokerError, ErrorCode

from ..api import KafkaApi, RequestContext, error_code, error_message
from ..configs import ConfigResourceType, alter_topic_config, refuse_broker_change

__all__ = ["API"]

_Result = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse
_SET, _DELETE = 0, 1


def _changes(configs: Any) -> dict[str, int | str | None]:
    out: dict[str, int | str | None] = {}
    for c in configs:
        if c.name in out:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"config {c.name!r} is given twice")
        if c.config_operation == _SET:
            if c.value is None:
                raise BrokerError(ErrorCode.INVALID_CONFIG, f"SET {c.name!r} needs a value")
            out[c.name] = c.value
        elif c.config_operation == _DELETE:
            out[c.name] = None
        elif c.config_operation in (2, 3):
            raise BrokerError(ErrorCode.INVALID_CONFIG, f"APPEND and SUBTRACT are for list configs, not {c.name!r}")
        else:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"unknown config operation {c.config_operation}")
    return out


async def _alter(ctx: RequestContext, resource: Any, validate_only: bool) -> None:
    if resource.resource_type == ConfigResourceType.TOPIC:
        await alter_topic_config(ctx, resource.resource_name, _changes(resource.configs), validate_only)
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
    return IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=results)


API = KafkaApi("IncrementalAlterConfigs", IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, 0, 1, handle)
