"""Leadership goes back to a group's preferred replica only once that replica is answering and caught up."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from cluster.cluster_nodes import ClusterNodes
from cluster.config import make_cluster_configs
from cluster.leader_balance import Candidate, LeaderBalancer


class Group:
    def __init__(self, gid: str, leader: bool, responsive: set[str], match: dict[str, int], commit: int) -> None:
        self.group_id = gid
        self._leader = leader
        self._status = SimpleNamespace(responsive=responsive, match_index=match, commit_index=commit)
        self.transfers: list[str] = []

    def is_leader(self) -> bool:
        return self._leader

    def status(self) -> SimpleNamespace:
        return self._status

    def transfer_leadership(self, to: str) -> None:
        self.transfers.append(to)


def test_only_a_caught_up_answering_preferred_replica_gets_leadership(tmp_path: Path) -> None:
    cfg = make_cluster_configs(3, tmp_path, http_ports=[1001, 1002, 1003], raft_ports=[2001, 2002, 2003])[0]
    two = "127.0.0.1:2002"
    fit = Group("a", True, {two}, {two: 10}, 10)
    behind = Group("b", True, {two}, {two: 9}, 10)
    silent = Group("c", True, set(), {two: 10}, 10)
    follower = Group("d", False, {two}, {two: 10}, 10)
    mine = Group("e", True, {two}, {two: 10}, 10)
    groups = [Candidate(fit, 2), Candidate(behind, 2), Candidate(silent, 2), Candidate(follower, 2),
              Candidate(mine, 1)]  # type: ignore[arg-type]  # fmt: skip
    asyncio.run(LeaderBalancer(1, ClusterNodes(cfg), 0.0, lambda: groups).run_once())
    assert fit.transfers == [two]
    assert behind.transfers == silent.transfers == follower.transfers == mine.transfers == []
    held = Group("f", True, {two}, {two: 10}, 10)
    asyncio.run(LeaderBalancer(1, ClusterNodes(cfg), 3600.0, lambda: [Candidate(held, 2)]).run_once())  # type: ignore[arg-type]
    assert held.transfers == []  # fit, but not for leader_balance_hold_s yet
