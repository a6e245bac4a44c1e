"""OpenAPI paths of operating a cluster: nodes, partition moves, decommission (merged into ``openapi_document``)."""

from __future__ import annotations

from typing import Any

from .openapi_txn import _op

_INT = {"type": "integer"}
_STR = {"type": "string"}
_IDS = {"type": "array", "items": _INT}
_ERRORS = (400, 401, 403, 404, 409, 421, 503, 504)


def operation_paths() -> dict[str, Any]:
    return {
        "/v1/nodes": {
            "get": _op("every registered node: {nodes: [{id, url, host, raft_port, kafka, alive, state, "
                       "controller_voter, replicas, moving}]}; DESCRIBE on CLUSTER", errors=_ERRORS),
            "post": _op("register a node (txbroker cluster add-node): 201 with the node's id, host, ports, url; "
                        "node_id defaults to the next free id; kafka_port (optional) is its Kafka listener, "
                        "different from its other ports; ALTER on CLUSTER",
                        {"node_id": _INT, "host": _STR, "http_port": _INT, "raft_port": _INT, "kafka_port": _INT},
                        ("host", "http_port", "raft_port"), errors=_ERRORS),
        },
        "/v1/nodes/{node_id}": {
            "get": _op("one node, with state active|decommissioning|decommissioned; DESCRIBE on CLUSTER",
                       params=("node_id",), errors=_ERRORS),
        },
        "/v1/nodes/{node_id}/decommission": {
            "post": _op("move every replica off the node (data, transaction-state and offsets partitions, its "
                        "controller vote), then mark it decommissioned; 202 with the moves; refused (400 "
                        "INVALID_REPLICATION_FACTOR) when the other active nodes cannot hold the replicas; "
                        "ALTER on CLUSTER", params=("node_id",), errors=_ERRORS),
        },
        "/v1/topics/{topic}/partitions/{partition}/reassign": {
            "post": _op("move the partition's Raft group to `replicas` by membership changes while it serves; 202 "
                        "with the move; `topic` may be __transaction_state or __consumer_offsets; ALTER on CLUSTER",
                        {"replicas": _IDS}, ("replicas",), params=("topic", "partition"), errors=_ERRORS),
            "delete": _op("cancel an unfinished move: the group goes back to its replicas before the move; "
                          "409 NO_REASSIGNMENT_IN_PROGRESS when nothing moves; ALTER on CLUSTER",
                          params=("topic", "partition"), errors=_ERRORS),
        },
        "/v1/reassignments": {
            "get": _op("every move: {reassignments: [{topic, partition, group_id, replicas, target_replicas, "
                       "adding_replicas, removing_replicas, state, started_ms, leader, voters, roles "
                       "(voter|learner|pending per target node), entries_behind (Raft entries), high_watermark, "
                       "offsets_behind (data partitions)}]}; "
                       "DESCRIBE on CLUSTER", errors=_ERRORS),
        },
    }  # fmt: skip
