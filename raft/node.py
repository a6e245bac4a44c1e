"""``RaftNode``: all Raft groups of this process, one port, a few ticker threads.

Lifecycle: ``start()`` binds the node's single Raft port and starts the
listener and ticker threads, and each shard's node links (``raft.links``: one
connection per peer node carrying every group's messages, and the node
heartbeats quiescent groups rely on); ``add_group``/``add_groups``/``remove_group`` create and
destroy groups (on their ticker shard, synchronously); ``stop()`` destroys
every group (journals flushed and closed), stops the threads and closes the
port. Groups are assigned to shards by a stable hash (CRC32) of the group id.

Thread-safety: every public method may be called from any thread except a
ticker thread; the group registry is guarded by ``_lock`` (never held while
waiting for a shard).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import pathlib
import pickle
import re
import shutil
import socket
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType

from raft import pysyncobj_patches as patches
from raft.errors import RaftError
from raft.frame_crypto import cluster_key
from raft.group import RaftGroup
from raft.links import LinkStats, NodeLinks, channel_for, shard_of_channel
from raft.quiescence import QuiescenceState
from raft.settings import LeadershipEvent, RaftSettings
from raft.state_machine import StateMachine
from raft.ticker import ProxyPoller, TickerShard
from raft.transport import Listener

logger = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_CALL_TIMEOUT_S = 30.0
#: Groups ``add_groups`` builds in one ticker task (a few ms each: the ticker's other groups wait meanwhile).
ADD_BATCH = 32


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What ``RaftNode.add_groups`` needs of one group (the arguments of ``add_group``)."""

    group_id: str
    members: tuple[str, ...]
    sm: StateMachine
    on_event: Callable[[LeadershipEvent], None] | None = None
    lazy_commit_notify: bool = False
    delay_idle_commit_notify: bool = False


def group_dir_name(group_id: str) -> str:
    """Filesystem-safe, collision-free directory name for a group id."""
    digest = hashlib.sha256(group_id.encode("utf-8")).hexdigest()[:10]
    return f"{_UNSAFE.sub('_', group_id)[:80]}-{digest}"


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"raft address must be 'host:port', got {address!r}")
    return host.strip("[]"), int(port)


class RaftNode:
    """All Raft groups hosted by this process (see module doc)."""

    def __init__(
        self,
        self_address: str,
        data_dir: pathlib.Path,
        settings: RaftSettings,
        loop: asyncio.AbstractEventLoop,
        bind_host: str | None = None,
    ) -> None:
        patches.apply()
        host, port = split_address(self_address)
        self.self_address = self_address
        self.data_dir = pathlib.Path(data_dir)
        self.settings = settings
        self._loop = loop
        self._bind = (bind_host or host, port)
        self._lock = threading.Lock()
        self._groups: dict[str, RaftGroup] = {}
        self._shards: list[TickerShard] = []
        # Store-backed groups' log compactions (an fsync each) run here, never on a ticker (``raft.compaction``).
        self._compaction_pool: ThreadPoolExecutor | None = None
        self._listener: Listener | None = None
        self._links: list[NodeLinks] = []
        # The node liveness quiescent groups follow (shard 0's links); None: groups never quiesce.
        self.liveness: NodeLinks | None = None
        self._started = False
        self._stopped = False
        self.rejected_connections = 0
        # One per process start, the same on every shard's links (``raft.links``: a peer sees a restart).
        self._incarnation = os.urandom(8).hex()

    # --- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise RaftError("RaftNode already started")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._listener = Listener(self._bind[0], self._bind[1], self._dispatch, self._rejected)
        except OSError as e:
            raise RaftError(f"cannot bind raft port {self._bind[0]}:{self._bind[1]}: {e}") from e
        self._shards = [TickerShard(i, self.settings.tick_interval_s) for i in range(self.settings.tick_threads)]
        self._compaction_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raft-compaction")
        for shard in self._shards:
            shard.start()
        self._links = [self._start_links(shard) for shard in self._shards]
        if self.settings.quiesce_after_s > 0:
            self.liveness = self._links[0]
        self._listener.start()
        self._started = True

    def _start_links(self, shard: TickerShard) -> NodeLinks:
        s = self.settings
        judge = shard.index == 0
        links = NodeLinks(
            self.self_address,
            cluster_key(s.password),
            ProxyPoller(shard, channel_for(shard.index)),
            index=shard.index,
            heartbeat_s=s.heartbeat_s,
            lapse_s=s.check_quorum_s,
            silence_s=s.link_silence_s,
            retry_s=s.connection_retry_s,
            peers=self._peers,
            on_lapse=functools.partial(self._peer_lapsed, restarted=False) if judge else None,
            on_restart=functools.partial(self._peer_lapsed, restarted=True) if judge else None,
            on_rejected=self._rejected,
            mark_dirty=shard.dirty.add,
            forward=self._forward,
            judge=judge,
            incarnation=self._incarnation,
        )

        def install() -> None:
            shard.groups[links.group_id] = links
            shard.add_flush_hook(links.flush)
            shard.add_pulse_hook(links.pulse)

        shard.call(install).result(_CALL_TIMEOUT_S)
        return links

    def link_stats(self) -> LinkStats:
        """The node links' counters summed over the shards (any thread)."""
        total = LinkStats()
        for links in self._links:
            total = total.add(links.current_stats())
        return total

    def _peers(self) -> set[str]:
        """Every voter and learner of every group of this node (the nodes to keep links with): what the
        groups' transports asked each shard's links for, so the judging shard keeps a link to every peer
        node even when none of its own groups names it (no walk over thousands of groups)."""
        peers: set[str] = set()
        for links in self._links:
            peers |= links.wanted()
        peers.discard(self.self_address)
        return peers

    def _peer_lapsed(self, peer: str, *, restarted: bool) -> None:
        """Tell every quiet group ``peer`` is a voter of that its node lapsed or restarted."""
        for group in list(self._groups.values()):
            if group.quiescence() is not QuiescenceState.ACTIVE and peer in group.voters():
                group.peer_lapsed(peer, restarted)

    def quiet_generation(self) -> tuple[tuple[int, int], ...]:
        """Changes whenever a group of this node comes, goes, quiets or wakes (any thread): while it does not,
        the quiet groups' logs, terms and leaders stay as they were."""
        return tuple(shard.quiet_version() for shard in self._shards)

    def loud_group_ids(self) -> set[str]:
        """The groups of this node that are not quiet (any thread)."""
        out: set[str] = set()
        for shard in self._shards:
            out |= shard.loud_group_ids()
        return out

    def quiescent_groups(self) -> int:
        """How many groups of this node are quiescent (leader or follower; any thread)."""
        return sum(1 for g in list(self._groups.values()) if g.quiescence() is QuiescenceState.QUIESCENT)

    def stop(self) -> None:
        with self._lock:
            if self._stopped or not self._started:
                self._stopped = True
                return
            self._stopped = True
            groups = list(self._groups.values())
            self._groups.clear()
        if self._listener is not None:
            self._listener.stop()
        for shard in self._shards:
            mine = [g for g in groups if g._shard is shard]

            def finalize(mine: list[RaftGroup] = mine, shard: TickerShard = shard) -> None:
                for g in mine:
                    shard.groups.pop(g.group_id, None)
                    try:
                        g._destroy()
                    except Exception:
                        logger.exception("failed to destroy group %r", g.group_id)
                links = shard.groups.pop(channel_for(shard.index), None)
                if isinstance(links, NodeLinks):
                    links.close()

            shard.stop(finalize)
        if self._compaction_pool is not None:
            self._compaction_pool.shutdown(wait=True)

    # --- groups ---------------------------------------------------------------

    def add_group(
        self,
        group_id: str,
        members: Sequence[str],
        sm: StateMachine,
        on_event: Callable[[LeadershipEvent], None] | None = None,
        *,
        lazy_commit_notify: bool = False,
        delay_idle_commit_notify: bool = False,
    ) -> RaftGroup:
        """Create and start this node's replica of ``group_id``.

        ``members`` are the voters' raft addresses as the caller believes them, including
        this node's, the preferred leader first (``raft.campaigns``): the group's configuration
        when its log says nothing else. From the
        group's first tick on, the configuration of its snapshot and journal wins
        (``raft.membership_log``), so a restart with stale members never brings back an
        old configuration. A node about to be added (``RaftGroup.change_membership``)
        passes the current voters plus itself.
        ``lazy_commit_notify``: followers of an otherwise idle group learn a
        new commit index from the next heartbeat instead of an AppendEntries
        round of its own (``RaftGroup``); ``delay_idle_commit_notify``: after
        ``commit_notify_delay_s``, unless a sooner write's AppendEntries
        carries it (groups written in a trickle, like partitions).
        Blocks until the group exists on its ticker shard (milliseconds; the
        journal is replayed later, by the first ticks).
        """
        group = self._register(
            GroupSpec(group_id, tuple(members), sm, on_event, lazy_commit_notify, delay_idle_commit_notify)
        )
        results: list[RaftGroup | RaftError] = [group]
        self._construct(group._shard, [group], results)
        if isinstance(results[0], RaftError):
            raise results[0]
        return group

    def add_groups(self, specs: Sequence[GroupSpec]) -> list[RaftGroup | RaftError]:
        """Create many groups (``add_group`` of each spec), each shard's in one ticker task per ``ADD_BATCH``.

        A ticker runs its control tasks between passes over its groups; one task per group would
        make each creation wait for a pass. The result of each spec, in order: its group, or the
        ``RaftError`` that kept it from being created. Never from a ticker thread.
        """
        results: list[RaftGroup | RaftError] = []
        made: list[RaftGroup] = []
        for spec in specs:
            try:
                group = self._register(spec)
            except (RaftError, ValueError) as e:
                results.append(e if isinstance(e, RaftError) else RaftError(str(e)))
                continue
            results.append(group)
            made.append(group)
        for shard in self._shards:
            mine = [g for g in made if g._shard is shard]
            for at in range(0, len(mine), ADD_BATCH):
                self._construct(shard, mine[at : at + ADD_BATCH], results)
        return results

    def _register(self, spec: GroupSpec) -> RaftGroup:
        if self.self_address not in spec.members:
            raise RaftError(f"{self.self_address} is not a member of group {spec.group_id!r}")
        for m in spec.members:
            split_address(m)
        shard = self._shard_for(spec.group_id)
        data_dir = self.data_dir / group_dir_name(spec.group_id)
        with self._lock:
            if not self._started or self._stopped:
                raise RaftError("RaftNode is not running")
            if spec.group_id in self._groups:
                raise RaftError(f"group {spec.group_id!r} already exists")
        try:
            data_dir.mkdir(parents=True, exist_ok=True)  # here, not on the ticker thread (a directory entry written)
        except OSError as e:
            raise RaftError(f"cannot create group {spec.group_id!r}: {e}") from e
        with self._lock:
            if spec.group_id in self._groups:
                raise RaftError(f"group {spec.group_id!r} already exists")
            group = RaftGroup(
                group_id=spec.group_id,
                members=tuple(dict.fromkeys(spec.members)),
                self_address=self.self_address,
                sm=spec.sm,
                data_dir=str(data_dir),
                settings=self.settings,
                loop=self._loop,
                shard=shard,
                on_event=spec.on_event,
                links=self._links[shard.index],
                lazy_commit_notify=spec.lazy_commit_notify,
                compaction_executor=self._compaction_pool,
                delay_idle_commit_notify=spec.delay_idle_commit_notify,
                liveness=self.liveness,
            )
            self._groups[spec.group_id] = group
        return group

    def _construct(self, shard: TickerShard, groups: list[RaftGroup], results: list[RaftGroup | RaftError]) -> None:
        """Build ``groups`` on ``shard`` in one task; a group that fails is unregistered, its error in ``results``."""

        def construct() -> list[tuple[RaftGroup, BaseException]]:
            failed: list[tuple[RaftGroup, BaseException]] = []
            for group in groups:
                try:
                    group._construct()
                except Exception as e:
                    failed.append((group, e))
                    continue
                shard.groups[group.group_id] = group
            return failed

        try:
            failed = shard.call(construct).result(_CALL_TIMEOUT_S)
        except Exception as e:
            failed = [(g, e) for g in groups]
        for group, exc in failed:
            with self._lock:
                self._groups.pop(group.group_id, None)
            at = next(i for i, r in enumerate(results) if r is group)
            results[at] = RaftError(f"cannot create group {group.group_id!r}: {exc}")

    def remove_group(self, group_id: str, delete_data: bool = False) -> None:
        with self._lock:
            group = self._groups.pop(group_id, None)
        if group is None:
            return
        shard = group._shard

        def destroy() -> None:
            shard.groups.pop(group_id, None)
            group._destroy()

        shard.call(destroy).result(_CALL_TIMEOUT_S)
        if delete_data:
            shutil.rmtree(group.data_dir, ignore_errors=True)

    def group(self, group_id: str) -> RaftGroup | None:
        return self._groups.get(group_id)

    @property
    def groups(self) -> Mapping[str, RaftGroup]:
        with self._lock:
            return MappingProxyType(dict(self._groups))

    @property
    def listen_address(self) -> tuple[str, int] | None:
        return None if self._listener is None else self._listener.address

    # --- internals --------------------------------------------------------------

    def _shard_for(self, group_id: str) -> TickerShard:
        if not self._shards:
            raise RaftError("RaftNode is not started")
        return self._shards[zlib.crc32(group_id.encode("utf-8")) % len(self._shards)]

    def _dispatch(self, channel: str, dialer_nonce: bytes, sock: socket.socket) -> bool:
        """Listener thread: hand an accepted socket to the links of the shard its channel names."""
        index = shard_of_channel(channel)
        if index is None or not self._links:
            return False
        links = self._links[index % len(self._links)]
        self._shards[index % len(self._shards)].call(functools.partial(links.adopt, sock, dialer_nonce))
        return True

    def _forward(self, group_id: str, address: str, payload: bytes) -> bool:
        """A link got a message for a group of another shard (a peer with another shard count)."""
        group = self._groups.get(group_id)
        if group is None:
            return False

        def deliver() -> None:
            so = group._so
            if so is None or group._destroyed:
                return
            try:
                if patches.transport_of(so).deliver(address, payload):
                    group._shard.dirty.add(group_id)
            except (pickle.UnpicklingError, EOFError, ValueError):
                logger.warning("group %r: undecodable message from %s dropped", group_id, address)

        group._shard.call(deliver)
        return True

    def _rejected(self, why: str) -> None:
        self.rejected_connections += 1
