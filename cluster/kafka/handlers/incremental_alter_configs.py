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

from typing import Any

from kafka.protocol.admin import IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse

from clients.protocol import BrokerError, ErrorCode

from ..api import KafkaApi, RequestContext
from ..configs import alter_resources

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


async def handle(ctx: RequestContext, request: Any) -> Any:
    results = await alter_resources(ctx, request, lambda _c, r: _changes(r.configs), _Result)
    return IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=results)


API = KafkaApi("IncrementalAlterConfigs", IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, 0, 1, handle)
