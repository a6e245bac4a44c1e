"""Local partition replicas: one Raft group + one PartitionLog per assigned partition.

``ReplicaManager.reconcile`` makes the set of local groups match the
controller's placement: it starts a group for every partition assigned to this
node (also the partitions a topic gains), keeps each replica's ``topic`` (so
its config) current, and stops (and deletes) groups of deleted topics,
including leftovers found on disk at start-up. Groups are built and destroyed
on a worker thread, a chunk at a time, never on the event loop.

Thread-safety: everything here runs on the asyncio loop thread except
``NotifyingLog.apply``/snapshot methods, which run on the Raft ticker thread
and only hand off to the loop (``call_soon_threadsafe``), and the setup steps
(``ReplicaManager._setup_chunk``), which touch only the groups of their step.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from raft import GroupSpec, LeadershipEvent, RaftError, RaftGroup, RaftNode
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


SETUP_CHUNK = 64  # groups the setup thread creates or destroys per step; the loop registers each step's


@dataclass(frozen=True, slots=True)
class _Create:
    gid: str
    meta: TopicMetadata
    partition: int
    replicas: tuple[int, ...]
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Destroy:
    gid: str
    rep: LocalReplica
    delete_data: bool


_Job = _Create | _Destroy


class ReplicaManager:
    """This node's data partition replicas (see module doc).

    Creating and destroying groups runs off the event loop: ``reconcile`` queues the work, and one task
    hands it to a worker thread ``SETUP_CHUNK`` groups at a time (each group's RocksDB state is read
    and its Raft group built there), then registers the step's replicas on the loop. A topic of
    thousands of partitions therefore never holds the loop for more than one step's registration.
    A replica is served from its registration on; a leadership event that comes before it is kept
    and applied then.
    """

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
        self._wanted: dict[str, tuple[TopicMetadata, int, tuple[int, ...]]] = {}
        self._jobs: deque[_Job] = deque()
        self._queued: set[str] = set()  # group ids with a creation queued or under way
        self._early: dict[str, LeadershipEvent] = {}  # the last event of a group not registered yet
        self._setup_task: asyncio.Task[None] | None = None
        self._stopped = False

    def get(self, topic: str, partition: int) -> LocalReplica | None:
        return self.replicas.get((topic, partition))

    def high_watermark(self, group_id: str) -> int | None:
        """The high watermark of this node's replica of the data partition ``group_id`` (None: none here)."""
        rep = self._by_group.get(group_id)
        return rep.log.high_watermark if rep is not None else None

    @property
    def setting_up(self) -> int:
        """Groups whose creation or destruction is queued or under way."""
        return len(self._jobs) + len(self._queued)

    def reconcile(self, view: ControllerView) -> None:
        """Make the local groups match ``view``: queue creations and destructions (loop thread; returns at once).

        Idempotent. Replicas that stay get the latest topic metadata and placement at once."""
        self._view = view
        me = self._config.node_id
        wanted: dict[str, tuple[TopicMetadata, int, tuple[int, ...]]] = {}
        hosted = hosted_groups(view, me)  # its placement, and every move it takes part in
        for meta in view.topics.values():
            for a in meta.partitions:
                gid = group_id_for(meta.topic_id, a.partition)
                if gid in hosted:
                    wanted[gid] = (meta, a.partition, a.replicas)
        self._wanted = wanted
        for gid in list(self._by_group):
            if gid not in wanted:
                self._queue_destroy(gid, delete_data=True)
        for gid, (meta, partition, replicas) in wanted.items():
            current = self._by_group.get(gid)
            if current is not None:
                current.topic = meta  # a config change or a finished move: the latest placement and config
                current.replicas = replicas
            elif gid not in self._queued:
                try:
                    members = tuple(group_members(self._nodes, replicas, f"{meta.name}-{partition}"))
                except Exception:
                    log.exception("could not start replica %s-%d (group %s)", meta.name, partition, gid)
                    continue
                self._queued.add(gid)
                self._jobs.append(_Create(gid, meta, partition, replicas, members))
        if not self._orphans_cleaned:
            self._orphans_cleaned = True
            self._clean_orphans(set(wanted))
        self._kick()

    def _queue_destroy(self, gid: str, *, delete_data: bool) -> None:
        rep = self._by_group.pop(gid, None)
        if rep is None:
            return
        self.replicas.pop(rep.key, None)  # no longer served from here on
        self._jobs.append(_Destroy(gid, rep, delete_data))

    def _kick(self) -> None:
        if self._jobs and self._setup_task is None and not self._stopped:
            self._setup_task = self._loop.create_task(self._run_setup())

    async def _run_setup(self) -> None:
        try:
            while self._jobs and not self._stopped:
                chunk = [self._jobs.popleft() for _ in range(min(SETUP_CHUNK, len(self._jobs)))]
                done = await asyncio.to_thread(self._setup_chunk, chunk)
                self._register(done)
        finally:
            self._setup_task = None
        self._kick()  # queued while the last step ran

    def _setup_chunk(self, chunk: list[_Job]) -> list[tuple[_Create, LocalReplica | None]]:
        """Worker thread: destroy, then build, the step's groups; the created replicas, for the loop to register."""
        builds: list[tuple[_Create, PartitionLog, NotifyingLog]] = []
        created: list[tuple[_Create, LocalReplica | None]] = []
        for job in chunk:
            if isinstance(job, _Destroy):
                self._destroy(job)
                continue
            meta, partition = job.meta, job.partition
            try:
                plog = PartitionLog(
                    self._store, storage_prefix_for(meta.topic_id, partition), f"{meta.name}-{partition}"
                )
            except Exception:
                log.exception("could not start replica %s-%d (group %s)", meta.name, partition, job.gid)
                created.append((job, None))
                continue
            builds.append((job, plog, NotifyingLog(plog, self._loop)))
        specs = [
            GroupSpec(job.gid, job.members, notifier, self._on_event, delay_idle_commit_notify=True)
            for job, _plog, notifier in builds
        ]
        for (job, plog, notifier), group in zip(builds, self._raft.add_groups(specs), strict=True):
            if isinstance(group, RaftError):
                log.error("could not start replica %s-%d (group %s): %s", job.meta.name, job.partition, job.gid, group)
                created.append((job, None))
            else:
                created.append((job, LocalReplica(job.meta, job.partition, job.replicas, plog, notifier, group)))
        return created

    def _destroy(self, job: _Destroy) -> None:
        try:
            self._raft.remove_group(job.gid, delete_data=job.delete_data)
        except Exception:
            log.exception("could not stop replica group %s", job.gid)
        finally:
            if job.delete_data:
                job.rep.log.destroy()
        log.info("stopped replica %s-%d (group %s, data deleted=%s)", job.rep.topic.name, job.rep.partition,
                 job.gid, job.delete_data)  # fmt: skip

    def _register(self, created: list[tuple[_Create, LocalReplica | None]]) -> None:
        """Loop thread: serve the replicas a setup step built; queue the destruction of any no longer wanted."""
        started = 0
        for job, rep in created:
            self._queued.discard(job.gid)
            early = self._early.pop(job.gid, None)
            if rep is None:
                continue
            current = self._wanted.get(job.gid)
            if current is None or self._stopped:  # deleted while it was built
                self._jobs.append(_Destroy(job.gid, rep, delete_data=not self._stopped))
                continue
            rep.topic, rep.partition, rep.replicas = current
            self.replicas[rep.key] = rep
            self._by_group[job.gid] = rep
            started += 1
            if early is not None:
                self._on_event(early)
        if started:
            log.info("started %d replicas (%d more queued)", started, len(self._queued))

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
            if event.group_id in self._queued:
                self._early[event.group_id] = event  # applied when the replica is registered
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
        """Stop every local group, keeping its data (shutdown; blocks while groups close)."""
        self._stopped = True
        self._jobs.clear()
        if self._setup_task is not None:
            self._setup_task.cancel()  # a step under way finishes in its thread; RaftNode.stop closes its groups
        for gid in list(self._by_group):
            rep = self._by_group.pop(gid)
            self.replicas.pop(rep.key, None)
            self._destroy(_Destroy(gid, rep, delete_data=False))
