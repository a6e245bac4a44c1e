"""``cluster.readiness.missing_groups``: which local internal groups lack a ready leader, and ``/readyz`` asking the
leaders it waits on afresh (fakes, no Raft)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from cluster.http.admin import READYZ_REFRESH_S, AdminRoutes
from cluster.readiness import NOT_READY_AS_REPORTED, missing_groups

NODES = {f"127.0.0.1:{7000 + i}": SimpleNamespace(id=i) for i in (1, 2, 3)}
CONFIG = SimpleNamespace(node_id=1, node_by_raft_address=NODES.get)


def addr(node: int) -> str:
    return f"127.0.0.1:{7000 + node}"


class FakeGroup:
    def __init__(self, leader: int | None, ready_here: bool = False) -> None:
        self._leader = leader
        self._ready_here = ready_here

    def is_leader(self) -> bool:
        return self._ready_here

    def leader(self) -> str | None:
        return None if self._leader is None else addr(self._leader)


def kind(name: str, groups: dict[int, FakeGroup]) -> Any:
    local = {p: SimpleNamespace(group_id=f"{name}-{p}", group=g) for p, g in groups.items()}
    return SimpleNamespace(local=local)


class FakePeers:
    def __init__(self, reports: dict[str, dict[str, Any]]) -> None:
        self.reports = reports

    def remote_partition(self, group_id: str) -> dict[str, Any] | None:
        return self.reports.get(group_id)


def test_ready_leaders_here_and_elsewhere_are_not_missing():
    txn = kind("__transaction_state", {0: FakeGroup(1, ready_here=True), 1: FakeGroup(2)})
    peers = FakePeers({"__transaction_state-1": {"leader": 2, "ready": True}})
    assert missing_groups(CONFIG, CONFIG, [txn], peers) == []  # type: ignore[arg-type]


def test_each_way_of_lacking_a_ready_leader_is_listed_in_order():
    txn = kind("__transaction_state", {
        3: FakeGroup(None),  # no leader known
        0: FakeGroup(1),  # elected here, barrier not applied
        1: FakeGroup(2),  # the leader's own report says it is not ready yet
        2: FakeGroup(3),  # the last report names another leader
    })  # fmt: skip
    offsets = kind("__consumer_offsets", {0: FakeGroup(2)})  # nothing reported at all
    peers = FakePeers({
        "__transaction_state-1": {"leader": 2, "ready": False},
        "__transaction_state-2": {"leader": 2, "ready": True},
    })  # fmt: skip
    got = [m.to_json() for m in missing_groups(CONFIG, CONFIG, [txn, offsets], peers)]  # type: ignore[arg-type]
    assert [(m["group"], m["leader"]) for m in got] == [
        ("__transaction_state-0", 1),
        ("__transaction_state-1", 2),
        ("__transaction_state-2", 3),
        ("__transaction_state-3", None),
        ("__consumer_offsets-0", 2),
    ]
    assert got[0]["reason"].startswith("leader loading")
    assert got[3]["reason"] == "no leader"


class StaleView:
    """A node whose only missing group is led by node 2, not ready as last reported until node 2 is asked again."""

    def __init__(self) -> None:
        self.refreshed: list[float] = []
        self.draining = False

    def missing_groups(self) -> list[dict[str, Any]]:
        if self.refreshed:
            return []
        return [{"group": "__transaction_state-1", "leader": 2, "reason": NOT_READY_AS_REPORTED}]

    def is_ready(self) -> bool:
        return not self.missing_groups()

    async def refresh_readiness(self, timeout: float) -> None:
        self.refreshed.append(timeout)


def test_readyz_asks_the_peers_afresh_before_answering():
    node = StaleView()
    services = SimpleNamespace(node=node, controller=SimpleNamespace(leader_known=lambda: True))
    request = SimpleNamespace(query={"verbose": ""})
    resp = asyncio.run(AdminRoutes(services).readyz(request))  # type: ignore[arg-type]
    # The leader reported ready when asked: the answer is 200 now, not after the next periodic poll.
    assert node.refreshed == [READYZ_REFRESH_S]
    assert resp.status == 200, resp.text
    assert json.loads(resp.text) == {
        "status": "ready",
        "checks": {"controller_leader_known": True, "internal_groups_led": True, "draining": False},
        "missing_groups": [],
    }
