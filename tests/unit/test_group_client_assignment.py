"""Client-assigned groups (Kafka's JoinGroup/SyncGroup) on the live membership, with a fake clock. Pure.

Kafka's classic GroupCoordinator rules: the coordinator selects the protocol
every member supports and elects a leader (onCompleteJoin), the leader's
SyncGroup carries every member's assignment and followers wait for it
(handleSyncGroup), CompletingRebalance answers heartbeats and is left by a
join, leave or expiry (KIP-394 member ids, KIP-345's instance id recorded).
A group is server-assigned (HTTP) or client-assigned (Kafka), never both.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from clients.protocol import BrokerError, ErrorCode
from coordinator import group_rules
from coordinator.consumer_protocol import (
    ConsumerProtocolError,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from coordinator.group_commands import (
    DeleteOffsets,
    StoreAssignment,
    StoreGroup,
    decode_group_command,
    encode_group_command,
)
from coordinator.group_membership import AssignmentPlan, ClientProtocols, GroupMembership, JoinAnswer, SyncAnswer
from coordinator.group_metadata import GroupMetadata, MemberMetadata, decode_group, encode_group
from coordinator.group_states import GroupState, IllegalGroupTransitionError, validate_group_transition
from coordinator.metadata import TopicPartition as TP

SESSION = 1000
REBALANCE = 5000
SUB = encode_subscription(["t"])


def kafka(*protocols: str, instance: str | None = None) -> ClientProtocols:
    return ClientProtocols("consumer", tuple((p, SUB + p.encode()) for p in protocols or ("range",)),
                           group_instance_id=instance, client_id="cid", client_host="10.0.0.1")  # fmt: skip


@dataclass
class Group:
    """A coordinator around one membership: replicates rebalance plans and leader assignments like apply does."""

    m: GroupMembership = field(default_factory=lambda: GroupMembership("g"))
    now: int = 0
    stored: GroupMetadata | None = None

    def join(self, member: str, client: ClientProtocols | None = None, new: bool = False,
             session: int = SESSION) -> JoinAnswer | BrokerError | None:  # fmt: skip
        return self.m.join(member, new=new, topics=("t",), protocol="range", session_timeout_ms=session,
                           rebalance_timeout_ms=REBALANCE, now_ms=self.now, client=client)  # fmt: skip

    def complete(self) -> dict[str, JoinAnswer]:
        plan = self.m.begin_completion(self.now, {"t": 4})
        cmd = StoreGroup(group_id="g", protocol=plan.protocol, leader_id=plan.leader_id, members=plan.members,
                         topic_partitions=plan.topic_partitions, protocol_type=plan.protocol_type, now_ms=self.now,
                         coordinator_epoch=1)  # fmt: skip
        self.stored = self._apply(group_rules.store_group(self._view(), cmd))
        return {a.member_id: a for a in self.m.complete(self.stored, self.now)}

    def sync(self, member: str, generation: int, assignments: dict[str, bytes] | None = None) -> object:
        return self.m.sync(member, generation, tuple((assignments or {}).items()), self.now)

    def store(self, plan: AssignmentPlan) -> dict[str, SyncAnswer]:
        cmd = StoreAssignment(group_id="g", generation_id=plan.generation_id, assignments=plan.assignments,
                              now_ms=self.now, coordinator_epoch=1)  # fmt: skip
        self.stored = self._apply(group_rules.store_assignment(self._view(), cmd))
        return {a.member_id: a for a in self.m.assignment_stored(self.stored)}

    def _view(self) -> _View:
        return _View(self.stored)

    @staticmethod
    def _apply(change: group_rules.GroupsChange) -> GroupMetadata:
        assert isinstance(change.result, group_rules.GroupStored), change.result
        return change.result.metadata


@dataclass
class _View:
    stored: GroupMetadata | None

    def group(self, group_id: str) -> GroupMetadata | None:
        return self.stored


def code(result: object) -> ErrorCode | None:
    return result.error_code if isinstance(result, BrokerError) else None


def formed(*members: str, protocols: tuple[str, ...] = ("range",)) -> Group:
    """A client-assigned group whose members joined together; waiting for its leader's SyncGroup."""
    g = Group()
    for mid in members:
        assert g.join(mid, kafka(*protocols), new=True) is None
    g.complete()
    assert g.m.state is GroupState.COMPLETING_REBALANCE
    return g


def stable(*members: str) -> Group:
    g = formed(*members)
    plan = g.sync(g.m.leader_id or "", g.m.generation_id, {mid: mid.encode() for mid in members})
    assert isinstance(plan, AssignmentPlan)
    g.store(plan)
    assert g.m.state is GroupState.STABLE
    return g


# ---- the join phase ------------------------------------------------------------------------------------------


def test_join_completes_with_the_leader_holding_every_members_metadata() -> None:
    g = Group()
    assert g.join("a", kafka(), new=True) is None and g.join("b", kafka(), new=True) is None
    answers = g.complete()
    assert g.stored is not None and g.stored.awaiting_sync and g.stored.protocol_type == "consumer"
    a, b = answers["a"], answers["b"]
    assert (a.generation_id, a.protocol, a.leader_id, a.protocol_type) == (1, "range", "a", "consumer")
    assert [(i.member_id, i.metadata) for i in a.member_metadata] == [("a", SUB + b"range"), ("b", SUB + b"range")]
    assert b.member_metadata == () and b.leader_id == "a"
    assert g.m.state is GroupState.COMPLETING_REBALANCE
    # heartbeats are answered while the leader computes the assignment
    assert g.m.heartbeat("b", 1, g.now) is None


def test_the_protocol_is_the_one_every_member_supports_that_most_prefer() -> None:
    g = Group()
    assert g.join("a", kafka("cooperative-sticky", "range"), new=True) is None
    assert g.join("b", kafka("range", "cooperative-sticky"), new=True) is None
    assert g.join("c", kafka("range"), new=True) is None
    assert g.complete()["a"].protocol == "range"  # the only common one
    assert code(g.join("d", kafka("roundrobin"), new=True)) is ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_a_group_is_either_broker_assigned_or_leader_assigned() -> None:
    g = formed("a")
    http_join = g.join("h", None, new=True)
    assert code(http_join) is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    h = Group()
    assert h.join("h", None, new=True) is None
    h.complete()
    assert h.m.state is GroupState.STABLE and h.m.protocol_type is None
    assert code(h.join("k", kafka(), new=True)) is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # an empty group takes either kind: the HTTP member leaves, a Kafka member forms the next generation
    assert h.m.leave("h", h.now) is None
    h.complete()
    assert h.m.state is GroupState.EMPTY
    assert h.join("k", kafka(), new=True) is None
    h.complete()
    assert h.m.state is GroupState.COMPLETING_REBALANCE and h.m.protocol_type == "consumer"


# ---- the sync phase ------------------------------------------------------------------------------------------


def test_followers_wait_for_the_leaders_assignment_which_is_stored_first() -> None:
    g = formed("a", "b")
    assert g.sync("b", 1) is None  # the follower waits
    plan = g.sync("a", 1, {"a": b"A", "b": b"B"})
    assert isinstance(plan, AssignmentPlan) and plan.generation_id == 1
    assert g.sync("a", 1, {"a": b"A", "b": b"B"}) is None  # a retried leader sync waits for the same store
    assert g.m.state is GroupState.COMPLETING_REBALANCE  # prepare, then complete: nothing changes before apply
    answers = g.store(plan)
    assert {mid: a.assignment for mid, a in answers.items()} == {"a": b"A", "b": b"B"}
    assert g.m.state is GroupState.STABLE and g.stored is not None and not g.stored.awaiting_sync
    # in a Stable group a sync answers the member's assignment at once
    again = g.sync("b", 1)
    assert isinstance(again, SyncAnswer) and again.assignment == b"B"


def test_sync_errors_as_kafka_answers_them() -> None:
    g = formed("a", "b")
    assert code(g.sync("x", 1)) is ErrorCode.UNKNOWN_MEMBER_ID
    assert code(g.sync("b", 0)) is ErrorCode.ILLEGAL_GENERATION
    assert g.join("c", kafka(), new=True) is None  # a new member: a rebalance is prepared
    assert code(g.sync("b", 1)) is ErrorCode.REBALANCE_IN_PROGRESS
    assert code(g.m.heartbeat("b", 1, g.now)) is ErrorCode.REBALANCE_IN_PROGRESS


def test_members_left_out_by_the_leader_get_an_empty_assignment_and_consumer_bytes_are_decoded() -> None:
    g = formed("a", "b")
    plan = g.sync("a", 1, {"a": encode_assignment([TP("t", 0), TP("t", 1)])})
    assert isinstance(plan, AssignmentPlan)
    answers = g.store(plan)
    assert answers["b"].assignment == b""
    assert g.stored is not None and g.stored.member("a") is not None
    assert g.stored.member("a").assignment == (TP("t", 0), TP("t", 1))  # type: ignore[union-attr]
    assert g.m.describe()["members"][0]["assignment"] == [{"topic": "t", "partition": 0},
                                                          {"topic": "t", "partition": 1}]  # fmt: skip


def test_the_leader_leaving_before_its_sync_starts_a_new_rebalance() -> None:
    g = formed("a", "b")
    assert g.m.leave("a", g.now) is None
    assert g.m.state is GroupState.PREPARING_REBALANCE
    assert code(g.sync("b", 1)) is ErrorCode.REBALANCE_IN_PROGRESS
    assert g.join("b", kafka()) is None
    answers = g.complete()
    assert answers["b"].generation_id == 2 and answers["b"].leader_id == "b"


def test_a_member_that_neither_syncs_nor_heartbeats_expires() -> None:
    g = formed("a", "b")
    g.now += SESSION // 2
    assert g.m.heartbeat("a", 1, g.now) is None
    g.now += SESSION // 2
    assert g.m.tick(g.now, {"t": 4}) == ["b"]
    assert g.m.state is GroupState.PREPARING_REBALANCE


def test_a_store_that_fails_sends_everyone_back_to_rejoin() -> None:
    g = formed("a", "b")
    assert isinstance(g.sync("a", 1, {"a": b"A"}), AssignmentPlan)
    g.m.assignment_failed(g.now)
    assert g.m.state is GroupState.PREPARING_REBALANCE and g.m.storing_assignment is None


def test_an_assignment_stored_after_a_rebalance_began_answers_nobody() -> None:
    g = formed("a", "b")
    plan = g.sync("a", 1, {"a": b"A", "b": b"B"})
    assert isinstance(plan, AssignmentPlan)
    assert g.join("c", kafka(), new=True) is None
    assert g.store(plan) == {} and g.m.state is GroupState.PREPARING_REBALANCE


def test_a_plain_commit_waits_for_the_leaders_assignment() -> None:
    g = formed("a", "b")
    assert code(g.m.validate_commit("a", 1, transactional=False)) is ErrorCode.REBALANCE_IN_PROGRESS
    s = stable("a", "b")
    assert s.m.validate_commit("a", 1, transactional=False) is None


# ---- rejoins ------------------------------------------------------------------------------------------------


def test_rejoins_with_unchanged_protocols() -> None:
    g = formed("a", "b")
    again = g.join("b", kafka())  # while the leader syncs: the same generation at once
    assert isinstance(again, JoinAnswer) and again.generation_id == 1 and again.member_metadata == ()
    leader_again = g.join("a", kafka())
    assert isinstance(leader_again, JoinAnswer) and len(leader_again.member_metadata) == 2
    s = stable("a", "b")
    follower = s.join("b", kafka())
    assert isinstance(follower, JoinAnswer) and s.m.state is GroupState.STABLE
    # the leader rejoining a Stable group rebalances it (its metadata view changed), as in Kafka
    assert s.join("a", kafka()) is None and s.m.state is GroupState.PREPARING_REBALANCE
    # changed protocols rebalance too
    t = stable("a", "b")
    assert t.join("b", kafka("range", "roundrobin")) is None and t.m.state is GroupState.PREPARING_REBALANCE


def test_kip394_member_ids_are_handed_out_and_expire() -> None:
    g = Group()
    assert code(g.join("cid-1", kafka())) is ErrorCode.UNKNOWN_MEMBER_ID  # never handed out
    g.m.add_pending("cid-1", SESSION, g.now)
    assert not g.m.idle and g.m.next_deadline() == SESSION
    assert g.join("cid-1", kafka()) is None and "cid-1" not in g.m.pending
    g.m.add_pending("cid-2", SESSION, g.now)
    g.now += SESSION
    g.m.tick(g.now, {"t": 4})
    assert code(g.join("cid-2", kafka())) is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_static_members_new_incarnation_replaces_the_old_one_kip345() -> None:
    g = Group()
    assert g.join("a-1", kafka(instance="a"), new=True) is None and g.join("b", kafka(), new=True) is None
    g.complete()
    plan = g.sync("a-1", 1, {"a-1": b"A", "b": b"B"})
    assert isinstance(plan, AssignmentPlan)
    g.store(plan)
    # instance "a" restarts under a new member id: the old one is gone at once, not after its session timeout
    assert g.join("a-2", kafka(instance="a"), new=True) is None
    assert set(g.m.members) == {"a-2", "b"} and g.m.state is GroupState.PREPARING_REBALANCE
    assert code(g.m.heartbeat("a-1", 1, g.now)) is ErrorCode.UNKNOWN_MEMBER_ID
    assert g.join("b", kafka()) is None
    answers = g.complete()
    assert set(answers) == {"a-2", "b"} and answers["b"].generation_id == 2


# ---- failover, storage, transitions -------------------------------------------------------------------------


def test_a_new_coordinator_resumes_a_generation_waiting_for_its_assignment() -> None:
    g = formed("a", "b")
    assert g.stored is not None
    m = GroupMembership.from_metadata(g.stored, 50_000)
    assert m.state is GroupState.COMPLETING_REBALANCE and m.protocol_type == "consumer"
    plan = m.sync("a", 1, (("a", b"A"),), 50_000)
    assert isinstance(plan, AssignmentPlan)
    after = GroupMembership.from_metadata(stable("a", "b").stored, 0)  # type: ignore[arg-type]
    assert after.state is GroupState.STABLE and after.sync_answer("b").assignment == b"b"


def test_store_assignment_is_fenced_by_generation() -> None:
    g = stable("a", "b")
    assert g.stored is not None
    stale = StoreAssignment(group_id="g", generation_id=0, assignments=(), now_ms=0, coordinator_epoch=1)
    assert code(group_rules.store_assignment(_View(g.stored), stale).result) is ErrorCode.ILLEGAL_GENERATION
    twice = replace(stale, generation_id=1)
    assert code(group_rules.store_assignment(_View(g.stored), twice).result) is ErrorCode.REBALANCE_IN_PROGRESS


def test_kafka_members_round_trip_through_storage_and_commands() -> None:
    g = stable("a", "b")
    assert g.stored is not None
    assert decode_group(encode_group(g.stored), where="test") == g.stored
    cmd = StoreAssignment(group_id="g", generation_id=3, assignments=(("a", b"\x00\xff"),), now_ms=5,
                          coordinator_epoch=2)  # fmt: skip
    assert decode_group_command(encode_group_command(cmd)) == cmd
    member = g.stored.members[0]
    assert (member.client_id, member.client_host, member.protocols[0][0]) == ("cid", "10.0.0.1", "range")
    # an HTTP group's record has none of the Kafka fields
    http_group = GroupMetadata("h", 1, "range", "m", (MemberMetadata("m", ("t",), "range", 1, 1),), (("t", 4),), 0)
    raw = encode_group(http_group)
    assert b"protocol_type" not in raw and b"protocols" not in raw
    assert decode_group(raw, where="test") == http_group


def test_completing_rebalance_transitions() -> None:
    validate_group_transition("g", GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE)
    validate_group_transition("g", GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
    validate_group_transition("g", GroupState.COMPLETING_REBALANCE, GroupState.PREPARING_REBALANCE)
    for old, new in [(GroupState.EMPTY, GroupState.COMPLETING_REBALANCE),
                     (GroupState.STABLE, GroupState.COMPLETING_REBALANCE),
                     (GroupState.COMPLETING_REBALANCE, GroupState.EMPTY)]:  # fmt: skip
        with pytest.raises(IllegalGroupTransitionError, match=f"{old} -> {new}"):
            validate_group_transition("g", old, new)


def test_consumer_protocol_bytes() -> None:
    assert decode_subscription(encode_subscription(["b", "a", "a"])) == ("a", "b")
    tps = [TP("t", 2), TP("t", 0), TP("u", 1)]
    assert decode_assignment(encode_assignment(tps)) == tuple(sorted(tps))
    assert decode_assignment(b"") == ()
    for bad in (b"\x00", encode_subscription(["topic"])[:-6], b"\x00\x00\x7f\xff\xff\xff"):
        with pytest.raises(ConsumerProtocolError):
            decode_subscription(bad)


class _OffsetsView(_View):
    def __init__(self, stored: GroupMetadata | None, committed: set[TP]) -> None:
        super().__init__(stored)
        self.offsets = committed

    def committed(self, group_id: str, tp: TP) -> object:
        return tp if tp in self.offsets else None

    def committed_of(self, group_id: str) -> list[TP]:
        return sorted(self.offsets)

    def has_pending(self, group_id: str) -> bool:
        return False


def test_offset_delete_spares_subscribed_topics_and_needs_a_known_group() -> None:
    g = stable("a")
    cmd = DeleteOffsets(group_id="g", partitions=(("t", 0), ("u", 1), ("u", 2)), now_ms=0, coordinator_epoch=1)
    change = group_rules.delete_offsets(_OffsetsView(g.stored, {TP("t", 0), TP("u", 1)}), cmd)
    assert change.result == group_rules.OffsetsDeleted("g", 1, (TP("t", 0),))
    assert change.committed == {("g", TP("u", 1)): None}  # a partition without an offset is not written
    unknown = group_rules.delete_offsets(_OffsetsView(None, set()), cmd)
    assert code(unknown.result) is ErrorCode.GROUP_ID_NOT_FOUND and not unknown.committed
    assert decode_group_command(encode_group_command(cmd)) == cmd


# ---- a model: random joins, syncs, heartbeats, leaves and clock steps ------------------------------------------


class ClientGroupModel(RuleBasedStateMachine):
    """Kafka's invariants for a client-assigned group: generations only grow, every answer is of the current
    generation, a Stable group's members all hold the leader's assignment, and nothing is answered twice."""

    def __init__(self) -> None:
        super().__init__()
        self.g = Group()
        self.ids = itertools.count()
        self.generation = 0
        self.storing: AssignmentPlan | None = None

    @rule()
    def join_new(self) -> None:
        assert self.g.join(f"m{next(self.ids)}", kafka(), new=True) is None

    @rule(data=st.data())
    @precondition(lambda self: self.g.m.members)
    def rejoin(self, data: st.DataObject) -> None:
        result = self.g.join(data.draw(st.sampled_from(sorted(self.g.m.members))), kafka())
        assert result is None or (isinstance(result, JoinAnswer) and result.generation_id == self.generation)

    @rule(data=st.data())
    @precondition(lambda self: self.g.m.members)
    def sync(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(sorted(self.g.m.members)))
        out = self.g.sync(mid, self.generation, {m: m.encode() for m in self.g.m.members})
        if isinstance(out, AssignmentPlan):
            assert self.storing is None and mid == self.g.m.leader_id
            self.storing = out
        elif isinstance(out, SyncAnswer):
            assert self.g.m.state is GroupState.STABLE and out.generation_id == self.generation
        elif out is not None:
            assert code(out) in (ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION)

    @rule()
    @precondition(lambda self: self.storing is not None)
    def store(self) -> None:
        assert self.storing is not None
        plan, self.storing = self.storing, None
        if self.g.stored is None or self.g.stored.generation_id != plan.generation_id:
            self.g.m.assignment_failed(self.g.now)
            return
        answers = self.g.store(plan)
        assert all(a.generation_id == self.generation for a in answers.values())

    @rule(data=st.data())
    @precondition(lambda self: self.g.m.members)
    def leave(self, data: st.DataObject) -> None:
        assert self.g.m.leave(data.draw(st.sampled_from(sorted(self.g.m.members))), self.g.now) is None

    @rule(ms=st.integers(0, 2 * SESSION))
    def advance(self, ms: int) -> None:
        self.g.now += ms
        self.g.m.tick(self.g.now, {"t": 4})

    @rule()
    @precondition(lambda self: self.g.m.ready(self.g.now) and self.storing is None)
    def complete(self) -> None:
        answers = self.g.complete()
        self.generation += 1
        assert all(a.generation_id == self.generation for a in answers.values())
        leaders = [a for a in answers.values() if a.member_metadata]
        assert len(leaders) <= 1 and all(a.member_id == a.leader_id for a in leaders)

    @invariant()
    def consistent(self) -> None:
        m = self.g.m
        assert m.generation_id == self.generation
        if m.state is GroupState.EMPTY:
            assert not m.members
        if m.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            assert m.members and m.leader_id in m.members and m.protocol == "range"
        if m.state is GroupState.STABLE:
            assert all(x.meta.assignment_data == mid.encode() for mid, x in m.members.items())


TestClientGroupModel = ClientGroupModel.TestCase
TestClientGroupModel.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
