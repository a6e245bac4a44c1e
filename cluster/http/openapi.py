"""The OpenAPI 3.1 document served at ``GET /v1/openapi.json``."""

from __future__ import annotations

from typing import Any

from clients.protocol import ErrorCode

from ..metrics import VERSION
from .openapi_operations import operation_paths
from .openapi_security import SECURITY_SCHEMES, security_paths
from .openapi_topic_admin import topic_admin_paths
from .openapi_txn import transaction_and_group_paths

_ERROR = {"$ref": "#/components/schemas/Error"}


def _resp(desc: str, schema: dict[str, Any] | None = None, *, errors: tuple[int, ...] = (400,)) -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": desc}}
    if schema is not None:
        out["200"]["content"] = {"application/json": {"schema": schema}}
    for status in errors:
        out[str(status)] = {"description": "error", "content": {"application/json": {"schema": _ERROR}}}
    return out


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        s["required"] = required
    return s


_INT = {"type": "integer"}
_STR = {"type": "string"}
_B64 = {"type": ["string", "null"], "contentEncoding": "base64"}
_HEADER = _obj({"key": _STR, "value": _B64}, ["key"])
_RECORD_IN = _obj(
    {"key": _B64, "value": _B64, "headers": {"type": "array", "items": _HEADER}, "timestamp": _INT, "partition": _INT},
)
_RECORD_OUT = _obj(
    {"offset": _INT, "timestamp": _INT, "key": _B64, "value": _B64, "headers": {"type": "array", "items": _HEADER}}
)
_PARTITION_META = _obj(
    {
        "partition": _INT,
        "leader": {"type": ["integer", "null"]},
        "leader_url": {"type": ["string", "null"]},
        "replicas": {"type": "array", "items": _INT},
        "high_watermark": _INT,
        "last_stable_offset": _INT,
        "log_start_offset": _INT,
    }
)
_TOPIC = _obj(
    {
        "name": _STR,
        "topic_id": _INT,
        "replication_factor": _INT,
        "config": {"type": "object"},
        "partitions": {"type": "array", "items": _PARTITION_META},
    }
)
_NODE = _obj({"id": _INT, "url": _STR, "alive": {"type": "boolean"}})
_PRODUCE_RESULT = _obj(
    {
        "topic": _STR,
        "partition": _INT,
        "base_offset": _INT,
        "log_append_time": _INT,
        "error_code": _STR,
        "message": {"type": ["string", "null"]},
        # carried markers (docs/carried-markers.md; node setting txn_carried_markers): the leader's receipt
        "txn_receipt": {
            "type": "string",
            "description": "URL-safe base64 receipt of a transaction's first batch on the partition (sequence 0)",
        },
    }
)


def openapi_document() -> dict[str, Any]:
    doc = _base_document()
    doc["paths"].update(transaction_and_group_paths())
    doc["paths"].update(security_paths())
    doc["paths"].update(operation_paths())
    doc["paths"].update(topic_admin_paths(_TOPIC))
    doc.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    doc["security"] = [{"basic": []}, {"bearer": []}, {"mtls": []}]
    for path in ("/livez", "/readyz", "/v1/openapi.json"):  # open on every node
        doc["paths"][path]["get"]["security"] = []
    return doc


def _base_document() -> dict[str, Any]:
    def q(name: str, schema: dict[str, Any], required: bool = False, desc: str = "") -> dict[str, Any]:
        return {"name": name, "in": "query", "required": required, "schema": schema, "description": desc}

    def p(name: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "in": "path", "required": True, "schema": schema}

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "txbroker HTTP API",
            "version": VERSION,
            "description": (
                "Raft-replicated broker with Kafka's exactly-once model. Errors are an HTTP status plus "
                "{error_code, message, retriable}; error_code is Kafka's error name. A node that does not "
                "lead a partition answers NOT_LEADER_OR_FOLLOWER (421) with leader_url. Any request may carry "
                "the header X-Txbroker-Timeout-Ms (the caller's timeout in milliseconds): whatever a node "
                "forwards on its behalf is bounded by it (default: the node's request_timeout_ms), counted "
                "from the request's arrival."
            ),
        },
        "paths": {
            "/livez": {"get": {"summary": "200 while the process runs", "responses": _resp("alive", errors=())}},
            "/readyz": {
                "get": {
                    "summary": "200 when serving (controller leader known, every internal group replicated here "
                    "has a ready leader), else 503; ?verbose adds missing_groups",
                    "parameters": [q("verbose", _STR, desc="present: list what is missing (missing_groups)")],
                    "responses": _resp("ready", errors=(503,)),
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus text exposition",
                    "responses": {"200": {"description": "metrics", "content": {"text/plain": {"schema": _STR}}}},
                }
            },
            "/v1/openapi.json": {"get": {"summary": "this document", "responses": _resp("OpenAPI", errors=())}},
            "/v1/cluster": {
                "get": {
                    "summary": "nodes and controller leader",
                    "responses": _resp(
                        "cluster",
                        _obj(
                            {
                                "nodes": {"type": "array", "items": _NODE},
                                "controller_leader": {"type": ["integer", "null"]},
                            }
                        ),
                        errors=(),
                    ),
                }
            },
            "/v1/metadata": {
                "get": {
                    "summary": "nodes and every topic's partitions, leaders and offsets",
                    "parameters": [q("topics", _STR, desc="comma-separated topic names (default: all)")],
                    "responses": _resp(
                        "metadata",
                        _obj(
                            {"nodes": {"type": "array", "items": _NODE}, "topics": {"type": "array", "items": _TOPIC}}
                        ),
                        errors=(),
                    ),
                }
            },
            "/v1/topics": {
                "post": {
                    "summary": "create a topic (any node; forwarded to the controller leader)",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": _obj(
                                    {
                                        "name": _STR,
                                        "partitions": _INT,
                                        "replication_factor": _INT,
                                        "config": {
                                            "type": "object",
                                            "description": "retention.ms, retention.bytes, max.message.bytes, "
                                            "cleanup.policy, "
                                            "producer.id.expiration.ms",
                                        },
                                    },
                                    ["name"],
                                )
                            }
                        },
                    },
                    "responses": {
                        "201": {"description": "created", "content": {"application/json": {"schema": _TOPIC}}},
                        **_resp("", errors=(400, 409, 421)),
                    },
                },
                "get": {"summary": "list topics", "responses": _resp("topics", errors=())},
            },
            "/v1/topics/{topic}": {
                "parameters": [p("topic", _STR)],
                "get": {"summary": "describe a topic", "responses": _resp("topic", _TOPIC, errors=(404,))},
                "delete": {"summary": "delete a topic and its data", "responses": _resp("deleted", errors=(404,))},
            },
            "/v1/topics/{topic}/records": {
                "parameters": [p("topic", _STR)],
                "post": {
                    "summary": "convenience produce (plain writes; key -> murmur2 partition)",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": _obj(
                                    {
                                        "records": {"type": "array", "items": _RECORD_IN},
                                        "format": {"enum": ["base64", "string"]},
                                        "timeout_ms": {
                                            **_INT,
                                            "description": "how long to wait for a leader and the commit "
                                            "(capped by request_timeout_ms; default 30000)",
                                        },
                                    },
                                    ["records"],
                                )
                            }
                        },
                    },
                    "responses": _resp("offsets", errors=(400, 404, 413, 421)),
                },
            },
            "/v1/topics/{topic}/partitions/{partition}/records": {
                "parameters": [p("topic", _STR), p("partition", _INT)],
                "get": {
                    "summary": "fetch records from offset (long-poll with max_wait_ms)",
                    "parameters": [
                        q("offset", _INT, True),
                        q("max_bytes", _INT),
                        q("max_wait_ms", _INT),
                        q("isolation", {"enum": ["read_uncommitted", "read_committed"]}),
                        q(
                            "format",
                            {"enum": ["json", "batches", "binary"]},
                            desc="json: server-filtered records; batches: FetchResponse v4 shape; binary: "
                            "application/x-txbroker-batches for the Python client",
                        ),
                        q(
                            "read_replica",
                            {"enum": ["leader", "any"]},
                            desc="leader (default): only the partition's leader answers, else 421 "
                            "NOT_LEADER_OR_FOLLOWER with leader_url; any: a follower read, any replica answers "
                            "from its own committed copy (served_by, replica_end_offset; binary answers carry "
                            "them as X-Txbroker-Served-By and X-Txbroker-Replica-End-Offset headers)",
                        ),
                    ],
                    "responses": _resp(
                        "records",
                        _obj(
                            {
                                "high_watermark": _INT,
                                "last_stable_offset": _INT,
                                "log_start_offset": _INT,
                                "records": {"type": "array", "items": _RECORD_OUT},
                                "next_offset": _INT,
                                "served_by": {
                                    "type": "integer",
                                    "description": "read_replica=any: the node whose replica answered",
                                },
                                "replica_end_offset": {
                                    "type": "integer",
                                    "description": "read_replica=any: the end of that replica's committed copy; "
                                    "high_watermark (the leader's as last known to that replica) may be above it",
                                },
                            }
                        ),
                        errors=(400, 404, 421),
                    ),
                },
            },
            "/v1/producers/init": {
                "post": {
                    "summary": "InitProducerId: a fresh producer id (epoch 0) from a consensus-allocated block",
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": _obj(
                                    {"transactional_id": {"type": ["string", "null"]}, "transaction_timeout_ms": _INT}
                                )
                            }
                        }
                    },
                    "responses": _resp("producer id", _obj({"producer_id": _INT, "producer_epoch": _INT})),
                }
            },
            "/v1/produce": {
                "post": {
                    "summary": "produce batches (acks=all: answered once committed); idempotent when producer_id >= 0",
                    "description": (
                        "JSON, or the binary form (Content-Type application/x-txbroker-produce, see "
                        "clients/protocol.py: magic 'TXP1', timeout_ms i32, acks i32, transactional id, then per "
                        "partition topic, partition and one CRC-checked record batch)."
                    ),
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": _obj(
                                    {
                                        "acks": {"enum": ["all", 0]},
                                        "timeout_ms": _INT,
                                        "transactional_id": {"type": ["string", "null"]},
                                        "partitions": {
                                            "type": "array",
                                            "items": _obj(
                                                {
                                                    "topic": _STR,
                                                    "partition": _INT,
                                                    "producer_id": _INT,
                                                    "producer_epoch": _INT,
                                                    "base_sequence": _INT,
                                                    "records": {"type": "array", "items": _RECORD_IN},
                                                    "txn_token": {
                                                        "type": "string",
                                                        "description": "carried marker token (URL-safe base64)",
                                                    },
                                                },
                                                ["topic", "partition", "records"],
                                            ),
                                        },
                                    },
                                    ["partitions"],
                                )
                            }
                        },
                    },
                    "responses": _resp(
                        "per-partition results",
                        _obj({"partitions": {"type": "array", "items": _PRODUCE_RESULT}}),
                        errors=(400, 404, 409, 413, 421, 503, 504),
                    ),
                }
            },
        },
        "components": {
            "schemas": {
                "Error": _obj(
                    {
                        "error_code": {"enum": [e.name for e in ErrorCode if e is not ErrorCode.NONE]},
                        "message": _STR,
                        "retriable": {"type": "boolean"},
                        "leader_url": {"type": ["string", "null"]},
                    },
                    ["error_code", "message", "retriable"],
                )
            }
        },
    }
