"""OpenAPI paths of the transaction and consumer-group APIs (merged into ``openapi_document``)."""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_TP = {"type": "object", "properties": {"topic": _STR, "partition": _INT}, "required": ["topic", "partition"]}
_IDENTITY = {"producer_id": _INT, "producer_epoch": _INT}
_OFFSET = {
    "type": "object",
    "properties": {"topic": _STR, "partition": _INT, "offset": _INT, "metadata": _STR},
    "required": ["topic", "partition", "offset"],
}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _STR}


def _op(
    summary: str,
    body: dict[str, Any] | None = None,
    required: tuple[str, ...] = (),
    *,
    params: tuple[str, ...] = (),
    query: tuple[str, ...] = (),
    errors: tuple[int, ...] = (400, 409, 421, 503, 504),
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            "200": {"description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}},
            **{str(s): {"description": "error", "content": {"application/json": {"schema": _ERROR}}} for s in errors},
        },
    }
    parameters = [_path_param(p) for p in params]
    parameters += [{"name": q, "in": "query", "required": False, "schema": _STR} for q in query]
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        schema: dict[str, Any] = {"type": "object", "properties": body}
        if required:
            schema["required"] = list(required)
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    return op


TID = ("transactional_id",)
_END_TXN = (
    "Answers as soon as the decision is durable: `state` is PrepareCommit/PrepareAbort and the COMMIT/ABORT "
    "markers are written in the background, so read_committed readers see the outcome shortly after (poll). The "
    "next transaction may begin at once: the coordinator holds its first write (and AddPartitions, AddOffsets, "
    "InitProducerId) until the markers are written, answering CONCURRENT_TRANSACTIONS (retriable) only if that "
    "takes longer than the request timeout. With `wait_for_completion: true` -- and always when ending a Prepared "
    "transaction -- it answers only after CompleteCommit/CompleteAbort (`state` says so), or after the request "
    "timeout with the decision durable and `state` still PrepareCommit/PrepareAbort."
)
GID = ("group_id",)


def transaction_and_group_paths() -> dict[str, Any]:
    members = {"type": "array", "items": {"type": "object", "properties": {"transactional_id": _STR, **_IDENTITY}}}
    return {
        "/v1/coordinators/transaction/{transactional_id}": {
            "get": _op("the coordinator node of a transactional id", params=TID, errors=(400, 503))
        },
        "/v1/coordinators/group/{group_id}": {
            "get": _op("the coordinator node of a consumer group", params=GID, errors=(400, 503))
        },
        "/v1/transactions": {"get": _op("every transaction of the cluster", query=("state", "prefix"), errors=(400,))},
        "/v1/transactions/{transactional_id}": {"get": _op("describe a transactional id", params=TID)},
        "/v1/transactions/{transactional_id}/partitions": {
            "post": _op(
                "AddPartitionsToTxn (optional: the first transactional produce adds its partition, KIP-890)",
                {**_IDENTITY, "partitions": {"type": "array", "items": _TP}},
                ("producer_id", "producer_epoch", "partitions"),
                params=TID,
            )
        },
        "/v1/transactions/{transactional_id}/offsets": {
            "post": _op(
                "AddOffsetsToTxn: add the group's offsets partition to the transaction",
                {**_IDENTITY, "group_id": _STR},
                ("producer_id", "producer_epoch", "group_id"),
                params=TID,
            )
        },
        "/v1/transactions/{transactional_id}/end": {
            "post": {
                **_op(
                    "EndTxn: commit or abort; answers the identity for the next transaction (epoch bumped)",
                    {
                        **_IDENTITY,
                        "commit": _BOOL,
                        "wait_for_completion": {
                            **_BOOL,
                            "default": False,
                            "description": "answer only after CompleteCommit/CompleteAbort",
                        },
                        "txn_receipts": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {"topic": _STR, "partition": _INT, "receipt": _STR},
                            },
                            "description": "carried markers (docs/carried-markers.md): the produce answers' "
                            "receipts of this transaction; the answer then has `txn_tokens` for the next one",
                        },
                    },
                    ("producer_id", "producer_epoch", "commit"),
                    params=TID,
                ),
                "description": _END_TXN,
            }
        },
        "/v1/transactions/{transactional_id}/release": {
            "post": _op(
                "carried markers: give back the tokens the next transaction will not use (their markers are "
                "written now)",
                {**_IDENTITY, "partitions": {"type": "array", "items": _TP}},
                ("producer_id", "producer_epoch", "partitions"),
                params=TID,
            )
        },
        "/v1/transactions/{transactional_id}/prepare": {
            "post": _op(
                "prepare: durable, completable later by /end from any holder of (id, pid, epoch)",
                {**_IDENTITY, "group_id": _STR},
                ("producer_id", "producer_epoch"),
                params=TID,
            )
        },
        "/v1/transactions/{transactional_id}/abort": {
            "post": _op("admin abort: fence the producer and abort its open transaction", params=TID)
        },
        "/v1/transaction-groups/{group_id}/end": {
            "post": _op(
                "decide a commit group of prepared transactions once (write-once), then carry it out",
                {"commit": _BOOL, "members": members},
                ("commit", "members"),
                params=GID,
            )
        },
        "/v1/transactions-by-prefix/abort": {
            "post": _op(
                "abort every open or prepared transaction whose id has this prefix", {"prefix": _STR}, ("prefix",)
            )
        },
        "/v1/topics/{topic}/partitions/{partition}/producers": {
            "get": _op("DescribeProducers: producer state of a partition", params=("topic", "partition"))
        },
        "/v1/groups": {"get": _op("every consumer group of the cluster", errors=(400,))},
        "/v1/groups/{group_id}": {
            "get": _op(
                "DescribeGroups plus offsets: state, protocol_type, assignment_by (broker: HTTP members; leader: "
                "Kafka clients, whose members also show client_id, client_host and group_instance_id), protocol, "
                "members with assignments, and per partition the committed offset (-1: none), log_end_offset (the "
                "high watermark) and lag (null without a committed offset); an unknown group answers state Dead "
                "with no members, as in Kafka",
                params=GID,
                errors=(400, 421, 503),
            ),
            "delete": _op(
                "DeleteGroups: delete an empty group's metadata and committed offsets; 409 NON_EMPTY_GROUP while "
                "it has members, 409 CONCURRENT_TRANSACTIONS while a transaction's offsets are pending, 404 "
                "GROUP_ID_NOT_FOUND for an unknown group",
                params=GID,
                errors=(400, 404, 409, 421, 503, 504),
            ),
        },
        "/v1/groups/{group_id}/offsets/reset": {
            "post": _op(
                "reset a group's offsets of a topic (kafka-consumer-groups.sh --reset-offsets): to earliest (log "
                "start), latest (high watermark), an offset (clamped to [log start, high watermark]) or a timestamp "
                "(first offset whose record timestamp is >= it, else the high watermark). dry_run (default true) "
                "only computes; dry_run false writes the offsets as one commit. 409 NON_EMPTY_GROUP (nothing "
                "changed) while the group has members; 404 for an unknown topic or partition",
                {
                    "topic": _STR,
                    "partitions": {"type": "array", "items": _INT},
                    "to": {
                        "oneOf": [
                            {"enum": ["earliest", "latest"]},
                            {"type": "object", "properties": {"offset": _INT}, "required": ["offset"]},
                            {"type": "object", "properties": {"timestamp": _INT}, "required": ["timestamp"]},
                        ]
                    },
                    "dry_run": _BOOL,
                },
                ("topic", "to"),
                params=GID,
                errors=(400, 404, 409, 421, 503, 504),
            )
        },
        "/v1/groups/{group_id}/join": {
            "post": _op(
                "join (long-polls until the rebalance completes; the server assigns partitions)",
                {
                    "member_id": _STR,
                    "session_timeout_ms": _INT,
                    "rebalance_timeout_ms": _INT,
                    "topics": {"type": "array", "items": _STR},
                    "protocol": {"enum": ["range", "roundrobin"]},
                },
                ("topics",),
                params=GID,
            )
        },
        "/v1/groups/{group_id}/heartbeat": {
            "post": _op(
                "heartbeat", {"member_id": _STR, "generation_id": _INT}, ("member_id", "generation_id"), params=GID
            )
        },
        "/v1/groups/{group_id}/leave": {
            "post": _op("leave the group", {"member_id": _STR}, ("member_id",), params=GID)
        },
        "/v1/groups/{group_id}/offsets": {
            "post": _op(
                "OffsetCommit, or TxnOffsetCommit when the transaction fields are present",
                {
                    "offsets": {"type": "array", "items": _OFFSET},
                    "generation_id": _INT,
                    "member_id": _STR,
                    "transactional_id": _STR,
                    **_IDENTITY,
                },
                ("offsets",),
                params=GID,
            ),
            "get": _op("OffsetFetch", params=GID, query=("require_stable", "topics", "partitions")),
        },
    }
