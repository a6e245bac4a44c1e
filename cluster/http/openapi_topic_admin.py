"""OpenAPI paths of growing a topic and changing its config (merged into ``openapi_document``)."""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_TOPIC_PARAM = {"name": "topic", "in": "path", "required": True, "schema": _STR}
_CONFIG_KEYS = "retention.ms, retention.bytes, max.message.bytes, cleanup.policy, producer.id.expiration.ms"
_CONFIG = {
    "type": "object",
    "properties": {
        "topic": _STR,
        "config": {"type": "object", "description": "every topic config key with its value (defaults included)"},
        "overrides": {"type": "object", "description": "the keys set on this topic"},
    },
    "required": ["topic", "config", "overrides"],
}


def _responses(desc: str, schema: dict[str, Any], errors: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": desc, "content": {"application/json": {"schema": schema}}}}
    for status in errors:
        out[str(status)] = {"description": "error", "content": {"application/json": {"schema": _ERROR}}}
    return out


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def topic_admin_paths(topic_schema: dict[str, Any]) -> dict[str, Any]:
    """``topic_schema``: the topic description ``GET /v1/topics/{topic}`` answers."""
    return {
        "/v1/topics/{topic}/partitions": {
            "parameters": [_TOPIC_PARAM],
            "post": {
                "summary": "grow the topic to `count` partitions in total (only up, as in Kafka's CreatePartitions); "
                "any node, forwarded to the controller leader; answers the topic once every live node knows the "
                "new partitions (their leaders are elected right after). 400 INVALID_PARTITIONS for a count not "
                "above the current one or above max_partitions_per_topic, INVALID_REPLICA_ASSIGNMENT for bad "
                "`assignments`; nothing changes then. ALTER on the topic",
                "requestBody": _body(
                    {
                        "type": "object",
                        "properties": {
                            "count": _INT,
                            "assignments": {
                                "type": "array",
                                "items": {"type": "array", "items": _INT},
                                "description": "the replicas (node ids, preferred leader first) of each new "
                                "partition, as many as the topic's replication factor (default: round-robin)",
                            },
                        },
                        "required": ["count"],
                    }
                ),
                "responses": _responses("the topic", topic_schema, (400, 403, 404, 421, 503, 504)),
            },
        },
        "/v1/topics/{topic}/config": {
            "parameters": [_TOPIC_PARAM],
            "get": {
                "summary": "the topic's config: every key's value and the overrides (kafka-configs.sh --describe); "
                "DESCRIBE on the topic",
                "responses": _responses("config", _CONFIG, (403, 404)),
            },
            "patch": {
                "summary": "set config overrides (validated like creation); a key with value null deletes its "
                "override (back to the default); any node, forwarded to the controller leader; answers the config "
                "once every live node applies it. 400 INVALID_CONFIG for an unknown key or a bad value, nothing "
                "changed. ALTER on the topic",
                "requestBody": _body(
                    {
                        "type": "object",
                        "description": f"{{key: value | null}}; keys: {_CONFIG_KEYS}",
                        "additionalProperties": {"type": ["integer", "string", "null"]},
                    }
                ),
                "responses": _responses("config", _CONFIG, (400, 403, 404, 421, 503, 504)),
            },
        },
    }
