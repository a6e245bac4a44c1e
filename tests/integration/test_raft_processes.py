"""3 node processes (raft.node_host) x 20 groups; SIGKILL the busiest leader."""

from __future__ import annotations

import os
import pathlib
from collections import Counter

import pytest

from raft.node_host import HostProcess
from tests.raft_support.cluster import PASSWORD, free_port
from tests.raft_support.hosts import ready_leaders, wait_until

pytestmark = pytest.mark.integration

N_GROUPS = 20
SM = "tests.raft_support.counter_sm:CounterStateMachine"


def _start(i: int, addrs: list[str], tmp: pathlib.Path) -> HostProcess:
    args = [
        "--addr", addrs[i], "--members", ",".join(addrs), "--data", str(tmp / f"n{i}"),
        "--groups", str(N_GROUPS), "--sm", SM, "--password", PASSWORD, "--log-level", "INFO",
    ]  # fmt: skip
    return HostProcess(args, stderr_path=str(tmp / f"n{i}.log"))


def test_sigkill_leader_process_fails_over_and_restart_catches_up(tmp_path: pathlib.Path) -> None:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    procs: dict[int, HostProcess] = {}
    try:
        for i in range(3):
            procs[i] = _start(i, addrs, tmp_path)
        groups = [f"g{i}" for i in range(N_GROUPS)]
        wait_until(lambda: len(ready_leaders(procs)) == N_GROUPS, 15, "leaders in all groups")
        leaders = ready_leaders(procs)
        for g in groups:
            for n in range(1, 6):
                reply = procs[leaders[g]].request({"op": "submit", "group": g, "command": "add:k:1", "timeout": 5})
                assert reply == {"ok": n}, (g, reply)
        # Kill -9 the process leading the most groups.
        victim = Counter(leaders.values()).most_common(1)[0][0]
        procs.pop(victim).kill()
        # Every group elects a new ready leader. The 3 s failover target is asserted for the
        # broker (tests/fault/test_failover.py) and measured by `txbroker bench failover`; here the
        # bound only has to tell "fails over" from "stuck" on a loaded 2-core CI machine.
        wait_until(lambda: len(ready_leaders(procs)) == N_GROUPS, 10.0, "failover")
        leaders = ready_leaders(procs)
        assert victim not in leaders.values()
        for g in groups:
            for i in procs:
                values = procs[i].request({"op": "sm", "group": g, "attr": "values"})["ok"]
                assert values.get("k", 0) in (4, 5)  # a follower may lag by the last entry
            reply = procs[leaders[g]].request({"op": "submit", "group": g, "command": "add:k:1", "timeout": 5})
            assert reply == {"ok": 6}, (g, reply)
        # Restart the killed node from its data dir: it catches up in every group.
        procs[victim] = _start(victim, addrs, tmp_path)

        def caught_up() -> bool:
            for g in groups:
                values = procs[victim].request({"op": "sm", "group": g, "attr": "values"})
                if values["ok"].get("k") != 6:
                    return False
            return True

        wait_until(caught_up, 15, "restarted node caught up")
        assert os.path.exists(tmp_path / f"n{victim}")
    finally:
        for p in procs.values():
            p.stop()
