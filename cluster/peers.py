"""What this node knows about its peers: liveness and their partition leadership.

Every node polls ``GET /v1/internal/state`` of each peer once per
``peer_poll_interval_s``. A peer is *alive* while its last successful answer
is younger than three intervals. The answers also tell this node who leads
partitions it does not replicate itself (RF < number of nodes), so it can
answer ``NOT_LEADER_OR_FOLLOWER`` with the right ``leader_url`` and serve
``/v1/metadata`` for the whole cluster. ``refresh`` polls chosen peers at
once: a node asked about a partition whose leader it has no news of (a
partition made a moment ago on other nodes) asks its replicas rather than
answering from a view up to one interval old.

Each poll is a node call signed afresh (``cluster.security.node_calls``), like
every internal call: only nodes of the cluster can make it, and a captured one
cannot be replayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .config import NodeConfig
from .seams import NodeDirectory
from .security.node_calls import NODE_CALL_HEADER, NodeCallSigner
from .state_versions import apply_delta

log = logging.getLogger(__name__)

STATE_PATH = "/v1/internal/state"


@dataclass
class PeerState:
    node_id: int
    last_ok: float = 0.0
    controller_leader: int | None = None
    # group id -> {"topic","partition","leader","term","high_watermark","last_stable_offset","log_start_offset"}
    partitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the version of the peer's states ``partitions`` holds (``cluster.state_versions``): polls ask for what
    # changed after it
    epoch: str | None = None
    version: int = 0


class PeerView:
    """``ssl_context``: for ``https://`` node URLs (node-to-node TLS; the node's client certificate)."""

    def __init__(
        self, config: NodeConfig, *, ssl_context: ssl.SSLContext | None = None, nodes: NodeDirectory | None = None
    ) -> None:
        self._config = config
        self._nodes = nodes
        self._signer = NodeCallSigner(config.cluster_secret, config.node_id)
        self._ssl = ssl_context
        self.peers: dict[int, PeerState] = {n.id: PeerState(n.id) for n in config.nodes if n.id != config.node_id}
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        # node id -> the on-demand poll of that peer under way, and when it started (``refresh``)
        self._refreshing: dict[int, tuple[asyncio.Task[None], float]] = {}

    def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(1.0, self._config.peer_poll_interval_s * 2))
        connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for task in [self._task, *(t for t, _ in self._refreshing.values())]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._session is not None:
            await self._session.close()

    def is_alive(self, node_id: int) -> bool:
        if node_id == self._config.node_id:
            return True
        p = self.peers.get(node_id)
        return p is not None and time.monotonic() - p.last_ok < 3 * self._config.peer_poll_interval_s + 1.0

    def remote_partition(self, group_id: str) -> dict[str, Any] | None:
        """The freshest view of a group from a live peer that is its leader, else any live peer."""
        best: dict[str, Any] | None = None
        for p in self.peers.values():
            if not self.is_alive(p.node_id):
                continue
            info = p.partitions.get(group_id)
            if info is None:
                continue
            if info.get("leader") == p.node_id:
                return info
            if best is None or int(info.get("term", 0)) > int(best.get("term", 0)):
                best = info
        return best

    def reported(self, node_id: int, group_id: str) -> dict[str, Any]:
        """What live peer ``node_id`` last reported of its replica of ``group_id`` (empty when nothing)."""
        p = self.peers.get(node_id)
        if p is None or not self.is_alive(node_id):
            return {}
        return dict(p.partitions.get(group_id) or {})

    def controller_leader(self) -> int | None:
        for p in self.peers.values():
            if self.is_alive(p.node_id) and p.controller_leader is not None:
                return p.controller_leader
        return None

    def _sync_peers(self) -> None:
        """Poll every node the directory knows (a node added to the cluster is polled from the next round)."""
        if self._nodes is None:
            return
        known = set(self._nodes.node_ids())
        for node_id in known:
            if node_id != self._config.node_id and node_id not in self.peers:
                self.peers[node_id] = PeerState(node_id)
        for node_id in [n for n in self.peers if n not in known]:
            del self.peers[node_id]

    async def _run(self) -> None:
        while True:
            self._sync_peers()
            await asyncio.gather(*(self._poll(p) for p in self.peers.values()), return_exceptions=True)
            await asyncio.sleep(self._config.peer_poll_interval_s)

    async def poll_now(self) -> None:
        await asyncio.gather(*(self._poll(p) for p in self.peers.values()), return_exceptions=True)

    async def refresh(self, node_ids: Iterable[int], timeout: float) -> None:
        """Poll the live peers among ``node_ids`` now; return once each has answered a poll that started
        after this call, or after ``timeout`` seconds (what arrives later still updates the view).

        Concurrent callers share polls: a poll of a peer already under way serves every caller that came
        before it started; a caller that came later waits for it and then for the next one.
        """
        since = time.monotonic()
        wanted = [
            self.peers[n] for n in set(node_ids) if n != self._config.node_id and n in self.peers and self.is_alive(n)
        ]
        if not wanted:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(self._poll_after(p, since) for p in wanted), return_exceptions=True), timeout
            )

    async def _poll_after(self, peer: PeerState, since: float) -> None:
        """Wait for a poll of ``peer`` that started at or after ``since`` (starting one when none is)."""
        while True:
            running = self._refreshing.get(peer.node_id)
            if running is None or running[0].done():
                task = asyncio.get_running_loop().create_task(self._poll(peer))
                running = (task, time.monotonic())
                self._refreshing[peer.node_id] = running
                task.add_done_callback(functools.partial(self._poll_done, peer.node_id))
            task, started = running
            await asyncio.shield(task)
            if started >= since:
                return

    def _poll_done(self, node_id: int, task: asyncio.Task[None]) -> None:
        running = self._refreshing.get(node_id)
        if running is not None and running[0] is task:
            del self._refreshing[node_id]

    async def _poll(self, peer: PeerState) -> None:
        addr = self._nodes.node(peer.node_id) if self._nodes is not None else self._config.node(peer.node_id)
        if addr is None or self._session is None:
            return
        epoch, version = peer.epoch, peer.version
        path = STATE_PATH if epoch is None else f"{STATE_PATH}?epoch={epoch}&since={version}"
        headers = {NODE_CALL_HEADER: self._signer.sign("GET", path, b"", None, receiver=peer.node_id)}
        try:
            async with self._session.get(addr.url + path, headers=headers) as resp:
                if resp.status != 200:
                    return
                body = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        if not isinstance(body, dict):
            return
        peer.last_ok = time.monotonic()
        new_epoch, new_version = body.get("epoch"), body.get("version")
        if not (isinstance(new_epoch, str) and new_epoch.isalnum() and isinstance(new_version, int)):
            new_epoch, new_version = None, 0
        versioned = new_epoch is not None
        if versioned and new_epoch == peer.epoch and new_version < peer.version:
            return  # another poll of this peer brought newer states already
        if not body.get("full", True) and not (versioned and epoch == new_epoch == peer.epoch):
            return  # a delta against states this view no longer holds
        peer.controller_leader = body.get("controller_leader")
        peer.partitions = apply_delta(peer.partitions, body)
        peer.epoch, peer.version = new_epoch, new_version
