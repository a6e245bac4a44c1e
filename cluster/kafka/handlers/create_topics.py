"""CreateTopics (key 19, versions 2-7): the controller's topic creation, as ``POST /v1/topics`` does it.

Per topic: CREATE on CLUSTER or on the topic (TOPIC_AUTHORIZATION_FAILED
otherwise); a name given twice in one request is INVALID_REQUEST for each;
``num_partitions``/``replication_factor`` -1 take the node's defaults
(``default_partitions``; ``default_replication_factor``, at most the node
count); manual replica assignments are not offered (INVALID_REPLICA_ASSIGNMENT);
``configs`` are checked like the HTTP API's (INVALID_CONFIG). A topic that
fails is not created and the others are; ``validate_only`` checks everything
and creates nothing. A node that does not lead the controller sends the
creation to the leader (``cluster.kafka.controller_calls``). Versions 5 and up
answer the topic's partitions, replication factor and configs, version 7 its
topic id.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse

from clients.protocol import BrokerError, ErrorCode

from ...security.acl import CLUSTER_NAME, Operation, ResourceType
from ...topics import TOPIC_CONFIG_DEFAULTS
from ..api import KafkaApi, RequestContext, error_code, error_message
from ..configs import ConfigSource
from ..controller_calls import create_at_controller
from .metadata import topic_uuid

__all__ = ["API", "requested_configs"]

_Result = CreateTopicsResponse.CreatableTopicResult
_Config = _Result.CreatableTopicConfigs


def requested_configs(entries: Any) -> dict[str, str]:
    """A request's (name, value) config entries as a dict; INVALID_REQUEST for a name given twice,
    INVALID_CONFIG for a null value."""
    out: dict[str, str] = {}
    for entry in entries or ():
        if entry.name in out:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"config {entry.name!r} is given twice")
        if entry.value is None:
            raise BrokerError(ErrorCode.INVALID_CONFIG, f"config {entry.name!r} has no value")
        out[entry.name] = entry.value
    return out


def _failed(name: str, exc: BrokerError | ErrorCode, message: str | None = None) -> Any:
    code = error_code(exc)
    text = message if message is not None else error_message(exc) if isinstance(exc, BrokerError) else None
    return _Result(name=name, topic_id=uuid.UUID(int=0), error_code=code, error_message=text,
                   num_partitions=-1, replication_factor=-1, configs=None)  # fmt: skip


def _created(ctx: RequestContext, name: str, topic_id: int | None, partitions: int, rf: int,
             config: dict[str, Any]) -> Any:  # fmt: skip
    configs = [
        _Config(name=key, value=str(config.get(key, default)), read_only=False, is_sensitive=False,
                config_source=int(ConfigSource.DYNAMIC_TOPIC_CONFIG if key in config else ConfigSource.DEFAULT_CONFIG))
        for key, default in sorted(TOPIC_CONFIG_DEFAULTS.items())
    ]  # fmt: skip
    tid = topic_uuid(ctx.services.config.cluster_id, topic_id) if topic_id is not None else uuid.UUID(int=0)
    return _Result(name=name, topic_id=tid, error_code=0, error_message=None, num_partitions=partitions,
                   replication_factor=rf, configs=configs)  # fmt: skip


async def _create(ctx: RequestContext, topic: Any, validate_only: bool) -> Any:
    name = topic.name
    s = ctx.services
    if not (ctx.guard.allowed(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
            or ctx.guard.allowed(Operation.CREATE, ResourceType.TOPIC, name)):  # fmt: skip
        return _failed(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"{ctx.guard.principal} may not create {name!r}")
    try:
        if topic.assignments:
            raise BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "manual replica assignments are not offered")
        config = requested_configs(topic.configs)
        partitions = s.config.default_partitions if topic.num_partitions == -1 else topic.num_partitions
        rf = topic.replication_factor
        if rf == -1:
            rf = min(s.config.default_replication_factor, len(s.nodes.node_ids()))
        _, assignment, cfg = s.controller.check_new_topic(name, partitions, rf, config)
        if validate_only:
            return _created(ctx, name, None, len(assignment), rf, cfg)
        topic_id, count, rf, made = await create_at_controller(ctx, name, partitions, rf, config)
        return _created(ctx, name, topic_id, count, rf, made)
    except BrokerError as exc:
        return _failed(name, exc)


async def handle(ctx: RequestContext, request: Any) -> Any:
    counts = Counter(t.name for t in request.topics)
    validate_only = bool(request.validate_only) if ctx.api_version >= 1 else False
    results = []
    for topic in request.topics:
        if counts[topic.name] > 1:
            results.append(_failed(topic.name, ErrorCode.INVALID_REQUEST, "the topic is named more than once"))
        else:
            results.append(await _create(ctx, topic, validate_only))
    return CreateTopicsResponse(throttle_time_ms=0, topics=results)


API = KafkaApi("CreateTopics", CreateTopicsRequest, CreateTopicsResponse, 2, 7, handle)
