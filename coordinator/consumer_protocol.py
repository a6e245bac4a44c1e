"""Kafka's consumer embedded protocol: the bytes a ``"consumer"`` group's members exchange. Pure.

A Kafka consumer group is generic on the coordinator: JoinGroup carries each
member's protocols as ``(name, metadata bytes)`` and SyncGroup the leader's
assignments as bytes; only the clients read them. For the ``"consumer"``
protocol type those bytes are Kafka's ``ConsumerProtocolSubscription`` and
``ConsumerProtocolAssignment`` (big-endian, versions 0-3 share the prefix read
here):

* subscription: ``int16 version, [string topic], bytes user_data, ...``
* assignment: ``int16 version, [string topic, [int32 partition]], bytes user_data``

The coordinator decodes them only to show a group (subscribed topics and
assignments in describe, lag per assigned partition); a member's bytes that do
not decode are shown as no topics. It encodes them for the groups whose
assignment it computes (HTTP members), so Kafka's DescribeGroups shows those
groups as any consumer group.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from coordinator.metadata import TopicPartition

__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "ConsumerProtocolError",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
]

CONSUMER_PROTOCOL_TYPE = "consumer"
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class ConsumerProtocolError(ValueError):
    """Bytes that are not a consumer protocol subscription or assignment."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ConsumerProtocolError("truncated consumer protocol bytes")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return int(_I16.unpack(self.take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self.take(4))[0])

    def string(self) -> str:
        n = self.i16()
        try:
            return self.take(n).decode()
        except UnicodeDecodeError as exc:
            raise ConsumerProtocolError("a topic name is not UTF-8") from exc

    def count(self) -> int:
        n = self.i32()
        if n < 0 or n > len(self.data):
            raise ConsumerProtocolError(f"array length {n} does not fit the bytes")
        return n


def _string(s: str) -> bytes:
    raw = s.encode()
    return _I16.pack(len(raw)) + raw


def encode_subscription(topics: Iterable[str]) -> bytes:
    names = sorted(set(topics))
    return b"".join([_I16.pack(0), _I32.pack(len(names)), *map(_string, names), _I32.pack(-1)])


def decode_subscription(data: bytes) -> tuple[str, ...]:
    """The subscribed topics (sorted); raises ``ConsumerProtocolError``."""
    r = _Reader(data)
    if r.i16() < 0:
        raise ConsumerProtocolError("negative subscription version")
    return tuple(sorted({r.string() for _ in range(r.count())}))


def encode_assignment(partitions: Iterable[TopicPartition]) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    parts = [_I16.pack(0), _I32.pack(len(by_topic))]
    for topic in sorted(by_topic):
        ps = sorted(by_topic[topic])
        parts += [_string(topic), _I32.pack(len(ps)), *(_I32.pack(p) for p in ps)]
    parts.append(_I32.pack(-1))
    return b"".join(parts)


def decode_assignment(data: bytes) -> tuple[TopicPartition, ...]:
    """The assigned partitions (sorted); empty bytes are no assignment; raises ``ConsumerProtocolError``."""
    if not data:
        return ()
    r = _Reader(data)
    if r.i16() < 0:
        raise ConsumerProtocolError("negative assignment version")
    out = set()
    for _ in range(r.count()):
        topic = r.string()
        for _ in range(r.count()):
            out.add(TopicPartition(topic, r.i32()))
    return tuple(sorted(out))
