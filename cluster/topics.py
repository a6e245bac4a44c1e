"""Topic metadata values, name/config validation and replica placement (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clients.protocol import BrokerError, ErrorCode

MAX_TOPIC_NAME = 249
_LEGAL_NAME = re.compile(r"^[A-Za-z0-9._-]+$")

# Kafka's defaults for the topic configs txbroker honours.
TOPIC_CONFIG_DEFAULTS: dict[str, int | str] = {
    "retention.ms": 604_800_000,
    "retention.bytes": -1,
    "max.message.bytes": 1_048_588,
    "cleanup.policy": "delete",
    "producer.id.expiration.ms": 86_400_000,
}
_INT_CONFIGS = {"retention.ms", "retention.bytes", "max.message.bytes", "producer.id.expiration.ms"}


@dataclass(frozen=True, slots=True)
class PartitionAssignment:
    partition: int
    replicas: tuple[int, ...]  # replicas[0] is the preferred leader


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: int
    partitions: tuple[PartitionAssignment, ...]
    config: Mapping[str, int | str]
    created_ms: int

    def config_int(self, key: str) -> int:
        v = self.config.get(key, TOPIC_CONFIG_DEFAULTS[key])
        return int(v)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic_id": self.topic_id,
            "partitions": [[p.partition, list(p.replicas)] for p in self.partitions],
            "config": dict(self.config),
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TopicMetadata:
        return cls(
            name=str(d["name"]),
            topic_id=int(d["topic_id"]),
            partitions=tuple(PartitionAssignment(int(p), tuple(int(r) for r in reps)) for p, reps in d["partitions"]),
            config=dict(d["config"]),
            created_ms=int(d["created_ms"]),
        )


def validate_topic_name(name: object, *, allow_internal: bool = False) -> str:
    """Kafka's rules: 1-249 chars of [A-Za-z0-9._-], not '.' or '..'."""
    if not isinstance(name, str) or not name:
        raise BrokerError(ErrorCode.INVALID_TOPIC, "topic name must be a non-empty string")
    if len(name) > MAX_TOPIC_NAME:
        raise BrokerError(ErrorCode.INVALID_TOPIC, f"topic name longer than {MAX_TOPIC_NAME}")
    if name in (".", "..") or not _LEGAL_NAME.match(name):
        raise BrokerError(
            ErrorCode.INVALID_TOPIC,
            "topic names use only ASCII letters, digits, '.', '_' and '-', and are not '.' or '..'",
        )
    if name.startswith("__") and not allow_internal:
        raise BrokerError(ErrorCode.INVALID_TOPIC, "names starting with '__' are internal")
    return name


def validate_topic_config(config: object) -> dict[str, int | str]:
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise BrokerError(ErrorCode.INVALID_CONFIG, "config must be an object")
    out: dict[str, int | str] = {}
    for key, value in config.items():
        if key not in TOPIC_CONFIG_DEFAULTS:
            raise BrokerError(ErrorCode.INVALID_CONFIG, f"unknown topic config {key!r}")
        if key in _INT_CONFIGS:
            if isinstance(value, bool):
                raise BrokerError(ErrorCode.INVALID_CONFIG, f"{key} must be an integer")
            try:
                iv = int(value)
            except (TypeError, ValueError, OverflowError) as exc:
                raise BrokerError(ErrorCode.INVALID_CONFIG, f"{key} must be an integer") from exc
            if isinstance(value, float) and value != iv:
                raise BrokerError(ErrorCode.INVALID_CONFIG, f"{key} must be an integer")
            lower = 1024 if key == "max.message.bytes" else -1
            if iv < lower or iv > 2**62:
                raise BrokerError(ErrorCode.INVALID_CONFIG, f"{key} out of range")
            out[key] = iv
        else:
            if value != "delete":
                raise BrokerError(ErrorCode.INVALID_CONFIG, "cleanup.policy supports only 'delete'")
            out[key] = "delete"
    return out


def assign_replicas(
    node_ids: Sequence[int], partitions: int, replication_factor: int, cursor: int
) -> tuple[PartitionAssignment, ...]:
    """Round-robin placement, Kafka-style: partition p's preferred leader is node
    ``(cursor + p) % n`` and its followers are the next ``rf - 1`` nodes, so
    leaders (and replicas) spread evenly and successive topics start on
    different nodes (``cursor`` advances per topic).
    """
    ids = sorted(node_ids)
    n = len(ids)
    if replication_factor < 1 or replication_factor > n:
        raise BrokerError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor must be between 1 and the number of nodes ({n})",
        )
    out = []
    for p in range(partitions):
        first = (cursor + p) % n
        out.append(PartitionAssignment(p, tuple(ids[(first + i) % n] for i in range(replication_factor))))
    return tuple(out)


def group_id_for(topic_id: int, partition: int) -> str:
    """The Raft group id of a data partition: stable across renames, unique across re-creation."""
    return f"t{topic_id}p{partition}"


def storage_prefix_for(topic_id: int, partition: int) -> bytes:
    return b"P" + topic_id.to_bytes(4, "big") + partition.to_bytes(4, "big")


def parse_group_id(group_id: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"t(\d+)p(\d+)", group_id)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2))
