"""InternalGroups reports the "ready leader" event that follows "leader, barrier pending" in the same term.

Regression: the change check compared the event with ``group.is_leader()`` read when the event was
processed; when the barrier committed after the first event was processed, the second event looked
unchanged and a new coordinator never loaded its state (transactions in a prepare state were never
resumed; the group coordinator relies on the same callback).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster.cluster_nodes import ClusterNodes
from cluster.config import make_cluster_configs
from cluster.internal_groups import InternalGroups, InternalPartition
from raft import LeadershipEvent


class _Group:
    """What ``_on_event`` may look at: the current leadership, which moves independently of the events."""

    def __init__(self) -> None:
        self.ready = False

    def is_leader(self) -> bool:
        return self.ready


def test_ready_leader_event_is_reported_after_the_barrier_event(tmp_path: Path) -> None:
    cfg = make_cluster_configs(3, tmp_path)[0]
    seen: list[bool] = []
    groups: InternalGroups[Any] = InternalGroups(
        "__consumer_offsets", 1, cfg, raft=None, peers=None,  # type: ignore[arg-type]
        make_sm=lambda p: None, on_leader_change=lambda part: seen.append(part.group.is_leader()),
        nodes=ClusterNodes(cfg),
    )  # fmt: skip
    group = _Group()
    part: InternalPartition[Any] = InternalPartition(0, "__consumer_offsets-0", (1, 2, 3), group, None)  # type: ignore[arg-type]
    groups._by_group[part.group_id] = part
    me = cfg.self_address.raft_address
    # Given this node won the election of term 5 but its barrier has not committed yet
    groups._on_event(LeadershipEvent(part.group_id, False, me, 5))
    assert seen == [False]
    # When the barrier commits (the group is now the ready leader) and that event arrives
    group.ready = True
    groups._on_event(LeadershipEvent(part.group_id, True, me, 5))
    # Then the owner hears of it, and can load its state
    assert seen == [False, True]
    groups._on_event(LeadershipEvent(part.group_id, True, me, 5))  # a repeat is not a change
    assert seen == [False, True]
