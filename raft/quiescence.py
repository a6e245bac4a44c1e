"""Pure rules of quiescent Raft groups (CockroachDB's range quiescence, TiKV's hibernate regions), on explicit times.

Terms:

* *quiesce mark*: ``(term, last index, last term, commit index)`` of a leader's log at the
  moment it stops heartbeating. Its followers accept it only when their own log ends at the
  same entry and they know the same commit index, so a quiescent follower holds everything
  the leader holds.
* *node liveness*: one heartbeat per pair of nodes per heartbeat interval (``raft.links``),
  whatever the number of groups the pair shares. ``heard`` is when this node last heard the
  peer's node (``None``: never).
* *quiescent group*: the leader sends no per-group heartbeats; its followers start no
  elections while the leader's node is heard.
* *left out*: a follower on a node that is silent (or whose replica is not connected) while
  a majority of the group is reachable and caught up. The leader quiesces with the others, as
  CockroachDB's ranges quiesce past a follower on a non-live node: one dead node does not keep
  every group it shares awake. When a left-out follower's node is heard again (and its replica
  connected), the leader wakes and catches it up. Raft's safety rules are untouched: terms,
  votes and the log are Raft's; quiescence only decides when heartbeats and election timers
  run. A follower that stops hearing the leader's node campaigns one election timeout
  later, exactly as if the leader's heartbeats had stopped.

States (one ``Quiescence`` per replica of a group, leader or follower)::

    ACTIVE --(leader idle for quiesce_after_s)--> QUIESCING --(every follower acked)--> QUIESCENT
      ^  ^--------------------- wake ----------------------------|                          |
      |-------------------------------- wake ------------------------------------------------|
    ACTIVE --(follower: leader's quiesce mark matches its log)--> QUIESCENT

Every function here is deterministic; callers pass the clock's reading.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from raft.election_rules import majority


class QuiescenceState(enum.Enum):
    """A replica's quiescence; the ints are stable (metrics and logs show them)."""

    ACTIVE = 0  # Raft as usual: heartbeats, election timers
    QUIESCING = 1  # leader: quiesce mark sent, waiting for every follower's ack (no heartbeats meanwhile)
    QUIESCENT = 2  # leader: every follower acked; follower: accepted its leader's mark


VALID_PREVIOUS: dict[QuiescenceState, frozenset[QuiescenceState]] = {
    QuiescenceState.ACTIVE: frozenset({QuiescenceState.QUIESCING, QuiescenceState.QUIESCENT}),
    QuiescenceState.QUIESCING: frozenset({QuiescenceState.ACTIVE}),
    QuiescenceState.QUIESCENT: frozenset({QuiescenceState.ACTIVE, QuiescenceState.QUIESCING}),
}


class InvalidQuiescenceTransition(Exception):
    """A transition the table does not allow (a bug in the caller)."""


class WakeReason(enum.Enum):
    """Why a quiescent (or quiescing) replica goes back to ACTIVE."""

    PROPOSAL = "proposal"  # the leader's log grew or commands are queued
    FOLLOWER_BEHIND = "follower_behind"  # a follower's match index is below the mark
    FOLLOWER_ASKED = "follower_asked"  # a follower refused the mark or sent anything but an ack
    MEMBERSHIP = "membership"  # configuration change, learner or leadership transfer
    PEER_LAPSED = "peer_lapsed"  # a member's node liveness lapsed (or the node restarted)
    PEER_RETURNED = "peer_returned"  # leader: a follower left out of the quiescence is reachable again
    LEADER_MESSAGE = "leader_message"  # follower: the leader sent an AppendEntries
    ROLE_CHANGED = "role_changed"  # term or role differs from the mark's
    DISCONNECTED = "disconnected"  # a member's connection of this group dropped


@dataclass(frozen=True, slots=True)
class QuiesceMark:
    """Where a leader's log stands when it stops heartbeating (see module doc)."""

    term: int
    last_index: int
    last_term: int
    commit_index: int


@dataclass(slots=True)
class Quiescence:
    """One replica's quiescence state; ``transition_to`` is the only way to change ``state``."""

    state: QuiescenceState = QuiescenceState.ACTIVE
    mark: QuiesceMark | None = None
    # leader: the followers that acknowledged ``mark``
    acked: set[str] = field(default_factory=set)
    # leader: the followers it quiesced with (the others are left out: their nodes were silent)
    followers: frozenset[str] = frozenset()
    # leader: since when every quiesce condition held (None: not now)
    idle_since: float | None = None
    # follower: the leader whose mark it accepted
    leader: str | None = None
    last_wake: WakeReason | None = None

    def transition_to(self, to: QuiescenceState) -> None:
        if self.state not in VALID_PREVIOUS[to]:
            raise InvalidQuiescenceTransition(f"quiescence: invalid transition {self.state.name} -> {to.name}")
        self.state = to

    @property
    def quiet(self) -> bool:
        """No per-group heartbeats and no election timer: QUIESCING or QUIESCENT."""
        return self.state is not QuiescenceState.ACTIVE

    def wake(self, reason: WakeReason) -> bool:
        """Back to ACTIVE; False (and nothing changes) when already active."""
        self.idle_since = None
        if self.state is QuiescenceState.ACTIVE:
            return False
        self.transition_to(QuiescenceState.ACTIVE)
        self.mark = None
        self.acked.clear()
        self.followers = frozenset()
        self.leader = None
        self.last_wake = reason
        return True


def node_alive(now: float, heard: float | None, timeout_s: float) -> bool:
    """A peer's node is alive while its last node heartbeat is less than ``timeout_s`` old."""
    return heard is not None and now - heard < timeout_s


@dataclass(frozen=True, slots=True)
class LeaderView:
    """What a leader knows of its group on one tick (the inputs of ``quiescing_followers``)."""

    term: int
    last_index: int
    last_term: int
    commit_index: int
    last_applied: int
    queued_commands: int
    # follower voter -> match index (the leader itself excluded)
    match_index: Mapping[str, int]
    # follower voter -> when its node was last heard (None: never)
    follower_heard: Mapping[str, float | None]
    connected: frozenset[str]
    has_learners: bool
    change_pending: bool
    transfer_in_progress: bool
    ready: bool  # the leader's barrier of this term is applied


def quiescing_followers(view: LeaderView, now: float, liveness_timeout_s: float) -> frozenset[str] | None:
    """The followers a leader may quiesce with now; None when it may not quiesce.

    Nothing to replicate: the last entry committed and applied, nothing queued, no learner,
    uncommitted membership change or leadership transfer. Every *reachable* follower (its node
    alive, its replica connected) caught up: its match index is the last index. The others are
    left out, as long as the reachable ones and the leader are a majority.
    """
    if not view.ready or view.queued_commands or view.has_learners or view.change_pending:
        return None
    if view.transfer_in_progress or not view.match_index:
        return None
    if view.commit_index != view.last_index or view.last_applied != view.last_index:
        return None
    reachable: list[str] = []
    for follower, match in view.match_index.items():
        if follower not in view.connected or not node_alive(now, view.follower_heard.get(follower), liveness_timeout_s):
            continue  # left out: the leader wakes when it is reachable again
        if match != view.last_index:
            return None
        reachable.append(follower)
    if len(reachable) + 1 < majority(len(view.match_index) + 1):
        return None
    return frozenset(reachable)


def leader_should_quiesce(q: Quiescence, idle: bool, now: float, quiesce_after_s: float) -> bool:
    """Track how long the leader has been idle; True once it has been for ``quiesce_after_s`` (ACTIVE only).

    Updates ``q.idle_since``: any non-idle tick restarts the wait.
    """
    if q.state is not QuiescenceState.ACTIVE:
        return False
    if not idle:
        q.idle_since = None
        return False
    if q.idle_since is None:
        q.idle_since = now
    return now - q.idle_since >= quiesce_after_s


def begin_quiescing(q: Quiescence, mark: QuiesceMark, followers: frozenset[str] = frozenset()) -> None:
    """Leader: send ``mark`` to ``followers`` and stop heartbeating until they ack."""
    q.transition_to(QuiescenceState.QUIESCING)
    q.mark = mark
    q.acked.clear()
    q.followers = followers
    q.idle_since = None


def record_ack(q: Quiescence, follower: str, term: int, last_index: int, followers: Iterable[str]) -> bool:
    """Leader: count ``follower``'s ack of the mark; True when this ack made the group QUIESCENT.

    An ack of another mark (an earlier term or index) counts nothing.
    """
    mark = q.mark
    if q.state is not QuiescenceState.QUIESCING or mark is None:
        return False
    if term != mark.term or last_index != mark.last_index:
        return False
    q.acked.add(follower)
    if set(followers) <= q.acked:
        q.transition_to(QuiescenceState.QUIESCENT)
        return True
    return False


def leave_out_unreachable(q: Quiescence, reachable: frozenset[str], voters: int) -> bool:
    """Leader, quiet: leave out the followers it quiesced with that are no longer reachable.

    False (and nothing changes) when the reachable ones and the leader are no longer a majority
    of the ``voters``: the group must wake (check quorum then deposes a leader cut off from its
    majority). Leaving out the last follower a quiescing leader waited for makes it QUIESCENT.
    """
    if not q.quiet:
        return True
    kept = q.followers & reachable
    if kept == q.followers:
        return True
    if len(kept) + 1 < majority(voters):
        return False
    q.followers = kept
    if q.state is QuiescenceState.QUIESCING and kept <= q.acked:
        q.transition_to(QuiescenceState.QUIESCENT)
    return True


def leader_wake_reason(
    q: Quiescence,
    *,
    is_leader: bool,
    term: int,
    last_index: int,
    queued_commands: int,
    followers_alive: bool,
    followers_connected: bool,
    membership_busy: bool,
    left_out_reachable: bool = False,
) -> WakeReason | None:
    """Leader, on each tick while quiet: why it must heartbeat again (None: stay quiet).

    ``followers_alive`` and ``followers_connected`` are of the followers it quiesced with;
    ``left_out_reachable``: a follower it left out is reachable again (it has entries to catch up on).
    """
    mark = q.mark
    if not q.quiet or mark is None:
        return None
    if not is_leader or term != mark.term:
        return WakeReason.ROLE_CHANGED
    if queued_commands or last_index != mark.last_index:
        return WakeReason.PROPOSAL
    if membership_busy:
        return WakeReason.MEMBERSHIP
    if not followers_connected:
        return WakeReason.DISCONNECTED
    if not followers_alive:
        return WakeReason.PEER_LAPSED
    if left_out_reachable:
        return WakeReason.PEER_RETURNED
    return None


def leader_wakes_on_message(q: Quiescence, kind: str | None, *, success: bool, reset: bool, next_index: int) -> bool:
    """Leader, quiet: does a follower's message wake the group?

    Acks of the mark are handled by ``record_ack``. A late successful answer to the last
    heartbeat before the mark (``next_node_idx`` past the mark's last index) does not wake it;
    a follower asking for earlier entries (``reset``, a failed append, an index at or below
    the mark) does, and so does every other message (votes, pre-votes, wake requests).
    """
    mark = q.mark
    if not q.quiet or mark is None:
        return False
    if kind == "next_node_idx":
        return reset or not success or next_index <= mark.last_index
    return True


def follower_accepts_mark(
    *,
    sender: str,
    leader: str | None,
    term: int,
    last_term: int,
    last_index: int,
    commit_index: int,
    mark: QuiesceMark,
) -> bool:
    """Follower: may it go quiescent on ``mark`` from ``sender``?

    Only from the leader it follows, in its current term, with a log that ends at the mark's
    entry and the same commit index. Anything else (a stale or a newer term, a log behind or
    diverging, a commit index not yet learned) is answered with a wake request, and the leader
    resumes AppendEntries, which repair it as Raft does.
    """
    return (
        sender == leader
        and mark.term == term
        and mark.last_term == last_term
        and mark.last_index == last_index
        and mark.commit_index == commit_index
    )


def accept_mark(q: Quiescence, leader: str, mark: QuiesceMark) -> None:
    """Follower: go quiescent under ``leader`` at ``mark`` (also when already quiescent: a newer mark)."""
    if q.state is not QuiescenceState.QUIESCENT:
        q.transition_to(QuiescenceState.QUIESCENT)
    q.mark = mark
    q.leader = leader


def follower_wake_reason(
    q: Quiescence,
    *,
    is_follower: bool,
    term: int,
    leader: str | None,
    last_index: int,
    leader_heard: float | None,
    now: float,
    liveness_timeout_s: float,
    leader_connected: bool = True,
) -> WakeReason | None:
    """Follower, on each tick while quiescent: why it must run its election timer again.

    A dropped connection to the leader wakes it too: an active replica redials at once.
    """
    mark = q.mark
    if q.state is not QuiescenceState.QUIESCENT or mark is None:
        return None
    if not is_follower or term != mark.term or leader != q.leader:
        return WakeReason.ROLE_CHANGED
    if last_index != mark.last_index:
        return WakeReason.LEADER_MESSAGE
    if not leader_connected:
        return WakeReason.DISCONNECTED
    if not node_alive(now, leader_heard, liveness_timeout_s):
        return WakeReason.PEER_LAPSED
    return None


def follower_may_campaign(q: Quiescence, now: float, leader_heard: float | None, liveness_timeout_s: float) -> bool:
    """False while quiescent under a leader whose node is heard: the election timer is suppressed.

    Once the leader's node falls silent for ``liveness_timeout_s`` the follower wakes and its
    election timer runs from the last time it heard the leader's node, as Raft's does from the
    last heartbeat.
    """
    if q.state is not QuiescenceState.QUIESCENT:
        return True
    return not node_alive(now, leader_heard, liveness_timeout_s)


FOLLOWER_WAKING_MESSAGES = frozenset({"append_entries", "timeout_now", "request_vote"})


def follower_wakes_on_message(q: Quiescence, kind: str | None) -> bool:
    """Follower, quiescent: an AppendEntries, a TimeoutNow or a vote request wakes it.

    A leader sends AppendEntries only while active, so one means the group is busy again. A
    pre-vote is only a question: a quiescent follower that hears its leader's node refuses it
    and stays quiet, so a cut-off node asking again and again cannot keep the group awake.
    """
    return q.state is QuiescenceState.QUIESCENT and kind in FOLLOWER_WAKING_MESSAGES


def leader_contact(q: Quiescence, now: float, leader_heard: float | None, liveness_timeout_s: float) -> float | None:
    """Follower: the time to count as its last contact with the leader (for leases and pre-vote).

    While quiescent and the leader's node is heard, that is when its node was last heard;
    otherwise None (the caller keeps what the leader's own messages gave it).
    """
    if q.state is not QuiescenceState.QUIESCENT or not node_alive(now, leader_heard, liveness_timeout_s):
        return None
    return leader_heard
