"""Live membership of one consumer group on its coordinator: joins, heartbeats, sessions, rebalances. Pure.

The group coordinator (the leader of the group's ``__consumer_offsets``
partition) keeps one ``GroupMembership`` per group in memory. Time comes in as
``now_ms`` and member ids are chosen by the caller, so every step here is
deterministic and testable with a fake clock. Only the outcome of a completed
rebalance is replicated (``StoreGroup`` -> ``GroupMetadata``); heartbeats and
session deadlines are not, and a new coordinator restarts every member's
session timer from its load time (as Kafka does).

Protocol (Kafka's classic group protocol). A group is one of two kinds, set by
its first member and kept while it has members; a member of the other kind
gets ``INCONSISTENT_GROUP_PROTOCOL``:

* **server-assigned** (HTTP members): the coordinator computes the assignment
  (``group_assignors``) and each member gets it in its join answer;
* **client-assigned** (Kafka clients, ``ClientProtocols``): members join with a
  protocol type and their protocols as ``(name, opaque metadata)``; the
  coordinator picks the protocol every member supports (most members' first
  choice), elects a leader and answers it every member's metadata; the
  leader's **sync** brings the assignment (opaque bytes per member), which is
  replicated (``StoreAssignment``) before any member's sync is answered.
  Between the two the group is ``CompletingRebalance``: followers' syncs
  wait, heartbeats are answered, and a join, leave or expiry starts a new
  rebalance. A known member that rejoins with unchanged protocols gets the
  current generation back (the leader in a Stable group starts a rebalance,
  as in Kafka: it rejoins when its metadata changed). KIP-394: a Kafka
  member without an id first gets one (``pending``), joining with it within
  its session timeout. KIP-345, in part: a join naming a ``group_instance_id``
  that another member holds replaces that member at once (its requests are
  then UNKNOWN_MEMBER_ID), so a restarted static member does not wait for its
  old incarnation's session timeout; the group rebalances.

* **join** ``(member_id, subscription, protocol, timeouts)``: a new member
  (the caller picked a fresh id) or a known one. A known member that rejoins
  a Stable group with an unchanged subscription gets the current generation
  at once (a retried join). Any other join moves the group to
  ``PreparingRebalance`` and waits for the rebalance to complete. Unknown
  ids are ``UNKNOWN_MEMBER_ID``; a protocol other than the other members'
  is ``INCONSISTENT_GROUP_PROTOCOL``.
* **rebalance**: completes when every member has rejoined (no earlier than
  ``initial_rebalance_delay_ms`` after it started on an Empty group, so members
  starting together land in one generation) or when the rebalance timeout --
  the largest of the members' -- passes; members that did not rejoin are then
  removed. ``begin_completion`` computes the assignment (``group_assignors``)
  and returns the plan to replicate; ``complete`` takes the stored metadata
  (generation = previous + 1, assigned at apply) and answers every waiting
  member; ``completion_failed`` sends everyone back to rejoin. Joins and
  leaves that arrive while the plan is being replicated are kept and start
  the next rebalance right after.
* **heartbeat** ``(member_id, generation_id)``: ``UNKNOWN_MEMBER_ID``,
  ``ILLEGAL_GENERATION``, or -- while a rebalance is in progress --
  ``REBALANCE_IN_PROGRESS`` (the member must rejoin); each accepted heartbeat
  restarts the member's session timer.
* **session timeout**: a member that neither heartbeats nor waits in a join
  for ``session_timeout_ms`` is removed, which starts a rebalance.
* **leave**: removes the member and starts a rebalance for the others.
* A change in the partition count of a subscribed topic (created, grown or
  deleted) starts a rebalance too: the assignment covers the new partitions.

Not thread-safe: its owner (the coordinator's event loop) serialises calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from clients.protocol import BrokerError, ErrorCode
from coordinator.consumer_protocol import CONSUMER_PROTOCOL_TYPE, encode_assignment, encode_subscription
from coordinator.group_assignors import ASSIGNORS
from coordinator.group_metadata import GroupMetadata, MemberMetadata
from coordinator.group_rules import validate_member
from coordinator.group_states import GroupState, validate_group_transition
from coordinator.metadata import TopicPartition

__all__ = [
    "AssignmentPlan",
    "ClientProtocols",
    "GroupMembership",
    "JoinAnswer",
    "KafkaMember",
    "MemberInfo",
    "RebalancePlan",
    "SyncAnswer",
]


@dataclass(frozen=True, slots=True)
class ClientProtocols:
    """What a Kafka client's JoinGroup adds: the group is client-assigned (module docstring)."""

    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """One member as a client-assigned group's leader learns it: its chosen protocol's metadata."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    """What a member learns when its join completes (Kafka's JoinGroup + SyncGroup answers in one)."""

    group_id: str
    generation_id: int
    member_id: str
    leader_id: str | None
    protocol: str | None
    assignment: tuple[TopicPartition, ...]
    members: tuple[str, ...]
    #: client-assigned groups: the protocol type, and (the leader's answer only) every member's metadata
    protocol_type: str | None = None
    member_metadata: tuple[MemberInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    """A member's SyncGroup answer: its assignment bytes in the current generation."""

    member_id: str
    generation_id: int
    protocol_type: str | None
    protocol: str | None
    assignment: bytes


@dataclass(frozen=True, slots=True)
class AssignmentPlan:
    """The leader's assignment of ``generation_id``, to be replicated as ``StoreAssignment``."""

    generation_id: int
    assignments: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class RebalancePlan:
    """The result of a rebalance, to be replicated as ``StoreGroup``. ``removed``: members dropped by it."""

    protocol: str | None
    leader_id: str | None
    members: tuple[MemberMetadata, ...]
    topic_partitions: tuple[tuple[str, int], ...]
    removed: tuple[str, ...]
    protocol_type: str | None = None


@dataclass(slots=True)
class _Live:
    meta: MemberMetadata
    joined: bool  # waiting in a join of the current rebalance: counts as alive, answered at completion
    session_deadline_ms: int


class GroupMembership:
    def __init__(self, group_id: str, *, initial_rebalance_delay_ms: int = 0) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.generation_id = 0
        self.protocol: str | None = None
        self.leader_id: str | None = None
        self.topic_partitions: dict[str, int] = {}
        self.members: dict[str, _Live] = {}
        self.rebalance_deadline_ms = 0
        self.not_before_ms = 0
        self.completing: RebalancePlan | None = None
        #: None: server-assigned (or no kind yet); else the Kafka protocol type of a client-assigned group
        self.protocol_type: str | None = None
        #: KIP-394: member ids handed out to Kafka clients, each valid for a join until its deadline
        self.pending: dict[str, int] = {}
        #: the generation whose leader assignment is being replicated
        self.storing_assignment: int | None = None
        self._initial_delay_ms = initial_rebalance_delay_ms
        self._delaying = False
        self._late_joins: set[str] = set()
        self._late_leaves: set[str] = set()

    @classmethod
    def from_metadata(cls, meta: GroupMetadata, now_ms: int, *, initial_rebalance_delay_ms: int = 0) -> GroupMembership:
        """The membership a newly loaded coordinator starts from: the stored generation, fresh session timers."""
        m = cls(meta.group_id, initial_rebalance_delay_ms=initial_rebalance_delay_ms)
        m._adopt(meta, now_ms)
        if not meta.members:
            m.state = GroupState.EMPTY
        else:
            m.state = GroupState.COMPLETING_REBALANCE if meta.awaiting_sync else GroupState.STABLE
        return m

    # ---- transitions -------------------------------------------------------------------------

    def _transition(self, new: GroupState) -> None:
        validate_group_transition(self.group_id, self.state, new)
        self.state = new

    def _adopt(self, meta: GroupMetadata, now_ms: int) -> None:
        self.generation_id = meta.generation_id
        self.protocol = meta.protocol
        self.leader_id = meta.leader_id
        self.topic_partitions = dict(meta.topic_partitions)
        self.protocol_type = meta.protocol_type
        self.members = {m.member_id: _Live(m, False, now_ms + m.session_timeout_ms) for m in meta.members}

    def _prepare_rebalance(self, now_ms: int) -> None:
        from_empty = self.state is GroupState.EMPTY
        self._transition(GroupState.PREPARING_REBALANCE)
        longest = max((m.meta.rebalance_timeout_ms for m in self.members.values()), default=0)
        self.rebalance_deadline_ms = now_ms + longest
        self._delaying = from_empty and self._initial_delay_ms > 0
        self.not_before_ms = min(now_ms + self._initial_delay_ms, self.rebalance_deadline_ms) if self._delaying else 0

    # ---- requests ---------------------------------------------------------------------------------

    def join(
        self,
        member_id: str,
        *,
        new: bool,
        topics: tuple[str, ...],
        protocol: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        now_ms: int,
        client: ClientProtocols | None = None,
    ) -> JoinAnswer | BrokerError | None:
        """Join (see the module docstring). Returns the answer at once, an error, or None: wait for the rebalance.

        ``client``: a Kafka member (client-assigned group); ``topics`` is then what its subscription
        decodes to (shown only) and ``protocol`` is ignored.
        """
        if client is None and protocol not in ASSIGNORS:
            return BrokerError(ErrorCode.INVALID_REQUEST, f"unknown protocol {protocol!r}: use {sorted(ASSIGNORS)}")
        if client is not None and (not client.protocol_type or not client.protocols):
            return BrokerError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "a member needs a protocol type and protocols")
        current = self.members.get(member_id)
        if current is None and not new and member_id not in self.pending:
            return BrokerError(ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} is not a member of {self.group_id!r}")
        err = self._check_protocols(member_id, protocol, client)
        if err is not None:
            return err
        topics = tuple(sorted(set(topics)))
        if current is not None and self.completing is None and self._unchanged(current.meta, topics, protocol, client):
            leader_rejoins = client is not None and member_id == self.leader_id
            if (self.state is GroupState.STABLE and not leader_rejoins) or (
                self.state is GroupState.COMPLETING_REBALANCE
            ):
                current.session_deadline_ms = now_ms + current.meta.session_timeout_ms
                return self.answer_for(member_id)
        meta = MemberMetadata(
            member_id, topics, protocol if client is None else client.protocols[0][0], session_timeout_ms,
            rebalance_timeout_ms, current.meta.assignment if current is not None else (),
            protocols=client.protocols if client is not None else (),
            assignment_data=current.meta.assignment_data if current is not None else b"",
            group_instance_id=client.group_instance_id if client is not None else None,
            client_id=client.client_id if client is not None else "",
            client_host=client.client_host if client is not None else "",
        )  # fmt: skip
        instance = client.group_instance_id if client is not None else None
        for mid in [mid for mid, m in self.members.items() if instance and mid != member_id
                    and m.meta.group_instance_id == instance]:  # fmt: skip
            self._remove(mid, now_ms)  # KIP-345: the instance's new incarnation replaces the old one at once
        if not any(mid != member_id for mid in self.members):
            self.protocol_type = client.protocol_type if client is not None else None
        self.pending.pop(member_id, None)
        self.members[member_id] = _Live(meta, True, now_ms + session_timeout_ms)
        if self.completing is not None:
            self._late_joins.add(member_id)
        elif self.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(now_ms)
        elif self._delaying:
            self.not_before_ms = min(now_ms + self._initial_delay_ms, self.rebalance_deadline_ms)
        return None

    def _check_protocols(self, member_id: str, protocol: str, client: ClientProtocols | None) -> BrokerError | None:
        """INCONSISTENT_GROUP_PROTOCOL for a member the other members cannot form a generation with."""
        others = [m.meta for mid, m in self.members.items() if mid != member_id]
        if not others:
            return None
        kind = client.protocol_type if client is not None else None
        if kind != self.protocol_type:

            def name(k: str | None) -> str:
                return f"Kafka protocol type {k!r} (assigned by the leader member)" if k else "assigned by the broker"

            return BrokerError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"group {self.group_id!r} is {name(self.protocol_type)}; this member is {name(kind)}",
            )
        if client is None:
            theirs = {m.protocol for m in others}
            if theirs != {protocol}:
                return BrokerError(
                    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    f"protocol {protocol!r} differs from the group's members' {sorted(theirs)}",
                )
            return None
        common = set.intersection(*({n for n, _ in m.protocols} for m in others)) & {n for n, _ in client.protocols}
        if not common:
            return BrokerError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"none of the protocols {[n for n, _ in client.protocols]} is supported by every member",
            )
        return None

    @staticmethod
    def _unchanged(
        meta: MemberMetadata, topics: tuple[str, ...], protocol: str, client: ClientProtocols | None
    ) -> bool:
        if client is None:
            return not meta.protocols and (meta.topics, meta.protocol) == (topics, protocol)
        return meta.protocols == client.protocols

    def add_pending(self, member_id: str, session_timeout_ms: int, now_ms: int) -> None:
        """KIP-394: ``member_id`` was handed to a Kafka client; it may join with it within its session timeout."""
        self.pending[member_id] = now_ms + session_timeout_ms

    def heartbeat(self, member_id: str, generation_id: int, now_ms: int) -> BrokerError | None:
        member = self.members.get(member_id)
        if member is None:
            return BrokerError(ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} is not a member of {self.group_id!r}")
        if generation_id != self.generation_id:
            return BrokerError(
                ErrorCode.ILLEGAL_GENERATION,
                f"generation {generation_id} is not the group's current generation {self.generation_id}",
            )
        member.session_deadline_ms = now_ms + member.meta.session_timeout_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            return BrokerError(ErrorCode.REBALANCE_IN_PROGRESS, f"{self.group_id!r} is rebalancing: rejoin the group")
        return None

    def sync(
        self, member_id: str, generation_id: int, assignments: tuple[tuple[str, bytes], ...], now_ms: int
    ) -> SyncAnswer | AssignmentPlan | BrokerError | None:
        """SyncGroup: the member's assignment, the leader's plan to replicate, an error, or None: wait for it."""
        member = self.members.get(member_id)
        if member is None:
            return BrokerError(ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} is not a member of {self.group_id!r}")
        if generation_id != self.generation_id:
            return BrokerError(
                ErrorCode.ILLEGAL_GENERATION,
                f"generation {generation_id} is not the group's current generation {self.generation_id}",
            )
        if self.state is GroupState.PREPARING_REBALANCE or self.completing is not None:
            return BrokerError(ErrorCode.REBALANCE_IN_PROGRESS, f"{self.group_id!r} is rebalancing: rejoin the group")
        member.session_deadline_ms = now_ms + member.meta.session_timeout_ms
        if self.state is GroupState.STABLE:
            return self.sync_answer(member_id)
        if member_id == self.leader_id and self.storing_assignment is None:
            self.storing_assignment = self.generation_id
            return AssignmentPlan(self.generation_id, assignments)
        return None

    def assignment_stored(self, stored: GroupMetadata) -> list[SyncAnswer]:
        """The leader's assignment is replicated as ``stored``: the generation is Stable; answer every member.

        Nothing is answered if a rebalance began meanwhile (the members rejoin).
        """
        self.storing_assignment = None
        if self.state is not GroupState.COMPLETING_REBALANCE or stored.generation_id != self.generation_id:
            return []
        for m in stored.members:
            live = self.members.get(m.member_id)
            if live is not None:
                live.meta = replace(live.meta, assignment=m.assignment, assignment_data=m.assignment_data)
        self._transition(GroupState.STABLE)
        return [self.sync_answer(mid) for mid in sorted(self.members)]

    def assignment_failed(self, now_ms: int) -> None:
        """Replicating the leader's assignment failed: every member must rejoin."""
        self.storing_assignment = None
        if self.state is GroupState.COMPLETING_REBALANCE:
            self._prepare_rebalance(now_ms)

    def leave(self, member_id: str, now_ms: int) -> BrokerError | None:
        if member_id not in self.members:
            return BrokerError(ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} is not a member of {self.group_id!r}")
        self._remove(member_id, now_ms)
        return None

    def _remove(self, member_id: str, now_ms: int) -> None:
        del self.members[member_id]
        if self.completing is not None:
            self._late_joins.discard(member_id)
            if any(m.member_id == member_id for m in self.completing.members):
                self._late_leaves.add(member_id)
        elif self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now_ms)

    def tick(self, now_ms: int, partition_counts: Mapping[str, int]) -> list[str]:
        """Expire members past their session timeout; start a rebalance if a subscribed topic changed.

        Returns the expired member ids.
        """
        expired = sorted(mid for mid, m in self.members.items() if not m.joined and m.session_deadline_ms <= now_ms)
        for mid in expired:
            self._remove(mid, now_ms)
        for mid in [mid for mid, deadline in self.pending.items() if deadline <= now_ms]:
            del self.pending[mid]
        # a client-assigned group's leader watches its subscriptions' metadata and rejoins itself
        if self.state is GroupState.STABLE and self.completing is None and self.protocol_type is None:
            subscribed = {t for m in self.members.values() for t in m.meta.topics}
            if {t: partition_counts.get(t, 0) for t in subscribed} != {
                t: self.topic_partitions.get(t, 0) for t in subscribed
            }:
                self._prepare_rebalance(now_ms)
        return expired

    # ---- completing a rebalance --------------------------------------------------------------

    def ready(self, now_ms: int) -> bool:
        """Whether the rebalance in progress can complete now."""
        if self.state is not GroupState.PREPARING_REBALANCE or self.completing is not None:
            return False
        if not self.members or now_ms >= self.rebalance_deadline_ms:
            return True
        return all(m.joined for m in self.members.values()) and now_ms >= self.not_before_ms

    def begin_completion(self, now_ms: int, partition_counts: Mapping[str, int]) -> RebalancePlan:
        """Drop the members that did not rejoin, assign partitions, and return the plan to replicate.

        The remaining members' session timers restart now: they waited in their
        joins, and their answers come when the plan is replicated.
        """
        if self.state is not GroupState.PREPARING_REBALANCE or self.completing is not None:
            raise RuntimeError(f"group {self.group_id!r}: no rebalance to complete")
        removed = tuple(sorted(mid for mid, m in self.members.items() if not m.joined))
        for mid in removed:
            del self.members[mid]
        subscriptions = {mid: m.meta.topics for mid, m in self.members.items()}
        topics = sorted({t for ts in subscriptions.values() for t in ts})
        counts = {t: max(0, partition_counts.get(t, 0)) for t in topics}
        leader = self.leader_id if self.leader_id in self.members else min(self.members, default=None)
        if self.protocol_type is not None:  # the leader member assigns, in its SyncGroup
            protocol = self._select_protocol()
            metas = tuple(
                replace(self.members[mid].meta, protocol=protocol or "", assignment=(), assignment_data=b"")
                for mid in sorted(self.members)
            )
        else:
            protocol = next(iter(self.members.values())).meta.protocol if self.members else None
            assignment = ASSIGNORS[protocol](subscriptions, counts) if protocol is not None else {}
            metas = tuple(replace(self.members[mid].meta, assignment=assignment[mid]) for mid in sorted(self.members))
        for m in self.members.values():
            m.joined = False
            m.session_deadline_ms = now_ms + m.meta.session_timeout_ms
        kind = self.protocol_type if self.members else None
        plan = RebalancePlan(protocol, leader, metas, tuple(counts.items()), removed, kind)
        self.completing = plan
        self._late_joins.clear()
        self._late_leaves.clear()
        return plan

    def complete(self, stored: GroupMetadata, now_ms: int) -> list[JoinAnswer]:
        """The plan is replicated as ``stored``: form the generation and answer its members.

        Members that joined again or left while it was replicated are not
        answered; they start the next rebalance at once.
        """
        if self.completing is None:
            raise RuntimeError(f"group {self.group_id!r}: no rebalance is completing")
        late_joins, late_leaves = set(self._late_joins), set(self._late_leaves)
        joined_again = {mid: self.members[mid] for mid in late_joins}
        self._adopt(stored, now_ms)
        for mid in late_leaves:
            self.members.pop(mid, None)
        for mid, live in joined_again.items():
            stored_member = self.members.get(mid)
            live.meta = replace(live.meta, assignment=stored_member.meta.assignment if stored_member else ())
            self.members[mid] = live
        self.completing = None
        self._late_joins.clear()
        self._late_leaves.clear()
        if not stored.members:
            self._transition(GroupState.EMPTY)
        else:
            self._transition(GroupState.COMPLETING_REBALANCE if stored.awaiting_sync else GroupState.STABLE)
        answers = [self.answer_for(m.member_id) for m in stored.members if m.member_id not in late_joins | late_leaves]
        if late_joins or late_leaves:
            self._prepare_rebalance(now_ms)
        return answers

    def _select_protocol(self) -> str | None:
        """Kafka's selectProtocol: among the protocols every member supports, most members' first choice.

        Ties go to the protocol the member with the smallest id prefers first.
        """
        metas = [self.members[mid].meta for mid in sorted(self.members)]
        if not metas:
            return None
        candidates = set.intersection(*({n for n, _ in m.protocols} for m in metas))
        votes: dict[str, int] = {}
        for m in metas:
            choice = next(n for n, _ in m.protocols if n in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        order = [n for n, _ in metas[0].protocols]
        return max(votes, key=lambda n: (votes[n], -order.index(n)))

    def completion_failed(self, now_ms: int) -> None:
        """Replicating the plan failed: every member must rejoin (its assignment is what it was)."""
        self.completing = None
        self._late_joins.clear()
        self._late_leaves.clear()
        for m in self.members.values():
            m.joined = False
            m.session_deadline_ms = now_ms + m.meta.session_timeout_ms
        longest = max((m.meta.rebalance_timeout_ms for m in self.members.values()), default=0)
        self.rebalance_deadline_ms = now_ms + longest
        self.not_before_ms = 0

    # ---- reads --------------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No member, no rebalance, no handed-out member id: the stored metadata is the whole state."""
        return self.state is GroupState.EMPTY and not self.members and self.completing is None and not self.pending

    def answer_for(self, member_id: str) -> JoinAnswer:
        infos: tuple[MemberInfo, ...] = ()
        if self.protocol_type is not None and member_id == self.leader_id:
            infos = tuple(
                MemberInfo(mid, m.meta.group_instance_id, m.meta.metadata_for(self.protocol))
                for mid, m in sorted(self.members.items())
            )
        return JoinAnswer(
            group_id=self.group_id,
            generation_id=self.generation_id,
            member_id=member_id,
            leader_id=self.leader_id,
            protocol=self.protocol,
            assignment=self.members[member_id].meta.assignment,
            members=tuple(sorted(self.members)),
            protocol_type=self.protocol_type,
            member_metadata=infos,
        )

    def sync_answer(self, member_id: str) -> SyncAnswer:
        meta = self.members[member_id].meta
        return SyncAnswer(member_id, self.generation_id, self.protocol_type, self.protocol, meta.assignment_data)

    def validate_commit(self, member_id: str, generation_id: int, *, transactional: bool) -> BrokerError | None:
        """The leader's fail-fast KIP-447 check against live membership (apply re-checks the stored one).

        A plain commit of a member of a client-assigned group waiting for its leader's assignment is
        REBALANCE_IN_PROGRESS, as in Kafka: the member's partitions are not known yet.
        """
        if (
            not transactional
            and member_id
            and self.state is GroupState.COMPLETING_REBALANCE
            and member_id in self.members
            and generation_id == self.generation_id
        ):
            return BrokerError(ErrorCode.REBALANCE_IN_PROGRESS, f"{self.group_id!r} waits for its leader's assignment")
        return validate_member(
            self.members.keys(), self.generation_id, member_id, generation_id, transactional=transactional
        )

    def next_deadline(self) -> int | None:
        """The earliest time ``tick`` or ``ready`` may change something (None: only a request can)."""
        times = [m.session_deadline_ms for m in self.members.values() if not m.joined]
        times.extend(self.pending.values())
        if self.state is GroupState.PREPARING_REBALANCE and self.completing is None:
            times.append(self.rebalance_deadline_ms)
            if self.not_before_ms:
                times.append(self.not_before_ms)
        return min(times, default=None)

    def describe(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "state": self.state.display_name,
            "generation_id": self.generation_id,
            "protocol_type": self.protocol_type or CONSUMER_PROTOCOL_TYPE,
            "assignment_by": "broker" if self.protocol_type is None else "leader",
            "protocol": self.protocol,
            "leader_id": self.leader_id,
            "members": [
                {
                    "member_id": mid,
                    "topics": list(m.meta.topics),
                    "protocol": m.meta.protocol,
                    "session_timeout_ms": m.meta.session_timeout_ms,
                    "rebalance_timeout_ms": m.meta.rebalance_timeout_ms,
                    "assignment": [{"topic": tp.topic, "partition": tp.partition} for tp in m.meta.assignment],
                    "rejoined": m.joined,
                }
                | _client_fields(m.meta)
                for mid, m in sorted(self.members.items())
            ],
        }

    def kafka_members(self) -> list[KafkaMember]:
        """The members as Kafka's DescribeGroups shows them (a server-assigned group's subscriptions and
        assignments encoded in the consumer protocol, so Kafka tools read every group alike)."""
        out = []
        for mid, m in sorted(self.members.items()):
            meta = m.meta
            if meta.protocols:
                metadata, assignment = meta.metadata_for(self.protocol), meta.assignment_data
            else:
                metadata, assignment = encode_subscription(meta.topics), encode_assignment(meta.assignment)
            out.append(KafkaMember(mid, meta.group_instance_id, meta.client_id, meta.client_host, metadata, assignment))
        return out


@dataclass(frozen=True, slots=True)
class KafkaMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


def _client_fields(meta: MemberMetadata) -> dict[str, Any]:
    if not meta.protocols:
        return {}
    return {"group_instance_id": meta.group_instance_id, "client_id": meta.client_id, "client_host": meta.client_host}
