"""Quiescent groups for PySyncObj: a SyncObj mixin (rules in ``raft.quiescence``, liveness in ``raft.links``).

* **Leader.** On each tick of an active ready leader the mixin checks ``quiescing_followers``;
  after ``quiesce_after_s`` of it, it sends those followers ``QUIESCE`` with its mark and stops
  PySyncObj's heartbeats (``__newAppendEntriesTime`` is pushed back every tick; an
  AppendEntries with entries still goes out at once). It re-sends the mark every heartbeat
  interval to followers that have not acknowledged it. While quiet, each follower whose node
  is heard counts as having answered when its node was last heard (PySyncObj's leader
  fallback, check quorum and read leases then see the node heartbeats instead of the group's).
  A proposal, a follower asking for entries or votes, a membership change or a transfer
  wakes it: heartbeats resume in the same tick. A follower whose node falls silent or whose
  connection drops is left out while a majority stays reachable (otherwise the group wakes);
  a left-out follower reachable again wakes it, to be caught up.
* **Follower.** It accepts a mark from the leader it follows when its log ends at the mark's
  entry with the same commit index (``follower_accepts_mark``), answers ``QUIESCE_ACK``, and
  from then on counts the leader's node heartbeats as contact with the leader: its election
  deadline and pre-vote lease move with them. Otherwise it answers ``WAKE``. An
  AppendEntries, a TimeoutNow, a vote request, a change of term or leader, or the leader's
  node falling silent for ``liveness_timeout_s`` wakes it; its election deadline is then
  what the last node heartbeat left, so it campaigns one election timeout after it last
  heard the leader's node, through pre-vote, as Raft does after the last heartbeat.

Safety is Raft's: the mark carries term and indexes, and a follower with another log or term
never goes quiet; votes, terms and the log are PySyncObj's, untouched.

Ticker thread only, except ``txb_quiet``, ``quorum_heard_within`` and ``leader_heard_within``
(reads of single attributes, any thread).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from raft import pysyncobj_patches as patches
from raft.election_rules import has_quorum_contact
from raft.quiescence import (
    LeaderView,
    QuiesceMark,
    Quiescence,
    QuiescenceState,
    WakeReason,
    accept_mark,
    begin_quiescing,
    follower_accepts_mark,
    follower_wake_reason,
    follower_wakes_on_message,
    leader_contact,
    leader_should_quiesce,
    leader_wake_reason,
    leader_wakes_on_message,
    leave_out_unreachable,
    node_alive,
    quiescing_followers,
    record_ack,
)

logger = logging.getLogger(__name__)

QUIESCE = "txb_quiesce"
QUIESCE_ACK = "txb_quiesce_ack"
WAKE = "txb_wake"
_LEADER = 2
_FOLLOWER = 0


class LivenessView(Protocol):
    """What a group needs of the node liveness (``raft.links.NodeLinks``)."""

    def heard(self, address: str) -> float | None: ...


class QuiescentGroup:
    """SyncObj mixin (see module doc). List it before ``QuorumGuard`` in the bases.

    ``txb_liveness`` None: the group never quiesces (and answers every mark with ``WAKE``).
    """

    txb_liveness: LivenessView | None = None
    txb_name = ""
    quiesce_after_s = 1.0
    liveness_timeout_s = 0.6
    heartbeat_s = 0.1
    txb_quiet = False
    _txb_q: Quiescence | None = None
    _txb_next_mark_send = 0.0
    _txb_leader_contact: float | None = None
    #: Counters: times this replica went quiet, and woke.
    quiesce_count = 0
    wake_count = 0

    # --- state ----------------------------------------------------------------------------------

    @property
    def txb_quiescence(self) -> Quiescence:
        q = self._txb_q
        if q is None:
            q = self._txb_q = Quiescence()
        return q

    def txb_quiescence_state(self) -> QuiescenceState:
        q = self._txb_q
        return QuiescenceState.ACTIVE if q is None else q.state

    def _txb_heard(self, address: str, sync_now: float) -> float | None:
        """When ``address``'s node was last heard, on PySyncObj's clock (``syncobj_clock``)."""
        liveness = self.txb_liveness
        heard = None if liveness is None else liveness.heard(address)
        if heard is None:
            return None
        return sync_now - (time.monotonic() - heard)

    def _txb_set_quiet(self) -> None:
        self.txb_quiet = self.txb_quiescence.quiet

    def txb_wake(self, reason: WakeReason) -> None:
        """Back to Raft's own heartbeats and election timers (ticker thread).

        A quiet replica is ticked only every few seconds, so what its last tick took from the
        node heartbeats may be old: it is taken again now. A woken leader then counts each
        follower whose node is heard as having answered (check quorum must not depose it
        before its first heartbeat is answered), and a woken follower's election deadline runs
        from the last time it heard its leader's node, never from an older tick.
        """
        q = self.txb_quiescence
        if not q.quiet:
            return
        now = patches.syncobj_clock()
        state = patches.raft_state(self)
        leader = patches.raft_leader_node(self)
        if state == _LEADER:
            self._txb_count_node_heartbeats(now)
        elif q.state is QuiescenceState.QUIESCENT and leader is not None and str(leader.id) == q.leader:
            heard = self._txb_heard(str(leader.id), now)
            if heard is not None:
                self._txb_follow_node_heartbeat(heard)
        q.wake(reason)
        self.wake_count += 1
        self.txb_quiet = False
        logger.debug("raft group %r wakes: %s", self.txb_name, reason.value)
        if state == _LEADER:
            self.__dict__["_SyncObj__newAppendEntriesTime"] = 0.0  # heartbeat in this very tick
        self._wake_at(now)

    def txb_peer_lapsed(self, peer: str, restarted: bool) -> bool:
        """Node ``peer`` fell silent (or restarted): wake if it matters to this replica; True if it woke.

        A quiet leader leaves a silent follower out while a majority of the group is still
        reachable, and wakes otherwise; a quiescent follower wakes for its leader only (a
        silent fellow follower changes nothing for it). A restart wakes any replica the node
        is a voter of: a restarted leader lost its leadership, a restarted follower may have
        lost entries it had not written.
        """
        q = self.txb_quiescence
        if not q.quiet:
            return False
        voters = {str(n.id) for n in patches.other_nodes(self)}
        reason: WakeReason | None = None
        if patches.raft_state(self) == _LEADER:
            if peer in voters and restarted:
                reason = WakeReason.PEER_LAPSED
            elif peer in voters:
                reason = self._txb_leader_wake_reason(q, patches.syncobj_clock())
        elif peer == q.leader or (restarted and peer in voters):
            reason = WakeReason.PEER_LAPSED
        if reason is None:
            self._txb_set_quiet()
            return False
        self.txb_wake(reason)
        return True

    # --- tick ---------------------------------------------------------------------------------

    def _onTick(self, timeToWait: float = 0.0) -> None:  # PySyncObj's names
        if self.txb_liveness is not None:
            self._txb_before_tick()
        super()._onTick(timeToWait)  # type: ignore[misc]  # SyncObj provides it
        if self.txb_liveness is not None:
            self._txb_after_tick()

    def txb_quiet_upkeep(self) -> bool:
        """A quiescent replica's tick without PySyncObj's: wake checks and node heartbeat bookkeeping only.

        True: still quiescent, nothing else to do. False: a proposal, a transfer or a wake
        reason needs PySyncObj's own tick (the caller runs it now).
        """
        q = self.txb_quiescence
        if q.state is not QuiescenceState.QUIESCENT or self.txb_liveness is None:
            return False
        if _queued(self) or patches.transfer_in_progress(self):
            return False
        self._txb_before_tick()
        return q.state is QuiescenceState.QUIESCENT

    def _txb_followers(self) -> list[Any]:
        return list(patches.other_nodes(self))

    def _txb_before_tick(self) -> None:
        q = self.txb_quiescence
        if not q.quiet:
            return
        now = patches.syncobj_clock()
        state = patches.raft_state(self)
        if state == _LEADER:
            reason = self._txb_leader_wake_reason(q, now)
            if reason is not None:
                self.txb_wake(reason)
                return
            self._txb_leader_stay_quiet(q, now)
        else:
            leader = patches.raft_leader_node(self)
            leader_id = None if leader is None else str(leader.id)
            heard = None if leader_id is None else self._txb_heard(leader_id, now)
            reason = follower_wake_reason(
                q,
                is_follower=state == _FOLLOWER,
                term=int(self.raftCurrentTerm),  # type: ignore[attr-defined]  # SyncObj provides it
                leader=leader_id,
                last_index=patches.last_log_position(self)[1],
                leader_heard=heard,
                now=now,
                liveness_timeout_s=self.liveness_timeout_s,
                leader_connected=leader is not None and leader in patches.connected_nodes(self),
            )
            if reason is not None:
                self.txb_wake(reason)
                return
            assert heard is not None  # alive: heard within the timeout
            self._txb_follow_node_heartbeat(heard)

    def _txb_leader_wake_reason(self, q: Quiescence, now: float) -> WakeReason | None:
        followers = [str(n.id) for n in self._txb_followers()]
        connected = {str(n.id) for n in patches.connected_nodes(self)}
        alive = {f for f in followers if node_alive(now, self._txb_heard(f, now), self.liveness_timeout_s)}
        reachable = frozenset(alive & connected)
        leave_out_unreachable(q, reachable, len(followers) + 1)
        kept = q.followers
        return leader_wake_reason(
            q,
            is_leader=True,
            term=int(self.raftCurrentTerm),  # type: ignore[attr-defined]
            last_index=patches.last_log_position(self)[1],
            queued_commands=_queued(self),
            followers_alive=kept <= alive,
            followers_connected=kept <= connected,
            membership_busy=bool(patches.readonly_nodes(self)) or patches.transfer_in_progress(self),
            left_out_reachable=not reachable <= kept,
        )

    def _txb_leader_stay_quiet(self, q: Quiescence, now: float) -> None:
        # No heartbeat from PySyncObj; the followers' node heartbeats stand for their answers.
        self.__dict__["_SyncObj__newAppendEntriesTime"] = now + self.heartbeat_s
        self._txb_count_node_heartbeats(now)
        if q.state is QuiescenceState.QUIESCING and now >= self._txb_next_mark_send:
            self._txb_send_mark(q, now)

    def _txb_count_node_heartbeats(self, now: float) -> None:
        responses = patches.last_response_times(self)
        for node in self._txb_followers():
            heard = self._txb_heard(str(node.id), now)
            if heard is not None and heard > responses.get(node, float("-inf")):
                responses[node] = heard

    def _txb_follow_node_heartbeat(self, heard: float) -> None:
        self._txb_leader_contact = max(self._txb_leader_contact or heard, heard)
        deadline = heard + patches.random_election_timeout(self)
        if deadline > patches.election_deadline(self):
            patches.set_election_deadline(self, deadline)

    def _txb_after_tick(self) -> None:
        q = self.txb_quiescence
        now = patches.syncobj_clock()
        state = patches.raft_state(self)
        if q.quiet:
            if state == _LEADER:
                reason = self._txb_leader_wake_reason(q, now)
                if reason is not None:
                    self.txb_wake(reason)
            elif q.state is QuiescenceState.QUIESCING:
                self.txb_wake(WakeReason.ROLE_CHANGED)
            self._txb_set_quiet()
            return
        if state != _LEADER:
            q.idle_since = None
            return
        view = self._txb_leader_view(now)
        followers = quiescing_followers(view, now, self.liveness_timeout_s)
        if leader_should_quiesce(q, followers is not None, now, self.quiesce_after_s) and followers is not None:
            mark = QuiesceMark(view.term, view.last_index, view.last_term, view.commit_index)
            begin_quiescing(q, mark, followers)
            self.quiesce_count += 1
            self.__dict__["_SyncObj__newAppendEntriesTime"] = now + self.heartbeat_s
            self._txb_send_mark(q, now)
        self._txb_set_quiet()

    def _txb_leader_view(self, now: float) -> LeaderView:
        followers = self._txb_followers()
        match = patches.raft_match_index(self)
        last_term, last_index = patches.last_log_position(self)
        connected = patches.connected_nodes(self)
        noop = patches.leader_noop_index(self)
        commit = patches.raft_commit_index(self)
        return LeaderView(
            term=int(self.raftCurrentTerm),  # type: ignore[attr-defined]
            last_index=last_index,
            last_term=last_term,
            commit_index=commit,
            last_applied=patches.raft_last_applied(self),
            queued_commands=_queued(self),
            match_index={str(n.id): int(match.get(n, 0)) for n in followers},
            follower_heard={str(n.id): self._txb_heard(str(n.id), now) for n in followers},
            connected=frozenset(str(n.id) for n in connected),
            has_learners=bool(patches.readonly_nodes(self)),
            change_pending=bool(self.txb_change_pending()),  # type: ignore[attr-defined]  # MembershipLog
            transfer_in_progress=patches.transfer_in_progress(self),
            ready=noop is not None and commit >= noop,
        )

    def _txb_send_mark(self, q: Quiescence, now: float) -> None:
        mark = q.mark
        if mark is None:
            return
        self._txb_next_mark_send = now + self.heartbeat_s
        message = {
            "type": QUIESCE,
            "term": mark.term,
            "last_index": mark.last_index,
            "last_term": mark.last_term,
            "commit_index": mark.commit_index,
        }
        transport = patches.transport_of(self)
        for node in self._txb_followers():
            if str(node.id) in q.followers and str(node.id) not in q.acked:
                transport.send(node, message)

    # --- messages -------------------------------------------------------------------------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # overrides SyncObj's
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == QUIESCE:
            self._txb_on_mark(node, message)
            return
        if kind == QUIESCE_ACK:
            self._txb_on_ack(node, message)
            return
        q = self.txb_quiescence
        if kind == WAKE:
            if q.quiet and patches.raft_state(self) == _LEADER:
                self.txb_wake(WakeReason.FOLLOWER_ASKED)
            return
        if q.quiet:
            if patches.raft_state(self) == _LEADER:
                wakes = leader_wakes_on_message(
                    q,
                    kind,
                    success=bool(message.get("success")),
                    reset=bool(message.get("reset")),
                    next_index=int(message.get("next_node_idx", 0) or 0),
                )
                if wakes:
                    self.txb_wake(WakeReason.FOLLOWER_ASKED)
            elif follower_wakes_on_message(q, kind):
                self.txb_wake(WakeReason.LEADER_MESSAGE)
            else:
                self._txb_refresh_contact()  # a pre-vote is judged on the leader's node heartbeats
        super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]  # SyncObj provides it

    def _txb_refresh_contact(self) -> None:
        leader = patches.raft_leader_node(self)
        if leader is None:
            return
        now = patches.syncobj_clock()
        contact = leader_contact(
            self.txb_quiescence, now, self._txb_heard(str(leader.id), now), self.liveness_timeout_s
        )
        if contact is not None:
            self._txb_follow_node_heartbeat(contact)

    def _txb_on_mark(self, node: Any, message: dict[str, Any]) -> None:
        transport = patches.transport_of(self)
        try:
            mark = QuiesceMark(
                int(message["term"]),
                int(message["last_index"]),
                int(message["last_term"]),
                int(message["commit_index"]),
            )
        except (KeyError, TypeError, ValueError):
            return
        term = int(self.raftCurrentTerm)  # type: ignore[attr-defined]
        leader = patches.raft_leader_node(self)
        sender = str(node.id)
        last_term, last_index = patches.last_log_position(self)
        accepted = (
            self.txb_liveness is not None
            and patches.raft_state(self) == _FOLLOWER
            and follower_accepts_mark(
                sender=sender,
                leader=None if leader is None else str(leader.id),
                term=term,
                last_term=last_term,
                last_index=last_index,
                commit_index=patches.raft_commit_index(self),
                mark=mark,
            )
        )
        if not accepted:
            transport.send(node, {"type": WAKE, "term": term})
            return
        now = patches.syncobj_clock()
        q = self.txb_quiescence
        if q.state is not QuiescenceState.QUIESCENT:
            self.quiesce_count += 1
        accept_mark(q, sender, mark)
        self._txb_set_quiet()
        # The mark comes from the leader in its term: contact, as a heartbeat is.
        self._txb_follow_node_heartbeat(now)
        transport.send(node, {"type": QUIESCE_ACK, "term": mark.term, "last_index": mark.last_index})

    def _txb_on_ack(self, node: Any, message: dict[str, Any]) -> None:
        q = self.txb_quiescence
        if patches.raft_state(self) != _LEADER:
            return
        try:
            term, last_index = int(message["term"]), int(message["last_index"])
        except (KeyError, TypeError, ValueError):
            return
        if str(node.id) in q.followers:
            record_ack(q, str(node.id), term, last_index, q.followers)
        self._txb_set_quiet()

    # --- leases (any thread) --------------------------------------------------------------------

    def quorum_heard_within(self, seconds: float) -> bool:
        q = self._txb_q
        if q is None or not q.quiet or self.txb_liveness is None:
            return bool(super().quorum_heard_within(seconds))  # type: ignore[misc]  # QuorumGuard provides it
        others = list(patches.other_nodes(self))
        if not others:
            return True
        now = patches.syncobj_clock()
        heard = (self._txb_heard(str(n.id), now) for n in others)
        return has_quorum_contact(now, (h if h is not None else float("-inf") for h in heard), len(others) + 1, seconds)

    def txb_responsive(self, seconds: float) -> frozenset[str] | None:
        """A quiet leader's followers whose node was heard within ``seconds``; None when not a quiet leader."""
        q = self._txb_q
        if q is None or not q.quiet or self.txb_liveness is None or patches.raft_state(self) != _LEADER:
            return None
        now = patches.syncobj_clock()
        heard = {str(n.id): self._txb_heard(str(n.id), now) for n in list(patches.other_nodes(self))}
        return frozenset(a for a, h in heard.items() if h is not None and now - h < seconds)

    def leader_heard_within(self, seconds: float) -> bool:
        q = self._txb_q
        leader = patches.raft_leader_node(self)
        if q is None or q.state is not QuiescenceState.QUIESCENT or leader is None or self.txb_liveness is None:
            return bool(super().leader_heard_within(seconds))  # type: ignore[misc]  # QuorumGuard provides it
        now = patches.syncobj_clock()
        heard = self._txb_heard(str(leader.id), now)
        return heard is not None and now - heard < seconds

    def _wake_at(self, when: float) -> None:
        """Hook: make sure the SyncObj is ticked at ``when`` (PySyncObj's clock)."""


def _queued(so: Any) -> int:
    return len(so.__dict__["_SyncObj__commandsQueue"]._FastQueue__queue)
