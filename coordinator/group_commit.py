"""Atomic commit of a *commit group*: prepared transactions that must all commit, or all abort.

The members may live on different ``__transaction_state`` partitions (each
transactional id hashes to its own), so no single Raft entry can change them
all. The design makes one Raft entry the commit point and makes every member
unable to end any other way.

1. **Bind.** Every member is ``Prepared`` and *bound* to the group ``G`` on
   its own partition: ``Prepare(group_id=G)``, or ``BindPrepared`` for one
   prepared unbound. A bound member ends only through ``G``'s decision:
   EndTxn and FenceAndAbort refuse it (INVALID_TXN_STATE), InitProducerId
   waits (CONCURRENT_TRANSACTIONS), the timeout does not apply.
2. **Decide.** One ``DecideGroup(G, commit, members)`` entry on partition
   ``coordinator_partition(G, N)``. It is write-once: the first decision
   applied wins and every later ``DecideGroup`` answers the recorded one. That
   entry *is* the commit point: before it every member may still abort; after
   it every listed member commits. Before proposing COMMIT the leader makes
   sure every member is ready: a successful ``BindPrepared(G)`` on the member's
   partition (idempotent when it was bound at prepare) proves it is Prepared,
   bound to G, with the listed identity (``check_member_ready`` is the same
   test on a metadata value already at hand). Nothing can end a bound member
   between that check and the decision except a decision of G itself, which
   the write-once rule orders.
3. **Carry out.** The leader of G's partition sends ``ResolvePrepared`` (with
   the decision) to each member's coordinator; once a member's own partition
   has applied it, the member is in PrepareCommit/PrepareAbort (or later) and
   its own coordinator writes the markers and completes it, as for any EndTxn.
   Then ``GroupMemberDone`` records it. ``pending_group_decisions`` lists
   decisions with members not done; a new leader of G's partition resumes
   them. So if the caller dies at any point after step 2, every member still
   commits; before step 2, none does.
4. **Orphans.** A member bound to G that must end without a decision (its
   ``max prepared`` time passed, abort-by-prefix, an admin abort) is resolved
   by its coordinator proposing ``DecideGroup(G, commit=False, members=())``
   to G's partition. If nothing was decided, ABORT is recorded (a later
   commit of G gets the abort back: all-or-nothing holds). If COMMIT was
   recorded first, that decision comes back and ``member_commits`` tells the
   member: commit if it is listed with its identity, abort if it is not (an
   attempt the caller left out of the group).
5. **Forget.** ``ForgetGroup`` deletes a decision whose members are all done,
   after a retention period that covers retried group-commit requests.

Cost: one extra Raft entry per group, plus one per member not bound at prepare.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from clients.protocol import BrokerError, ErrorCode
from coordinator.codec import decode_record, encode_record, get_bool, get_int, get_str
from coordinator.commands import DecideGroup, ForgetGroup, GroupMember, GroupMemberDone
from coordinator.errors import CommandDecodeError, CoordinatorCorruptionError
from coordinator.metadata import TransactionMetadata
from coordinator.states import TransactionState
from coordinator.transitions import check_id

__all__ = [
    "GroupDecision",
    "GroupDecisionResult",
    "GroupOutcome",
    "check_member_ready",
    "decide_group",
    "decode_decision",
    "encode_decision",
    "forget_group",
    "group_member_done",
    "member_commits",
]

_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class GroupDecision:
    """The recorded outcome of commit group ``group_id``; ``done``: members whose partition applied it."""

    group_id: str
    commit: bool
    members: tuple[GroupMember, ...]
    decided_ms: int
    coordinator_epoch: int
    done: frozenset[str] = frozenset()

    @property
    def pending(self) -> tuple[GroupMember, ...]:
        return tuple(m for m in self.members if m.transactional_id not in self.done)


@dataclass(frozen=True, slots=True)
class GroupDecisionResult:
    """``created``: this command recorded the decision (False: an earlier one is answered)."""

    decision: GroupDecision
    created: bool


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    result: GroupDecisionResult | BrokerError
    decision: GroupDecision | None = None
    removed: bool = False


def member_commits(decision: GroupDecision, member: GroupMember) -> bool:
    """Whether a member bound to the decision's group commits: only when listed, identity and all."""
    return decision.commit and member in decision.members


def check_member_ready(meta: TransactionMetadata | None, group_id: str, member: GroupMember) -> BrokerError | None:
    """The pre-check before a COMMIT decision: the member is Prepared, bound to ``group_id``, same identity."""
    tid = member.transactional_id
    if meta is None:
        return BrokerError(ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"unknown transactional id {tid!r}")
    if (meta.producer_id, meta.producer_epoch) != (member.producer_id, member.producer_epoch):
        return BrokerError(
            ErrorCode.PRODUCER_FENCED,
            f"{tid!r} is at producer {meta.producer_id} epoch {meta.producer_epoch}, "
            f"not {member.producer_id}/{member.producer_epoch}",
        )
    if meta.state is not TransactionState.PREPARED:
        return BrokerError(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is not prepared ({meta.state})")
    if meta.group_id != group_id:
        return BrokerError(ErrorCode.INVALID_TXN_STATE, f"{tid!r} is not bound to commit group {group_id!r}")
    return None


def decide_group(existing: GroupDecision | None, cmd: DecideGroup) -> GroupOutcome:
    if (err := check_id(cmd.group_id, "commit group id")) is not None:
        return GroupOutcome(err)
    tids = [m.transactional_id for m in cmd.members]
    if len(set(tids)) != len(tids):
        return GroupOutcome(BrokerError(ErrorCode.INVALID_REQUEST, "a transactional id is listed twice"))
    for m in cmd.members:
        if (err := check_id(m.transactional_id)) is not None:
            return GroupOutcome(err)
        if m.producer_id < 0 or m.producer_epoch < 0:
            return GroupOutcome(BrokerError(ErrorCode.INVALID_REQUEST, f"invalid identity for {m.transactional_id!r}"))
    if cmd.commit and not cmd.members:
        return GroupOutcome(BrokerError(ErrorCode.INVALID_REQUEST, "a commit decision needs its members"))
    if existing is not None:
        return GroupOutcome(GroupDecisionResult(existing, created=False))
    decision = GroupDecision(
        group_id=cmd.group_id,
        commit=cmd.commit,
        members=tuple(sorted(cmd.members)),
        decided_ms=cmd.now_ms,
        coordinator_epoch=cmd.coordinator_epoch,
    )
    return GroupOutcome(GroupDecisionResult(decision, created=True), decision)


def _unknown(group_id: str) -> GroupOutcome:
    return GroupOutcome(BrokerError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"no decision for commit group {group_id!r}"))


def group_member_done(existing: GroupDecision | None, cmd: GroupMemberDone) -> GroupOutcome:
    if existing is None:
        return _unknown(cmd.group_id)
    if cmd.transactional_id not in {m.transactional_id for m in existing.members}:
        return GroupOutcome(
            BrokerError(ErrorCode.INVALID_REQUEST, f"{cmd.transactional_id!r} is not in group {cmd.group_id!r}")
        )
    if cmd.transactional_id in existing.done:
        return GroupOutcome(GroupDecisionResult(existing, created=False))
    updated = replace(existing, done=existing.done | {cmd.transactional_id})
    return GroupOutcome(GroupDecisionResult(updated, created=False), updated)


def forget_group(existing: GroupDecision | None, cmd: ForgetGroup) -> GroupOutcome:
    if existing is None:
        return _unknown(cmd.group_id)
    if existing.pending:
        return GroupOutcome(BrokerError(ErrorCode.INVALID_TXN_STATE, f"group {cmd.group_id!r} has members pending"))
    if existing.decided_ms + cmd.retention_ms >= cmd.now_ms:
        return GroupOutcome(BrokerError(ErrorCode.INVALID_TXN_STATE, f"group {cmd.group_id!r} is within retention"))
    return GroupOutcome(GroupDecisionResult(existing, created=False), removed=True)


def encode_decision(decision: GroupDecision) -> bytes:
    body = {
        "group": decision.group_id,
        "commit": decision.commit,
        "members": [[m.transactional_id, m.producer_id, m.producer_epoch] for m in decision.members],
        "decided_ms": decision.decided_ms,
        "cepoch": decision.coordinator_epoch,
        "done": sorted(decision.done),
    }
    return encode_record(body, _FORMAT_VERSION)


def decode_decision(raw: bytes, *, where: str) -> GroupDecision:
    d = decode_record(raw, version=_FORMAT_VERSION, where=where)
    try:
        members = tuple(
            GroupMember(get_str({"t": t}, "t"), get_int({"p": p}, "p"), get_int({"e": e}, "e"))
            for t, p, e in d["members"]
        )
        return GroupDecision(
            group_id=get_str(d, "group"),
            commit=get_bool(d, "commit"),
            members=members,
            decided_ms=get_int(d, "decided_ms"),
            coordinator_epoch=get_int(d, "cepoch"),
            done=frozenset(get_str({"t": t}, "t") for t in d["done"]),
        )
    except (CommandDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CoordinatorCorruptionError(f"{where}: malformed group decision: {exc}") from exc
