"""Growing a topic and changing its config (pure): Kafka's CreatePartitions and IncrementalAlterConfigs.

What a request may ask is checked here once, without I/O: the new partition
count (only up, at most ``max_partitions_per_topic``), an explicit placement
of the new partitions (Kafka's ``--replica-assignment``: known nodes, no
duplicate in a partition, exactly the topic's replication factor), and a
config change (every value validated like creation; ``None`` deletes the
override, Kafka's DELETE op). New partitions without an explicit placement
continue the topic's round-robin (``cluster.topics.assign_replicas``): the
preferred leader of each new partition is the node after the previous
partition's, so leaders keep spreading evenly.

The controller's state machine applies the two commands with
``apply_add_partitions`` and ``apply_alter_config``: pure transitions from
the topics to (result, topics) whose errors are results (a command checked on
an older view may meet a topic that changed since: it is refused, never
half-applied).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from clients.protocol import BrokerError, ErrorCode

from .topics import TOPIC_CONFIG_DEFAULTS, PartitionAssignment, TopicMetadata, validate_topic_config

__all__ = [
    "ADD_PARTITIONS",
    "ALTER_TOPIC_CONFIG",
    "add_partitions_command",
    "alter_topic_config_command",
    "apply_add_partitions",
    "apply_alter_config",
    "config_changes",
    "config_json",
    "effective_config",
    "new_partitions",
    "replication_factor",
    "validate_partition_count",
]

ADD_PARTITIONS = "add_partitions"
ALTER_TOPIC_CONFIG = "alter_topic_config"


def replication_factor(meta: TopicMetadata) -> int:
    """The topic's replication factor: the replica count of partition 0."""
    return len(meta.partitions[0].replicas) if meta.partitions else 0


def validate_partition_count(count: object, current: int, max_partitions: int) -> int:
    """The requested total: an integer above ``current`` and at most ``max_partitions``; INVALID_PARTITIONS else."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise BrokerError(ErrorCode.INVALID_PARTITIONS, "count must be an integer (the topic's new partition count)")
    if count <= current:
        raise BrokerError(
            ErrorCode.INVALID_PARTITIONS,
            f"the topic has {current} partitions; the count can only increase (asked {count})",
        )
    if count > max_partitions:
        raise BrokerError(ErrorCode.INVALID_PARTITIONS, f"count must be at most {max_partitions}")
    return count


def _validate_assignments(assignments: object, added: int, rf: int, node_ids: Sequence[int]) -> list[tuple[int, ...]]:
    if not isinstance(assignments, list) or len(assignments) != added:
        raise BrokerError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"assignments must list the replicas of each of the {added} new partitions",
        )
    known = set(node_ids)
    out = []
    for i, reps in enumerate(assignments):
        if not isinstance(reps, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in reps):
            raise BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"assignment {i} must be a list of node ids")
        if len(reps) != rf:
            raise BrokerError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"assignment {i} names {len(reps)} replicas; the topic's replication factor is {rf}",
            )
        if len(set(reps)) != len(reps):
            raise BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"assignment {i} names a node twice: {reps}")
        unknown = sorted(set(reps) - known)
        if unknown:
            raise BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"assignment {i} names unknown nodes {unknown}")
        out.append(tuple(reps))
    return out


def new_partitions(
    meta: TopicMetadata, count: int, node_ids: Sequence[int], assignments: object = None
) -> tuple[PartitionAssignment, ...]:
    """The placement of partitions ``len(meta.partitions)`` .. ``count - 1``: ``assignments`` (validated) when
    given, else round-robin over ``node_ids`` continuing from the topic's last partition, with its replication
    factor (INVALID_REPLICATION_FACTOR when fewer nodes remain)."""
    current = len(meta.partitions)
    rf = replication_factor(meta)
    added = count - current
    if assignments is not None:
        placed = _validate_assignments(assignments, added, rf, node_ids)
        return tuple(PartitionAssignment(current + i, reps) for i, reps in enumerate(placed))
    ids = sorted(node_ids)
    n = len(ids)
    if rf < 1 or rf > n:
        raise BrokerError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"the topic's replication factor {rf} exceeds the {n} nodes that can hold replicas",
        )
    last_leader = meta.partitions[-1].replicas[0] if meta.partitions else None
    start = ids.index(last_leader) + 1 if last_leader in ids else current
    out = []
    for k in range(added):
        first = (start + k) % n
        out.append(PartitionAssignment(current + k, tuple(ids[(first + i) % n] for i in range(rf))))
    return tuple(out)


def config_changes(body: object) -> tuple[dict[str, int | str], tuple[str, ...]]:
    """A config change (``{key: value | None}``) as (overrides to set, validated; keys to delete).

    Every key must be a topic config (INVALID_CONFIG otherwise, also for a deletion); an empty change is
    INVALID_REQUEST."""
    if not isinstance(body, dict):
        raise BrokerError(ErrorCode.INVALID_CONFIG, "the config change must be an object of key: value (null deletes)")
    if not body:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "no config change given")
    deletes = sorted(k for k, v in body.items() if v is None)
    for key in deletes:
        if key not in TOPIC_CONFIG_DEFAULTS:
            raise BrokerError(ErrorCode.INVALID_CONFIG, f"unknown topic config {key!r}")
    sets = validate_topic_config({k: v for k, v in body.items() if v is not None})
    return sets, tuple(deletes)


def effective_config(overrides: Mapping[str, int | str]) -> dict[str, int | str]:
    """Every topic config key with its value: the override if there is one, else the default."""
    return {key: overrides.get(key, default) for key, default in sorted(TOPIC_CONFIG_DEFAULTS.items())}


def config_json(meta: TopicMetadata) -> dict[str, Any]:
    """``GET /v1/topics/{topic}/config``: ``{"topic", "config": every key's value, "overrides": what was set}``."""
    return {"topic": meta.name, "config": effective_config(meta.config), "overrides": dict(sorted(meta.config.items()))}


# ---- controller commands and their transitions ------------------------------------------------------


def add_partitions_command(meta: TopicMetadata, added: Sequence[PartitionAssignment]) -> bytes:
    return json.dumps(
        {
            "op": ADD_PARTITIONS,
            "name": meta.name,
            "topic_id": meta.topic_id,
            "partitions": [[a.partition, list(a.replicas)] for a in added],
        }
    ).encode()


def alter_topic_config_command(meta: TopicMetadata, sets: Mapping[str, int | str], deletes: Sequence[str]) -> bytes:
    return json.dumps(
        {"op": ALTER_TOPIC_CONFIG, "name": meta.name, "topic_id": meta.topic_id, "set": dict(sets),
         "delete": list(deletes)}
    ).encode()  # fmt: skip


def _topic(topics: Mapping[str, TopicMetadata], cmd: Mapping[str, Any]) -> TopicMetadata | BrokerError:
    name = str(cmd["name"])
    meta = topics.get(name)
    if meta is None or meta.topic_id != int(cmd["topic_id"]):  # deleted (and maybe re-created) since
        return BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
    return meta


def apply_add_partitions(
    topics: Mapping[str, TopicMetadata], cmd: Mapping[str, Any]
) -> tuple[TopicMetadata | BrokerError, Mapping[str, TopicMetadata]]:
    """Append the command's partitions to the topic: (its new metadata, topics), or (error, topics unchanged)."""
    meta = _topic(topics, cmd)
    if isinstance(meta, BrokerError):
        return meta, topics
    added = tuple(PartitionAssignment(int(p), tuple(int(r) for r in reps)) for p, reps in cmd["partitions"])
    current = len(meta.partitions)
    if not added or [a.partition for a in added] != list(range(current, current + len(added))):
        return BrokerError(
            ErrorCode.INVALID_PARTITIONS, f"topic {meta.name!r} has {current} partitions now; nothing added"
        ), topics
    rf = replication_factor(meta)
    if any(len(a.replicas) != rf or len(set(a.replicas)) != rf for a in added):
        return BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"new partitions need {rf} distinct replicas"), topics
    grown = replace(meta, partitions=meta.partitions + added)
    return grown, {**topics, meta.name: grown}


def apply_alter_config(
    topics: Mapping[str, TopicMetadata], cmd: Mapping[str, Any]
) -> tuple[TopicMetadata | BrokerError, Mapping[str, TopicMetadata]]:
    """Set and delete the command's overrides: (the topic's new metadata, topics), or (error, topics unchanged)."""
    meta = _topic(topics, cmd)
    if isinstance(meta, BrokerError):
        return meta, topics
    try:
        sets = validate_topic_config(cmd.get("set") or {})
    except BrokerError as exc:
        return exc, topics
    deletes = [str(k) for k in cmd.get("delete") or ()]
    config = {k: v for k, v in meta.config.items() if k not in deletes}
    config.update(sets)
    altered = replace(meta, config=config)
    return altered, {**topics, meta.name: altered}
