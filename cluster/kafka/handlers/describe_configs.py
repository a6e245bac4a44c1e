"""DescribeConfigs (key 32, versions 1-4): a topic's configs, or a broker's, as Kafka's config tools read them.

TOPIC resources: DESCRIBE on the topic (TOPIC_AUTHORIZATION_FAILED; an unknown
topic is UNKNOWN_TOPIC_OR_PARTITION), every config txbroker honours with its
value and source (``cluster.kafka.configs``), as ``GET
/v1/topics/{topic}/config`` shows them. BROKER resources: DESCRIBE on
CLUSTER (CLUSTER_AUTHORIZATION_FAILED), this node's settings, read-only; the
name is this node's id ("" for the cluster-wide defaults: the same values),
another node's id is INVALID_REQUEST (clients ask each broker for its own).
Other resource types are INVALID_REQUEST. ``configuration_keys`` narrows the
list; synonyms come with ``include_synonyms``, types and documentation from
version 3.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import CLUSTER_NAME, Operation, ResourceType
from ..api import KafkaApi, RequestContext, error_code, error_message
from ..configs import ConfigEntry, ConfigResourceType, broker_configs, topic_configs

__all__ = ["API"]

_Result = DescribeConfigsResponse.DescribeConfigsResult
_Entry = _Result.DescribeConfigsResourceResult
_Synonym = _Entry.DescribeConfigsSynonym


def _entries(ctx: RequestContext, resource: Any) -> list[ConfigEntry]:
    name = resource.resource_name
    if resource.resource_type == ConfigResourceType.TOPIC:
        ctx.guard.require(Operation.DESCRIBE, ResourceType.TOPIC, name)
        return topic_configs(ctx.services.controller.topic(name))
    if resource.resource_type == ConfigResourceType.BROKER:
        ctx.guard.require(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
        if name not in ("", str(ctx.node_id)):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"this is node {ctx.node_id}; ask node {name!r} itself")
        return broker_configs(ctx.services.config)
    raise BrokerError(ErrorCode.INVALID_REQUEST, f"config resource type {resource.resource_type} is not served")


def _entry(ctx: RequestContext, e: ConfigEntry, synonyms: bool, documentation: bool) -> Any:
    return _Entry(
        name=e.name,
        value=e.value,
        read_only=e.read_only,
        config_source=int(e.source),
        is_default=e.is_default,
        is_sensitive=False,
        synonyms=[_Synonym(name=e.name, value=v, source=int(src)) for v, src in e.synonyms] if synonyms else [],
        config_type=e.config_type,
        documentation=e.documentation if documentation else None,
    )


async def handle(ctx: RequestContext, request: Any) -> Any:
    synonyms = bool(request.include_synonyms)
    documentation = ctx.api_version >= 3 and bool(request.include_documentation)
    results = []
    for resource in request.resources:
        keys = resource.configuration_keys
        try:
            entries = [e for e in _entries(ctx, resource) if keys is None or e.name in keys]
        except BrokerError as exc:
            results.append(_Result(error_code=error_code(exc), error_message=error_message(exc),
                                   resource_type=resource.resource_type, resource_name=resource.resource_name,
                                   configs=[]))  # fmt: skip
            continue
        results.append(_Result(error_code=0, error_message=None, resource_type=resource.resource_type,
                               resource_name=resource.resource_name,
                               configs=[_entry(ctx, e, synonyms, documentation) for e in entries]))  # fmt: skip
    return DescribeConfigsResponse(throttle_time_ms=0, results=results)


API = KafkaApi("DescribeConfigs", DescribeConfigsRequest, DescribeConfigsResponse, 1, 4, handle)
