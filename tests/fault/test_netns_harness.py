"""verify.netns: a real 3-node cluster, one network namespace per node; silent cuts, kill, pause, cleanup.

These tests need root, iproute2 and nftables; elsewhere they skip with ``unavailable_reason()``.
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import http, plain_produce, wait_for
from verify.nemesis import Fault, FaultEvent, Nemesis
from verify.netns import NamespacedCluster, NetnsError, sweep, unavailable_reason
from verify.netns_network import Network, run_command

REASON = unavailable_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.fault,
    pytest.mark.skipif(REASON is not None, reason=f"namespaced cluster unavailable: {REASON}"),
]

CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))"


def leftovers(c: NamespacedCluster) -> list[str]:
    """Every namespace, link and root-namespace nft table that carries this run's id."""
    run = c.network.run
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    links = [link["ifname"] for link in json.loads(subprocess.check_output(["ip", "-j", "link", "show"]))]
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False).stdout.split()
    return [n for n in [*names, *links, *tables] if run in n]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NamespacedCluster]:
    c = NamespacedCluster(tmp_path / "cluster", 3)
    try:
        c.start(timeout=60)
        create_topic(c, "t")
        yield c
    finally:
        c.close()
    assert leftovers(c) == []


def create_topic(c: NamespacedCluster, name: str) -> None:
    body = {"name": name, "partitions": 1, "replication_factor": 3}

    def created() -> bool:
        status, res = http("POST", c.url(1) + "/v1/topics", body, timeout=10)
        assert status == 201 or res.get("retriable") or res.get("error_code") == "TOPIC_ALREADY_EXISTS", res
        return status == 201 or res.get("error_code") == "TOPIC_ALREADY_EXISTS"

    wait_for(created, 30, f"topic {name} created")
    wait_for(lambda: c.leader_of(name, 0), 30, f"a leader of {name}-0")


def produce(url: str, topic: str, value: bytes) -> tuple[int, Any]:
    return plain_produce(url, topic, value, timeout_ms=5000, timeout=10)


def reaches(c: NamespacedCluster, src: int, dst: int, port: int, timeout: float = 1.5) -> bool:
    """Whether a TCP connect from inside ``src``'s namespace to ``dst``'s address and ``port`` succeeds."""
    done = c.exec_in(src, [sys.executable, "-c", CONNECT, c.address(dst), str(port), str(timeout)], timeout=30)
    return done.returncode == 0


def livez(url: str) -> int | None:
    try:
        return http("GET", url + "/livez", timeout=2)[0]
    except OSError:
        return None


def test_every_node_is_reachable_from_the_root_namespace_and_sees_its_peers(cluster: NamespacedCluster) -> None:
    c = cluster
    assert len({c.address(i) for i in c.node_ids}) == 3
    for i in c.node_ids:
        assert c.url(i).startswith(f"http://{c.address(i)}:")
        assert livez(c.url(i)) == 200
        assert c.alive_seen_by(i) == {1, 2, 3}
        assert c.exec_in(i, ["ip", "-br", "link", "show", "lo"]).stdout.split()[1] in ("UNKNOWN", "UP")
    assert c.coordinator_of("tx-1") in c.node_ids


def test_an_isolated_leader_keeps_its_client_while_the_majority_serves_without_it(cluster: NamespacedCluster) -> None:
    c = cluster
    old = wait_for(lambda: c.leader_of("t", 0), 30, "a leader of t-0")
    peers = [i for i in c.node_ids if i != old]
    assert reaches(c, old, peers[0], c.configs[peers[0] - 1].raft_port)  # the check can fail: it reaches now

    # When the leader is cut from both peers
    c.isolate(old)
    assert c.cuts == {(min(old, p), max(old, p)) for p in peers}

    # Then the other two elect a leader among themselves and accept writes through it
    new = wait_for(lambda: (n := c.leader_of("t", 0)) in peers and n, 30, "a leader among the majority")
    wait_for(lambda: produce(c.url(new), "t", b"during")[0] == 200, 30, "a produce through the majority's leader")
    # and the isolated node still answers the root namespace, but reaches no peer
    assert livez(c.url(old)) == 200
    for p in peers:
        assert not reaches(c, old, p, c.configs[p - 1].raft_port)
        assert not reaches(c, old, p, c.configs[p - 1].http_port)
        assert not reaches(c, p, old, c.configs[old - 1].http_port)
    assert reaches(c, peers[0], peers[1], c.configs[peers[1] - 1].http_port)
    wait_for(lambda: c.alive_seen_by(old) == {old}, 30, f"node {old} to see its peers gone")

    # When the cut heals, every node sees every node again and writes go on
    c.heal()
    assert c.cuts == frozenset()
    c.wait_connected(timeout=30)
    assert all(c.alive_seen_by(i) == {1, 2, 3} for i in c.node_ids)
    leader = wait_for(lambda: c.leader_of("t", 0), 30, "a leader of t-0 after the heal")
    wait_for(lambda: produce(c.url(leader), "t", b"after")[0] == 200, 30, "a produce after the heal")


def test_a_cut_between_two_nodes_leaves_the_third_reaching_both(cluster: NamespacedCluster) -> None:
    c = cluster
    port = {i: c.configs[i - 1].http_port for i in c.node_ids}
    c.cut(1, 3)
    assert not reaches(c, 1, 3, port[3]) and not reaches(c, 3, 1, port[1])
    assert reaches(c, 1, 2, port[2]) and reaches(c, 3, 2, port[2]) and reaches(c, 2, 1, port[1])
    assert reaches(c, 2, 3, port[3])
    c.heal()
    assert reaches(c, 1, 3, port[3]) and reaches(c, 3, 1, port[1])


def test_a_killed_node_is_gone_until_restarted_and_then_rejoins(cluster: NamespacedCluster) -> None:
    c = cluster
    c.kill(2)
    assert not c.is_running(2)
    assert livez(c.url(2)) is None
    wait_for(lambda: 2 not in (c.alive_seen_by(1) or {2}), 30, "node 1 to see node 2 gone")
    c.restart(2)
    c.wait_ready([2], timeout=60)
    c.wait_connected(timeout=30)
    assert c.is_running(2)


def test_a_paused_node_is_silent_until_resumed(cluster: NamespacedCluster) -> None:
    c = cluster
    c.pause(3)
    assert c.paused == {3}
    assert livez(c.url(3)) is None  # stopped: the connection is accepted by the kernel, nothing answers
    wait_for(lambda: 3 not in (c.alive_seen_by(1) or {3}), 30, "node 1 to see node 3 silent")
    c.resume(3)
    wait_for(lambda: livez(c.url(3)) == 200, 30, "node 3 to answer again")
    c.wait_connected(timeout=30)
    assert c.is_running(3) and c.paused == frozenset()


def test_close_removes_every_process_namespace_link_and_table(tmp_path: Path) -> None:
    c = NamespacedCluster(tmp_path / "cluster", 3).start(timeout=60)
    try:
        c.cut(1, 2)
        pids = list(c.pids.values())
        assert len(leftovers(c)) >= 4  # 3 namespaces, a bridge, veths: the check sees them
        assert "table inet" in c.exec_in(1, ["nft", "list", "ruleset"]).stdout or c.fault_backend == "blackhole"
    finally:
        c.close()
    c.close()  # idempotent
    assert leftovers(c) == []
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)


def test_a_failed_start_leaves_nothing_behind(tmp_path: Path) -> None:
    c = NamespacedCluster(tmp_path / "cluster", 3, python="/nonexistent/python3")
    with pytest.raises(NetnsError):
        c.start(timeout=10)
    assert leftovers(c) == []


CRASHED_RUN = """
import os, sys
from verify.netns_network import Network
net = Network(2, prefix="txbs")
net.create()
net.cut([(1, 2)])
print(net.run, flush=True)
os._exit(0)  # no close(): what a crashed run leaves
"""


def test_sweep_removes_what_a_crashed_run_left_and_spares_live_runs(cluster: NamespacedCluster) -> None:
    run = subprocess.run(
        [sys.executable, "-c", CRASHED_RUN], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2]
    ).stdout.strip()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"txbs-{run}-1" in left
    assert sweep("txbs") == 5  # 2 namespaces, 2 host veths, 1 bridge
    links = subprocess.run(["ip", "link"], capture_output=True, text=True, check=True).stdout
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert run not in links and run not in after
    sweep("txb")  # this cluster's owner (the test process) lives: its run stays
    assert len(leftovers(cluster)) >= 4 and all(livez(u) == 200 for u in cluster.urls)


def test_the_nemesis_drives_each_kind_of_fault_and_leaves_the_cluster_whole(cluster: NamespacedCluster) -> None:
    c = cluster
    events: list[FaultEvent] = []
    leader = wait_for(lambda: c.leader_of("t", 0), 30, "a leader of t-0")
    nemesis = Nemesis(c, topic="t", transactional_id="tx-1", rng=random.Random(11), on_event=events.append)
    faults = [Fault.LEADER_ISOLATION, Fault.BRIDGE, Fault.PAUSE, Fault.KILL]
    nemesis.run(faults, rounds=4, fault_s=1.0, quiet_s=0.2)
    assert [(e.kind, e.fault) for e in events] == [(k, f) for f in faults for k in ("start", "heal")]
    assert events[0].nodes == (leader,) and len(events[0].cuts) == 2
    assert len(events[2].cuts) == 1 and events[2].nodes[0] not in events[2].cuts[0]  # the bridge reaches both
    assert c.cuts == frozenset() and c.paused == frozenset()
    assert all(c.is_running(i) for i in c.node_ids)
    c.wait_ready(timeout=60)
    c.wait_connected(timeout=30)


# What a TCP connect to a closed port says: "refused" when the peer's kernel answers (reachable),
# "TimeoutError" when the packets vanish (nft drops), another error when a route refuses to send.
KNOCK = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=1.5)
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.mark.parametrize("backend", ["nft", "blackhole"])
def test_each_fault_backend_cuts_both_directions_and_spares_the_rest(backend: str) -> None:
    if backend == "nft" and shutil.which("nft") is None:
        pytest.skip("nft is not installed")
    net = Network(3, backend=backend)
    try:
        net.create()
        assert net.backend == backend

        def knock(a: int, b: int) -> str:
            return run_command(net.exec_argv(a, [sys.executable, "-c", KNOCK, net.address(b)])).strip()

        assert knock(1, 2) == "refused"
        net.cut([(1, 2)])
        silent = {"nft": "TimeoutError"}.get(backend)
        for a, b in ((1, 2), (2, 1)):
            answer = knock(a, b)
            assert answer != "refused" and (silent is None or answer == silent), (a, b, answer)
        assert knock(1, 3) == knock(3, 2) == "refused"
        with pytest.raises(ConnectionRefusedError):  # the root namespace still reaches the cut nodes
            socket.create_connection((net.address(1), 9), timeout=1.5)
        net.heal()
        assert knock(1, 2) == knock(2, 1) == "refused"
    finally:
        net.close()
    assert not [n for n in subprocess.check_output(["ip", "netns", "list"], text=True).split() if net.run in n]
