"""Range and round-robin assignment: Kafka's documented examples, and properties over random subscriptions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordinator.group_assignors import ASSIGNORS, range_assign, roundrobin_assign
from coordinator.metadata import TopicPartition as TP


def tps(*items: tuple[str, int]) -> tuple[TP, ...]:
    return tuple(TP(t, p) for t, p in items)


def test_range_gives_each_member_a_contiguous_range_per_topic() -> None:
    # RangeAssignor javadoc: C0, C1 subscribed to t0, t1 with 3 partitions each
    out = range_assign({"C0": ["t0", "t1"], "C1": ["t0", "t1"]}, {"t0": 3, "t1": 3})
    assert out == {
        "C0": tps(("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)),
        "C1": tps(("t0", 2), ("t1", 2)),
    }


def test_roundrobin_deals_partitions_in_a_circle() -> None:
    # RoundRobinAssignor javadoc, same subscriptions
    out = roundrobin_assign({"C0": ["t0", "t1"], "C1": ["t0", "t1"]}, {"t0": 3, "t1": 3})
    assert out == {
        "C0": tps(("t0", 0), ("t0", 2), ("t1", 1)),
        "C1": tps(("t0", 1), ("t1", 0), ("t1", 2)),
    }


def test_roundrobin_skips_members_not_subscribed_to_the_topic() -> None:
    # RoundRobinAssignor javadoc: C0 -> t0; C1 -> t0, t1; C2 -> t0, t1, t2 (1, 2 and 3 partitions)
    out = roundrobin_assign({"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}, {"t0": 1, "t1": 2, "t2": 3})
    assert out == {
        "C0": tps(("t0", 0)),
        "C1": tps(("t1", 0)),
        "C2": tps(("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)),
    }


def test_unknown_topics_and_unsubscribed_members_get_nothing() -> None:
    for assign in ASSIGNORS.values():
        assert assign({"a": ["missing"], "b": []}, {"t": 2}) == {"a": (), "b": ()}


subscriptions = st.dictionaries(
    st.text("abcdef", min_size=1, max_size=4),
    st.lists(st.sampled_from(["t0", "t1", "t2", "gone"]), max_size=3),
    min_size=1,
    max_size=6,
)
counts = st.fixed_dictionaries({"t0": st.integers(0, 9), "t1": st.integers(0, 9), "t2": st.integers(0, 9)})


@given(subscriptions, counts)
def test_every_subscribed_partition_goes_to_exactly_one_subscriber(subs: dict[str, list[str]],
                                                                   parts: dict[str, int]) -> None:  # fmt: skip
    wanted = {TP(t, p) for ts in subs.values() for t in ts for p in range(parts.get(t, 0))}
    for name, assign in ASSIGNORS.items():
        out = assign(subs, parts)
        assert set(out) == set(subs), name
        given_out = [tp for tps_ in out.values() for tp in tps_]
        assert len(given_out) == len(set(given_out)), f"{name}: a partition assigned twice"
        assert set(given_out) == wanted, name
        for member, assigned in out.items():
            assert all(tp.topic in subs[member] for tp in assigned), name
        assert assign(dict(reversed(list(subs.items()))), parts) == out, f"{name}: depends on input order"


@given(st.lists(st.text("abc", min_size=1, max_size=3), min_size=1, max_size=6, unique=True), counts)
def test_identical_subscriptions_are_balanced_within_one_partition(members: list[str], parts: dict[str, int]) -> None:
    subs = {m: ["t0", "t1", "t2"] for m in members}
    sizes = [len(v) for v in roundrobin_assign(subs, parts).values()]
    assert max(sizes) - min(sizes) <= 1
    for topic, n in parts.items():  # range balances per topic
        per_topic = [sum(tp.topic == topic for tp in v) for v in range_assign(subs, parts).values()]
        assert max(per_topic) - min(per_topic) <= 1 and sum(per_topic) == n
