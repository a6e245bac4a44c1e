"""The nemesis: drives faults into a ``NamespacedCluster`` in rounds and reports them for the history.

Each round applies one fault for ``fault_s`` seconds, heals it, then leaves the cluster
alone for ``quiet_s`` seconds. The faults:

* ``LEADER_ISOLATION``: cut the current leader of (topic, 0) from every other node.
* ``COORDINATOR_ISOLATION``: cut the transaction coordinator of the transactional id from every other node.
* ``MAJORITY_SPLIT``: cut a random minority (``(n - 1) // 2`` nodes, at least one) from the rest.
* ``BRIDGE``: split the nodes but one into two sides that cannot reach each other, while the
  remaining node (the bridge) reaches both: connectivity is not transitive.
* ``KILL``: SIGKILL a random node; healing restarts it (same data directory).
* ``PAUSE``: SIGSTOP a random node; healing sends SIGCONT.

Which nodes a fault hits is a pure choice (``plan_fault``: the fault, the node ids, the leader
and coordinator the cluster names, and a ``random.Random``), so a seeded run picks the same
targets for the same views. When the cluster names no leader (or coordinator), a targeted
isolation falls back to a random node.

Every fault is reported twice through ``on_event``: ``start`` (its time taken just before the
fault is applied) and ``heal`` (its time taken once the heal is complete), so
``[start.time, heal.time]`` covers every moment the fault was in effect. ``run`` heals whatever
it applied on every exit, including an exception or ``stop``.
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class Fault(enum.Enum):
    LEADER_ISOLATION = "leader-isolation"
    MAJORITY_SPLIT = "majority-split"
    COORDINATOR_ISOLATION = "coordinator-isolation"
    BRIDGE = "bridge"
    KILL = "kill"
    PAUSE = "pause"


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """What the nemesis reports, for the history.

    ``nodes``: the nodes the fault targets: the isolated, killed or paused node; for a
    majority split, the minority; for a bridge, the bridge node (the one that reaches
    both sides). ``cuts``: the node pairs whose traffic is dropped, ``(smaller, larger)``.
    ``time``: ``time.monotonic()``.
    """

    kind: str  # "start" | "heal"
    fault: Fault
    nodes: tuple[int, ...]
    time: float
    cuts: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """One fault's targets: the nodes it names and the links it cuts (none for kill and pause)."""

    fault: Fault
    nodes: tuple[int, ...]
    cuts: tuple[tuple[int, int], ...] = ()


PARTITIONS = frozenset({Fault.LEADER_ISOLATION, Fault.COORDINATOR_ISOLATION, Fault.MAJORITY_SPLIT, Fault.BRIDGE})


def _between(side: Iterable[int], rest: Iterable[int]) -> tuple[tuple[int, int], ...]:
    others = list(rest)
    return tuple(sorted((min(a, b), max(a, b)) for a in side for b in others))


def plan_fault(
    fault: Fault,
    node_ids: Sequence[int],
    rng: random.Random,
    *,
    leader: int | None = None,
    coordinator: int | None = None,
) -> FaultPlan:
    """Pick ``fault``'s targets among ``node_ids`` (pure: the same inputs and rng state give the same plan).

    ``leader`` / ``coordinator``: the node the cluster names as the partition leader /
    transaction coordinator (``None`` or an unknown id: a random node is isolated instead).
    """
    ids = sorted(node_ids)
    if fault in PARTITIONS and len(ids) < 2:
        raise ValueError(f"{fault.value} needs at least 2 nodes")
    if fault in (Fault.LEADER_ISOLATION, Fault.COORDINATOR_ISOLATION):
        aimed = leader if fault is Fault.LEADER_ISOLATION else coordinator
        target = aimed if aimed in ids else rng.choice(ids)
        assert target is not None
        return FaultPlan(fault, (target,), _between([target], [n for n in ids if n != target]))
    if fault is Fault.MAJORITY_SPLIT:
        minority = sorted(rng.sample(ids, max(1, (len(ids) - 1) // 2)))
        return FaultPlan(fault, tuple(minority), _between(minority, [n for n in ids if n not in minority]))
    if fault is Fault.BRIDGE:
        if len(ids) < 3:
            raise ValueError("bridge needs at least 3 nodes")
        order = ids[:]
        rng.shuffle(order)
        bridge, rest = order[0], order[1:]
        half = len(rest) // 2
        return FaultPlan(fault, (bridge,), _between(rest[:half], rest[half:]))
    return FaultPlan(fault, (rng.choice(ids),))  # KILL, PAUSE


class FaultableCluster(Protocol):
    """What the nemesis needs of a cluster (``verify.netns.NamespacedCluster`` has it all)."""

    @property
    def node_ids(self) -> list[int]: ...

    def cut_links(self, pairs: Iterable[tuple[int, int]]) -> None: ...

    def heal(self) -> None: ...

    def kill(self, node_id: int) -> None: ...

    def restart(self, node_id: int) -> None: ...

    def pause(self, node_id: int) -> None: ...

    def resume(self, node_id: int) -> None: ...

    def leader_of(self, topic: str, partition: int) -> int | None: ...

    def coordinator_of(self, transactional_id: str) -> int | None: ...


class Nemesis:
    """Applies faults to ``cluster`` in rounds; see the module docstring.

    ``topic`` / ``transactional_id``: whose partition-0 leader / transaction coordinator the
    targeted isolations aim at. ``on_event`` is called from the thread that runs ``run``.
    """

    def __init__(
        self,
        cluster: FaultableCluster,
        *,
        topic: str,
        transactional_id: str,
        rng: random.Random,
        on_event: Callable[[FaultEvent], None],
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.transactional_id = transactional_id
        self.rng = rng
        self.on_event = on_event
        self._active: FaultPlan | None = None

    def plan(self, fault: Fault) -> FaultPlan:
        """``fault``'s targets given what the cluster says now (asks it for the leader or coordinator)."""
        leader = self.cluster.leader_of(self.topic, 0) if fault is Fault.LEADER_ISOLATION else None
        coordinator = (
            self.cluster.coordinator_of(self.transactional_id) if fault is Fault.COORDINATOR_ISOLATION else None
        )
        return plan_fault(fault, self.cluster.node_ids, self.rng, leader=leader, coordinator=coordinator)

    def run(
        self,
        faults: Sequence[Fault],
        *,
        rounds: int,
        fault_s: float,
        quiet_s: float,
        stop: threading.Event | None = None,
    ) -> None:
        """Blocking: ``rounds`` rounds, cycling through ``faults``; returns early once ``stop`` is set.

        Each round is ``quiet_s`` of health, then the fault for ``fault_s``: the first fault finds the
        workload's clients running, not starting up. Whatever is applied when it returns or raises is
        healed first.
        """
        if not faults:
            raise ValueError("no faults to run")
        stop = stop or threading.Event()
        try:
            for r in range(rounds):
                if stop.wait(quiet_s):
                    break
                self.start(self.plan(faults[r % len(faults)]))
                stop.wait(fault_s)
                self.heal()
        finally:
            self.heal()

    def start(self, plan: FaultPlan) -> None:
        """Apply ``plan`` and report it (one fault at a time: heal the previous one first)."""
        if self._active is not None:
            raise RuntimeError(f"{self._active.fault.value} is still applied")
        at = time.monotonic()
        self._active = plan  # before applying: a fault applied halfway is healed too
        if plan.cuts:
            self.cluster.cut_links(plan.cuts)
        elif plan.fault is Fault.KILL:
            self.cluster.kill(plan.nodes[0])
        elif plan.fault is Fault.PAUSE:
            self.cluster.pause(plan.nodes[0])
        self.on_event(FaultEvent("start", plan.fault, plan.nodes, at, plan.cuts))

    def heal(self) -> None:
        """Undo the applied fault, if any (cuts removed, a killed node restarted, a paused one resumed); report it."""
        plan, self._active = self._active, None
        if plan is None:
            return
        if plan.cuts:
            self.cluster.heal()
        elif plan.fault is Fault.KILL:
            self.cluster.restart(plan.nodes[0])
        elif plan.fault is Fault.PAUSE:
            self.cluster.resume(plan.nodes[0])
        self.on_event(FaultEvent("heal", plan.fault, plan.nodes, time.monotonic(), plan.cuts))
