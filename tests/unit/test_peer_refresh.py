"""PeerView.refresh: polls at once the live peers asked for, shares polls between callers, and never waits
for an answer that predates the call (the peers' HTTP answers are stood in for by a controllable poll)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cluster.config import make_cluster_configs
from cluster.peers import PeerState, PeerView


class _GatedPeers(PeerView):
    """Each poll is recorded and answers only when the test releases it."""

    def __init__(self, directory: Path) -> None:
        config = make_cluster_configs(3, directory, http_ports=[1001, 1002, 1003], raft_ports=[2001, 2002, 2003])[0]
        super().__init__(config)
        self.started: list[int] = []
        self.gates: list[asyncio.Event] = []
        self.polled = asyncio.Event()

    async def _poll(self, peer: PeerState) -> None:
        gate = asyncio.Event()
        self.started.append(peer.node_id)
        self.gates.append(gate)
        self.polled.set()
        await gate.wait()
        peer.last_ok = time.monotonic()

    def mark_alive(self, *node_ids: int) -> None:
        for n in node_ids:
            self.peers[n].last_ok = time.monotonic()


async def _polls(peers: _GatedPeers, n: int) -> None:
    """Wait until ``n`` polls started."""
    async with asyncio.timeout(5):
        while len(peers.started) < n:
            await peers.polled.wait()
            peers.polled.clear()


def test_refresh_polls_only_live_other_peers_and_returns_when_they_answer(tmp_path: Path) -> None:
    async def run() -> None:
        peers = _GatedPeers(tmp_path)
        peers.mark_alive(2)  # node 3 never answered: not polled; node 1 is this node
        call = asyncio.create_task(peers.refresh([1, 2, 3, 2], timeout=5))
        await _polls(peers, 1)
        assert peers.started == [2]
        assert not call.done()
        peers.gates[0].set()
        await asyncio.wait_for(call, 5)
        assert peers.started == [2]
        await peers.refresh([3], timeout=5)  # nothing alive to ask: returns at once
        assert peers.started == [2]

    asyncio.run(run())


def test_a_caller_after_a_poll_started_waits_for_the_next_one(tmp_path: Path) -> None:
    async def run() -> None:
        peers = _GatedPeers(tmp_path)
        peers.mark_alive(2)
        first = asyncio.create_task(peers.refresh([2], timeout=5))
        also_first = asyncio.create_task(peers.refresh([2], timeout=5))
        await _polls(peers, 1)
        await asyncio.sleep(0.001)
        late = asyncio.create_task(peers.refresh([2], timeout=5))  # came after the poll under way started
        await asyncio.sleep(0.01)
        assert peers.started == [2]  # one poll serves the callers that came before it
        peers.gates[0].set()
        await asyncio.wait_for(asyncio.gather(first, also_first), 5)
        await _polls(peers, 2)
        assert not late.done()  # the first poll's answer may predate what the late caller asks about
        peers.gates[1].set()
        await asyncio.wait_for(late, 5)

    asyncio.run(run())


def test_refresh_gives_up_after_its_timeout(tmp_path: Path) -> None:
    async def run() -> None:
        peers = _GatedPeers(tmp_path)
        peers.mark_alive(2, 3)
        began = time.monotonic()
        await peers.refresh([2, 3], timeout=0.05)
        assert time.monotonic() - began < 2
        assert sorted(peers.started) == [2, 3]
        for gate in peers.gates:
            gate.set()
        await peers.stop()

    asyncio.run(run())
