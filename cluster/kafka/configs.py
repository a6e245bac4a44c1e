"""Topic and broker configs as Kafka's config APIs describe them (DescribeConfigs, CreateTopics v5+).

A topic config is its override when the topic has one (source
DYNAMIC_TOPIC_CONFIG), else Kafka's default (DEFAULT_CONFIG); the topic
configs are the ones txbroker honours (``cluster.topics.TOPIC_CONFIG_DEFAULTS``).
A broker's configs are the node's own settings that Kafka names, read-only
(STATIC_BROKER_CONFIG): they come from the node's config file.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from clients.protocol import BrokerError, ErrorCode

from ..config import NodeConfig
from ..security.acl import CLUSTER_NAME, Operation, ResourceType
from ..topic_admin import config_changes
from ..topics import TOPIC_CONFIG_DEFAULTS, TopicMetadata
from .api import RequestContext, error_code, error_message
from .controller_calls import forward

__all__ = [
    "ConfigEntry",
    "ConfigResourceType",
    "ConfigSource",
    "alter_resources",
    "alter_topic_config",
    "broker_configs",
    "refuse_broker_change",
    "topic_configs",
]


class ConfigResourceType(enum.IntEnum):
    """Kafka's ``ConfigResource.Type`` codes."""

    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8


class ConfigSource(enum.IntEnum):
    DYNAMIC_TOPIC_CONFIG = 1
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class _Type(enum.IntEnum):
    """Kafka's ``ConfigDef.Type`` codes (DescribeConfigs v3+)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    LIST = 7


_TOPIC_DOCS: dict[str, tuple[_Type, str]] = {
    "retention.ms": (_Type.LONG, "How long records are kept before they are deleted (-1: no time limit)."),
    "retention.bytes": (_Type.LONG, "The bytes a partition keeps before its oldest records go (-1: no limit)."),
    "max.message.bytes": (_Type.INT, "The largest record batch the topic accepts."),
    "cleanup.policy": (_Type.LIST, "What happens to old records: 'delete' (compaction is not offered)."),
    "producer.id.expiration.ms": (_Type.LONG, "How long a producer's idempotence state is kept after its last write."),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str
    source: ConfigSource
    read_only: bool
    #: (value, source) of the values this one overrides, most specific first (Kafka's synonyms)
    synonyms: tuple[tuple[str, ConfigSource], ...]
    config_type: int
    documentation: str

    @property
    def is_default(self) -> bool:
        return self.source is ConfigSource.DEFAULT_CONFIG


def _text(value: int | str) -> str:
    return str(value)


def topic_configs(meta: TopicMetadata) -> list[ConfigEntry]:
    """Every topic config of ``meta``, by name."""
    out = []
    for name, default in sorted(TOPIC_CONFIG_DEFAULTS.items()):
        config_type, doc = _TOPIC_DOCS.get(name, (_Type.STRING, ""))
        default_synonym = (_text(default), ConfigSource.DEFAULT_CONFIG)
        if name in meta.config:
            value = _text(meta.config[name])
            source = ConfigSource.DYNAMIC_TOPIC_CONFIG
            synonyms: tuple[tuple[str, ConfigSource], ...] = ((value, source), default_synonym)
        else:
            value, source, synonyms = _text(default), ConfigSource.DEFAULT_CONFIG, (default_synonym,)
        out.append(ConfigEntry(name, value, source, False, synonyms, int(config_type), doc))
    return out


def broker_configs(config: NodeConfig) -> list[ConfigEntry]:
    """The node's settings Kafka names for a broker (read-only: they come from the node's config file)."""
    protocol = ("SASL_SSL" if config.security.tls else "SASL_PLAINTEXT") if config.security is not None else "PLAINTEXT"
    listeners = f"{protocol}://{config.host}:{config.kafka_port}"
    values: Mapping[str, tuple[str, _Type, str]] = {
        "auto.create.topics.enable": ("false", _Type.BOOLEAN, "Topics are created explicitly (CreateTopics)."),
        "broker.id": (str(config.node_id), _Type.INT, "This node's id."),
        "default.replication.factor": (str(config.default_replication_factor), _Type.INT,
                                       "The replication factor of a topic created without one."),
        "listeners": (listeners, _Type.LIST, "The Kafka listener of this node."),
        "message.max.bytes": (str(TOPIC_CONFIG_DEFAULTS["max.message.bytes"]), _Type.INT,
                              "The default of a topic's max.message.bytes."),
        "num.partitions": (str(config.default_partitions), _Type.INT,
                           "The partition count of a topic created without one."),
        "socket.request.max.bytes": (str(config.kafka_max_frame_bytes), _Type.INT,
                                     "The largest request frame the listener reads."),
    }  # fmt: skip
    return [
        ConfigEntry(
            name,
            value,
            ConfigSource.STATIC_BROKER_CONFIG,
            True,
            ((value, ConfigSource.STATIC_BROKER_CONFIG),),
            int(config_type),
            doc,
        )
        for name, (value, config_type, doc) in sorted(values.items())
    ]


async def alter_topic_config(
    ctx: RequestContext, name: str, changes: dict[str, int | str | None], validate_only: bool
) -> None:
    """Set (None: delete) overrides of topic ``name``, as ``PATCH /v1/topics/{topic}/config`` does: ALTER on the
    topic, every value checked; ``validate_only`` checks and changes nothing. An empty change only checks that
    the topic exists. A node that does not lead the controller sends it to the leader."""
    ctx.guard.require(Operation.ALTER, ResourceType.TOPIC, name)
    controller = ctx.services.controller
    if not changes or validate_only:
        if changes:
            config_changes(changes)
        controller.topic(name)
        return
    try:
        await controller.alter_topic_config(name, changes)
    except BrokerError as exc:
        await forward(ctx, exc, "PATCH", f"/v1/topics/{name}/config", changes)


def refuse_broker_change(ctx: RequestContext) -> None:
    """A broker's configs come from its config file: a change is refused (after the rights check)."""
    ctx.guard.require(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
    raise BrokerError(ErrorCode.INVALID_REQUEST, "broker configs are read-only here (the node's config file)")


async def alter_resources(
    ctx: RequestContext,
    request: Any,
    changes_of: Callable[[RequestContext, Any], dict[str, int | str | None]],
    result: Any,
) -> list[Any]:
    """AlterConfigs and IncrementalAlterConfigs: each resource's ``changes_of`` applied (a topic's overrides;
    a broker's are refused), answered per resource as ``result`` entries; a resource named twice is refused."""
    counts = Counter((r.resource_type, r.resource_name) for r in request.resources)
    results = []
    for r in request.resources:
        try:
            if counts[(r.resource_type, r.resource_name)] > 1:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "the resource is named more than once")
            if r.resource_type == ConfigResourceType.TOPIC:
                changes = changes_of(ctx, r)
                await alter_topic_config(ctx, r.resource_name, changes, bool(request.validate_only))
            elif r.resource_type == ConfigResourceType.BROKER:
                refuse_broker_change(ctx)
            else:
                raise BrokerError(ErrorCode.INVALID_REQUEST, f"config resource type {r.resource_type} is not served")
        except BrokerError as exc:
            results.append(result(error_code=error_code(exc), error_message=error_message(exc),
                                  resource_type=r.resource_type, resource_name=r.resource_name))  # fmt: skip
            continue
        results.append(result(error_code=0, error_message=None, resource_type=r.resource_type,
                              resource_name=r.resource_name))  # fmt: skip
    return results
