"""Pre-vote and check quorum for PySyncObj: a SyncObj mixin (rules in ``raft.election_rules``).

* **Pre-vote.** When a follower's (or candidate's) election deadline passes,
  PySyncObj would raise its term and campaign at once. The mixin intercepts
  the tick before that: it pushes the deadline back and asks every peer
  ``txb_pre_vote`` for ``term + 1`` instead. Only when a majority answers yes
  does it let PySyncObj campaign (the deadline is set in the past and a tick
  requested). A node cut off from its peers therefore never raises its term,
  and on heal it follows the majority's leader instead of deposing it. A
  campaign asked for by the leader (``TimeoutNow``, leadership transfer) skips
  the pre-vote, as in etcd.
* **Snapshot answers.** A follower answers every snapshot message of its
  leader (PySyncObj's answers only the install), so a follower that waits for
  a snapshot, or receives one, counts as heard for the leader's check quorum.
* **Check quorum.** A leader that has not heard from a majority (itself
  included) within ``check_quorum_s`` steps down. ``RaftSettings`` keeps that
  window below the minimum election timeout, so a deposed leader has stepped
  down before a new leader can be elected without it. The check is skipped on
  a tick that comes late (the ticker thread itself stalled): the answers are
  then still waiting in the sockets, unread, and judging on them would depose
  a healthy leader. PySyncObj's own ``leaderFallbackTimeout`` stays as a
  longer backstop. Every proposal the old leader still holds fails at once
  with ``LEADERSHIP_LOST`` (outcome unknown: the entry may still commit under
  the next leader, so callers retry idempotently) instead of waiting for an
  apply that cannot happen while the node is cut off. When the step-down came
  from a newer term instead (a vote request, a new leader's AppendEntries), the
  held entries usually commit or are discarded within a round trip; they get
  ``lease_s`` to settle before they are failed.

Ticker thread only (the tick and message handlers run there).
"""

from __future__ import annotations

import logging
from typing import Any

from raft import pysyncobj_patches as patches
from raft.election_rules import LogPosition, PreVoteRound, grant_pre_vote, has_quorum_contact

logger = logging.getLogger(__name__)

PRE_VOTE = "txb_pre_vote"
PRE_VOTE_RESPONSE = "txb_pre_vote_response"
#: The fail code held proposals get on step-down, beside PySyncObj's ``FAIL_REASON`` values (0-7).
LEADERSHIP_LOST = 100
_LEADER = 2


class QuorumGuard:
    """SyncObj mixin: pre-vote before every campaign, held proposals failed on step-down.

    List it first in the bases (before ``SyncObj`` and the other mixins). ``lease_s`` is the
    follower lease (the minimum election timeout): a follower that heard from its leader more
    recently refuses pre-votes.
    """

    lease_s = 0.8
    check_quorum_s = 0.6
    txb_name = ""
    _txb_last_tick: float | None = None
    _txb_round: PreVoteRound | None = None
    _txb_campaign = False
    _txb_leader_contact: float | None = None
    _txb_was_leader = False
    _txb_fail_held_at: float | None = None
    #: Counters (read by tests and status): pre-vote rounds started, campaigns they allowed,
    #: proposals failed on step-down.
    pre_vote_rounds = 0
    pre_vote_campaigns = 0
    failed_on_step_down = 0
    quorum_step_downs = 0

    # --- tick --------------------------------------------------------------------------------

    def _onTick(self, timeToWait: float = 0.0) -> None:  # PySyncObj's names
        now = patches.syncobj_clock()
        previous, self._txb_last_tick = self._txb_last_tick, now
        on_time = previous is not None and now - previous < self.check_quorum_s / 2
        self._txb_settle_leadership()
        self._txb_gate_campaign()
        super()._onTick(timeToWait)  # type: ignore[misc]  # SyncObj provides it
        if on_time:
            self._txb_check_quorum()
        self._txb_settle_leadership()

    def _txb_check_quorum(self) -> None:
        if patches.raft_state(self) != _LEADER or self.quorum_heard_within(self.check_quorum_s):
            return
        now = patches.syncobj_clock()
        logger.warning(
            "raft group %r: no majority heard within %.2fs: stepping down (term %s)",
            self.txb_name,
            self.check_quorum_s,
            self.raftCurrentTerm,  # type: ignore[attr-defined]  # SyncObj provides it
        )
        patches.step_down(self)
        self.quorum_step_downs += 1
        self._txb_fail_held_at = now  # cut off: nothing it holds can commit before the heal

    def _txb_gate_campaign(self) -> None:
        if patches.raft_state(self) == _LEADER or not patches.has_self_node(self):
            return
        now = patches.syncobj_clock()
        if patches.election_deadline(self) >= now:
            return
        others = patches.other_nodes(self)
        if not others or not patches.connected_nodes(self):
            return  # a single-node group wins alone; unconnected, PySyncObj does not campaign either
        if patches.transfer_in_progress(self):
            return  # the leader asked for this campaign (TimeoutNow)
        if self._txb_campaign:
            self._txb_campaign = False  # a majority said yes: PySyncObj campaigns in this tick
            self.pre_vote_campaigns += 1
            return
        hold = self._txb_campaign_hold(now)  # successor rank and campaign slots (``raft.campaigns``)
        if hold > 0:
            patches.set_election_deadline(self, now + hold)
            self._wake_at(now + hold)
            return
        patches.set_election_deadline(self, now + patches.random_election_timeout(self))
        term = int(self.raftCurrentTerm) + 1  # type: ignore[attr-defined]  # SyncObj provides it
        self._txb_round = PreVoteRound(term=term, cluster_size=len(others) + 1, started=now)
        self.pre_vote_rounds += 1
        last_term, last_index = patches.last_log_position(self)
        message = {"type": PRE_VOTE, "term": term, "last_log_term": last_term, "last_log_index": last_index}
        transport = patches.transport_of(self)
        for node in others:
            transport.send(node, message)

    def _txb_settle_leadership(self) -> None:
        leader_now = patches.raft_state(self) == _LEADER
        now = patches.syncobj_clock()
        if self._txb_was_leader and not leader_now and self._txb_fail_held_at is None:
            # Deposed by a newer term (a vote request or a new leader's AppendEntries): the new
            # leader usually settles what this node held within a round trip; give it the lease.
            self._txb_fail_held_at = now + self.lease_s
        self._txb_was_leader = leader_now
        if leader_now:
            self._txb_fail_held_at = None
        elif self._txb_fail_held_at is not None and now >= self._txb_fail_held_at:
            self._txb_fail_held_at = None
            self._txb_fail_held()

    def _txb_fail_held(self) -> None:
        held = patches.take_commands_waiting_commit(self)
        for _index, callback in held:
            try:
                callback(None, LEADERSHIP_LOST)
            except Exception:
                logger.exception("callback of a proposal failed on step-down raised")
        self.failed_on_step_down += len(held)

    # --- messages ----------------------------------------------------------------------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # overrides SyncObj's
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == PRE_VOTE:
            self._txb_on_pre_vote(node, message)
            return
        if kind == PRE_VOTE_RESPONSE:
            self._txb_on_pre_vote_response(node, message)
            return
        current = kind == "append_entries" and message.get("term", -1) >= self.raftCurrentTerm  # type: ignore[attr-defined]
        if current:
            self._txb_leader_contact = patches.syncobj_clock()
            self._txb_campaign = False
            self._txb_round = None
        super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]  # SyncObj provides it
        if current and "serialized" in message:
            self._txb_ack_snapshot_message(node)

    def _txb_ack_snapshot_message(self, node: Any) -> None:
        """Answer a leader's snapshot message (a chunk, or "not built yet") so it counts this follower as heard.

        PySyncObj's follower answers a snapshot only once it is installed: for a large one, the leader's
        build and the transfer take many election timeouts, the follower stays silent meanwhile, and the
        leader's check quorum rests on its other followers alone. The answer changes nothing on the leader
        but the follower's last response time (``next_node_idx`` with neither ``reset`` nor ``success``).
        """
        _term, last_index = patches.last_log_position(self)
        answer = {"type": "next_node_idx", "next_node_idx": last_index + 1, "reset": False, "success": False}
        patches.transport_of(self).send(node, answer)

    def _txb_on_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        try:
            request_term = int(message["term"])
            candidate = LogPosition(int(message["last_log_term"]), int(message["last_log_index"]))
        except (KeyError, TypeError, ValueError):
            return
        last_term, last_index = patches.last_log_position(self)
        granted = grant_pre_vote(
            now=patches.syncobj_clock(),
            my_term=int(self.raftCurrentTerm),  # type: ignore[attr-defined]
            i_am_leader=patches.raft_state(self) == _LEADER,
            last_leader_contact=self._txb_leader_contact,
            lease_s=self.lease_s,
            mine=LogPosition(last_term, last_index),
            request_term=request_term,
            candidate=candidate,
        )
        patches.transport_of(self).send(node, {"type": PRE_VOTE_RESPONSE, "term": request_term, "granted": granted})

    def _txb_on_pre_vote_response(self, node: Any, message: dict[str, Any]) -> None:
        current = self._txb_round
        if current is None or patches.raft_state(self) == _LEADER:
            return
        if not current.answer(str(node.id), int(message.get("term", -1)), bool(message.get("granted"))):
            return
        self._txb_round = None
        self._txb_campaign = True
        now = patches.syncobj_clock()
        patches.set_election_deadline(self, 0.0)
        self._wake_at(now)

    def _txb_campaign_hold(self, now: float) -> float:
        """Hook: seconds to wait before starting a campaign (0: now); ``raft.campaigns`` decides."""
        return 0.0

    def quorum_heard_within(self, seconds: float) -> bool:
        """As a leader: did a majority (itself included) answer within ``seconds``? (any thread)

        The lease a leader read needs: a leader that was paused or cut off may not yet have run the
        tick that deposes it, but its majority has not answered for that long."""
        others = patches.other_nodes(self)
        if not others:
            return True
        try:
            answered = dict(patches.last_response_times(self))
        except RuntimeError:  # resized by the ticker while copied: no verdict, no lease
            return False
        now = patches.syncobj_clock()
        last = (answered.get(node, float("-inf")) for node in others)
        return has_quorum_contact(now, last, len(others) + 1, seconds)

    def leader_heard_within(self, seconds: float) -> bool:
        """As a follower: did the leader's AppendEntries arrive within ``seconds``? (any thread)"""
        contact = self._txb_leader_contact
        return contact is not None and patches.syncobj_clock() - contact < seconds

    def _wake_at(self, when: float) -> None:
        """Hook: make sure the SyncObj is ticked at ``when`` (PySyncObj's clock)."""
