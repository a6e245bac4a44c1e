"""Commands a ``__transaction_state-p`` Raft group replicates, and their byte encoding.

A command is compact JSON ``{"op": <name>, ...fields}`` (never pickle; the
first byte is ``{``, so it cannot be mistaken for the Raft NOOP barrier
``0x00``). The leader builds it: every value that depends on the leader --
its clock (``now_ms``), its term (``coordinator_epoch``), a producer id taken
from its consensus-allocated block (``producer_id_candidate``), the limits of
its configuration (``max_timeout_ms``, ``expiration_ms``...) -- travels inside,
so ``apply`` computes the same result on every replica (DESIGN.md rule 1).

``coordinator_epoch`` is the proposing leader's Raft term. The state machine
remembers the highest it applied and answers ``NOT_COORDINATOR`` to a command
carrying a lower one: a deposed leader's command that commits after its
successor's first command changes nothing (DESIGN.md rule 7).

Commands are frozen keyword-only dataclasses; their constructors are the API:
``encode_command(EndTxn(transactional_id=..., ...))``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from coordinator.codec import get_bool, get_int, get_opt_int, get_opt_str, get_str, json_bytes
from coordinator.errors import CommandDecodeError
from coordinator.metadata import TopicPartition

__all__ = [
    "DEFAULT_GROUP_DECISION_RETENTION_MS",
    "DEFAULT_MAX_TIMEOUT_MS",
    "DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS",
    "MAX_ID_BYTES",
    "AddPartitions",
    "BindPrepared",
    "Command",
    "CompleteTxn",
    "DecideGroup",
    "EndTxn",
    "ExpireTransactionalId",
    "FenceAndAbort",
    "ForgetGroup",
    "GroupCommand",
    "GroupMember",
    "GroupMemberDone",
    "InitProducerId",
    "Prepare",
    "ResolvePrepared",
    "TxnCommand",
    "decode_command",
    "encode_command",
]

#: ``transaction.max.timeout.ms`` (kafka_txn.md §2).
DEFAULT_MAX_TIMEOUT_MS = 900_000
#: ``transactional.id.expiration.ms`` (7 days, §2).
DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS = 604_800_000
#: How long a fully carried-out group decision is kept for retried group-commit requests.
DEFAULT_GROUP_DECISION_RETENTION_MS = 604_800_000
#: Longest transactional id / commit-group id accepted (UTF-8 bytes); bounds keys and commands.
MAX_ID_BYTES = 4096


@dataclass(frozen=True, slots=True, order=True)
class GroupMember:
    """One prepared transaction of a commit group: its transactional id and the identity it was prepared with."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class _Stamped:
    """What every command carries from its leader: the clock and the term (coordinator epoch)."""

    now_ms: int
    coordinator_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class _ProducerCommand(_Stamped):
    """A command about the transaction of one (transactional id, producer id, epoch)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class InitProducerId(_Stamped):
    """InitProducerId with a transactional id (kafka_txn.md §4.3).

    ``producer_id_candidate``: a fresh id from the leader's block, used when the
    transactional id is new or its epoch is exhausted (None: the leader saw no
    need; if apply needs one anyway it answers CONCURRENT_TRANSACTIONS and the
    client retries). ``expected_producer_id``/``expected_producer_epoch``:
    KIP-360's current identity of a recovering producer (both or neither).
    """

    OP: ClassVar[str] = "init_producer_id"
    transactional_id: str
    timeout_ms: int
    producer_id_candidate: int | None = None
    expected_producer_id: int | None = None
    expected_producer_epoch: int | None = None
    max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class AddPartitions(_ProducerCommand):
    """AddPartitionsToTxn, also the implicit add of a first transactional produce (KIP-890 part 2)."""

    OP: ClassVar[str] = "add_partitions"
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class EndTxn(_ProducerCommand):
    """EndTxn: PrepareCommit/PrepareAbort. The candidate covers a rotation.

    TV2 (``classic`` False): the epoch is bumped and the markers carry the new epoch. ``classic``: the
    classic protocol of Kafka clients that send EndTxn below version 5 -- no bump; the client keeps its
    producer id and epoch across transactions and the markers carry that epoch.

    Carried markers (docs/carried-markers.md): ``carry`` -- the decision's data partitions get their markers
    from the client's next transaction (tokens). ``settle`` -- the previous transaction's carried markers are
    all settled: it completes in the same apply, and its next transaction (the one this command ends) opens
    with ``settled_partitions`` (receipted or found in use) besides the ones it added.
    """

    OP: ClassVar[str] = "end_txn"
    commit: bool
    producer_id_candidate: int | None = None
    carry: bool = False
    settle: bool = False
    settled_partitions: tuple[TopicPartition, ...] = ()
    classic: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteTxn(_ProducerCommand):
    """Every marker of the prepare state with this marker identity is written: CompleteCommit/CompleteAbort.

    ``settled_partitions``: carried partitions the next transaction already wrote to (a revoking marker found
    them in use); the next transaction opens with them.
    """

    OP: ClassVar[str] = "complete_txn"
    commit: bool
    settled_partitions: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepare(_ProducerCommand):
    """Make the transaction of (pid, epoch) durable and wait for an external decision (``PREPARED``)."""

    OP: ClassVar[str] = "prepare"
    group_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BindPrepared(_ProducerCommand):
    """Bind an unbound prepared transaction to a commit group (idempotent for the same group)."""

    OP: ClassVar[str] = "bind_prepared"
    group_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvePrepared(_ProducerCommand):
    """Carry out a commit group's recorded decision on one bound member (PrepareCommit/PrepareAbort)."""

    OP: ClassVar[str] = "resolve_prepared"
    group_id: str
    commit: bool
    producer_id_candidate: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceAndAbort(_ProducerCommand):
    """Fence (epoch bump) and abort the open transaction of exactly this (pid, epoch).

    Used for the timeout scan, abort-by-prefix and admin aborts; the identity
    guard makes a decision taken on a stale view a no-op error.
    """

    OP: ClassVar[str] = "fence_and_abort"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireTransactionalId(_ProducerCommand):
    """Remove an idle transactional id (Empty/Complete*, idle longer than ``expiration_ms``)."""

    OP: ClassVar[str] = "expire_transactional_id"
    expiration_ms: int = DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class DecideGroup(_Stamped):
    """Record a commit group's decision (write-once; the first decision wins)."""

    OP: ClassVar[str] = "decide_group"
    group_id: str
    commit: bool
    members: tuple[GroupMember, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMemberDone(_Stamped):
    """The decision is durable on this member's own partition (it reached a prepare or complete state)."""

    OP: ClassVar[str] = "group_member_done"
    group_id: str
    transactional_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ForgetGroup(_Stamped):
    """Delete a decision whose members are all done, ``retention_ms`` after it was decided."""

    OP: ClassVar[str] = "forget_group"
    group_id: str
    retention_ms: int = DEFAULT_GROUP_DECISION_RETENTION_MS


TxnCommand = (
    InitProducerId
    | AddPartitions
    | EndTxn
    | CompleteTxn
    | Prepare
    | BindPrepared
    | ResolvePrepared
    | FenceAndAbort
    | ExpireTransactionalId
)
GroupCommand = DecideGroup | GroupMemberDone | ForgetGroup
Command = TxnCommand | GroupCommand

_COMMANDS: Mapping[str, type[Command]] = {
    cls.OP: cls
    for cls in (
        InitProducerId,
        AddPartitions,
        EndTxn,
        CompleteTxn,
        Prepare,
        BindPrepared,
        ResolvePrepared,
        FenceAndAbort,
        ExpireTransactionalId,
        DecideGroup,
        GroupMemberDone,
        ForgetGroup,
    )
}


def _partitions(d: Mapping[str, Any], key: str) -> tuple[TopicPartition, ...]:
    raw = d.get(key)
    if not isinstance(raw, list):
        raise CommandDecodeError(f"field {key!r} must be a list")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2):
            raise CommandDecodeError(f"{key}: each partition is [topic, partition]")
        out.append(TopicPartition(get_str({"t": item[0]}, "t"), get_int({"p": item[1]}, "p")))
    return tuple(out)


def _members(d: Mapping[str, Any], key: str) -> tuple[GroupMember, ...]:
    raw = d.get(key)
    if not isinstance(raw, list):
        raise CommandDecodeError(f"field {key!r} must be a list")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3):
            raise CommandDecodeError(f"{key}: each member is [transactional_id, producer_id, producer_epoch]")
        m = {"t": item[0], "p": item[1], "e": item[2]}
        out.append(GroupMember(get_str(m, "t"), get_int(m, "p"), get_int(m, "e")))
    return tuple(out)


# Field readers by the annotation text (``from __future__ import annotations`` keeps them as strings).
_READERS: Mapping[str, Callable[[Mapping[str, Any], str], Any]] = {
    "int": get_int,
    "int | None": get_opt_int,
    "str": get_str,
    "str | None": get_opt_str,
    "bool": get_bool,
    "tuple[TopicPartition, ...]": _partitions,
    "tuple[GroupMember, ...]": _members,
}


def _to_json(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, TopicPartition):
        return [value.topic, value.partition]
    if isinstance(value, GroupMember):
        return [value.transactional_id, value.producer_id, value.producer_epoch]
    return value


def encode_command(cmd: Command) -> bytes:
    body: dict[str, Any] = {"op": cmd.OP}
    for f in dataclasses.fields(cmd):
        body[f.name] = _to_json(getattr(cmd, f.name))
    return json_bytes(body)


# Each command class's (field name, reader, whether it may be absent), built on first use: decoding runs in
# every replica's apply. A field added later has a default and may be absent from commands written before it.
_FIELD_READERS: dict[type[Command], tuple[tuple[str, Callable[[Mapping[str, Any], str], Any], bool], ...]] = {}


def decode_command(raw: bytes) -> Command:
    """Parse a command; raises ``CommandDecodeError`` for anything malformed (unknown op, wrong types)."""
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CommandDecodeError(f"not a JSON command: {exc}") from exc
    if not isinstance(d, dict):
        raise CommandDecodeError("a command is a JSON object")
    op = d.get("op")
    cls = _COMMANDS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise CommandDecodeError(f"unknown coordinator command {d.get('op')!r}")
    readers = _FIELD_READERS.get(cls)
    if readers is None:
        readers = _FIELD_READERS[cls] = tuple(
            (f.name, _READERS[str(f.type)], f.default is not dataclasses.MISSING) for f in dataclasses.fields(cls)
        )
    return cls(**{name: read(d, name) for name, read, optional in readers if name in d or not optional})
