"""The deltas of ``/v1/internal/state``: versions of a node's group states, and a peer's copy of them."""

from __future__ import annotations

from typing import Any

from cluster.state_versions import StateVersions, apply_delta


def states(**hw: int) -> dict[str, dict[str, Any]]:
    return {gid: {"leader": 1, "high_watermark": v} for gid, v in hw.items()}


def test_a_first_poll_gets_every_group_and_a_second_only_what_changed() -> None:
    sv = StateVersions("e1")
    sv.record(states(a=0, b=0, c=0))
    first = sv.since(None, None)
    assert first.full and set(first.changed) == {"a", "b", "c"} and first.version == 1
    sv.record(states(a=0, b=5, c=0))
    delta = sv.since("e1", first.version)
    assert not delta.full and delta.changed == {"b": {"leader": 1, "high_watermark": 5}} and delta.removed == []
    assert delta.version == 2


def test_nothing_changed_keeps_the_version_and_answers_an_empty_delta() -> None:
    sv = StateVersions("e1")
    sv.record(states(a=1))
    sv.record(states(a=1))
    assert sv.version == 1
    delta = sv.since("e1", 1)
    assert not delta.full and delta.changed == {} and delta.removed == [] and delta.version == 1


def test_a_removed_group_is_named_and_a_group_that_returns_is_sent_again() -> None:
    sv = StateVersions("e1")
    sv.record(states(a=1, b=1))
    sv.record(states(a=1))
    delta = sv.since("e1", 1)
    assert delta.changed == {} and delta.removed == ["b"]
    sv.record(states(a=1, b=7))
    delta = sv.since("e1", 1)
    assert delta.changed == {"b": {"leader": 1, "high_watermark": 7}} and delta.removed == []


def test_another_epoch_a_future_version_or_forgotten_removals_get_the_whole_state() -> None:
    sv = StateVersions("e2", max_removed=1)
    sv.record(states(a=1, b=1, c=1))
    assert sv.since("e1", 1).full  # the node restarted: its versions start over
    assert sv.since("e2", 9).full  # a version it never reached
    sv.record(states(a=1, b=1))  # version 2 removes c
    sv.record(states(a=1))  # version 3 removes b; c's removal is forgotten
    assert sv.since("e2", 1).full and sv.since("e2", 1).changed == {"a": {"leader": 1, "high_watermark": 1}}
    delta = sv.since("e2", 2)
    assert not delta.full and delta.removed == ["b"]


def test_a_peer_copy_follows_the_node_through_changes_removals_and_a_restart() -> None:
    sv = StateVersions("e1")
    held: dict[str, Any] = {}
    version: int | None = None
    epoch: str | None = None
    script = [states(a=0, b=0), states(a=3, b=0, c=1), states(a=3, c=2), states(a=4, c=2, d=0), states(d=1)]
    for current in script:
        sv.record(current)
        d = sv.since(epoch, version)
        body = {"full": d.full, "partitions": d.changed, "removed": d.removed}
        held = apply_delta(held, body)
        epoch, version = d.epoch, d.version
        assert held == current
    restarted = StateVersions("e9")
    restarted.record(states(z=1))
    d = restarted.since(epoch, version)
    assert d.full
    assert apply_delta(held, {"full": d.full, "partitions": d.changed, "removed": d.removed}) == states(z=1)


def test_an_answer_without_versions_replaces_the_copy() -> None:
    held = {"old": {"leader": 2}}
    assert apply_delta(held, {"partitions": {"new": {"leader": 1}}}) == {"new": {"leader": 1}}
    assert apply_delta({"x": {}}, {"full": False, "partitions": "garbage", "removed": "garbage"}) == {"x": {}}


def test_a_record_told_which_groups_were_read_again_compares_only_those() -> None:
    sv = StateVersions("e1")
    first = states(a=0, b=0, c=0)
    sv.record(first)
    again = dict(first)
    again["b"] = {"leader": 1, "high_watermark": 4}
    again["c"] = {"leader": 1, "high_watermark": 9}  # not read again: the caller vouches it did not change
    sv.record(again, touched={"b"})
    delta = sv.since("e1", 1)
    assert delta.changed == {"b": {"leader": 1, "high_watermark": 4}} and delta.removed == []
    sv.record(again)  # without the hint every group is compared
    assert sv.since("e1", 2).changed == {"c": {"leader": 1, "high_watermark": 9}}
