"""The values a ``__consumer_offsets-p`` partition replicates, and their byte formats.

Terms:

* **group metadata**: what a completed rebalance decided (Kafka's
  ``GroupMetadataValue``): the generation id, the assignment protocol, the
  leader and every member with its subscription, timeouts and assignment. It
  is written once per rebalance; heartbeats and session timers are not
  replicated (a new coordinator restarts them).
* **committed offset**: the position a group will resume a partition from,
  with the client's metadata string and the commit time. ``applied_index`` is
  the Raft index of the commit that wrote it, so a plain commit and a
  transactional one for the same partition are ordered by when they reached
  the log, as Kafka orders them by log offset.
* **pending offsets**: offsets of a TxnOffsetCommit, per (group, producer id),
  invisible until the COMMIT marker of that producer's transaction reaches this
  partition (then they become committed offsets) or its ABORT marker drops them.
* **producer fence**: per producer id, the newest producer epoch and
  transaction-coordinator epoch seen in its markers and commits here, and the
  epoch of its open (pending) transaction -- the marker rules of
  ``storage.producer_state`` applied to this partition.

Values are immutable; each encodes to a checksummed, versioned JSON record
(``coordinator.codec``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from coordinator.codec import decode_record, encode_record, get_bool, get_int, get_opt_int, get_opt_str, get_str
from coordinator.errors import CommandDecodeError, CoordinatorCorruptionError
from coordinator.metadata import TopicPartition

__all__ = [
    "NO_GENERATION",
    "OFFSETS_TOPIC",
    "CommittedOffset",
    "GroupMetadata",
    "MemberMetadata",
    "PendingOffsets",
    "ProducerFence",
    "b64",
    "counts_from_json",
    "decode_committed",
    "decode_group",
    "decode_pending",
    "decode_producer",
    "encode_committed",
    "encode_group",
    "encode_pending",
    "encode_producer",
    "from_b64",
    "member_from_json",
    "member_json",
    "named_bytes_from_json",
    "named_bytes_json",
    "tps_from_json",
    "tps_json",
]

#: The internal topic whose partitions hold group state; markers for it reach the group coordinator.
OFFSETS_TOPIC = "__consumer_offsets"
#: ``generation_id`` of a commit that does not come from a group member (Kafka's ``UNKNOWN_GENERATION_ID``).
NO_GENERATION = -1
_VERSION = 1
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    """One member of a generation.

    ``topics``/``assignment``: its subscription and its partitions (for a group whose members assign
    on the client, what the consumer protocol bytes decode to; shown, never enforced). A member of a
    Kafka group also has ``protocols`` (each protocol name it supports with its opaque metadata, in
    its order of preference), ``assignment_data`` (the opaque assignment its leader sent), and what
    Kafka's DescribeGroups shows: ``group_instance_id``, ``client_id``, ``client_host``.
    """

    member_id: str
    topics: tuple[str, ...]
    protocol: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    assignment: tuple[TopicPartition, ...] = ()
    protocols: tuple[tuple[str, bytes], ...] = ()
    assignment_data: bytes = b""
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""

    def metadata_for(self, protocol: str | None) -> bytes:
        """The metadata this member sent for ``protocol`` (empty if it did not name it)."""
        return next((data for name, data in self.protocols if name == protocol), b"")


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """The last completed rebalance of a group. ``topic_partitions``: each subscribed topic's partition
    count when the assignment was computed (a change triggers a new rebalance).

    ``protocol_type``: None for a group whose assignment the coordinator computes (HTTP members);
    the Kafka protocol type (``"consumer"``) for a group whose leader member assigns. Such a
    generation is stored twice: when its members are known (``awaiting_sync``: the leader's
    assignment is still to come) and when the leader's SyncGroup brings the assignment.
    """

    group_id: str
    generation_id: int
    protocol: str | None
    leader_id: str | None
    members: tuple[MemberMetadata, ...]
    topic_partitions: tuple[tuple[str, int], ...]
    updated_ms: int
    protocol_type: str | None = None
    awaiting_sync: bool = False

    @property
    def client_assigned(self) -> bool:
        return self.protocol_type is not None

    def member(self, member_id: str) -> MemberMetadata | None:
        for m in self.members:
            if m.member_id == member_id:
                return m
        return None

    @property
    def member_ids(self) -> frozenset[str]:
        return frozenset(m.member_id for m in self.members)


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    group_id: str
    topic: str
    partition: int
    offset: int
    metadata: str
    commit_timestamp_ms: int
    applied_index: int
    #: Kafka's committed leader epoch (-1: none)
    leader_epoch: int = -1

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class PendingOffsets:
    """Offsets one producer's open transaction committed for one group (TxnOffsetCommit, KIP-447)."""

    group_id: str
    producer_id: int
    producer_epoch: int
    transactional_id: str
    offsets: Mapping[TopicPartition, CommittedOffset] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProducerFence:
    """``open_epoch``: the epoch of the producer's pending offsets here (None when it has none)."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    open_epoch: int | None
    last_update_ms: int


# ---- JSON shapes shared with commands -----------------------------------------------------------


def tps_json(tps: tuple[TopicPartition, ...]) -> list[list[Any]]:
    return [[tp.topic, tp.partition] for tp in tps]


def tps_from_json(raw: Any, what: str) -> tuple[TopicPartition, ...]:
    if not isinstance(raw, list):
        raise CommandDecodeError(f"{what} must be a list")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2):
            raise CommandDecodeError(f"{what}: each partition is [topic, partition]")
        out.append(TopicPartition(get_str({"t": item[0]}, "t"), get_int({"p": item[1]}, "p")))
    return tuple(out)


def _str_list(raw: Any, what: str) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise CommandDecodeError(f"{what} must be a list")
    return tuple(get_str({"s": s}, "s") for s in raw)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def from_b64(raw: Any, what: str) -> bytes:
    if not isinstance(raw, str):
        raise CommandDecodeError(f"{what} must be a base64 string")
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CommandDecodeError(f"{what} is not base64") from exc


def named_bytes_json(items: tuple[tuple[str, bytes], ...]) -> list[list[str]]:
    return [[name, b64(data)] for name, data in items]


def named_bytes_from_json(raw: Any, what: str) -> tuple[tuple[str, bytes], ...]:
    if not isinstance(raw, list):
        raise CommandDecodeError(f"{what} must be a list")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2):
            raise CommandDecodeError(f"{what}: each entry is [name, base64 bytes]")
        out.append((get_str({"n": item[0]}, "n"), from_b64(item[1], what)))
    return tuple(out)


def member_json(m: MemberMetadata) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": m.member_id,
        "topics": list(m.topics),
        "protocol": m.protocol,
        "session": m.session_timeout_ms,
        "rebalance": m.rebalance_timeout_ms,
        "assignment": tps_json(m.assignment),
    }
    if m.protocols:  # a Kafka member (client-side assignment)
        d |= {
            "protocols": named_bytes_json(m.protocols),
            "assignment_data": b64(m.assignment_data),
            "instance": m.group_instance_id,
            "client_id": m.client_id,
            "client_host": m.client_host,
        }
    return d


def member_from_json(d: Any) -> MemberMetadata:
    if not isinstance(d, dict):
        raise CommandDecodeError("a member is an object")
    kafka = "protocols" in d
    return MemberMetadata(
        member_id=get_str(d, "id"),
        topics=_str_list(d.get("topics"), "topics"),
        protocol=get_str(d, "protocol"),
        session_timeout_ms=get_int(d, "session"),
        rebalance_timeout_ms=get_int(d, "rebalance"),
        assignment=tps_from_json(d.get("assignment"), "assignment"),
        protocols=named_bytes_from_json(d["protocols"], "protocols") if kafka else (),
        assignment_data=from_b64(d.get("assignment_data"), "assignment_data") if kafka else b"",
        group_instance_id=get_opt_str(d, "instance") if kafka else None,
        client_id=get_str(d, "client_id") if kafka else "",
        client_host=get_str(d, "client_host") if kafka else "",
    )


def counts_from_json(raw: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(raw, list):
        raise CommandDecodeError("topic_partitions must be a list")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2):
            raise CommandDecodeError("topic_partitions: each entry is [topic, count]")
        out.append((get_str({"t": item[0]}, "t"), get_int({"n": item[1]}, "n")))
    return tuple(out)


def _decoded(where: str, what: str, build: Callable[[dict[str, Any]], _T], raw: bytes) -> _T:
    d = decode_record(raw, version=_VERSION, where=where)
    try:
        return build(d)
    except (CommandDecodeError, ValueError, TypeError) as exc:
        raise CoordinatorCorruptionError(f"{where}: malformed {what}: {exc}") from exc


# ---- records ---------------------------------------------------------------------------------------


def encode_group(g: GroupMetadata) -> bytes:
    return encode_record(
        {
            "group": g.group_id,
            "generation": g.generation_id,
            "protocol": g.protocol,
            "leader": g.leader_id,
            "members": [member_json(m) for m in g.members],
            "topic_partitions": [[t, n] for t, n in g.topic_partitions],
            "updated": g.updated_ms,
        }
        | ({"protocol_type": g.protocol_type, "awaiting_sync": g.awaiting_sync} if g.client_assigned else {}),
        _VERSION,
    )


def decode_group(raw: bytes, *, where: str) -> GroupMetadata:
    def build(d: dict[str, Any]) -> GroupMetadata:
        members = d.get("members")
        if not isinstance(members, list):
            raise CommandDecodeError("members must be a list")
        return GroupMetadata(
            group_id=get_str(d, "group"),
            generation_id=get_int(d, "generation"),
            protocol=get_opt_str(d, "protocol"),
            leader_id=get_opt_str(d, "leader"),
            members=tuple(member_from_json(m) for m in members),
            topic_partitions=counts_from_json(d.get("topic_partitions")),
            updated_ms=get_int(d, "updated"),
            protocol_type=get_opt_str(d, "protocol_type"),
            awaiting_sync=get_bool(d, "awaiting_sync") if d.get("protocol_type") is not None else False,
        )

    return _decoded(where, "group metadata", build, raw)


def _committed_body(c: CommittedOffset) -> dict[str, Any]:
    body = {
        "offset": c.offset,
        "metadata": c.metadata,
        "ts": c.commit_timestamp_ms,
        "index": c.applied_index,
    }
    if c.leader_epoch != -1:
        body["epoch"] = c.leader_epoch
    return body


def _committed_from(d: Any, group_id: str, topic: str, partition: int) -> CommittedOffset:
    if not isinstance(d, dict):
        raise CommandDecodeError("an offset is an object")
    return CommittedOffset(
        group_id=group_id,
        topic=topic,
        partition=partition,
        offset=get_int(d, "offset"),
        metadata=get_str(d, "metadata"),
        commit_timestamp_ms=get_int(d, "ts"),
        applied_index=get_int(d, "index"),
        leader_epoch=get_int(d, "epoch") if "epoch" in d else -1,
    )


def encode_committed(c: CommittedOffset) -> bytes:
    return encode_record(
        {"group": c.group_id, "topic": c.topic, "partition": c.partition, **_committed_body(c)}, _VERSION
    )


def decode_committed(raw: bytes, *, where: str) -> CommittedOffset:
    def build(d: dict[str, Any]) -> CommittedOffset:
        return _committed_from(d, get_str(d, "group"), get_str(d, "topic"), get_int(d, "partition"))

    return _decoded(where, "committed offset", build, raw)


def encode_pending(p: PendingOffsets) -> bytes:
    return encode_record(
        {
            "group": p.group_id,
            "pid": p.producer_id,
            "epoch": p.producer_epoch,
            "tid": p.transactional_id,
            "offsets": [[tp.topic, tp.partition, _committed_body(c)] for tp, c in sorted(p.offsets.items())],
        },
        _VERSION,
    )


def decode_pending(raw: bytes, *, where: str) -> PendingOffsets:
    def build(d: dict[str, Any]) -> PendingOffsets:
        group = get_str(d, "group")
        items = d.get("offsets")
        if not isinstance(items, list):
            raise CommandDecodeError("offsets must be a list")
        offsets: dict[TopicPartition, CommittedOffset] = {}
        for item in items:
            if not (isinstance(item, list) and len(item) == 3):
                raise CommandDecodeError("offsets: each entry is [topic, partition, offset]")
            topic, partition = get_str({"t": item[0]}, "t"), get_int({"p": item[1]}, "p")
            offsets[TopicPartition(topic, partition)] = _committed_from(item[2], group, topic, partition)
        return PendingOffsets(group, get_int(d, "pid"), get_int(d, "epoch"), get_str(d, "tid"), offsets)

    return _decoded(where, "pending offsets", build, raw)


def encode_producer(f: ProducerFence) -> bytes:
    return encode_record(
        {
            "pid": f.producer_id,
            "epoch": f.producer_epoch,
            "cepoch": f.coordinator_epoch,
            "open": f.open_epoch,
            "updated": f.last_update_ms,
        },
        _VERSION,
    )


def decode_producer(raw: bytes, *, where: str) -> ProducerFence:
    def build(d: dict[str, Any]) -> ProducerFence:
        return ProducerFence(
            get_int(d, "pid"), get_int(d, "epoch"), get_int(d, "cepoch"), get_opt_int(d, "open"), get_int(d, "updated")
        )

    return _decoded(where, "producer fence", build, raw)
