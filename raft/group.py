"""One Raft group on this node: a PySyncObj instance driving a ``StateMachine``.

Terms:

* *ready leader*: this node is leader and the barrier (``NOOP_COMMAND``) it
  proposed in the current term has been applied. Only then does its state
  machine hold every entry committed by earlier leaders (DESIGN rule 7), so
  only then does ``is_leader()`` return True and ``submit`` propose.
* *state index*: ``StateMachine.last_applied``, which the machine persists
  with its state; entries at or below it are skipped on replay.

Threading: the SyncObj, the state machine and everything named ``_tick*`` or
``_on_*`` run on the owning ticker shard's thread. The public read methods
(``is_leader``, ``leader``, ``term``, ...) read single attributes written by
that thread (atomic under the GIL) and may be called from any thread.
``submit`` must be awaited on the node's event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON

from raft import membership, snapshot, snapshot_transmission
from raft import pysyncobj_patches as patches
from raft.campaigns import CampaignScheduling
from raft.compaction import Compaction
from raft.errors import (
    CannotRemoveLeader,
    MembershipChangeInProgress,
    NotLeaderError,
    QueueFullError,
    RaftApplyError,
    RaftCommandFailed,
    RaftError,
    RaftTimeoutError,
    SnapshotCorruptError,
)
from raft.full_snapshot import FullSnapshotBuilder
from raft.links import NodeLinks
from raft.membership_log import MembershipLog
from raft.quiescence import QuiescenceState, WakeReason
from raft.quiescent_group import LivenessView, QuiescentGroup
from raft.quorum_guard import LEADERSHIP_LOST, QuorumGuard
from raft.settings import GroupStatus, LeadershipEvent, RaftSettings
from raft.state_machine import NOOP_COMMAND, DurableStateMachine, StateMachine
from raft.ticker import ProxyPoller, TickerShard
from raft.transport import LinkTransport

logger = logging.getLogger(__name__)

_FAIL_NAMES = {v: k for k, v in vars(FAIL_REASON).items() if not k.startswith("_") and isinstance(v, int)}
_FAIL_NAMES[LEADERSHIP_LOST] = "LEADERSHIP_LOST"
_STATE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}
EXIT_CORRUPT_SNAPSHOT = 70
_COMPACTION_WAIT_S = 30.0
QUIET_FULL_TICK_S = 60.0


def _fatal_corrupt_snapshot(group_id: str, path: str, exc: BaseException) -> None:
    """Fail-stop on a corrupted snapshot.

    PySyncObj's ``__loadDumpFile`` swallows every exception and then keeps
    applying journal entries over a state machine that lacks the snapshot,
    silently diverging. Nothing raised here can escape it (a bare
    ``except:`` catches SystemExit too), so the only safe outcome is to end
    the process; the file is left in place for the operator, and the node
    will not start until it is repaired or removed (then it re-fetches the
    snapshot from the leader). Tests replace this hook.
    """
    logger.critical(
        "group %r: snapshot %s is corrupted (%s); exiting with status %d to avoid "
        "applying the log over incomplete state",
        group_id,
        path,
        exc,
        EXIT_CORRUPT_SNAPSHOT,
    )
    logging.shutdown()
    os._exit(EXIT_CORRUPT_SNAPSHOT)


fatal_corrupt_snapshot: Callable[[str, str, BaseException], None] = _fatal_corrupt_snapshot


class _GroupSyncObj(
    MembershipLog,
    QuiescentGroup,
    CampaignScheduling,
    QuorumGuard,
    patches.CoalescedAppendEntries,
    SyncObj,  # type: ignore[misc]  # PySyncObj is untyped
):
    """The SyncObj of one group; its single replicated method applies a command."""

    def __init__(self, owner: RaftGroup, *args: Any, **kwargs: Any) -> None:
        self._owner = owner
        self.txb_name = owner.group_id
        self.lease_s = owner._settings.election_timeout_min_s
        self.check_quorum_s = owner._settings.check_quorum_s
        self.commit_notify_delay = owner._settings.commit_notify_delay_s
        self.lazy_commit_notify = owner.lazy_commit_notify
        self.delay_idle_commit_notify = owner.delay_idle_commit_notify
        self.txb_preference = owner.members  # campaign order (``raft.campaigns``)
        self.txb_shard = owner._shard
        self.txb_campaign_slots = owner._settings.campaign_slots
        self.heartbeat_s = owner._settings.heartbeat_s
        self.liveness_timeout_s = owner._settings.check_quorum_s
        self.quiesce_after_s = owner._settings.quiesce_after_s
        super().__init__(*args, **kwargs)
        # Set after construction: no quiescence before the group's first tick.
        self.txb_liveness = owner._liveness if owner._settings.quiesce_after_s > 0 else None

    def _wake_at(self, when: float) -> None:
        # ``when`` is on PySyncObj's clock, the shard's timers on time.monotonic(): pass the delay across. Before,
        # the time itself went across, and with PySyncObj's clock 0.25 s behind the timer fired at once, before the
        # deadline: a lone write's commit reached the followers with the heartbeat (~100 ms) instead of after
        # commit_notify_delay_s. The extra millisecond keeps the tick after the deadline PySyncObj checks (``>``).
        delay = max(0.0, when - patches.syncobj_clock())
        self._owner._shard.tick_at(self._owner.group_id, time.monotonic() + delay + 0.001)

    @replicated  # type: ignore[untyped-decorator]  # PySyncObj's decorator is untyped
    def apply_command(self, command: bytes) -> Any:
        # Inside a replicated method the entry's Raft index is lastApplied + 1.
        return self._owner._apply(self.raftLastApplied + 1, command)


class RaftGroup:
    """Handle of one group on this node (see module doc for terms and threading)."""

    def __init__(
        self,
        group_id: str,
        members: tuple[str, ...],
        self_address: str,
        sm: StateMachine,
        data_dir: str,
        settings: RaftSettings,
        loop: asyncio.AbstractEventLoop,
        shard: TickerShard,
        on_event: Callable[[LeadershipEvent], None] | None,
        links: NodeLinks,
        lazy_commit_notify: bool = False,
        compaction_executor: Executor | None = None,
        delay_idle_commit_notify: bool = False,
        liveness: LivenessView | None = None,
    ) -> None:
        self.group_id = group_id
        # Node heartbeats (``raft.links``); None: the group never quiesces.
        self._liveness = liveness
        self._next_slow_tick = 0.0
        self._next_full_tick = 0.0
        # Followers learn a new commit index from the next heartbeat when nothing else is in flight
        # (``pysyncobj_patches.CoalescedAppendEntries``): for groups written now and then, like coordinators'.
        self.lazy_commit_notify = lazy_commit_notify
        # ... or after ``commit_notify_delay_s``, unless a write sooner carries it: groups written in a trickle.
        self.delay_idle_commit_notify = delay_idle_commit_notify
        self.members = members
        self.self_address = self_address
        self.data_dir = data_dir
        self._sm = sm
        self._durable = sm if isinstance(sm, DurableStateMachine) else None
        self._full: FullSnapshotBuilder | None = None
        # Log compaction; a store-backed group's runs on ``compaction_executor`` (None: on the ticker).
        self._compaction = Compaction(group_id, compaction_executor)
        self._settings = settings
        self._loop = loop
        self._shard = shard
        self._on_event = on_event
        self._links = links
        self._so: _GroupSyncObj | None = None
        self._ready_term = -1  # term whose barrier this node applied as leader
        self._barrier_term = -1  # term for which a barrier is in flight
        self._last_event: tuple[bool, str | None, int] | None = None
        self._destroyed = False
        self._membership_term = -1  # term in which a membership change of ours is queued or uncommitted

    # --- construction / destruction (shard thread) -------------------------

    def _conf(self) -> SyncObjConf:
        s = self._settings
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,
            appendEntriesPeriod=s.heartbeat_s,
            raftMinTimeout=s.election_timeout_min_s,
            raftMaxTimeout=s.election_timeout_max_s,
            leaderFallbackTimeout=s.leader_fallback_s,
            connectionTimeout=s.connection_timeout_s,
            connectionRetryTime=s.connection_retry_s,
            logCompactionMinEntries=s.log_compaction_min_entries,
            logCompactionMinTime=s.log_compaction_min_time_s,
            logCompactionSplit=s.log_compaction_split,
            logCompactionBatchSize=1 << 20,
            commandsQueueSize=s.commands_queue_size,
            commandsWaitLeader=False,
            appendEntriesBatchSizeBytes=s.max_entry_bytes,
            journalFile=os.path.join(self.data_dir, "raft.journal"),
            fullDumpFile=os.path.join(self.data_dir, "raft.dump"),
            serializer=self._serialize,
            deserializer=self._deserialize,
            serializeChecker=self._compaction.check,
            maxBindRetries=1,
            dynamicMembershipChange=True,
            sendBufferSize=1 << 20,
            recvBufferSize=1 << 20,
        )
        conf.validate()
        return conf

    def _construct(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        transport_class = functools.partial(LinkTransport, group_id=self.group_id, links=self._links)
        others = [m for m in self.members if m != self.self_address]
        with patches.constructing_with_poller(ProxyPoller(self._shard, self.group_id)):
            self._so = _GroupSyncObj(self, self.self_address, others, self._conf(), transportClass=transport_class)
        if self._durable is not None:
            rate = self._settings.snapshot_max_bytes_per_s
            dump = os.path.join(self.data_dir, "raft.dump")
            self._full = FullSnapshotBuilder(self.group_id, dump, self._durable, rate)
            snapshot_transmission.set_transmission_source(self._so, self._full.path_for_transmission, rate)

    def _destroy(self) -> None:
        so = self._so
        if so is None or self._destroyed:
            return
        self._destroyed = True
        so._txb_forget_campaign()
        try:
            patches.store_commit_index(so)
        except Exception:
            logger.exception("group %r: failed to store journal meta", self.group_id)
        so.destroy()  # manual-tick mode: synchronous (transport closed, journal flushed+closed)
        patches.close_pipe_notifier(so)
        snapshot_transmission.close_serializer_files(so)
        self._compaction.wait(_COMPACTION_WAIT_S)
        if self._full is not None:
            self._full.close()
        self._emit(force=(False, None, self.term()))

    # --- ticking (shard thread) ---------------------------------------------

    def tick(self) -> None:
        so = self._so
        if so is None or self._destroyed:
            return
        now = time.monotonic()
        # A quiescent replica runs PySyncObj's own tick (journal timers, log compaction by time) only every
        # QUIET_FULL_TICK_S; its other ticks are the few checks of ``txb_quiet_upkeep``.
        if now < self._next_full_tick and so.txb_quiet_upkeep():
            self._schedule_slow_tick(now)
            return
        so.doTick(0.0)
        self._after_tick(so)
        shard = self._shard
        if so.txb_quiescence_state() is QuiescenceState.QUIESCENT:  # a QUIESCING leader re-sends its mark on time
            if self.group_id not in shard.quiet:
                shard.set_quiet(self.group_id, True)
            if now >= self._next_full_tick:
                self._next_full_tick = now + QUIET_FULL_TICK_S
            self._schedule_slow_tick(now)
        elif self.group_id in shard.quiet:
            shard.set_quiet(self.group_id, False)
            self._next_slow_tick = self._next_full_tick = 0.0

    def _schedule_slow_tick(self, now: float) -> None:
        if now >= self._next_slow_tick:
            self._next_slow_tick = now + self._settings.quiescent_tick_s
            self._shard.tick_slowly(self.group_id, self._next_slow_tick)

    def quiescence(self) -> QuiescenceState:
        """This replica's quiescence (any thread; ``raft.quiescence``)."""
        so = self._so
        return QuiescenceState.ACTIVE if so is None or self._destroyed else so.txb_quiescence_state()

    def quiet_settled(self) -> bool:
        """Quiet, with everything committed applied: its log, term and leader stay as they are until it wakes
        (a follower may still be applying what it learned committed with the leader's mark; any thread)."""
        so = self._so
        return so is not None and not self._destroyed and so.txb_quiet and so.raftLastApplied == so.raftCommitIndex

    def wake_count(self) -> int:
        """How many times this replica woke from quiescence (any thread)."""
        so = self._so
        return 0 if so is None else int(so.wake_count)

    def left_out(self) -> frozenset[str]:
        """A quiet leader's followers left out of its quiescence (their nodes silent); empty otherwise (any thread)."""
        so = self._so
        if so is None or self._destroyed or not so.txb_quiet or not so._isLeader():
            return frozenset()
        return frozenset(str(n.id) for n in list(patches.other_nodes(so))) - so.txb_quiescence.followers

    def wake(self, reason: WakeReason) -> None:
        """Make a quiet replica run Raft's heartbeats and election timers again (any thread, asynchronous)."""

        def run() -> None:
            so = self._so
            if so is None or self._destroyed or not so.txb_quiet:
                return
            so.txb_wake(reason)
            self._awake()

        self._shard.call(run)

    def peer_lapsed(self, peer: str, restarted: bool) -> None:
        """Node ``peer`` fell silent or restarted: a quiet replica it matters to wakes (any thread, asynchronous)."""

        def run() -> None:
            so = self._so
            if so is not None and not self._destroyed and so.txb_peer_lapsed(peer, restarted):
                self._awake()

        self._shard.call(run)

    def _awake(self) -> None:
        self._shard.set_quiet(self.group_id, False)
        self._next_slow_tick = self._next_full_tick = 0.0
        self._shard.notify(self.group_id)

    def _after_tick(self, so: _GroupSyncObj) -> None:
        term = so.raftCurrentTerm
        if so._isLeader() and self._ready_term != term and self._barrier_term != term:
            self._barrier_term = term
            so.apply_command(NOOP_COMMAND, callback=functools.partial(self._on_barrier, term))
        self._emit()

    def _on_barrier(self, term: int, result: Any, err: int) -> None:
        so = self._so
        if so is None:
            return
        if err == FAIL_REASON.SUCCESS and so._isLeader() and so.raftCurrentTerm == term:
            self._ready_term = term
        elif self._barrier_term == term:
            self._barrier_term = -1  # still leader of this term? propose it again next tick
        self._emit()

    def _emit(self, force: tuple[bool, str | None, int] | None = None) -> None:
        state = force if force is not None else (self.is_leader(), self.leader(), self.term())
        if state == self._last_event:
            return
        self._last_event = state
        if self._on_event is None:
            return
        event = LeadershipEvent(self.group_id, state[0], state[1], state[2])
        # Batched with everything else of the shard's pass: when a node dies, thousands of groups change
        # leader within a few passes, and one loop wake-up per group would hand the GIL back and forth.
        self._shard.post(self._loop, functools.partial(self._on_event, event))

    # --- state machine bridge (shard thread) --------------------------------

    def _apply(self, index: int, command: bytes) -> Any:
        try:
            return self._sm.apply(index, command)
        except Exception as e:
            # Never propagate: an exception here wedges the group on every replica.
            logger.exception("group %r: StateMachine.apply failed at index %d", self.group_id, index)
            return RaftApplyError(self.group_id, index, f"{type(e).__name__}: {e}")

    def _serialize(self, dump_path: str, raft_data: Any) -> None:
        # PySyncObj's serializer hook (with ``pysyncobj_patches``): start writing the dump; ``Compaction.check``
        # tells PySyncObj when it is in place.
        so = self._so
        if so is not None:
            # PySyncObj records the configuration of the moment, which may hold a change appended after the
            # snapshot's index (uncommitted: a new leader may truncate it). Record the one at the index.
            voters = so.txb_configuration_at(int(raft_data[0][1]))
            raft_data = (raft_data[0], raft_data[1], [patches.new_node(so, a) for a in sorted(voters)])
        if self._durable is not None:
            # The state is in the store: make it crash-proof, then record only where it stands (off the ticker).
            self._compaction.start(dump_path, raft_data, self._sm.last_applied, self._durable.make_durable, None)
        else:
            self._compaction.start(dump_path, raft_data, self._sm.last_applied, None, self._sm.write_snapshot)

    def _deserialize(self, path: str) -> Any:
        self._compaction.invalidate()
        try:
            reader = snapshot.SnapshotReader(path)
            if self._so is not None:
                self._so.txb_note_snapshot(reader.raft_data)
            if reader.light:
                # Our own compaction point: the store must already hold the state at or past it.
                if self._sm.last_applied < reader.state_index:
                    raise SnapshotCorruptError(
                        f"{path}: light snapshot at state index {reader.state_index} but the store is at "
                        f"{self._sm.last_applied} (store writes lost)"
                    )
                return reader.raft_data
            if self._sm.last_applied < reader.state_index:
                with reader.open_body() as body:
                    self._sm.read_snapshot(body, reader.state_index)
                logger.info(
                    "group %r: restored state machine from snapshot at index %d",
                    self.group_id,
                    reader.state_index,
                )
            return reader.raft_data
        except Exception as e:
            # Corrupted container, I/O error, or read_snapshot failing half-way
            # (the machine's state is then unknown): all fatal.
            fatal_corrupt_snapshot(self.group_id, path, e)
            raise

    # --- public API ------------------------------------------------------------

    def is_leader(self) -> bool:
        so = self._so
        return so is not None and not self._destroyed and so._isLeader() and self._ready_term == so.raftCurrentTerm

    def holds_lease(self) -> bool:
        """Ready leader *and* heard from a majority within ``check_quorum_s``: safe to answer a read.

        A leader that was paused (SIGSTOP) or cut off answers from its own log until the tick that
        deposes it; by then a newer leader may have acknowledged writes. Reads check this instead."""
        so = self._so
        return self.is_leader() and so is not None and so.quorum_heard_within(self._settings.check_quorum_s)

    def leader(self) -> str | None:
        """The leader as this node knows it; None while electing, or when a follower has not heard
        from its leader for the maximum election timeout (cut off: whoever leads now, it is not news
        this node has)."""
        so = self._so
        if so is None or self._destroyed:
            return None
        node = so._getLeader()
        if node is None:
            return None
        if not so._isLeader() and not so.leader_heard_within(self._settings.election_timeout_max_s):
            return None
        return str(node.id)

    def term(self) -> int:
        so = self._so
        return 0 if so is None else int(so.raftCurrentTerm)

    def commit_index(self) -> int:
        so = self._so
        return 0 if so is None else int(so.raftCommitIndex)

    def last_applied(self) -> int:
        so = self._so
        return 0 if so is None else int(so.raftLastApplied)

    async def submit(self, command: bytes, timeout: float, on_applied: Callable[[Any], None] | None = None) -> Any:
        """Propose ``command`` and return ``sm.apply``'s result for it on this node.

        Raises NotLeaderError (not the ready leader; nothing proposed),
        QueueFullError (nothing proposed), RaftCommandFailed or
        RaftTimeoutError (outcome unknown: may still commit), or the
        RaftApplyError that apply produced. ``on_applied(result)`` runs on
        the event loop once the command is applied here without an apply
        error, even when the caller stopped waiting (timed out or cancelled):
        what must count every applied command goes there.
        """
        so = self._so
        if so is None or not self.is_leader():
            raise NotLeaderError(self.leader(), self.group_id)
        loop = self._loop
        fut: asyncio.Future[Any] = loop.create_future()

        def resolve(result: Any, err: int) -> None:
            if on_applied is not None and err == FAIL_REASON.SUCCESS and not isinstance(result, RaftApplyError):
                on_applied(result)
            if fut.done():
                return  # the caller timed out or was cancelled
            if err == FAIL_REASON.SUCCESS:
                if isinstance(result, RaftApplyError):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
            else:
                fut.set_exception(self._error_for(err))

        def callback(result: Any, err: int) -> None:  # shard thread (or ours for QUEUE_FULL)
            self._shard.post(loop, functools.partial(resolve, result, err))

        so.apply_command(command, callback=callback)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError as e:
            raise RaftTimeoutError(f"group {self.group_id!r}: no commit within {timeout}s (outcome unknown)") from e

    def submit_threadsafe(self, command: bytes, callback: Callable[[Any, RaftError | None], None]) -> None:
        """Propose from any thread; ``callback(result, error)`` runs on the shard thread
        (or synchronously on the caller's thread for NotLeaderError/QueueFullError)."""
        so = self._so
        if so is None or not self.is_leader():
            callback(None, NotLeaderError(self.leader(), self.group_id))
            return

        def on_done(result: Any, err: int) -> None:
            if err != FAIL_REASON.SUCCESS:
                callback(None, self._error_for(err))
            elif isinstance(result, RaftApplyError):
                callback(None, result)
            else:
                callback(result, None)

        so.apply_command(command, callback=on_done)

    def _error_for(self, err: int) -> RaftError:
        if err == FAIL_REASON.QUEUE_FULL:
            return QueueFullError(f"group {self.group_id!r}: command queue full")
        if err in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER):
            return NotLeaderError(self.leader(), self.group_id)
        return RaftCommandFailed(_FAIL_NAMES.get(err, str(err)), self.group_id)

    def status(self) -> GroupStatus:
        so = self._so
        if so is None:
            return GroupStatus("follower", None, 0, 0, 0, False)
        for _ in range(5):
            try:
                state = patches.raft_state(so)
                match = {str(n.id): int(i) for n, i in dict(patches.raft_match_index(so)).items()} if state == 2 else {}
                connected = frozenset(str(n.id) for n in set(patches.connected_nodes(so)))
                now = patches.syncobj_clock()
                window = self._settings.check_quorum_s
                responsive = so.txb_responsive(window)  # a quiet leader: its followers' node heartbeats
                if responsive is None:
                    responsive = (
                        frozenset(
                            str(n.id) for n, t in dict(patches.last_response_times(so)).items() if now - t < window
                        )
                        if state == 2
                        else frozenset()
                    )
                return GroupStatus(
                    state=_STATE_NAMES.get(state, str(state)),
                    leader=self.leader(),
                    term=self.term(),
                    commit_index=self.commit_index(),
                    last_applied=self.last_applied(),
                    has_quorum=bool(so.hasQuorum),
                    match_index=match,
                    connected=connected,
                    responsive=responsive,
                    voters=so.txb_voters,
                    learners=so.txb_learners if state == 2 else frozenset(),
                )
            except RuntimeError:
                continue  # a dict/set changed size while copied by the shard thread
        raise RaftError(f"group {self.group_id!r}: status unavailable (concurrent updates)")

    def transfer_leadership(self, to: str) -> None:
        """Ask the leader to hand over to ``to`` (must be caught up); best effort.

        The outcome shows up as a LeadershipEvent / ``leader()`` change.
        """

        def run() -> None:
            so = self._so
            if so is None or self._destroyed:
                return

            def done(_result: Any, err: int) -> None:
                if err != FAIL_REASON.SUCCESS:
                    logger.info(
                        "group %r: leadership transfer to %s refused: %s",
                        self.group_id,
                        to,
                        _FAIL_NAMES.get(err, err),
                    )

            so.transferLeadership(to, done)

        self._shard.call(run)

    # --- membership ------------------------------------------------------------------------------

    def voters(self) -> frozenset[str]:
        """The group's configuration as this replica knows it (any thread).

        Raft addresses of the voters, this node's own included when it is one. A
        membership entry counts from the moment it is in this replica's log (Raft's
        rule), committed or not; from the group's first tick on (milliseconds after
        ``add_group``) it is the log's configuration, whatever ``members`` said."""
        so = self._so
        return frozenset(self.members) if so is None else so.txb_voters

    def member_lag(self, address: str) -> int | None:
        """On the leader: its last log index minus the match index of voter or learner ``address``.

        0 for the leader itself; None when this node is not the leader or does not
        replicate to ``address``. Right after a leader change every follower shows the
        whole log until its first answer (a heartbeat later)."""
        so = self._so
        if so is None or self._destroyed or not so._isLeader():
            return None
        if address == self.self_address:
            return 0
        if address not in so.txb_voters and address not in so.txb_learners:
            return None
        try:
            match = {str(n.id): int(i) for n, i in dict(patches.raft_match_index(so)).items()}
            last_index = patches.last_log_position(so)[1]
        except (RuntimeError, IndexError):  # resized (or the log replaced) by the shard thread meanwhile
            return None
        return membership.lag(last_index, match.get(address))

    def learner_lag(self, address: str) -> int | None:
        """``member_lag`` of a learner of this leader; None when ``address`` is not one."""
        so = self._so
        if so is None or address not in so.txb_learners:
            return None
        return self.member_lag(address)

    def learners(self) -> frozenset[str]:
        """The learners this node replicates to as leader (leader-local: not replicated); empty on a follower."""
        so = self._so
        return frozenset() if so is None or not so._isLeader() else so.txb_learners

    async def change_membership(self, *, add: str | None = None, remove: str | None = None, timeout: float) -> None:
        """Add or remove one voter; resolves when the change's entry is committed.

        Exactly one of ``add``/``remove`` (``host:port``; ValueError otherwise). Only on the
        ready leader (NotLeaderError). CannotRemoveLeader for the leader itself (transfer
        leadership first). MembershipChangeInProgress while an earlier change is queued or
        uncommitted (checked before the no-op case, so a retry after a timeout never returns
        before the change committed). Adding a voter or removing a non-voter returns at once.
        Adding a learner of this leader makes it a voter (keeping its replication progress).
        RaftTimeoutError: outcome unknown (the change may still commit; ask ``voters()``).
        RaftCommandFailed (e.g. LEADERSHIP_LOST): outcome unknown as well.
        """
        change = membership.requested(add, remove)  # ValueError
        if self._so is None or not self.is_leader():
            raise NotLeaderError(self.leader(), self.group_id)
        loop = self._loop
        committed: asyncio.Future[None] = loop.create_future()

        def resolve(error: RaftError | None) -> None:
            if committed.done():
                return
            if error is None:
                committed.set_result(None)
            else:
                committed.set_exception(error)

        def on_done(_result: Any, err: int) -> None:  # shard thread
            self._membership_term = -1
            error = None if err == FAIL_REASON.SUCCESS else self._membership_error(err)
            self._shard.post(loop, functools.partial(resolve, error))

        def propose() -> bool:  # shard thread; False: nothing to change
            so = self._so
            if so is None or self._destroyed or not self.is_leader():
                raise NotLeaderError(self.leader(), self.group_id)
            try:
                plan = membership.plan_change(so.txb_voters, self.self_address, change)
            except membership.RemovesLeader as e:
                raise CannotRemoveLeader(f"group {self.group_id!r}: {e}") from e
            if self._membership_term == so.raftCurrentTerm or so.txb_change_pending():
                raise self._change_in_progress()
            if plan is membership.Plan.NOTHING:
                return False
            self._membership_term = so.raftCurrentTerm
            if change.op == membership.ADD:
                so.addNodeToCluster(change.address, on_done)
            else:
                so.removeNodeFromCluster(change.address, on_done)
            return True

        try:
            async with asyncio.timeout(timeout):
                if await asyncio.wrap_future(self._shard.call(propose)):
                    await committed
        except TimeoutError as e:
            raise RaftTimeoutError(
                f"group {self.group_id!r}: membership change not committed within {timeout}s (outcome unknown)"
            ) from e

    def _membership_error(self, err: int) -> RaftError:
        so = self._so
        if err == FAIL_REASON.REQUEST_DENIED and so is not None:
            if not so._isLeader():
                return NotLeaderError(self.leader(), self.group_id)
            if so.txb_change_pending():
                return self._change_in_progress()
        return self._error_for(err)

    def _change_in_progress(self) -> MembershipChangeInProgress:
        return MembershipChangeInProgress(f"group {self.group_id!r}: an earlier membership change is not committed")

    async def add_learner(self, address: str, timeout: float) -> None:
        """On the ready leader: replicate to ``address`` without counting it (``change_membership(add=)`` promotes it).

        Leader-local, not replicated: after a leader change the new leader does not know the
        learner (``learner_lag`` is None there; add it again, or promote it anyway). Returns
        once the leader replicates to it; catching up shows in ``learner_lag``. A voter is no
        learner: adding one returns at once. The node must run the group with ``members`` the
        current voters plus itself, as for any node being added."""
        membership.check_address(address)  # ValueError
        if address == self.self_address:
            raise ValueError("the leader cannot be its own learner")

        def register() -> None:
            so = self._so
            if so is None or self._destroyed or not self.is_leader():
                raise NotLeaderError(self.leader(), self.group_id)
            so.txb_add_learner(address)

        await self._on_shard(register, timeout)

    async def remove_learner(self, address: str, timeout: float) -> None:
        """Stop replicating to learner ``address`` (nothing when it is none)."""

        def unregister() -> None:
            so = self._so
            if so is not None and not self._destroyed:
                so.txb_remove_learner(address)

        await self._on_shard(unregister, timeout)

    async def _on_shard(self, fn: Callable[[], None], timeout: float) -> None:
        try:
            await asyncio.wait_for(asyncio.wrap_future(self._shard.call(fn)), timeout)
        except TimeoutError as e:
            raise RaftTimeoutError(f"group {self.group_id!r}: no answer within {timeout}s") from e
