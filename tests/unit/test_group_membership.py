"""Live group membership with a fake clock: joins, rebalances, heartbeats, session and rebalance timeouts.

The rules are Kafka's classic group protocol (GroupCoordinator: handleJoinGroup, handleHeartbeat,
onExpireHeartbeat, onCompleteJoin), with the assignment computed by the coordinator.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from clients.protocol import BrokerError, ErrorCode
from coordinator.group_membership import GroupMembership, JoinAnswer
from coordinator.group_metadata import GroupMetadata
from coordinator.group_states import VALID_PREVIOUS, GroupState, IllegalGroupTransitionError, validate_group_transition
from coordinator.metadata import TopicPartition as TP

COUNTS = {"t": 4}
SESSION = 1000
REBALANCE = 5000


@dataclass
class Harness:
    """A coordinator around one membership: replicates plans with generation = previous + 1."""

    m: GroupMembership = field(default_factory=lambda: GroupMembership("g"))
    now: int = 0
    stored: GroupMetadata | None = None
    counts: dict[str, int] = field(default_factory=lambda: dict(COUNTS))

    def join(self, member: str, new: bool = False, topics: tuple[str, ...] = ("t",),
             protocol: str = "range", session: int = SESSION) -> JoinAnswer | BrokerError | None:  # fmt: skip
        return self.m.join(member, new=new, topics=topics, protocol=protocol, session_timeout_ms=session,
                           rebalance_timeout_ms=REBALANCE, now_ms=self.now)  # fmt: skip

    def complete(self) -> dict[str, JoinAnswer]:
        plan = self.m.begin_completion(self.now, self.counts)
        gen = (self.stored.generation_id if self.stored else 0) + 1
        self.stored = GroupMetadata("g", gen, plan.protocol, plan.leader_id, plan.members, plan.topic_partitions,
                                    self.now)  # fmt: skip
        return {a.member_id: a for a in self.m.complete(self.stored, self.now)}

    def tick(self, advance: int = 0) -> list[str]:
        self.now += advance
        return self.m.tick(self.now, self.counts)


def code(result: object) -> ErrorCode | None:
    return result.error_code if isinstance(result, BrokerError) else None


def formed(*members: str) -> Harness:
    """A Stable group whose members joined together (one generation)."""
    h = Harness()
    for mid in members:
        assert h.join(mid, new=True) is None
    assert h.m.ready(h.now)
    h.complete()
    assert h.m.state is GroupState.STABLE
    return h


def test_first_member_of_an_empty_group_gets_every_partition_at_once() -> None:
    h = Harness()
    assert h.join("a", new=True) is None
    assert h.m.state is GroupState.PREPARING_REBALANCE and h.m.ready(0)
    answers = h.complete()
    assert answers["a"].generation_id == 1 and set(answers["a"].assignment) == {TP("t", p) for p in range(4)}
    assert answers["a"].leader_id == "a" and answers["a"].members == ("a",)
    assert h.m.state is GroupState.STABLE


def test_new_member_waits_until_every_known_member_rejoined() -> None:
    h = formed("a")
    assert h.join("b", new=True) is None
    assert h.m.state is GroupState.PREPARING_REBALANCE and not h.m.ready(h.now)
    assert code(h.m.heartbeat("a", 1, h.now)) is ErrorCode.REBALANCE_IN_PROGRESS
    assert h.join("a") is None
    assert h.m.ready(h.now)
    answers = h.complete()
    assert {a.generation_id for a in answers.values()} == {2}
    assert set(answers["a"].assignment).isdisjoint(answers["b"].assignment)
    assert set(answers["a"].assignment) | set(answers["b"].assignment) == {TP("t", p) for p in range(4)}
    assert h.m.heartbeat("a", 2, h.now) is None and h.m.heartbeat("b", 2, h.now) is None


def test_retried_join_of_a_stable_member_answers_at_once_without_rebalancing() -> None:
    h = formed("a", "b")
    answer = h.join("a")
    assert isinstance(answer, JoinAnswer) and answer.generation_id == 1 and h.m.state is GroupState.STABLE
    # a changed subscription is a new rebalance
    assert h.join("a", topics=("t", "u")) is None and h.m.state is GroupState.PREPARING_REBALANCE


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda h: h.join("ghost"), ErrorCode.UNKNOWN_MEMBER_ID),
        (lambda h: h.join("c", new=True, protocol="roundrobin"), ErrorCode.INCONSISTENT_GROUP_PROTOCOL),
        (lambda h: h.join("c", new=True, protocol="sticky"), ErrorCode.INVALID_REQUEST),
        (lambda h: h.m.heartbeat("ghost", 1, 0), ErrorCode.UNKNOWN_MEMBER_ID),
        (lambda h: h.m.heartbeat("a", 0, 0), ErrorCode.ILLEGAL_GENERATION),
        (lambda h: h.m.leave("ghost", 0), ErrorCode.UNKNOWN_MEMBER_ID),
        (lambda h: h.m.validate_commit("a", 0, transactional=True), ErrorCode.ILLEGAL_GENERATION),
        (lambda h: h.m.validate_commit("ghost", 1, transactional=False), ErrorCode.UNKNOWN_MEMBER_ID),
        (lambda h: h.m.validate_commit("", -1, transactional=False), ErrorCode.UNKNOWN_MEMBER_ID),
    ],
)
def test_refused_requests_change_nothing(call: object, expected: ErrorCode) -> None:
    h = formed("a", "b")
    before = (h.m.state, h.m.generation_id, h.m.describe())
    assert code(call(h)) is expected  # type: ignore[operator]
    assert (h.m.state, h.m.generation_id, h.m.describe()) == before


def test_a_sole_member_may_switch_protocol_and_identity_free_txn_commits_pass() -> None:
    h = formed("a")
    assert h.join("a", protocol="roundrobin") is None  # no other member disagrees
    assert h.m.validate_commit("", -1, transactional=True) is None  # KIP-447 compatibility path


def test_member_that_stops_heartbeating_is_removed_after_its_session_timeout() -> None:
    h = formed("a", "b")
    h.now = 600
    assert h.m.heartbeat("a", 1, h.now) is None
    assert h.tick(399) == []  # b's session (1000 ms from its completion at t=0) has not run out
    assert h.tick(1) == ["b"]  # t=1000
    assert h.m.state is GroupState.PREPARING_REBALANCE and set(h.m.members) == {"a"}
    assert code(h.m.heartbeat("b", 1, h.now)) is ErrorCode.UNKNOWN_MEMBER_ID
    assert code(h.m.heartbeat("a", 1, h.now)) is ErrorCode.REBALANCE_IN_PROGRESS
    assert h.join("a") is None and h.m.ready(h.now)
    answers = h.complete()
    assert answers["a"].generation_id == 2 and len(answers["a"].assignment) == 4


def test_member_waiting_in_a_join_does_not_expire() -> None:
    h = formed("a", "b")
    assert h.join("a", topics=("t", "u")) is None
    assert h.tick(10 * SESSION) == ["b"]  # b neither heartbeats nor rejoins; a waits in its join
    assert set(h.m.members) == {"a"} and h.m.ready(h.now)


def test_members_that_do_not_rejoin_are_dropped_when_the_rebalance_timeout_passes() -> None:
    h = formed("a", "b")
    assert h.join("c", new=True) is None
    for _ in range(REBALANCE // 500 - 1):  # a and b keep heartbeating, but never rejoin
        h.now += 500
        assert code(h.m.heartbeat("a", 1, h.now)) is ErrorCode.REBALANCE_IN_PROGRESS
        assert code(h.m.heartbeat("b", 1, h.now)) is ErrorCode.REBALANCE_IN_PROGRESS
        assert h.tick() == [] and not h.m.ready(h.now)
    h.now += 500
    assert h.m.ready(h.now)
    plan = h.m.begin_completion(h.now, COUNTS)
    assert plan.removed == ("a", "b") and [m.member_id for m in plan.members] == ["c"]


def test_last_member_leaving_empties_the_group_with_a_new_generation() -> None:
    h = formed("a")
    assert h.m.leave("a", h.now) is None
    assert h.m.state is GroupState.PREPARING_REBALANCE and h.m.ready(h.now)
    assert h.complete() == {}
    assert h.m.state is GroupState.EMPTY and h.m.generation_id == 2 and h.stored is not None
    assert h.stored.members == () and h.stored.protocol is None


def test_joins_and_leaves_while_a_plan_is_replicated_start_the_next_rebalance() -> None:
    h = formed("a", "b")
    assert h.join("c", new=True) is None
    assert h.join("a") is None and h.join("b") is None and h.m.ready(h.now)
    plan = h.m.begin_completion(h.now, COUNTS)
    assert [m.member_id for m in plan.members] == ["a", "b", "c"]
    # While StoreGroup is in flight: d joins and b leaves
    assert h.join("d", new=True) is None
    assert h.m.leave("b", h.now) is None
    gen = 2
    stored = GroupMetadata("g", gen, plan.protocol, plan.leader_id, plan.members, plan.topic_partitions, h.now)
    answers = {a.member_id: a for a in h.m.complete(stored, h.now)}
    assert set(answers) == {"a", "c"}  # b left, d waits for the next generation
    assert h.m.state is GroupState.PREPARING_REBALANCE and set(h.m.members) == {"a", "c", "d"}
    assert h.m.members["d"].joined and not h.m.ready(h.now)  # a and c must rejoin


def test_failed_replication_sends_every_member_back_to_rejoin() -> None:
    h = formed("a")
    assert h.join("b", new=True) is None and h.join("a") is None
    h.m.begin_completion(h.now, COUNTS)
    h.m.completion_failed(h.now)
    assert h.m.state is GroupState.PREPARING_REBALANCE and h.m.generation_id == 1
    assert not h.m.ready(h.now) and not any(m.joined for m in h.m.members.values())
    assert h.join("a") is None and h.join("b") is None and h.m.ready(h.now)


def test_a_subscribed_topic_growing_starts_a_rebalance() -> None:
    h = formed("a", "b")
    assert h.tick(10) == [] and h.m.state is GroupState.STABLE
    h.counts["t"] = 6
    h.tick()
    assert h.m.state is GroupState.PREPARING_REBALANCE


def test_initial_rebalance_delay_gathers_members_starting_together() -> None:
    h = Harness(m=GroupMembership("g", initial_rebalance_delay_ms=300))
    assert h.join("a", new=True) is None and not h.m.ready(0)
    h.now = 200
    assert h.join("b", new=True) is None and not h.m.ready(h.now)  # each join extends the delay
    assert not h.m.ready(499) and h.m.ready(500)
    h.now = 500
    assert set(h.complete()) == {"a", "b"}


def test_a_new_coordinator_resumes_the_stored_generation_with_fresh_session_timers() -> None:
    h = formed("a", "b")
    assert h.stored is not None
    m = GroupMembership.from_metadata(h.stored, 50_000)
    assert m.state is GroupState.STABLE and m.generation_id == 1
    assert m.heartbeat("a", 1, 50_500) is None
    assert m.tick(50_999, COUNTS) == [] and m.tick(51_000, COUNTS) == ["b"]


@pytest.mark.parametrize(("old", "new"), list(itertools.product(GroupState, GroupState)))
def test_transition_table(old: GroupState, new: GroupState) -> None:
    if old in VALID_PREVIOUS[new]:
        validate_group_transition("g", old, new)
    else:
        with pytest.raises(IllegalGroupTransitionError, match=f"{old} -> {new}"):
            validate_group_transition("g", old, new)


class MembershipModel(RuleBasedStateMachine):
    """Random joins, heartbeats, leaves, clock jumps and completions against the protocol's invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.ids = itertools.count()
        self.generation = 0

    @rule()
    def join_new(self) -> None:
        assert self.h.join(f"m{next(self.ids)}", new=True) is None

    @rule(data=st.data())
    @precondition(lambda self: self.h.m.members)
    def rejoin(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(sorted(self.h.m.members)))
        result = self.h.join(mid)
        assert result is None or (isinstance(result, JoinAnswer) and result.generation_id == self.generation)

    @rule(data=st.data())
    @precondition(lambda self: self.h.m.members)
    def heartbeat(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(sorted(self.h.m.members)))
        err = self.h.m.heartbeat(mid, self.generation, self.h.now)
        assert code(err) in (None, ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION)
        assert (code(err) is ErrorCode.REBALANCE_IN_PROGRESS) == (
            self.h.m.state is GroupState.PREPARING_REBALANCE and self.h.m.generation_id == self.generation
        )

    @rule(data=st.data())
    @precondition(lambda self: self.h.m.members)
    def leave(self, data: st.DataObject) -> None:
        assert self.h.m.leave(data.draw(st.sampled_from(sorted(self.h.m.members))), self.h.now) is None

    @rule(ms=st.integers(0, 3 * SESSION))
    def advance(self, ms: int) -> None:
        before = set(self.h.m.members)
        expired = self.h.tick(ms)
        assert set(expired) <= before and not set(expired) & set(self.h.m.members)

    @rule(fail=st.booleans())
    @precondition(lambda self: self.h.m.ready(self.h.now))
    def complete(self, fail: bool) -> None:
        if fail:
            self.h.m.begin_completion(self.h.now, COUNTS)
            self.h.m.completion_failed(self.h.now)
            return
        answers = self.h.complete()
        self.generation += 1
        assert all(a.generation_id == self.generation for a in answers.values())
        given = [tp for a in answers.values() for tp in a.assignment]
        assert len(given) == len(set(given))
        if answers and self.h.m.state is GroupState.STABLE:
            assert set(given) == {TP("t", p) for p in range(4)}

    @invariant()
    def consistent(self) -> None:
        m = self.h.m
        assert m.generation_id == self.generation
        assert m.completing is None
        if m.state is GroupState.EMPTY:
            assert not m.members
        if m.state is GroupState.STABLE:
            assert m.members and not any(x.joined for x in m.members.values())
            given = [tp for x in m.members.values() for tp in x.meta.assignment]
            assert len(given) == len(set(given))


TestMembershipModel = MembershipModel.TestCase
TestMembershipModel.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
