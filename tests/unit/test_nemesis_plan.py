"""verify.nemesis's pure choices (which nodes a fault hits) and its rounds against a fake cluster; netns naming."""

from __future__ import annotations

import ipaddress
import itertools
import random
import threading
from collections.abc import Iterable

import pytest

from verify.nemesis import Fault, FaultEvent, FaultPlan, Nemesis, plan_fault
from verify.netns_network import Network, check_prefix, choose_subnet, majority

IDS = [1, 2, 3]


def _reach(plan: FaultPlan, a: int, b: int) -> bool:
    return (min(a, b), max(a, b)) not in plan.cuts


def test_leader_isolation_cuts_the_named_leader_from_every_other_node() -> None:
    plan = plan_fault(Fault.LEADER_ISOLATION, [1, 2, 3, 4, 5], random.Random(1), leader=4)
    assert plan.nodes == (4,)
    assert plan.cuts == ((1, 4), (2, 4), (3, 4), (4, 5))


def test_coordinator_isolation_aims_at_the_coordinator_not_the_leader() -> None:
    plan = plan_fault(Fault.COORDINATOR_ISOLATION, IDS, random.Random(1), leader=1, coordinator=3)
    assert plan.nodes == (3,)
    assert plan.cuts == ((1, 3), (2, 3))


@pytest.mark.parametrize("named", [None, 9])
def test_an_isolation_without_a_known_target_picks_a_random_node(named: int | None) -> None:
    picked = {plan_fault(Fault.LEADER_ISOLATION, IDS, random.Random(s), leader=named).nodes for s in range(40)}
    assert picked == {(1,), (2,), (3,)}


@pytest.mark.parametrize(("n", "minority"), [(3, 1), (4, 1), (5, 2), (7, 3)])
def test_a_majority_split_cuts_a_real_minority_from_the_rest(n: int, minority: int) -> None:
    ids = list(range(1, n + 1))
    seen = set()
    for seed in range(30):
        plan = plan_fault(Fault.MAJORITY_SPLIT, ids, random.Random(seed), leader=1)
        side = set(plan.nodes)
        rest = set(ids) - side
        assert len(side) == minority and len(rest) > n // 2
        assert set(plan.cuts) == {(min(a, b), max(a, b)) for a in side for b in rest}
        seen |= side
    assert seen == set(ids)  # random, not always the same node


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_a_bridge_leaves_one_node_reaching_two_sides_that_cannot_reach_each_other(n: int) -> None:
    ids = list(range(1, n + 1))
    for seed in range(20):
        plan = plan_fault(Fault.BRIDGE, ids, random.Random(seed))
        (bridge,) = plan.nodes
        others = [i for i in ids if i != bridge]
        assert all(_reach(plan, bridge, o) for o in others)
        cut_nodes = {x for pair in plan.cuts for x in pair}
        assert cut_nodes == set(others)  # every non-bridge node loses someone
        a, c = plan.cuts[0]
        assert not _reach(plan, a, c) and _reach(plan, a, bridge) and _reach(plan, bridge, c)  # not transitive


@pytest.mark.parametrize("fault", [Fault.KILL, Fault.PAUSE])
def test_kill_and_pause_pick_one_random_node_and_cut_nothing(fault: Fault) -> None:
    plans = [plan_fault(fault, IDS, random.Random(s)) for s in range(30)]
    assert {p.nodes for p in plans} == {(1,), (2,), (3,)}
    assert all(p.cuts == () for p in plans)


def test_the_same_seed_gives_the_same_plans() -> None:
    def plans(seed: int) -> list[FaultPlan]:
        rng = random.Random(seed)
        return [plan_fault(f, [1, 2, 3, 4, 5], rng) for f in Fault]

    assert plans(7) == plans(7)


def test_partitions_need_enough_nodes() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        plan_fault(Fault.MAJORITY_SPLIT, [1], random.Random(0))
    with pytest.raises(ValueError, match="at least 3"):
        plan_fault(Fault.BRIDGE, [1, 2], random.Random(0))


class FakeCluster:
    """Records what the nemesis does; names node 2 as leader and node 3 as coordinator."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    @property
    def node_ids(self) -> list[int]:
        return [1, 2, 3]

    def cut_links(self, pairs: Iterable[tuple[int, int]]) -> None:
        self.calls.append(("cut", tuple(pairs)))

    def heal(self) -> None:
        self.calls.append(("heal", None))

    def kill(self, node_id: int) -> None:
        self.calls.append(("kill", node_id))

    def restart(self, node_id: int) -> None:
        self.calls.append(("restart", node_id))

    def pause(self, node_id: int) -> None:
        self.calls.append(("pause", node_id))

    def resume(self, node_id: int) -> None:
        self.calls.append(("resume", node_id))

    def leader_of(self, topic: str, partition: int) -> int | None:
        return 2

    def coordinator_of(self, transactional_id: str) -> int | None:
        return 3


def _nemesis(cluster: FakeCluster, events: list[FaultEvent]) -> Nemesis:
    return Nemesis(cluster, topic="t", transactional_id="tx", rng=random.Random(3), on_event=events.append)


def test_each_round_applies_the_next_fault_then_heals_it_and_reports_both() -> None:
    cluster, events = FakeCluster(), []
    faults = [Fault.LEADER_ISOLATION, Fault.COORDINATOR_ISOLATION, Fault.KILL, Fault.PAUSE]
    _nemesis(cluster, events).run(faults, rounds=5, fault_s=0, quiet_s=0)
    assert [(e.kind, e.fault) for e in events] == [
        (kind, f) for f in [*faults, Fault.LEADER_ISOLATION] for kind in ("start", "heal")
    ]
    assert events[0].nodes == (2,) and events[0].cuts == ((1, 2), (2, 3))
    assert events[2].nodes == (3,)
    killed, paused = events[4].nodes[0], events[6].nodes[0]
    assert cluster.calls[:8] == [
        ("cut", ((1, 2), (2, 3))),
        ("heal", None),
        ("cut", ((1, 3), (2, 3))),
        ("heal", None),
        ("kill", killed),
        ("restart", killed),
        ("pause", paused),
        ("resume", paused),
    ]
    assert all(a.time <= b.time for a, b in itertools.pairwise(events))


def test_a_failure_while_a_fault_is_applied_still_heals_it() -> None:
    cluster = FakeCluster()

    def explode(event: FaultEvent) -> None:
        if event.kind == "start":
            raise RuntimeError("history writer failed")

    nemesis = Nemesis(cluster, topic="t", transactional_id="tx", rng=random.Random(0), on_event=explode)
    with pytest.raises(RuntimeError, match="history writer failed"):
        nemesis.run([Fault.PAUSE], rounds=3, fault_s=0, quiet_s=0)
    assert [c[0] for c in cluster.calls] == ["pause", "resume"]


def test_a_set_stop_runs_no_round() -> None:
    cluster, events = FakeCluster(), []
    stop = threading.Event()
    stop.set()
    _nemesis(cluster, events).run([Fault.KILL], rounds=10, fault_s=5, quiet_s=5, stop=stop)
    assert cluster.calls == [] and events == []


def test_majority_needs_more_than_half_of_all_nodes() -> None:
    assert majority([2, 2, 1], 3) == 2
    assert majority([2, 2], 3) == 2  # one node silent
    assert majority([2, None, 1], 3) is None
    assert majority([None, None, None], 3) is None
    assert majority([1, 1], 5) is None


def test_a_chosen_subnet_avoids_every_routed_network() -> None:
    rng = random.Random(5)
    taken = [ipaddress.IPv4Network("0.0.0.0/0"), ipaddress.IPv4Network("10.0.0.0/9")]
    for _ in range(100):
        net = choose_subnet(taken, rng)
        assert net.prefixlen == 24 and net.subnet_of(ipaddress.IPv4Network("10.0.0.0/8"))
        assert not net.overlaps(taken[1])
    every = [ipaddress.IPv4Network("10.0.0.0/8")]
    with pytest.raises(Exception, match="no free"):
        choose_subnet(every, rng)


def test_every_interface_name_fits_fifteen_characters() -> None:
    net = Network(200, prefix="abcde", run="0123ab")
    names = [net.bridge, net.host_veth(200), net.node_veth(200)]
    assert max(len(n) for n in names) <= 15, names
    assert net.namespace(7) == "abcde-0123ab-7" and net.table == "abcde_0123ab"
    for bad in ("", "toolong", "Txb", "1tx", "tx-b"):
        with pytest.raises(ValueError, match="prefix"):
            check_prefix(bad)
