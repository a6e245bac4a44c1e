"""Partition assignors run by the group coordinator (Kafka's ``RangeAssignor`` and ``RoundRobinAssignor``).

Kafka runs the assignor in the group leader's client; txbroker runs it on the
coordinator at the end of a rebalance, so a plain HTTP consumer needs no
assignor code. Both are deterministic functions of the members' subscriptions
and the topics' partition counts: members are ordered by member id, topics by
name.

* **range**: per topic, the subscribed members in order get contiguous ranges;
  the first ``partitions % members`` members get one extra partition.
* **roundrobin**: every partition of every subscribed topic in (topic,
  partition) order goes to the next member, in a circle, that subscribes to its topic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from coordinator.metadata import TopicPartition

__all__ = ["ASSIGNORS", "DEFAULT_PROTOCOL", "Assignor", "range_assign", "roundrobin_assign"]

#: member id -> subscribed topics, topic -> partition count (topics unknown to the cluster are absent)
Assignor = Callable[[Mapping[str, Sequence[str]], Mapping[str, int]], dict[str, tuple[TopicPartition, ...]]]


def _subscribers(subscriptions: Mapping[str, Sequence[str]], partitions: Mapping[str, int]) -> dict[str, list[str]]:
    by_topic: dict[str, list[str]] = {}
    for member in sorted(subscriptions):
        for topic in sorted(set(subscriptions[member])):
            if partitions.get(topic, 0) > 0:
                by_topic.setdefault(topic, []).append(member)
    return by_topic


def range_assign(
    subscriptions: Mapping[str, Sequence[str]], partitions: Mapping[str, int]
) -> dict[str, tuple[TopicPartition, ...]]:
    out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
    for topic, members in sorted(_subscribers(subscriptions, partitions).items()):
        n = partitions[topic]
        per, extra = divmod(n, len(members))
        for i, member in enumerate(members):
            start = per * i + min(i, extra)
            length = per + (1 if i < extra else 0)
            out[member].extend(TopicPartition(topic, p) for p in range(start, start + length))
    return {m: tuple(tps) for m, tps in out.items()}


def roundrobin_assign(
    subscriptions: Mapping[str, Sequence[str]], partitions: Mapping[str, int]
) -> dict[str, tuple[TopicPartition, ...]]:
    out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
    members = sorted(subscriptions)
    subscribed = {m: set(subscriptions[m]) for m in members}
    cursor = 0
    for topic in sorted(_subscribers(subscriptions, partitions)):
        for p in range(partitions[topic]):
            while topic not in subscribed[members[cursor % len(members)]]:
                cursor += 1
            out[members[cursor % len(members)]].append(TopicPartition(topic, p))
            cursor += 1
    return {m: tuple(tps) for m, tps in out.items()}


ASSIGNORS: Mapping[str, Assignor] = {"range": range_assign, "roundrobin": roundrobin_assign}
DEFAULT_PROTOCOL = "range"
