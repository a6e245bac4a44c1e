"""ApiVersions (key 18): the versions of every API this listener serves, read off the registered handlers.

A request in a version newer than the listener knows is answered in version 0 by the server itself
(``KafkaServer``), with UNSUPPORTED_VERSION and this same list (KIP-511).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from ..api import KafkaApi, RequestContext

__all__ = ["API", "api_version_entries"]


def api_version_entries(apis: Iterable[KafkaApi]) -> list[Any]:
    """ApiVersions' list: one entry per registered handler, sorted by key."""
    return [
        ApiVersionsResponse.ApiVersion(api_key=a.api_key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(apis, key=lambda a: a.api_key)
    ]


async def handle(ctx: RequestContext, request: Any) -> Any:
    from . import ALL_APIS  # the registry lists this module too

    return ApiVersionsResponse(error_code=0, api_keys=api_version_entries(ALL_APIS), throttle_time_ms=0)


API = KafkaApi("ApiVersions", ApiVersionsRequest, ApiVersionsResponse, 0, 3, handle, authenticated=False)
