"""Commands a ``__consumer_offsets-p`` Raft group replicates, and their byte encoding.

Like ``coordinator.commands``: compact JSON ``{"op": <name>, ...}`` (never
pickle; first byte ``{``, never the NOOP barrier), built by the leader with
everything that depends on it inside -- its clock (``now_ms``) and its Raft
term (``coordinator_epoch``: the state machine answers ``NOT_COORDINATOR`` to
a command from an older term, so a deposed leader's late command changes
nothing). ``apply`` decides everything else from the replicated state.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from coordinator.codec import get_bool, get_int, get_opt_str, get_str, json_bytes
from coordinator.errors import CommandDecodeError
from coordinator.group_metadata import (
    NO_GENERATION,
    MemberMetadata,
    counts_from_json,
    member_from_json,
    member_json,
    named_bytes_from_json,
    named_bytes_json,
)

__all__ = [
    "DEFAULT_PRODUCER_EXPIRATION_MS",
    "CommitOffsets",
    "DeleteGroup",
    "DeleteOffsets",
    "ExpireProducers",
    "GroupsCommand",
    "OffsetCommit",
    "StoreAssignment",
    "StoreGroup",
    "TxnCommitOffsets",
    "WriteTxnMarker",
    "decode_group_command",
    "encode_group_command",
]

#: Producer fences without pending offsets are forgotten after this idle time (Kafka's
#: ``producer.id.expiration.ms``); a commit delayed longer than that could no longer be fenced.
DEFAULT_PRODUCER_EXPIRATION_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    topic: str
    partition: int
    offset: int
    metadata: str = ""
    #: Kafka's committed leader epoch: the leader epoch of the record before ``offset`` as the consumer saw it
    #: (-1: none; kept and answered back, never checked here)
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class _Stamped:
    now_ms: int
    coordinator_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitOffsets(_Stamped):
    """OffsetCommit. ``generation_id``/``member_id``: the committer's group identity (-1/"" for none)."""

    OP: ClassVar[str] = "commit_offsets"
    group_id: str
    offsets: tuple[OffsetCommit, ...]
    generation_id: int = NO_GENERATION
    member_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnCommitOffsets(_Stamped):
    """TxnOffsetCommit: offsets pending for (group, producer id) until the transaction's marker (KIP-447 fenced)."""

    OP: ClassVar[str] = "txn_commit_offsets"
    group_id: str
    transactional_id: str
    producer_id: int
    producer_epoch: int
    offsets: tuple[OffsetCommit, ...]
    generation_id: int = NO_GENERATION
    member_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteTxnMarker(_Stamped):
    """A COMMIT/ABORT marker of a producer's transaction reached this offsets partition.

    ``txn_coordinator_epoch`` is the marker's own coordinator epoch (the
    transaction coordinator's term), fenced per producer like a data partition does.
    ``classic``: the marker of a classic-protocol transaction (no epoch bump at EndTxn).
    """

    OP: ClassVar[str] = "write_txn_marker"
    producer_id: int
    producer_epoch: int
    txn_coordinator_epoch: int
    commit: bool
    classic: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreGroup(_Stamped):
    """A rebalance completed: record its members and assignment; apply assigns generation = previous + 1."""

    OP: ClassVar[str] = "store_group"
    group_id: str
    protocol: str | None
    leader_id: str | None
    members: tuple[MemberMetadata, ...]
    topic_partitions: tuple[tuple[str, int], ...]
    #: None: the coordinator computed the assignment; else the Kafka protocol type of a group whose
    #: leader member assigns (stored ``awaiting_sync`` until ``StoreAssignment``)
    protocol_type: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreAssignment(_Stamped):
    """SyncGroup: the leader's assignment of generation ``generation_id`` (opaque bytes per member).

    Apply checks the stored generation is that one and still awaits its assignment; members the
    leader left out get an empty assignment, as Kafka does.
    """

    OP: ClassVar[str] = "store_assignment"
    group_id: str
    generation_id: int
    assignments: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireProducers(_Stamped):
    """Forget producer fences idle for ``expiration_ms`` that have no pending offsets."""

    OP: ClassVar[str] = "expire_producers"
    expiration_ms: int = DEFAULT_PRODUCER_EXPIRATION_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteGroup(_Stamped):
    """DeleteGroups: remove an empty group's metadata and committed offsets (tombstones; ``group_rules``)."""

    OP: ClassVar[str] = "delete_group"
    group_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteOffsets(_Stamped):
    """OffsetDelete: remove a group's committed offsets of ``partitions`` ([topic, partition]) except those
    of topics its members subscribe to (``group_rules.delete_offsets``)."""

    OP: ClassVar[str] = "delete_offsets"
    group_id: str
    partitions: tuple[tuple[str, int], ...]


GroupsCommand = (
    CommitOffsets
    | TxnCommitOffsets
    | WriteTxnMarker
    | StoreGroup
    | StoreAssignment
    | ExpireProducers
    | DeleteGroup
    | DeleteOffsets
)

_COMMANDS: Mapping[str, type[GroupsCommand]] = {
    cls.OP: cls
    for cls in (
        CommitOffsets, TxnCommitOffsets, WriteTxnMarker, StoreGroup, StoreAssignment, ExpireProducers, DeleteGroup,
        DeleteOffsets,
    )
}  # fmt: skip


def _list(d: Mapping[str, Any], key: str) -> list[Any]:
    v = d.get(key)
    if not isinstance(v, list):
        raise CommandDecodeError(f"field {key!r} must be a list")
    return v


def _offset_row(o: OffsetCommit) -> list[Any]:
    """[topic, partition, offset, metadata], and the leader epoch after them when there is one."""
    row: list[Any] = [o.topic, o.partition, o.offset, o.metadata]
    return row if o.leader_epoch == -1 else [*row, o.leader_epoch]


def _offsets(d: Mapping[str, Any], key: str) -> tuple[OffsetCommit, ...]:
    out = []
    for item in _list(d, key):
        if not (isinstance(item, list) and len(item) in (4, 5)):
            raise CommandDecodeError(f"{key}: each offset is [topic, partition, offset, metadata, leader epoch?]")
        o = {"t": item[0], "p": item[1], "o": item[2], "m": item[3], "e": item[4] if len(item) == 5 else -1}
        out.append(OffsetCommit(get_str(o, "t"), get_int(o, "p"), get_int(o, "o"), get_str(o, "m"), get_int(o, "e")))
    return tuple(out)


def _members(d: Mapping[str, Any], key: str) -> tuple[MemberMetadata, ...]:
    return tuple(member_from_json(m) for m in _list(d, key))


def _counts(d: Mapping[str, Any], key: str) -> tuple[tuple[str, int], ...]:
    return counts_from_json(d.get(key))


# (encode, decode) by the field's annotation text (``from __future__ import annotations`` keeps it a string).
_CODECS: Mapping[str, tuple[Callable[[Any], Any], Callable[[Mapping[str, Any], str], Any]]] = {
    "int": (lambda v: v, get_int),
    "str": (lambda v: v, get_str),
    "str | None": (lambda v: v, get_opt_str),
    "bool": (lambda v: v, get_bool),
    "tuple[OffsetCommit, ...]": (lambda v: [_offset_row(o) for o in v], _offsets),
    "tuple[MemberMetadata, ...]": (lambda v: [member_json(m) for m in v], _members),
    "tuple[tuple[str, int], ...]": (lambda v: [[t, n] for t, n in v], _counts),
    "tuple[tuple[str, bytes], ...]": (named_bytes_json, lambda d, key: named_bytes_from_json(d.get(key), key)),
}


def encode_group_command(cmd: GroupsCommand) -> bytes:
    body: dict[str, Any] = {"op": cmd.OP}
    for f in dataclasses.fields(cmd):
        body[f.name] = _CODECS[str(f.type)][0](getattr(cmd, f.name))
    return json_bytes(body)


def decode_group_command(raw: bytes) -> GroupsCommand:
    """Parse a command; raises ``CommandDecodeError`` for anything malformed (unknown op, wrong types)."""
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CommandDecodeError(f"not a JSON command: {exc}") from exc
    op = d.get("op") if isinstance(d, dict) else None
    cls = _COMMANDS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise CommandDecodeError(f"unknown group coordinator command {str(raw[:40])!r}")
    # A field added later has a default and may be absent from commands written before it.
    return cls(**{
        f.name: _CODECS[str(f.type)][1](d, f.name)
        for f in dataclasses.fields(cls)
        if f.name in d or f.default is dataclasses.MISSING
    })  # fmt: skip
