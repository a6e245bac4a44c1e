"""Raft membership changes of one group across node processes (raft.node_host).

A group moves to a new replica set one voter at a time while writes keep
committing; the leader refuses to remove itself; a second change waits for
the first; a node restarted with stale constructor members takes the log's
configuration; nodes not (or no longer) in the group do not disrupt it; a
new voter and a learner with empty logs catch up through full snapshots.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raft.node_host import HostProcess
from tests.raft_support.cluster import PASSWORD, free_port

pytestmark = pytest.mark.integration

GROUP = "g0"
SM = "tests.raft_support.counter_sm:CounterStateMachine"
DURABLE_SM = "tests.raft_support.counter_sm:DurableCounterStateMachine"


class Procs:
    """Node processes of one test, each hosting replica ``g0``; stops them all at the end."""

    def __init__(self, tmp: pathlib.Path, n: int) -> None:
        self.tmp = tmp
        self.addrs = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.procs: dict[int, HostProcess] = {}

    def start(self, i: int, members: list[int], sm: str = SM, compaction: int = 2000) -> HostProcess:
        args = [
            "--addr", self.addrs[i], "--members", ",".join(self.addrs[m] for m in members),
            "--data", str(self.tmp / f"n{i}"), "--groups", "1", "--sm", sm, "--password", PASSWORD,
            "--compaction-min-entries", str(compaction), "--log-level", "INFO",
        ]  # fmt: skip
        self.procs[i] = HostProcess(args, stderr_path=str(self.tmp / f"n{i}.log"))
        return self.procs[i]

    def stop(self, i: int) -> None:
        self.procs.pop(i).stop()

    def close(self) -> None:
        for p in self.procs.values():
            p.stop()
        self.procs.clear()

    def req(self, i: int, op: str, **kw: Any) -> dict[str, Any]:
        return self.procs[i].request({"op": op, "group": GROUP, **kw})

    def leader(self) -> int | None:
        ready = [i for i, p in self.procs.items() if GROUP in p.request({"op": "leaders"})["ready"]]
        return ready[0] if len(ready) == 1 else None

    def wait_leader(self, timeout: float, what: str) -> int:
        found: list[int] = []
        wait(lambda: (found.append(ld) or True) if (ld := self.leader()) is not None else False, timeout, what)
        return found[-1]

    def voters(self, i: int) -> set[str]:
        return set(self.req(i, "voters")["ok"])

    def term(self, i: int) -> int:
        return int(self.req(i, "status")["term"])

    def value(self, i: int) -> int:
        return int(self.req(i, "sm", attr="values")["ok"].get("k", 0))

    def change(self, i: int, timeout: float = 10.0, **kw: str) -> dict[str, Any]:
        return self.req(i, "change_membership", timeout=timeout, **kw)


@pytest.fixture
def procs(tmp_path: pathlib.Path) -> Iterator[Callable[[int], Procs]]:
    made: list[Procs] = []

    def make(n: int) -> Procs:
        made.append(Procs(tmp_path, n))
        return made[-1]

    yield make
    for p in made:
        p.close()


def wait(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def steady_term(p: Procs, leader: int, seconds: float) -> None:
    """The leader keeps its leadership and term for ``seconds`` (longer than an election timeout)."""
    term = p.term(leader)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert p.term(leader) == term
        assert p.leader() == leader
        time.sleep(0.1)


def test_group_moves_one_voter_at_a_time(procs: Callable[[int], Procs]) -> None:
    p = procs(5)
    a = p.addrs
    for i in range(3):
        p.start(i, [0, 1, 2])
    leader = p.wait_leader(15, "a leader")
    f1, f2 = (i for i in range(3) if i != leader)
    assert p.voters(leader) == {a[0], a[1], a[2]}
    assert p.req(leader, "load", key="k") == {"ok": True}

    # A node to be added runs with the new configuration before it is added: harmless.
    p.start(3, [0, 1, 2, 3])
    steady_term(p, leader, 2.5)
    assert p.change(leader, add=a[3]) == {"ok": True}
    assert p.voters(leader) == {a[0], a[1], a[2], a[3]}
    wait(lambda: p.voters(3) == {a[0], a[1], a[2], a[3]}, 10, "the new voter learns its configuration")
    wait(lambda: p.req(leader, "member_lag", address=a[3])["ok"] == 0, 10, "the new voter caught up")
    assert p.change(leader, add=a[3], timeout=1) == {"ok": True}  # a voter already: nothing to do

    assert p.change(leader, remove=a[f1]) == {"ok": True}
    assert p.voters(leader) == {a[leader], a[f2], a[3]}
    assert p.req(leader, "member_lag", address=a[f1])["ok"] is None
    assert p.change(leader, remove=a[f1], timeout=1) == {"ok": True}  # no voter: nothing to do
    # The removed node, still running until its owner destroys the group, does not disrupt it either.
    steady_term(p, leader, 2.5)
    p.stop(f1)

    committed = p.req(leader, "load_stop")
    assert committed["ok"] > 0 and committed["errors"] == 0, committed
    total = committed["ok"]
    for i in (leader, f2, 3):
        wait(lambda i=i: p.value(i) == total, 10, f"every entry on node {i}")

    # One change at a time: of two requests at once, the second is refused while the first is pending.
    both = [
        {"op": "change_membership", "group": GROUP, "add": a[4], "timeout": 10},
        {"op": "change_membership", "group": GROUP, "remove": a[3], "timeout": 10},
    ]
    first, second = p.procs[leader].request({"op": "batch", "requests": both})["ok"]
    assert first == {"ok": True}
    assert second["error"] == "MembershipChangeInProgress", second
    assert p.voters(leader) == {a[leader], a[f2], a[3], a[4]}
    assert p.change(leader, remove=a[4]) == {"ok": True}  # node 4 never ran: the group needs it gone

    # Restart from the logs with stale constructor members: the new configuration stands, and the
    # removed node's vote counts for nothing (with the old configuration, f1 + f2 would elect a leader).
    new_set = {a[leader], a[f2], a[3]}
    # The removal is committed on a majority; f2 may not have it yet, and its log is what the restart reads.
    wait(lambda: p.voters(f2) == new_set, 10, "f2's log has the configuration without node 4")
    p.procs.pop(f2).kill()
    p.procs.pop(3).kill()
    p.stop(leader)
    p.start(f1, [0, 1, 2])
    p.start(f2, [0, 1, 2])
    wait(lambda: p.voters(f2) == new_set, 5, "the restarted node takes the log's configuration")
    until = time.monotonic() + 3.0
    while time.monotonic() < until:
        assert p.leader() is None
        time.sleep(0.1)
    p.stop(f1)
    p.start(leader, [0, 1, 2])
    p.start(3, [0, 1, 2, 3])
    ld = p.wait_leader(15, "a leader of the new configuration")
    for i in (leader, f2, 3):
        wait(lambda i=i: p.voters(i) == new_set, 5, f"node {i} runs the new configuration")

    # The leader cannot remove itself; after a transfer the new leader removes it.
    refused = p.change(ld, remove=a[ld], timeout=1)
    assert refused["error"] == "CannotRemoveLeader", refused
    successor, other = (i for i in (leader, f2, 3) if i != ld)
    wait(lambda: p.req(ld, "member_lag", address=a[successor])["ok"] == 0, 10, "the successor caught up")
    p.req(ld, "transfer", to=a[successor])
    wait(lambda: p.leader() == successor, 10, "leadership moved")
    # The voter that stays must be caught up first: the new configuration has no majority without it.
    wait(lambda: p.req(successor, "member_lag", address=a[other])["ok"] == 0, 10, "the remaining voter caught up")
    assert p.change(successor, remove=a[ld]) == {"ok": True}
    assert p.voters(successor) == {a[successor], a[other]}
    steady_term(p, successor, 2.5)  # the old leader, removed but running, does not disrupt the group
    p.stop(ld)
    assert p.req(successor, "submit", command="add:k:1", timeout=5) == {"ok": total + 1}
    wait(lambda: p.value(other) == total + 1, 10, "the remaining voter applied it")


def test_new_voter_and_learner_catch_up_through_snapshots(procs: Callable[[int], Procs]) -> None:
    p = procs(5)
    a = p.addrs
    for i in range(3):
        p.start(i, [0, 1, 2], sm=DURABLE_SM, compaction=50)
    leader = p.wait_leader(15, "a leader")
    for n in range(1, 201):
        assert p.req(leader, "submit", command="add:k:1", timeout=5) == {"ok": n}

    # A learner can be dropped again (node 4 is not even running).
    assert p.req(leader, "add_learner", address=a[4], timeout=5) == {"ok": True}
    assert p.req(leader, "learners")["ok"] == [a[4]]
    last_index = p.req(leader, "status")["commit_index"]  # idle: the last index
    assert p.req(leader, "learner_lag", address=a[4])["ok"] == last_index  # matched nothing yet
    assert p.req(leader, "remove_learner", address=a[4], timeout=5) == {"ok": True}
    assert p.req(leader, "learners")["ok"] == []
    assert p.req(leader, "learner_lag", address=a[4])["ok"] is None

    # A learner with an empty log: replicated to (through a snapshot), not counted, then promoted.
    p.start(3, [0, 1, 2, 3], sm=DURABLE_SM, compaction=50)
    assert p.req(leader, "add_learner", address=a[3], timeout=5) == {"ok": True}
    assert p.req(leader, "learners")["ok"] == [a[3]]
    assert a[3] not in p.voters(leader)
    wait(lambda: p.req(leader, "learner_lag", address=a[3])["ok"] == 0, 15, "the learner caught up")
    wait(lambda: p.value(3) == 200, 10, "the learner applied everything")
    assert p.req(3, "sm", attr="restored_from_snapshot")["ok"] == 1
    assert p.change(leader, add=a[3]) == {"ok": True}
    assert p.req(leader, "learners")["ok"] == []
    assert p.voters(leader) == {a[0], a[1], a[2], a[3]}
    assert p.req(leader, "member_lag", address=a[3])["ok"] is not None
    # A follower whose snapshot predates the addition restarts with the current members: its snapshot's
    # configuration, then its journal's "add 3", give the same configuration, with node 3 connected.
    fo = next(i for i in range(3) if i != leader)
    p.procs.pop(fo).kill()
    p.start(fo, [0, 1, 2, 3], sm=DURABLE_SM, compaction=50)
    four = {a[0], a[1], a[2], a[3]}
    wait(lambda: p.voters(fo) == four, 5, "the restarted follower keeps the configuration")
    wait(lambda: set(p.req(fo, "status")["connected"]) == four - {a[fo]}, 10, "connected to every voter")

    # A voter added directly with an empty log catches up the same way.
    for n in range(201, 301):
        assert p.req(leader, "submit", command="add:k:1", timeout=5) == {"ok": n}
    p.start(4, [0, 1, 2, 3, 4], sm=DURABLE_SM, compaction=50)
    assert p.change(leader, add=a[4]) == {"ok": True}
    wait(lambda: p.req(leader, "member_lag", address=a[4])["ok"] == 0, 15, "the new voter caught up")
    wait(lambda: p.value(4) == 300, 10, "the new voter applied everything")
    assert p.req(4, "sm", attr="restored_from_snapshot")["ok"] == 1
    everyone = {a[0], a[1], a[2], a[3], a[4]}
    assert p.voters(4) == everyone

    # Killed and restarted with stale members (no node 3): its snapshot and journal decide.
    p.procs.pop(4).kill()
    p.start(4, [0, 1, 2, 4], sm=DURABLE_SM, compaction=50)
    wait(lambda: p.voters(4) == everyone, 5, "the restarted voter takes the log's configuration")
    assert p.req(leader, "submit", command="add:k:1", timeout=5) == {"ok": 301}
    wait(lambda: p.value(4) == 301, 10, "the restarted voter applied the next entry")
    # ... and restarted with the current members, whatever its snapshot recorded.
    p.procs.pop(3).kill()
    p.start(3, [0, 1, 2, 3, 4], sm=DURABLE_SM, compaction=50)
    wait(lambda: p.voters(3) == everyone, 5, "the restarted learner-made voter keeps the configuration")
    assert p.req(leader, "submit", command="add:k:1", timeout=5) == {"ok": 302}
    wait(lambda: p.value(3) == 302, 10, "it applies the next entry")
    assert p.req(leader, "status")["connected"] == sorted(everyone - {a[leader]})
