"""The campaign rules of ``raft.campaigns``: successor rank and campaign slots, on explicit times."""

from __future__ import annotations

import pytest

from raft.campaigns import CampaignSlots, rank_delay, successor_order, successor_rank

A, B, C, D = "a:1", "b:1", "c:1", "d:1"


def test_a_fresh_group_campaigns_from_its_preferred_replica_on() -> None:
    assert successor_order((A, B, C), {A, B, C}, None) == [A, B, C]
    assert successor_rank((B, C, A), {A, B, C}, None, B) == 0
    assert successor_rank((B, C, A), {A, B, C}, None, A) == 2


def test_the_replica_after_the_dead_leader_goes_first_cyclically() -> None:
    assert successor_order((A, B, C), {A, B, C}, A) == [B, C]
    assert successor_order((A, B, C), {A, B, C}, C) == [A, B]
    assert successor_order((B, C, A), {A, B, C}, B) == [C, A]
    assert successor_rank((A, B, C), {A, B, C}, B, C) == 0
    assert successor_rank((A, B, C), {A, B, C}, B, A) == 1


def test_a_dead_leaders_groups_spread_over_the_survivors_as_their_replica_lists_do() -> None:
    lists = [(A, B, C), (A, C, B), (B, A, C), (C, A, B)]  # A led the first two
    first = [successor_order(r, set(r), r[0])[0] for r in lists[:2]]
    assert sorted(first) == [B, C]


def test_voters_the_preference_does_not_list_come_last_sorted() -> None:
    assert successor_order((A, B), {A, B, D, C}, A) == [B, C, D]
    assert successor_order((A, B, C), {A, C}, None) == [A, C]  # B is no voter any more
    assert successor_rank((A, B, C), {A, B, C}, A, D) == 2  # not a voter: after every voter


def test_a_leader_outside_the_preference_changes_nothing_but_its_own_place() -> None:
    assert successor_order((A, B, C), {A, B, C, D}, D) == [A, B, C]


def test_rank_zero_waits_for_nothing_each_rank_after_it_longer() -> None:
    assert rank_delay(0, 1.0) == 0.0
    assert rank_delay(1, 1.0) == 1.0
    assert rank_delay(2, 0.5) == 1.0


class Wakes:
    def __init__(self) -> None:
        self.woken: list[str] = []

    def of(self, key: str) -> object:
        return lambda: self.woken.append(key)


def test_at_most_limit_campaigns_run_at_once_the_rest_wait_in_line() -> None:
    slots, wakes = CampaignSlots(limit=2, hold_s=1.0), Wakes()
    assert slots.try_acquire("g1", 0.0, wakes.of("g1"))  # type: ignore[arg-type]
    assert slots.try_acquire("g2", 0.0, wakes.of("g2"))  # type: ignore[arg-type]
    assert not slots.try_acquire("g3", 0.0, wakes.of("g3"))  # type: ignore[arg-type]
    assert not slots.try_acquire("g4", 0.1, wakes.of("g4"))  # type: ignore[arg-type]
    assert not slots.try_acquire("g3", 0.2, wakes.of("g3"))  # type: ignore[arg-type]  # asks again: still one place
    assert (slots.in_flight, slots.waiting, slots.waited) == (2, 2, 2)
    slots.release("g1", 0.3)
    assert wakes.woken == ["g3"]  # the first in line, reserved for it
    assert slots.try_acquire("g3", 0.3, wakes.of("g3"))  # type: ignore[arg-type]
    assert not slots.try_acquire("g5", 0.3, wakes.of("g5"))  # type: ignore[arg-type]  # g4 is still ahead
    assert slots.peak == 2 and slots.granted == 3


def test_a_slot_whose_campaign_goes_unanswered_frees_up_after_hold_s() -> None:
    slots, wakes = CampaignSlots(limit=1, hold_s=0.5), Wakes()
    assert slots.try_acquire("g1", 0.0, wakes.of("g1"))  # type: ignore[arg-type]
    assert not slots.try_acquire("g2", 0.1, wakes.of("g2"))  # type: ignore[arg-type]
    assert not slots.try_acquire("g3", 0.49, wakes.of("g3"))  # type: ignore[arg-type]
    assert wakes.woken == []
    assert not slots.try_acquire("g3", 0.5, wakes.of("g3"))  # type: ignore[arg-type]  # g1 expired: g2's turn
    assert wakes.woken == ["g2"]
    assert slots.try_acquire("g2", 0.6, wakes.of("g2"))  # type: ignore[arg-type]
    assert slots.try_acquire("g2", 0.9, wakes.of("g2"))  # type: ignore[arg-type]  # its own retry renews the slot
    assert not slots.try_acquire("g3", 1.2, wakes.of("g3"))  # type: ignore[arg-type]  # renewed at 0.9: held to 1.4
    assert slots.try_acquire("g3", 1.4, wakes.of("g3"))  # type: ignore[arg-type]  # expired, handed to g3 at once
    assert wakes.woken == ["g2", "g3"]


def test_a_forgotten_group_leaves_the_line_and_its_slot() -> None:
    slots, wakes = CampaignSlots(limit=1, hold_s=5.0), Wakes()
    assert slots.try_acquire("g1", 0.0, wakes.of("g1"))  # type: ignore[arg-type]
    assert not slots.try_acquire("g2", 0.0, wakes.of("g2"))  # type: ignore[arg-type]
    assert not slots.try_acquire("g3", 0.0, wakes.of("g3"))  # type: ignore[arg-type]
    slots.forget("g2", 0.1)
    slots.forget("g1", 0.2)
    assert wakes.woken == ["g3"] and slots.in_flight == 1 and slots.waiting == 0


def test_release_of_a_key_without_a_slot_changes_nothing() -> None:
    slots = CampaignSlots(limit=1, hold_s=1.0)
    slots.release("nobody", 0.0)
    assert slots.in_flight == 0 and slots.granted == 0


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        CampaignSlots(limit=0)


def test_poll_hands_an_expired_slot_on_without_anyone_asking() -> None:
    slots, wakes = CampaignSlots(limit=1, hold_s=0.5), Wakes()
    assert slots.try_acquire("g1", 0.0, wakes.of("g1"))  # type: ignore[arg-type]
    assert not slots.try_acquire("g2", 0.1, wakes.of("g2"))  # type: ignore[arg-type]
    slots.poll(0.4)
    assert wakes.woken == []
    slots.poll(0.5)
    assert wakes.woken == ["g2"] and slots.in_flight == 1 and slots.waiting == 0
