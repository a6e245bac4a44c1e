"""Quiescence rules (raft.quiescence) on a fake clock: when a group stops heartbeating, and what wakes it."""

from __future__ import annotations

import dataclasses

import pytest

from raft.quiescence import (
    VALID_PREVIOUS,
    InvalidQuiescenceTransition,
    LeaderView,
    QuiesceMark,
    Quiescence,
    QuiescenceState,
    WakeReason,
    accept_mark,
    begin_quiescing,
    follower_accepts_mark,
    follower_may_campaign,
    follower_wake_reason,
    follower_wakes_on_message,
    leader_contact,
    leader_should_quiesce,
    leader_wake_reason,
    leader_wakes_on_message,
    leave_out_unreachable,
    node_alive,
    quiescing_followers,
    record_ack,
)

LIVENESS = 0.6
AFTER = 1.0
F1, F2, LEADER = "n1:1", "n2:1", "n0:1"
MARK = QuiesceMark(term=3, last_index=40, last_term=3, commit_index=40)


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def _view(**overrides: object) -> LeaderView:
    base = LeaderView(
        term=3,
        last_index=40,
        last_term=3,
        commit_index=40,
        last_applied=40,
        queued_commands=0,
        match_index={F1: 40, F2: 40},
        follower_heard={F1: 99.9, F2: 99.95},
        connected=frozenset({F1, F2}),
        has_learners=False,
        change_pending=False,
        transfer_in_progress=False,
        ready=True,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def _quiescing(followers: frozenset[str] = frozenset({F1, F2})) -> Quiescence:
    q = Quiescence()
    begin_quiescing(q, MARK, followers)
    return q


def _quiescent_leader() -> Quiescence:
    q = _quiescing()
    record_ack(q, F1, 3, 40, [F1, F2])
    record_ack(q, F2, 3, 40, [F1, F2])
    return q


def _quiescent_follower() -> Quiescence:
    q = Quiescence()
    accept_mark(q, LEADER, MARK)
    return q


# --- transition table ------------------------------------------------------------------------


def test_every_state_is_reachable_and_the_table_names_both_states_on_a_bad_transition() -> None:
    assert set(VALID_PREVIOUS) == set(QuiescenceState)
    q = Quiescence()
    with pytest.raises(InvalidQuiescenceTransition, match="ACTIVE -> ACTIVE"):
        q.transition_to(QuiescenceState.ACTIVE)
    begin_quiescing(q, MARK)
    with pytest.raises(InvalidQuiescenceTransition, match="QUIESCING -> QUIESCING"):
        q.transition_to(QuiescenceState.QUIESCING)


def test_wake_returns_to_active_forgets_the_mark_and_says_whether_anything_changed() -> None:
    q = _quiescent_leader()
    assert q.wake(WakeReason.PROPOSAL)
    assert q.state is QuiescenceState.ACTIVE and q.mark is None and not q.acked
    assert q.last_wake is WakeReason.PROPOSAL
    assert not q.wake(WakeReason.PEER_LAPSED)  # already active
    assert q.last_wake is WakeReason.PROPOSAL


# --- node liveness ----------------------------------------------------------------------------


def test_a_node_is_alive_only_within_the_timeout_after_its_last_heartbeat() -> None:
    assert not node_alive(100.0, None, LIVENESS)
    assert node_alive(100.0, 99.5, LIVENESS)
    assert not node_alive(100.0, 99.25, LIVENESS)
    assert not node_alive(1.0, 0.5, 0.5)  # exactly the timeout: lapsed


# --- leader: when to quiesce ------------------------------------------------------------------


def test_a_caught_up_committed_group_with_live_followers_is_idle() -> None:
    assert quiescing_followers(_view(), 100.0, LIVENESS) is not None


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"ready": False}, "barrier of the term not applied"),
        ({"queued_commands": 1}, "a proposal is queued"),
        ({"commit_index": 39}, "last entry not committed"),
        ({"last_applied": 39}, "last entry not applied"),
        ({"match_index": {F1: 40, F2: 39}}, "a follower is behind"),
        ({"match_index": {}}, "no follower known"),
        ({"connected": frozenset()}, "no follower connected: no majority reachable"),
        ({"follower_heard": {F1: 99.0, F2: 99.0}}, "both followers' nodes lapsed: no majority reachable"),
        ({"follower_heard": {F1: 99.9}, "match_index": {F1: 39, F2: 40}}, "the reachable follower is behind"),
        ({"has_learners": True}, "learners are being fed"),
        ({"change_pending": True}, "membership change uncommitted"),
        ({"transfer_in_progress": True}, "leadership transfer"),
    ],
)
def test_a_leader_with_anything_to_do_is_not_idle(overrides: dict[str, object], why: str) -> None:
    assert quiescing_followers(_view(**overrides), 100.0, LIVENESS) is None, why


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"connected": frozenset({F1})}, "F2's replica is not connected"),
        ({"follower_heard": {F1: 99.9, F2: 99.0}}, "F2's node lapsed"),
        ({"follower_heard": {F1: 99.9}}, "F2's node never heard"),
        ({"follower_heard": {F1: 99.9, F2: 99.0}, "match_index": {F1: 40, F2: 12}}, "F2 behind, but silent"),
    ],
)
def test_a_follower_on_a_silent_node_is_left_out_while_a_majority_is_caught_up(
    overrides: dict[str, object], why: str
) -> None:
    assert quiescing_followers(_view(**overrides), 100.0, LIVENESS) == frozenset({F1}), why
    assert quiescing_followers(_view(), 100.0, LIVENESS) == frozenset({F1, F2})


def test_five_voters_quiesce_past_two_silent_followers_but_not_three() -> None:
    f3, f4 = "n3:1", "n4:1"
    five = {
        "match_index": {F1: 40, F2: 40, f3: 40, f4: 40},
        "connected": frozenset({F1, F2, f3, f4}),
        "follower_heard": {F1: 99.9, F2: 99.9, f3: 99.9, f4: 99.9},
    }
    assert quiescing_followers(_view(**five), 100.0, LIVENESS) == frozenset({F1, F2, f3, f4})
    two_silent = {**five, "follower_heard": {F1: 99.9, F2: 99.9}}
    assert quiescing_followers(_view(**two_silent), 100.0, LIVENESS) == frozenset({F1, F2})
    three_silent = {**five, "follower_heard": {F1: 99.9}}
    assert quiescing_followers(_view(**three_silent), 100.0, LIVENESS) is None


def test_a_leader_quiesces_only_after_being_idle_for_the_whole_wait() -> None:
    clock = FakeClock()
    q = Quiescence()
    assert not leader_should_quiesce(q, True, clock.now, AFTER)
    assert not leader_should_quiesce(q, True, clock.advance(0.5), AFTER)
    assert not leader_should_quiesce(q, False, clock.advance(0.1), AFTER)  # a busy tick restarts the wait
    assert not leader_should_quiesce(q, True, clock.advance(0.1), AFTER)
    assert not leader_should_quiesce(q, True, clock.advance(0.9), AFTER)
    assert leader_should_quiesce(q, True, clock.advance(0.1), AFTER)


def test_only_an_active_leader_considers_quiescing() -> None:
    q = _quiescing()
    assert not leader_should_quiesce(q, True, 1e9, AFTER)


def test_the_group_is_quiescent_once_every_follower_acked_this_mark() -> None:
    q = _quiescing()
    assert q.quiet and q.state is QuiescenceState.QUIESCING
    assert not record_ack(q, F1, 3, 39, [F1, F2])  # an ack of an earlier mark
    assert not record_ack(q, F1, 2, 40, [F1, F2])  # an ack from an earlier term
    assert not record_ack(q, F1, 3, 40, [F1, F2])
    assert q.state is QuiescenceState.QUIESCING
    assert record_ack(q, F2, 3, 40, [F1, F2])
    assert q.state is QuiescenceState.QUIESCENT
    assert not record_ack(q, F2, 3, 40, [F1, F2])  # already quiescent: nothing changes


# --- leader: what wakes it -----------------------------------------------------------------


def _leader_wake(q: Quiescence, **overrides: object) -> WakeReason | None:
    args: dict[str, object] = {
        "is_leader": True,
        "term": 3,
        "last_index": 40,
        "queued_commands": 0,
        "followers_alive": True,
        "followers_connected": True,
        "membership_busy": False,
    }
    args.update(overrides)
    return leader_wake_reason(q, **args)  # type: ignore[arg-type]


def test_a_quiet_leader_with_nothing_new_stays_quiet() -> None:
    assert _leader_wake(_quiescent_leader()) is None
    assert _leader_wake(_quiescing()) is None
    assert _leader_wake(Quiescence()) is None  # active: nothing to wake


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"queued_commands": 1}, WakeReason.PROPOSAL),
        ({"last_index": 41}, WakeReason.PROPOSAL),
        ({"is_leader": False}, WakeReason.ROLE_CHANGED),
        ({"term": 4}, WakeReason.ROLE_CHANGED),
        ({"membership_busy": True}, WakeReason.MEMBERSHIP),
        ({"followers_connected": False}, WakeReason.DISCONNECTED),
        ({"followers_alive": False}, WakeReason.PEER_LAPSED),
    ],
)
def test_a_quiet_leader_wakes_on_proposals_role_changes_membership_and_lapsed_peers(
    overrides: dict[str, object], reason: WakeReason
) -> None:
    assert _leader_wake(_quiescent_leader(), **overrides) is reason


def test_a_quiet_leader_leaves_out_a_follower_that_falls_silent_while_a_majority_remains() -> None:
    q = _quiescent_leader()
    assert leave_out_unreachable(q, frozenset({F1}), 3)
    assert q.followers == frozenset({F1}) and q.state is QuiescenceState.QUIESCENT
    assert _leader_wake(q) is None  # the followers it kept are alive and connected
    # the other follower too: no majority left, nothing changes and the caller wakes the group
    assert not leave_out_unreachable(q, frozenset(), 3)
    assert q.followers == frozenset({F1})
    assert _leader_wake(q, followers_alive=False) is WakeReason.PEER_LAPSED


def test_leaving_out_the_last_follower_a_quiescing_leader_waited_for_makes_it_quiescent() -> None:
    q = _quiescing()
    record_ack(q, F1, 3, 40, q.followers)
    assert q.state is QuiescenceState.QUIESCING
    assert leave_out_unreachable(q, frozenset({F1}), 3)
    assert q.state is QuiescenceState.QUIESCENT and q.followers == frozenset({F1})


def test_a_left_out_follower_reachable_again_wakes_the_leader_to_catch_it_up() -> None:
    q = _quiescing(frozenset({F1}))
    assert record_ack(q, F1, 3, 40, q.followers)
    assert q.state is QuiescenceState.QUIESCENT
    assert _leader_wake(q) is None
    assert _leader_wake(q, left_out_reachable=True) is WakeReason.PEER_RETURNED
    assert q.wake(WakeReason.PEER_RETURNED) and q.followers == frozenset()


def test_a_late_answer_to_the_last_heartbeat_does_not_wake_a_quiet_leader() -> None:
    q = _quiescent_leader()
    assert not leader_wakes_on_message(q, "next_node_idx", success=True, reset=False, next_index=41)


@pytest.mark.parametrize(
    ("kind", "success", "reset", "next_index"),
    [
        ("next_node_idx", True, True, 41),  # a follower asks to start over
        ("next_node_idx", False, False, 41),  # an append it refused
        ("next_node_idx", True, False, 30),  # a follower behind the mark
        ("txb_wake", False, False, 0),  # a follower refused the mark
        ("txb_pre_vote", False, False, 0),
        ("request_vote", False, False, 0),
    ],
)
def test_a_follower_asking_for_entries_or_votes_wakes_a_quiet_leader(
    kind: str, success: bool, reset: bool, next_index: int
) -> None:
    assert leader_wakes_on_message(_quiescent_leader(), kind, success=success, reset=reset, next_index=next_index)
    assert not leader_wakes_on_message(Quiescence(), kind, success=success, reset=reset, next_index=next_index)


# --- follower ---------------------------------------------------------------------------------


def _accepts(**overrides: object) -> bool:
    args: dict[str, object] = {
        "sender": LEADER,
        "leader": LEADER,
        "term": 3,
        "last_term": 3,
        "last_index": 40,
        "commit_index": 40,
        "mark": MARK,
    }
    args.update(overrides)
    return follower_accepts_mark(**args)  # type: ignore[arg-type]


def test_a_follower_accepts_its_leaders_mark_when_its_log_ends_at_the_same_entry() -> None:
    assert _accepts()


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"sender": F2}, "not from the leader it follows"),
        ({"leader": None}, "follows no leader"),
        ({"term": 4}, "the mark is from an earlier term"),
        ({"term": 2}, "the mark is from a newer term"),
        ({"last_index": 39}, "log behind"),
        ({"last_index": 41}, "log has an extra (uncommitted) entry"),
        ({"last_term": 2}, "same index, diverging term"),
        ({"commit_index": 39}, "commit index not yet learned"),
    ],
)
def test_a_follower_refuses_a_mark_its_log_or_term_does_not_match(overrides: dict[str, object], why: str) -> None:
    assert not _accepts(**overrides), why


def test_a_quiescent_follower_does_not_campaign_while_the_leaders_node_is_heard() -> None:
    clock = FakeClock()
    q = _quiescent_follower()
    heard = clock.now
    assert not follower_may_campaign(q, clock.advance(0.5), heard, LIVENESS)
    heard = clock.now  # the next node heartbeat
    assert not follower_may_campaign(q, clock.advance(0.5), heard, LIVENESS)
    assert follower_may_campaign(q, clock.advance(0.2), heard, LIVENESS)  # 0.7 s of silence
    assert follower_may_campaign(Quiescence(), clock.now, clock.now, LIVENESS)  # active: Raft's timer decides


def _follower_wake(q: Quiescence, now: float = 100.0, **overrides: object) -> WakeReason | None:
    args: dict[str, object] = {
        "is_follower": True,
        "term": 3,
        "leader": LEADER,
        "last_index": 40,
        "leader_heard": 99.9,
        "now": now,
        "liveness_timeout_s": LIVENESS,
    }
    args.update(overrides)
    return follower_wake_reason(q, **args)  # type: ignore[arg-type]


def test_a_quiescent_follower_that_hears_its_leader_stays_quiet() -> None:
    assert _follower_wake(_quiescent_follower()) is None


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"leader_heard": 99.0}, WakeReason.PEER_LAPSED),
        ({"leader_heard": None}, WakeReason.PEER_LAPSED),
        ({"term": 4}, WakeReason.ROLE_CHANGED),
        ({"is_follower": False}, WakeReason.ROLE_CHANGED),
        ({"leader": F2}, WakeReason.ROLE_CHANGED),
        ({"last_index": 41}, WakeReason.LEADER_MESSAGE),
        ({"leader_connected": False}, WakeReason.DISCONNECTED),
    ],
)
def test_a_quiescent_follower_wakes_when_the_leaders_node_lapses_or_its_term_or_log_moves(
    overrides: dict[str, object], reason: WakeReason
) -> None:
    assert _follower_wake(_quiescent_follower(), **overrides) is reason


def test_append_entries_timeout_now_and_vote_requests_wake_a_follower_but_a_pre_vote_does_not() -> None:
    q = _quiescent_follower()
    for kind in ("append_entries", "timeout_now", "request_vote"):
        assert follower_wakes_on_message(q, kind)
    for kind in ("txb_pre_vote", "txb_quiesce", None):
        assert not follower_wakes_on_message(q, kind)
    assert not follower_wakes_on_message(Quiescence(), "append_entries")


def test_a_newer_mark_replaces_the_old_one_while_quiescent() -> None:
    q = _quiescent_follower()
    newer = dataclasses.replace(MARK, last_index=41, commit_index=41)
    accept_mark(q, LEADER, newer)
    assert q.state is QuiescenceState.QUIESCENT and q.mark == newer


def test_the_leaders_node_heartbeat_counts_as_leader_contact_only_while_quiescent_and_alive() -> None:
    q = _quiescent_follower()
    assert leader_contact(q, 100.0, 99.9, LIVENESS) == 99.9
    assert leader_contact(q, 100.0, 99.0, LIVENESS) is None
    assert leader_contact(Quiescence(), 100.0, 99.9, LIVENESS) is None
