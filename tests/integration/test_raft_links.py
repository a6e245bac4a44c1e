"""Node links between 3 node processes (raft.node_host): one Raft connection per peer for every group.

Many groups share exactly one established TCP connection per pair of nodes (counted in
/proc/<pid>/fd); a peer's SIGKILL and restart reconnects every group of it; a forged frame on
the Raft port closes only the forger's connection and changes nothing.
"""

from __future__ import annotations

import pathlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from bench.raft_idle import sockets
from raft.connection import encode_preamble
from raft.frame_crypto import NONCE_BYTES, FrameCipher, cluster_key, new_nonce
from raft.links import LINK_CHANNEL
from raft.node_host import HostProcess
from tests.raft_support.cluster import PASSWORD, free_port
from tests.raft_support.hosts import wait_until
from tests.raft_support.wire import read_until_closed, recv_exactly

pytestmark = pytest.mark.integration

N_GROUPS = 48


def _start(i: int, addrs: list[str], tmp: pathlib.Path) -> HostProcess:
    args = [
        "--addr", addrs[i], "--members", ",".join(addrs), "--data", str(tmp / f"n{i}"),
        "--groups", str(N_GROUPS), "--password", PASSWORD, "--log-level", "INFO",
    ]  # fmt: skip
    return HostProcess(args, stderr_path=str(tmp / f"n{i}.log"))


def _all_ready(procs: dict[int, HostProcess]) -> bool:
    ready: set[str] = set()
    for p in procs.values():
        ready |= set(p.request({"op": "leaders"})["ready"])
    return len(ready) == N_GROUPS


def _connected_everywhere(procs: dict[int, HostProcess], addrs: list[str]) -> bool:
    groups = [f"g{i}" for i in range(N_GROUPS)]
    for i, p in procs.items():
        want = set(addrs) - {addrs[i]}
        replies = p.request({"op": "batch", "requests": [{"op": "status", "group": g} for g in groups]})["ok"]
        if any(set(r["connected"]) != want for r in replies):
            return False
    return True


@dataclass
class Nodes:
    procs: dict[int, HostProcess]
    addrs: list[str]
    tmp: pathlib.Path


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """Three node processes whose groups all have a ready leader and are connected to both peers."""
    tmp = tmp_path_factory.mktemp("links")
    n = Nodes({}, sorted(f"127.0.0.1:{free_port()}" for _ in range(3)), tmp)
    try:
        for i in range(3):
            n.procs[i] = _start(i, n.addrs, tmp)
        wait_until(lambda: _all_ready(n.procs), 30, "a ready leader in every group")
        wait_until(lambda: _connected_everywhere(n.procs, n.addrs), 10, "every group connected to both peers")
        yield n
    finally:
        for p in n.procs.values():
            p.stop()


def test_a_forged_frame_closes_only_its_connection_and_changes_nothing(nodes: Nodes) -> None:
    procs, addrs = nodes.procs, nodes.addrs
    target = procs[0]
    before = target.request({"op": "links"})["ok"]
    roles = target.request({"op": "roles"})["ok"]
    host, port = addrs[0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        nonce = new_nonce()
        s.sendall(encode_preamble(LINK_CHANNEL, nonce))
        acceptor_nonce = recv_exactly(s, NONCE_BYTES)
        cipher = FrameCipher(cluster_key("not-the-cluster-secret"), LINK_CHANNEL, nonce, acceptor_nonce, True)
        s.sendall(bytes(cipher.seal(b"\x00" * 64)))
        assert read_until_closed(s, 5)
    wait_until(lambda: target.request({"op": "links"})["ok"]["rejected"] > before["rejected"], 5, "rejection counted")
    after = target.request({"op": "links"})["ok"]
    assert after["links_up"] == 2 and after["messages_received"] >= before["messages_received"]
    now = target.request({"op": "roles"})["ok"]
    assert {g: r[1] for g, r in now.items()} == {g: r[1] for g, r in roles.items()}  # no term moved
    assert _connected_everywhere(procs, addrs)


def test_groups_share_one_connection_per_peer_and_a_restarted_peer_reconnects_every_group(nodes: Nodes) -> None:
    procs, addrs = nodes.procs, nodes.addrs
    for i, p in procs.items():
        assert sockets(p.pid)[1] == 2, f"node {i}: one Raft connection per peer"
        assert p.request({"op": "links"})["ok"]["links_up"] == 2
    # SIGKILL a node and start it again from its data: every group reconnects to it.
    procs.pop(2).kill()
    wait_until(
        lambda: all(
            addrs[2] not in r["connected"]
            for r in procs[0].request(
                {"op": "batch", "requests": [{"op": "status", "group": f"g{g}"} for g in range(N_GROUPS)]}
            )["ok"]
        ),
        10,
        "every group of node 0 sees node 2 disconnected",
    )
    procs[2] = _start(2, addrs, nodes.tmp)
    wait_until(lambda: _connected_everywhere(procs, addrs), 20, "every group reconnected to the restarted node")
    wait_until(lambda: _all_ready(procs), 30, "a ready leader in every group")
    for i, p in procs.items():
        assert sockets(p.pid)[1] == 2, f"node {i}: one Raft connection per peer after the restart"
    for g in range(N_GROUPS):
        leader = next(p for p in procs.values() if f"g{g}" in p.request({"op": "leaders"})["ready"])
        assert "ok" in leader.request({"op": "submit", "group": f"g{g}", "command": "x", "timeout": 5})
