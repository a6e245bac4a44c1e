"""The order of a move's membership changes, as the group's leader takes them (fake Raft group)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cluster.cluster_nodes import ClusterNodes
from cluster.config import make_cluster_configs
from cluster.controller_view import Reassignment
from cluster.reassignment import ReassignmentDriver


class FakeGroup:
    def __init__(self, voters: set[str]) -> None:
        self._voters = set(voters)
        self.lag: dict[str, int] = {}
        self.changes: list[tuple[str, str]] = []
        self.transfers: list[str] = []

        self._learners: set[str] = set()

    def voters(self) -> frozenset[str]:
        return frozenset(self._voters)

    def learners(self) -> frozenset[str]:
        return frozenset(self._learners)

    def member_lag(self, address: str) -> int | None:
        return self.lag.get(address) if address in self._voters | self._learners else None

    def learner_lag(self, address: str) -> int | None:
        return self.lag.get(address) if address in self._learners else None

    async def remove_learner(self, address: str, timeout: float) -> None:
        self._learners.discard(address)
        self.changes.append(("unlearn", address))

    async def add_learner(self, address: str, timeout: float) -> None:
        self._learners.add(address)
        self.lag[address] = 10_000
        self.changes.append(("learner", address))

    async def change_membership(self, *, add: str | None = None, remove: str | None = None, timeout: float) -> None:
        if add is not None:
            self._voters.add(add)
            self._learners.discard(add)
            self.changes.append(("add", add))
        if remove is not None:
            self._voters.discard(remove)
            self.changes.append(("remove", remove))

    def transfer_leadership(self, to: str) -> None:
        self.transfers.append(to)


class FakeController:
    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []

    async def submit_at_leader(self, command: bytes) -> None:
        self.commands.append(json.loads(command))


def driver(tmp_path: Path, me: int) -> tuple[ReassignmentDriver, FakeController, ClusterNodes]:
    configs = make_cluster_configs(4, tmp_path, http_ports=[1001, 1002, 1003, 1004],
                                   raft_ports=[2001, 2002, 2003, 2004])  # fmt: skip
    cfg = configs[me - 1]
    nodes = ClusterNodes(cfg)
    controller = FakeController()
    d = ReassignmentDriver(cfg, SimpleNamespace(), nodes, controller, SimpleNamespace(), dict)  # type: ignore[arg-type]
    return d, controller, nodes


def addr(nodes: ClusterNodes, *ids: int) -> set[str]:
    return {a.raft_address for i in ids if (a := nodes.node(i)) is not None}


def test_add_catch_up_hand_over_remove_complete(tmp_path: Path) -> None:
    move = Reassignment("t1p0", "t", 0, (1, 2, 3), (2, 3, 4), 0)
    d1, _c1, nodes = driver(tmp_path, 1)
    group = FakeGroup(addr(nodes, 1, 2, 3))
    [a1] = addr(nodes, 1)
    [a2] = addr(nodes, 2)
    [a4] = addr(nodes, 4)
    group.lag = {a2: 0, **{a: 0 for a in addr(nodes, 3)}}

    async def steps() -> None:
        assert await d1.step(group, move) == "learner 4"  # type: ignore[arg-type]
        # node 4 has an empty log: it stays a learner, counted for nothing, until it caught up
        assert await d1.step(group, move) == "waiting for learner 4 to catch up"  # type: ignore[arg-type]
        group.lag[a4] = 3
        assert await d1.step(group, move) == "added 4"  # type: ignore[arg-type]
        assert group.changes == [("learner", a4), ("add", a4)]
        # the leader itself leaves: it hands its leadership to a caught-up target node first
        assert await d1.step(group, move) == "leadership to 2"  # type: ignore[arg-type]
        assert group.transfers == [a2] and group.changes == [("learner", a4), ("add", a4)]

    asyncio.run(steps())
    # node 2 leads now and removes node 1, then reports the move complete
    d2, c2, _ = driver(tmp_path, 2)
    group.lag = {a4: 0, a1: 0, **{a: 0 for a in addr(nodes, 3)}}

    async def rest() -> None:
        assert await d2.step(group, move) == "removed 1"  # type: ignore[arg-type]
        assert await d2.step(group, move) == "complete"  # type: ignore[arg-type]

    asyncio.run(rest())
    assert group.changes[-1] == ("remove", a1)
    assert c2.commands == [{"op": "complete_reassignment", "group_id": "t1p0", "voters": [2, 3, 4]}]


@pytest.mark.parametrize("lag", [None, 51])
def test_a_removal_waits_for_the_new_replicas(tmp_path: Path, lag: int | None) -> None:
    move = Reassignment("t1p0", "t", 0, (1, 2, 3), (1, 2, 4), 0)
    d, c, nodes = driver(tmp_path, 1)
    group = FakeGroup(addr(nodes, 1, 2, 3, 4))
    [a4] = addr(nodes, 4)
    group.lag = {a: 0 for a in addr(nodes, 2, 3)}
    if lag is not None:
        group.lag[a4] = lag
    assert asyncio.run(d.step(group, move)) == "waiting for new replicas to catch up"  # type: ignore[arg-type]
    assert group.changes == [] and c.commands == []


def test_a_removal_waits_for_a_majority_of_the_target(tmp_path: Path) -> None:
    move = Reassignment("t1p0", "t", 0, (1, 2, 3, 4), (1, 2, 3), 0)
    d, _, nodes = driver(tmp_path, 1)
    group = FakeGroup(addr(nodes, 1, 2, 3, 4))
    # nodes 2 and 3 (just restarted) are not caught up: removing 4 could cost the leader its quorum
    assert asyncio.run(d.step(group, move)) == "waiting for a majority of the target to be caught up"  # type: ignore[arg-type]
    group.lag = {a: 0 for a in addr(nodes, 2)}
    [a4] = addr(nodes, 4)
    assert asyncio.run(d.step(group, move)) == "removed 4"  # type: ignore[arg-type]
    assert group.changes == [("remove", a4)]


def test_a_cancelled_move_drops_the_learner_it_had_begun_to_add(tmp_path: Path) -> None:
    back = Reassignment("t1p0", "t", 0, (4, 2, 3), (1, 2, 3), 0, cancelled=True)
    d, c, nodes = driver(tmp_path, 1)
    group = FakeGroup(addr(nodes, 1, 2, 3))
    [a4] = addr(nodes, 4)
    asyncio.run(group.add_learner(a4, 1.0))
    assert asyncio.run(d.step(group, back)) == "complete"  # type: ignore[arg-type]
    assert group.learners() == frozenset() and group.changes[-1] == ("unlearn", a4)
    assert c.commands == [{"op": "complete_reassignment", "group_id": "t1p0", "voters": [1, 2, 3]}]
