"""An in-process cluster of RaftNodes for the integration tests.

Each node has its own data dir, port and CounterStateMachine per group (in
RocksDB, reopened on restart). Everything is awaited with deadlines.
"""

from __future__ import annotations

import asyncio
import pathlib
import socket
import time
from collections.abc import Awaitable, Callable

from raft import LeadershipEvent, NotLeaderError, RaftGroup, RaftNode, RaftSettings
from tests.raft_support.counter_sm import CounterStateMachine, DurableCounterStateMachine

PASSWORD = "txbroker-test-secret"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def eventually(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> float:
    """Poll ``check`` until true; return the time it took. Fails after ``timeout``."""
    start = time.monotonic()
    while True:
        if check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        await asyncio.sleep(interval)


class Cluster:
    def __init__(
        self,
        tmp: pathlib.Path,
        group_ids: list[str],
        settings: RaftSettings | None = None,
        size: int = 3,
        durable: bool = False,
    ) -> None:
        self.tmp = tmp
        self.sm_class = DurableCounterStateMachine if durable else CounterStateMachine
        self.group_ids = group_ids
        self.settings = settings or RaftSettings(password=PASSWORD)
        self.addrs = [f"127.0.0.1:{free_port()}" for _ in range(size)]
        self.nodes: list[RaftNode | None] = [None] * size
        self.sms: dict[tuple[int, str], CounterStateMachine] = {}
        self.events: list[LeadershipEvent] = []

    def start_node(self, i: int, settings: RaftSettings | None = None) -> RaftNode:
        loop = asyncio.get_running_loop()
        node = RaftNode(self.addrs[i], self.tmp / f"node{i}", settings or self.settings, loop)
        node.start()
        self.nodes[i] = node
        for gid in self.group_ids:
            sm = self.sm_class(str(self.tmp / f"node{i}" / f"sm-{gid}"))
            self.sms[(i, gid)] = sm
            node.add_group(gid, self.addrs, sm, on_event=self.events.append)
        return node

    def start_all(self) -> None:
        for i in range(len(self.addrs)):
            self.start_node(i)

    def stop_node(self, i: int) -> None:
        node = self.nodes[i]
        if node is None:
            return
        node.stop()
        self.nodes[i] = None
        for gid in self.group_ids:
            sm = self.sms.pop((i, gid), None)
            if sm is not None:
                sm.close()

    def close(self) -> None:
        for i in range(len(self.nodes)):
            self.stop_node(i)

    def group(self, i: int, gid: str) -> RaftGroup:
        node = self.nodes[i]
        assert node is not None
        g = node.group(gid)
        assert g is not None
        return g

    def leader_index(self, gid: str) -> int | None:
        ready = [i for i, n in enumerate(self.nodes) if n is not None and self.group(i, gid).is_leader()]
        return ready[0] if len(ready) == 1 else None

    async def wait_leaders(self, timeout: float = 10.0) -> dict[str, int]:
        await eventually(
            lambda: all(self.leader_index(g) is not None for g in self.group_ids),
            timeout,
            "a ready leader in every group",
        )
        return {g: idx for g in self.group_ids if (idx := self.leader_index(g)) is not None}

    async def submit(self, gid: str, command: bytes, timeout: float = 5.0) -> object:
        """Submit on the current leader, waiting out an election in progress.

        Only NotLeaderError is retried: it is raised before the command is
        appended, so retrying can never apply it twice. Under full-suite load
        a heartbeat can be late enough for a follower to start an election.
        """
        deadline = time.monotonic() + timeout
        while True:
            idx = self.leader_index(gid)
            if idx is None:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no leader for {gid} within {timeout}s")
                await asyncio.sleep(0.02)
                continue
            try:
                return await self.group(idx, gid).submit(command, max(0.1, deadline - time.monotonic()))
            except NotLeaderError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)

    async def wait_value(self, gid: str, key: str, value: int, timeout: float = 10.0) -> None:
        def converged() -> bool:
            live = [i for i, n in enumerate(self.nodes) if n is not None]
            return all(self.sms[(i, gid)].value(key) == value for i in live)

        await eventually(converged, timeout, f"{gid}/{key} == {value} on every live replica")


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())
