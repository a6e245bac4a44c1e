"""Pre-vote and check-quorum rules (raft.election_rules) on explicit times."""

from __future__ import annotations

import pytest

from raft.election_rules import (
    LogPosition,
    PreVoteRound,
    grant_pre_vote,
    has_quorum_contact,
    in_leader_lease,
    log_up_to_date,
    majority,
)

LEASE = 0.8


def _grant(**overrides: object) -> bool:
    args: dict[str, object] = {
        "now": 100.0,
        "my_term": 5,
        "i_am_leader": False,
        "last_leader_contact": None,
        "lease_s": LEASE,
        "mine": LogPosition(5, 40),
        "request_term": 6,
        "candidate": LogPosition(5, 40),
    }
    args.update(overrides)
    return grant_pre_vote(**args)  # type: ignore[arg-type]


def test_logs_compare_by_term_first_then_index() -> None:
    assert log_up_to_date(LogPosition(5, 1), LogPosition(4, 900))
    assert not log_up_to_date(LogPosition(4, 900), LogPosition(5, 1))
    assert log_up_to_date(LogPosition(5, 40), LogPosition(5, 40))
    assert not log_up_to_date(LogPosition(5, 39), LogPosition(5, 40))


def test_lease_holds_only_within_the_window_after_hearing_the_leader() -> None:
    assert not in_leader_lease(100.0, None, LEASE)
    assert in_leader_lease(100.0, 99.5, LEASE)
    assert not in_leader_lease(100.0, 99.5, 0.5)  # exactly the lease: expired
    assert not in_leader_lease(100.0, 90.0, LEASE)


def test_a_follower_without_a_leader_grants_an_up_to_date_candidate() -> None:
    assert _grant()
    assert _grant(last_leader_contact=99.0)  # heard 1 s ago: lease over


def test_a_follower_that_hears_its_leader_refuses_whatever_the_candidate_offers() -> None:
    assert not _grant(last_leader_contact=99.9)
    assert not _grant(last_leader_contact=99.9, request_term=50, candidate=LogPosition(9, 1000))


def test_a_leader_refuses_pre_votes() -> None:
    assert not _grant(i_am_leader=True)


def test_a_term_not_above_mine_or_a_log_behind_mine_is_refused() -> None:
    assert not _grant(request_term=5)
    assert not _grant(request_term=4)
    assert not _grant(candidate=LogPosition(5, 39))
    assert not _grant(candidate=LogPosition(4, 400))
    assert _grant(candidate=LogPosition(6, 1))


@pytest.mark.parametrize(("size", "needed"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_majority(size: int, needed: int) -> None:
    assert majority(size) == needed


def test_quorum_contact_counts_the_leader_itself_and_recent_answers() -> None:
    now = 50.0
    assert has_quorum_contact(now, [49.9, 10.0], 3, 0.6)  # me + one recent peer of 3
    assert not has_quorum_contact(now, [49.0, 10.0], 3, 0.6)  # both stale
    assert not has_quorum_contact(now, [49.5, 49.5], 3, 0.5)  # exactly the window: stale
    assert has_quorum_contact(now, [], 1, 0.6)  # a group of one always has its quorum
    assert not has_quorum_contact(now, [49.9, 10.0, 10.0, 10.0], 5, 0.6)
    assert has_quorum_contact(now, [49.9, 49.8, 10.0, 10.0], 5, 0.6)


def test_a_round_is_won_by_a_majority_of_yes_answers_for_its_own_term() -> None:
    r = PreVoteRound(term=7, cluster_size=5, started=0.0)
    assert not r.answer("b", 7, True)
    assert not r.answer("b", 7, True)  # a repeated answer counts once
    assert not r.answer("c", 6, True)  # an answer to an earlier round counts nothing
    assert not r.answer("c", 7, False)
    assert not r.answer("c", 7, True)  # a node cannot change its answer
    assert r.answer("d", 7, True)  # me + b + d = 3 of 5
    assert r.won and not r.lost


def test_a_round_is_lost_once_a_majority_is_out_of_reach() -> None:
    r = PreVoteRound(term=3, cluster_size=3, started=0.0)
    r.answer("b", 3, False)
    assert not r.lost  # c may still say yes
    r.answer("c", 3, False)
    assert r.lost and not r.won
