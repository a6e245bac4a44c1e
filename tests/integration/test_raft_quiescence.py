"""Quiescent Raft groups in real nodes (raft.quiescence, raft.links).

In-process RaftNodes over real TCP:

* an idle group quiesces on every replica and wakes on a proposal, which commits everywhere;
* a follower's restart wakes the group (its node's liveness lapses), the follower catches
  up with what was written meanwhile, and the group quiesces again.

Node processes (``raft.node_host``):

* SIGKILL of the node leading quiescent groups: the survivors elect new leaders for each
  (the dead node's heartbeats stop; nobody waits for a per-group heartbeat that never comes);
* a follower cut off from the others (SIGSTOP past several election timeouts, then SIGCONT)
  never yields two leaders in one term, and the group keeps accepting writes through its
  one leader.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time
from collections import Counter
from typing import Any

import pytest

from raft import RaftSettings
from raft.node_host import HostProcess
from raft.quiescence import QuiescenceState
from tests.raft_support.cluster import PASSWORD, Cluster, eventually, free_port, run
from tests.raft_support.hosts import ready_leaders, wait_until

pytestmark = pytest.mark.integration

SETTINGS = RaftSettings(password=PASSWORD, quiesce_after_s=0.3, quiescent_tick_s=1.0)
GROUPS = ["qa", "qb"]
SM = "tests.raft_support.counter_sm:CounterStateMachine"


def _all_quiescent(c: Cluster, gids: list[str]) -> bool:
    live = [i for i, n in enumerate(c.nodes) if n is not None]
    return all(c.group(i, g).quiescence() is QuiescenceState.QUIESCENT for i in live for g in gids)


def test_an_idle_group_quiesces_everywhere_and_a_proposal_wakes_and_commits_it(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, GROUPS, settings=SETTINGS)
        try:
            c.start_all()
            leaders = await c.wait_leaders()
            await eventually(lambda: _all_quiescent(c, GROUPS), 10, "every replica quiescent")
            leader = c.group(leaders["qa"], "qa")
            so: Any = leader._so
            heartbeats_sent = so.quiesce_count, so.wake_count
            # When: a proposal on the quiescent leader.
            assert await c.submit("qa", b"add:k:5") == 5
            # Then: it committed and applied on every replica; the other group stayed quiet.
            await c.wait_value("qa", "k", 5)
            assert so.wake_count == heartbeats_sent[1] + 1
            assert all(c.group(i, "qb").quiescence() is QuiescenceState.QUIESCENT for i in range(3))
            # And the group quiesces again once the write is everywhere.
            await eventually(lambda: _all_quiescent(c, ["qa"]), 10, "qa quiescent again")
            assert so.quiesce_count == heartbeats_sent[0] + 1
            assert c.leader_index("qa") == leaders["qa"]
        finally:
            c.close()

    run(scenario)


def test_a_stopped_follower_is_left_out_and_its_restart_wakes_the_group_to_catch_it_up(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, ["qa"], settings=SETTINGS)
        try:
            c.start_all()
            leader_i = (await c.wait_leaders())["qa"]
            assert await c.submit("qa", b"add:k:1") == 1
            await eventually(lambda: _all_quiescent(c, ["qa"]), 10, "every replica quiescent")
            follower = next(i for i in range(3) if i != leader_i)
            leader = c.group(leader_i, "qa")
            wakes = leader.wake_count()
            # When: a follower's node stops.
            c.stop_node(follower)
            # Then: the leader leaves it out and stays quiescent with the other follower (a majority), without
            # waking: one dead node does not keep the groups it shares awake
            await eventually(lambda: bool(leader.left_out()), 5, "the stopped follower left out")
            assert leader.quiescence() is QuiescenceState.QUIESCENT and leader.wake_count() == wakes
            # and a write still commits (it wakes the group, and the majority is there)
            assert await c.submit("qa", b"add:k:1") == 2
            # When: it comes back, it catches up with what it missed, and the group quiesces again.
            c.start_node(follower)
            await c.wait_value("qa", "k", 2)
            await eventually(lambda: _all_quiescent(c, ["qa"]), 15, "quiescent again with the restarted follower")
            assert c.leader_index("qa") == leader_i
        finally:
            c.close()

    run(scenario)


# --- node processes --------------------------------------------------------------------------

N_GROUPS = 6


def _start(i: int, addrs: list[str], tmp: pathlib.Path) -> HostProcess:
    args = [
        "--addr", addrs[i], "--members", ",".join(addrs), "--data", str(tmp / f"n{i}"),
        "--groups", str(N_GROUPS), "--sm", SM, "--password", PASSWORD, "--log-level", "INFO",
        "--heartbeat", "0.1", "--quiesce-after", "0.3", "--quiescent-tick", "1.0",
    ]  # fmt: skip
    return HostProcess(args, stderr_path=str(tmp / f"n{i}.log"))


def _roles(procs: dict[int, HostProcess]) -> dict[int, dict[str, list[Any]]]:
    return {i: p.request({"op": "roles"})["ok"] for i, p in procs.items()}


def _quiescent_everywhere(procs: dict[int, HostProcess]) -> bool:
    return all(r[2] == "QUIESCENT" for roles in _roles(procs).values() for r in roles.values())


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Any:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    procs = {i: _start(i, addrs, tmp_path) for i in range(3)}
    try:
        yield procs
    finally:
        for p in procs.values():
            if p.proc.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
            p.stop()


def test_killing_the_node_leading_quiescent_groups_elects_new_leaders(cluster: dict[int, HostProcess]) -> None:
    procs = cluster
    groups = [f"g{i}" for i in range(N_GROUPS)]
    wait_until(lambda: len(ready_leaders(procs)) == N_GROUPS, 30, "a leader in every group")
    wait_until(lambda: _quiescent_everywhere(procs), 20, "every replica quiescent")
    leaders = ready_leaders(procs)
    victim = Counter(leaders.values()).most_common(1)[0][0]
    led = [g for g, i in leaders.items() if i == victim]
    # When: the node leading them dies without a word.
    procs.pop(victim).kill()
    # Then: each of its quiescent groups gets a new leader among the survivors, within a few election timeouts.
    took = wait_until(
        lambda: all(ready_leaders(procs).get(g) in procs for g in led), 15, "new leaders of the dead node's groups"
    )
    assert took < 10, took
    for g in groups:
        reply = procs[ready_leaders(procs)[g]].request({"op": "submit", "group": g, "command": "add:k:1"})
        assert "ok" in reply, reply


def test_a_cut_off_follower_of_a_quiescent_group_never_makes_a_second_leader(cluster: dict[int, HostProcess]) -> None:
    procs = cluster
    wait_until(lambda: len(ready_leaders(procs)) == N_GROUPS, 30, "a leader in every group")
    wait_until(lambda: _quiescent_everywhere(procs), 20, "every replica quiescent")
    leaders = ready_leaders(procs)
    terms_before = _roles(procs)
    # A node that leads nothing (or the least): a follower in (nearly) every group.
    counts = Counter(leaders.values())
    follower = min(procs, key=lambda i: counts.get(i, 0))
    others = [i for i in procs if i != follower]
    # When: it is cut off for several election timeouts (no node heartbeats either way), then comes back.
    os.kill(procs[follower].pid, signal.SIGSTOP)
    seen: dict[tuple[str, int], set[int]] = {}
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        for i in others:
            for g, (state, term, _q) in procs[i].request({"op": "roles"})["ok"].items():
                if state == "leader":
                    seen.setdefault((g, term), set()).add(i)
        time.sleep(0.05)
    os.kill(procs[follower].pid, signal.SIGCONT)
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        for i in procs:
            for g, (state, term, _q) in procs[i].request({"op": "roles"})["ok"].items():
                if state == "leader":
                    seen.setdefault((g, term), set()).add(i)
        time.sleep(0.05)
    # Then: never two leaders of one group in one term, and the groups it did not lead kept leader and term.
    assert all(len(nodes) == 1 for nodes in seen.values()), seen
    after, terms_after = ready_leaders(procs), _roles(procs)
    for g, i in leaders.items():
        if i != follower:
            assert after.get(g) == i, (g, i, after.get(g))
            assert all(terms_after[n][g][1] == terms_before[n][g][1] for n in others), g
    # And every group takes writes through its one leader.
    for g, i in ready_leaders(procs).items():
        reply = procs[i].request({"op": "submit", "group": g, "command": "add:k:1"})
        assert "ok" in reply, reply
