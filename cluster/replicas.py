"""Local partition replicas: one Raft group + one PartitionLog per assigned partition.

``ReplicaManager.reconcile`` makes the set of local groups match the
controller's placement: it starts a group for every partition assigned to this
node (also the partitions a topic gains), keeps each replica's ``topic`` (so
its config) current, and stops (and deletes) groups of deleted topics,
including leftovers found on disk at start-up.

Thread-safety: everything here runs on the asyncio loop thread except
``NotifyingLog.apply``/snapshot methods, which run on the Raft ticker thread
and only hand off to the loop (``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from raft import LeadershipEvent, RaftGroup, RaftNode
from storage.partition_log import PartitionLog
from storage.store import NodeStore

from .config import NodeConfig
from .controller_view import ControllerView
from .membership import group_members, hosted_groups
from .seams import NodeDirectory
from .topics import TopicMetadata, group_id_for, parse_group_id, storage_prefix_for

log = logging.getLogger(__name__)


class NotifyingLog:
    """A PartitionLog seen by Raft: wakes fetch long-polls when the high watermark moves.

    ``wake`` also wakes them on a leadership change of the partition (a leader
    read that loses leadership while it waits ends at once).

    Lost-wakeup freedom: a waiter registers *then* re-reads the high watermark;
    ``apply`` moves the high watermark *then* checks for waiters.
    """

    def __init__(self, log_: PartitionLog, loop: asyncio.AbstractEventLoop) -> None:
        self.log = log_
        self._loop = loop
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def last_applied(self) -> int:
        return self.log.last_applied

    def apply(self, index: int, command: bytes) -> Any:
        result = self.log.apply(index, command)
        if self._waiters:
            self._loop.call_soon_threadsafe(self._wake)
        return result

    def write_snapshot(self, out: BinaryIO) -> None:
        self.log.write_snapshot(out)

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        self.log.read_snapshot(inp, last_applied)
        self._loop.call_soon_threadsafe(self._wake)

    # DurableStateMachine: the log lives in RocksDB, so compaction copies nothing.
    def make_durable(self) -> None:
        self.log.make_durable()

    def consistent_snapshot(self) -> tuple[int, Callable[[BinaryIO], None]]:
        return self.log.consistent_snapshot()

    def wake(self) -> None:
        """Wake every waiter to re-check its predicate (loop thread)."""
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` holds (re-checked after every apply) or ``timeout`` passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            if predicate():
                return True
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                return predicate()
        return True


@dataclass
class LocalReplica:
    topic: TopicMetadata
    partition: int
    replicas: tuple[int, ...]
    log: PartitionLog
    notifier: NotifyingLog
    group: RaftGroup
    leader_id: int | None = None
    term: int = 0
    listeners: list[Callable[[], None]] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic.name, self.partition)


class ReplicaManager:
    def __init__(
        self,
        config: NodeConfig,
        store: NodeStore,
        raft: RaftNode,
        raft_dir: Path,
        loop: asyncio.AbstractEventLoop,
        on_leader_change: Callable[[LocalReplica], None] | None = None,
        *,
        nodes: NodeDirectory,
    ) -> None:
        self._config = config
        self._nodes = nodes
        self._store = store
        self._raft = raft
        self._raft_dir = raft_dir
        self._loop = loop
        self._on_leader_change = on_leader_change
        self.replicas: dict[tuple[str, int], LocalReplica] = {}
        self._by_group: dict[str, LocalReplica] = {}
        self._view: ControllerView | None = None
        self._orphans_cleaned = False

    def get(self, topic: str, partition: int) -> LocalReplica | None:
        return self.replicas.get((topic, partition))

    def high_watermark(self, group_id: str) -> int | None:
        """The high watermark of this node's replica of the data partition ``group_id`` (None: none here)."""
        rep = self._by_group.get(group_id)
        return rep.log.high_watermark if rep is not None else None

    def reconcile(self, view: ControllerView) -> None:
        """Start and stop local groups so they match ``view``. Idempotent; loop thread."""
        self._view = view
        me = self._config.node_id
        wanted: dict[str, tuple[TopicMetadata, int, tuple[int, ...]]] = {}
        hosted = hosted_groups(view, me)  # its placement, and every move it takes part in
        for meta in view.topics.values():
            for a in meta.partitions:
                gid = group_id_for(meta.topic_id, a.partition)
                if gid in hosted:
                    wanted[gid] = (meta, a.partition, a.replicas)
        for gid in list(self._by_group):
            if gid not in wanted:
                self._remove(gid, delete_data=True)
        for gid, (meta, partition, replicas) in wanted.items():
            current = self._by_group.get(gid)
            if current is not None:
                current.topic = meta  # a config change or a finished move: the latest placement and config
                current.replicas = replicas
            else:
                try:
                    self._add(gid, meta, partition, replicas)
                except Exception:
                    log.exception("could not start replica %s-%d (group %s)", meta.name, partition, gid)
        if not self._orphans_cleaned:
            self._orphans_cleaned = True
            self._clean_orphans(set(wanted))

    def _add(self, gid: str, meta: TopicMetadata, partition: int, replicas: tuple[int, ...]) -> None:
        plog = PartitionLog(self._store, storage_prefix_for(meta.topic_id, partition), f"{meta.name}-{partition}")
        notifier = NotifyingLog(plog, self._loop)
        members = group_members(self._nodes, replicas, f"{meta.name}-{partition}")
        group = self._raft.add_group(gid, members, notifier, on_event=self._on_event, delay_idle_commit_notify=True)
        rep = LocalReplica(meta, partition, replicas, plog, notifier, group)
        self.replicas[rep.key] = rep
        self._by_group[gid] = rep
        log.info("started replica %s-%d (group %s, replicas %s)", meta.name, partition, gid, replicas)

    def _remove(self, gid: str, *, delete_data: bool) -> None:
        rep = self._by_group.pop(gid, None)
        if rep is None:
            return
        self.replicas.pop(rep.key, None)
        try:
            self._raft.remove_group(gid, delete_data=delete_data)
        finally:
            if delete_data:
                rep.log.destroy()
        log.info("stopped replica %s-%d (group %s, data deleted=%s)", rep.topic.name, rep.partition, gid, delete_data)

    def _clean_orphans(self, wanted: set[str]) -> None:
        """Delete Raft dirs and RocksDB data of partitions deleted while this node was down."""
        if not self._raft_dir.exists():
            return
        for d in self._raft_dir.iterdir():
            parsed = parse_group_id(d.name)
            if parsed is None or d.name in wanted:
                continue
            topic_id, partition = parsed
            log.info("deleting leftover replica data of group %s", d.name)
            shutil.rmtree(d, ignore_errors=True)
            self._store.delete_prefix(storage_prefix_for(topic_id, partition))

    def _on_event(self, event: LeadershipEvent) -> None:
        rep = self._by_group.get(event.group_id)
        if rep is None:
            return
        leader_node = self._nodes.node_by_raft_address(event.leader) if event.leader else None
        new_leader = leader_node.id if leader_node else None
        changed = (new_leader, event.term) != (rep.leader_id, rep.term)
        rep.leader_id = new_leader
        rep.term = event.term
        rep.notifier.wake()  # leader reads waiting here re-check their leadership
        if changed and self._on_leader_change is not None:
            self._on_leader_change(rep)

    def stop_all(self) -> None:
        for gid in list(self._by_group):
            self._remove(gid, delete_data=False)
