"""Reads of the groups a node coordinates: describe, listing, Kafka's DescribeGroups and the metrics sample.

``GroupViews`` reads the live memberships (``GroupService``'s map, shared
by reference: partition -> group -> ``GroupMembership``, present only for the
partitions this node leads) and the stored state of the offsets partitions.
A group without live membership is shown from its stored generation; one
with neither metadata nor offsets is Kafka's ``Dead``. Runs on the event loop
(the state machines' reads are thread-safe).
"""

from __future__ import annotations

from typing import Any

from clients.protocol import BrokerError
from coordinator.consumer_protocol import CONSUMER_PROTOCOL_TYPE
from coordinator.group_admin import offset_rows
from coordinator.group_membership import GroupMembership, KafkaMember
from coordinator.group_state_machine import GroupStateMachine
from coordinator.group_states import GroupState
from coordinator.metadata import TopicPartition

from .internal_groups import InternalPartition
from .metrics import GroupCoordinatorSample, GroupSample
from .seams import TopicDirectory

__all__ = ["DEAD", "GroupViews"]

GroupPartition = InternalPartition[GroupStateMachine]
#: Kafka's DescribeGroups state for a group the coordinator does not know.
DEAD = "Dead"


class GroupViews:
    def __init__(
        self, node_id: int, max_lag_series: int, topics: TopicDirectory, live: dict[int, dict[str, GroupMembership]]
    ) -> None:
        self._node_id = node_id
        self._max_lag_series = max_lag_series
        self._topics = topics
        self._live = live

    def high_watermark(self, topic: str, partition: int) -> int | None:
        try:
            meta = self._topics.topic(topic)
        except BrokerError:
            return None
        if not 0 <= partition < len(meta.partitions):
            return None
        hw = self._topics.high_watermark(meta, partition)
        return hw if hw >= 0 else None

    def view(self, part: GroupPartition, group_id: str) -> GroupMembership | None:
        """The live membership, or one read off the stored metadata (None: no metadata)."""
        m = self._live.get(part.partition, {}).get(group_id)
        meta = part.sm.group(group_id)
        if m is None and meta is not None:
            m = GroupMembership.from_metadata(meta, 0)
        return m

    def summary(self, part: GroupPartition, group_id: str) -> dict[str, Any]:
        m = self.view(part, group_id)
        if m is not None:
            d = m.describe()
        else:
            known = part.sm.committed_offsets(group_id) or part.sm.pending_offsets(group_id)
            d = {"group_id": group_id, "state": GroupState.EMPTY.display_name if known else DEAD,
                 "generation_id": 0, "protocol_type": CONSUMER_PROTOCOL_TYPE, "assignment_by": None,
                 "protocol": None, "leader_id": None, "members": []}  # fmt: skip
        d["coordinator"] = self._node_id
        d["partition"] = part.partition
        return d

    def describe(self, part: GroupPartition, group_id: str) -> dict[str, Any]:
        """DescribeGroups plus offsets: state, generation, members with assignments, and per partition
        (committed or assigned) the committed offset, the log end offset and the lag (``group_admin``).

        A group the coordinator does not know is ``Dead`` with no members, as Kafka's DescribeGroups answers.
        """
        d = self.summary(part, group_id)
        assigned = {
            TopicPartition(a["topic"], a["partition"]): m["member_id"] for m in d["members"] for a in m["assignment"]
        }
        d["offsets"] = offset_rows(part.sm.committed_offsets(group_id), assigned, self.high_watermark)
        d["pending_offsets"] = part.sm.describe_pending(group_id)
        return d

    def kafka_group(self, part: GroupPartition, group_id: str) -> tuple[dict[str, Any], list[KafkaMember]]:
        """Kafka's DescribeGroups: the summary and the members as Kafka shows them (``Dead`` if unknown)."""
        m = self.view(part, group_id)
        return self.summary(part, group_id), m.kafka_members() if m is not None else []

    def listing(self, part: GroupPartition) -> list[dict[str, Any]]:
        """The groups of one offsets partition this node leads (loaded), as ListGroups shows them."""
        out = []
        names = set(part.sm.group_ids()) | set(self._live.get(part.partition, {}))
        keys = ("group_id", "state", "generation_id", "protocol_type", "protocol", "coordinator")
        for group_id in sorted(names):
            d = self.summary(part, group_id)
            out.append({k: d[k] for k in keys} | {"members": len(d["members"])})
        return out

    def sample(self, led: list[GroupPartition]) -> GroupCoordinatorSample:
        """Members, committed offsets and lag of the groups of ``led`` (scrape time).

        Per-partition series (committed offset, lag) stop at ``metrics_max_lag_series`` for the whole
        node, in (group, topic, partition) order; the per-group and per-topic sums always cover everything.
        """
        named = []
        for part in led:
            live = self._live.get(part.partition, {})
            for group_id in part.sm.group_ids():
                named.append((group_id, part, live.get(group_id)))
        budget = self._max_lag_series
        samples = []
        for group_id, part, m in sorted(named, key=lambda x: x[0]):
            meta = part.sm.group(group_id)
            members = len(m.members) if m is not None else len(meta.members) if meta is not None else 0
            committed = {(c.topic, c.partition): c.offset for c in part.sm.committed_offsets(group_id).values()}
            sample = GroupSample.from_offsets(group_id, members, committed, self.high_watermark, max_series=budget)
            budget -= sample.series
            samples.append(sample)
        return GroupCoordinatorSample(coordinator_partitions=len(led), groups=samples)
