"""What the clients hand back to users: ``RecordMetadata`` (producer) and ``ConsumerRecord`` (consumer).

Field names follow kafka-python so code written against it reads the same
values here. Both are immutable: a future's result or a polled record is a
value, not a handle into client state. ``RecordMetadata`` is a named tuple, as
in kafka-python (and cheap to create: the producer makes one per record).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "Headers",
    "OffsetAndMetadata",
    "PreparedTransaction",
    "RecordMetadata",
    "TopicPartition",
]

Headers = tuple[tuple[str, bytes | None], ...]
"""Record headers as stored: ordered ``(key, value)`` pairs; keys may repeat, values may be None."""

TopicPartition = tuple[str, int]
"""``(topic, partition)``: the key used everywhere a partition is named (``("in", 0)`` in API.md)."""


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed (kafka-python's ``RecordMetadata``).

    ``timestamp`` is the record's create time in ms (what the producer put in
    the batch); ``log_append_time`` is the leader's append time in ms, -1 when
    the broker did not report one. The ``serialized_*_size`` fields are -1 for
    a null key/value, as in Kafka.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int = -1
    log_append_time: int = -1
    serialized_key_size: int = -1
    serialized_value_size: int = -1
    serialized_header_size: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """One record as a consumer returns it (kafka-python's ``ConsumerRecord``).

    ``timestamp_type`` is Kafka's: 0 = CreateTime (the producer's timestamp),
    1 = LogAppendTime.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int
    timestamp_type: int = 0

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed position: the offset of the NEXT record to consume, plus free-form metadata."""

    offset: int
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """A consumer's group identity (kafka-python/Kafka ``ConsumerGroupMetadata``).

    ``Producer.send_offsets_to_transaction`` sends it with a transactional offset
    commit so the group coordinator can fence a zombie member whose generation
    is stale (KIP-447). ``generation_id`` -1 / empty ``member_id``: no membership.
    """

    group_id: str
    generation_id: int = -1
    member_id: str = ""


@dataclass(frozen=True, slots=True)
class PreparedTransaction:
    """A flushed, prepared transaction: any caller holding this identity may commit or abort it later."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
