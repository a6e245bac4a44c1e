"""A group coordinator that loses its ``__consumer_offsets`` partition answers the joins it holds at once.

``GroupService`` with fakes of its Raft group and state machine, on virtual time: a join waiting for its
rebalance gets NOT_COORDINATOR (naming the new coordinator) as soon as the leadership event arrives,
not when its rebalance timeout runs out.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from clients.protocol import BrokerError, ErrorCode
from cluster.cluster_nodes import ClusterNodes
from cluster.config import make_cluster_configs
from cluster.group_service import GroupService
from cluster.internal_groups import InternalPartition
from cluster.metrics import NodeMetrics
from tests.support.virtual_time import run_on_virtual_time


class FakeGroup:
    def __init__(self, leader_address: str) -> None:
        self.leader_address = leader_address
        self.me = leader_address

    def is_leader(self) -> bool:
        return self.leader_address == self.me

    def leader(self) -> str:
        return self.leader_address

    def term(self) -> int:
        return 1


class FakeSM:
    def groups(self) -> list[Any]:
        return []

    def group(self, group_id: str) -> Any:
        return None


class FakeRaft:
    self_address = ""


class Clock:
    def now_ms(self) -> int:
        return int(asyncio.get_running_loop().time() * 1000)


def test_a_join_waiting_for_its_rebalance_fails_over_at_once(tmp_path: Path) -> None:
    configs = make_cluster_configs(3, tmp_path)
    cfg = configs[0]

    @run_on_virtual_time
    async def main() -> None:
        raft = FakeRaft()
        raft.self_address = cfg.self_address.raft_address
        svc = GroupService(
            cfg, None, raft, None, clock=Clock(), nodes=ClusterNodes(cfg), peers=None, topics=None, txn=None,  # type: ignore[arg-type]
            offsets=None,
            metrics=NodeMetrics(),
        )  # fmt: skip
        group = FakeGroup(cfg.self_address.raft_address)
        p = svc.partition_for("g")
        part = InternalPartition(p, f"__consumer_offsets-{p}", (1, 2, 3), group, FakeSM())  # type: ignore[arg-type]
        svc.groups.local[p] = part  # type: ignore[assignment]
        join = asyncio.get_running_loop().create_task(svc.join("g", "", ("t",), "range", 10_000, 60_000))
        await asyncio.sleep(1.0)
        assert not join.done()  # waiting for the rebalance (initial delay, other members)
        moved = asyncio.get_running_loop().time()
        other = configs[1].self_address
        group.leader_address = other.raft_address  # node 2 is elected; this node is told
        svc._on_leader_change(part)  # type: ignore[arg-type]
        with pytest.raises(BrokerError) as err:
            await join
        assert err.value.error_code is ErrorCode.NOT_COORDINATOR
        assert err.value.extra["coordinator_url"] == other.url
        assert asyncio.get_running_loop().time() == pytest.approx(moved)

    main()
