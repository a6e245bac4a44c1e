"""Membership changes for PySyncObj: a SyncObj mixin (rules in ``raft.membership``).

PySyncObj (``dynamicMembershipChange``) applies a membership entry when it is
appended (the leader in ``__changeCluster``, a follower on AppendEntries),
undoes it when the entry is truncated, and takes a snapshot's configuration
when it installs one. The mixin closes the gaps that leaves:

* **The log's configuration wins at start.** The constructor's members are
  only the caller's belief; at the first tick (before any election logic) the
  group takes the configuration of its snapshot (or the constructor's, when
  it has none) and applies every membership entry of its journal after it.
  Stock PySyncObj re-applied them only as they were *applied* again, so a
  restarted node ran with its constructor's configuration (counting a removed
  node's vote) until its commit index, stored every few seconds, caught up.
  Replaying entries at apply is switched off: the configuration is already
  the log's, and replaying "add X" after a later "remove X" is already in it
  would resurrect X until the removal is applied again.
* **One uncommitted change at a time.** PySyncObj's own guard never fires (it
  never records the change's index); ``txb_change_pending`` looks at the log
  instead: a membership entry after the commit index.
* **Only voters vote.** Vote and pre-vote messages from a node outside the
  configuration count nothing (the transport also refuses such dialers).
* **A replica that knows it is no voter does not campaign** (a node whose
  removal reached it, or one being added that installed a snapshot taken
  before its addition).
* **Learners** (leader-local, not replicated): nodes the leader replicates to
  (entries and snapshots) beside the voters, tracking their match index but
  counting them neither for commit nor for elections. Adding a learner as a
  voter keeps its connection and progress. PySyncObj's own readonly nodes
  hold them; a readonly node of stock PySyncObj (an anonymous dialer) is
  refused by ``raft.transport``.

``configuration_at`` gives the configuration at a snapshot's index, so a
snapshot never carries an uncommitted change that a new leader may truncate.

Ticker thread only, except ``txb_voters`` / ``txb_learners`` (frozensets,
replaced whole) which any thread may read.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from raft import membership
from raft import pysyncobj_patches as patches
from raft.membership import Change
from raft.quorum_guard import PRE_VOTE, PRE_VOTE_RESPONSE

logger = logging.getLogger(__name__)

_VOTE_MESSAGES = frozenset({"request_vote", "response_vote", PRE_VOTE, PRE_VOTE_RESPONSE})
_LEADER = 2


def snapshot_voters(raft_data: Any) -> frozenset[str]:
    """The voters a snapshot's Raft metadata ``(last entry, previous entry, cluster)`` carries."""
    return frozenset(str(getattr(node, "id", node)) for node in raft_data[2])


class MembershipLog:
    """SyncObj mixin (see module doc). List it first in the bases, before ``QuorumGuard``."""

    txb_voters: frozenset[str] = frozenset()
    txb_learners: frozenset[str] = frozenset()
    txb_member = True
    _txb_snapshot: tuple[int, frozenset[str]] | None = None  # (index, voters) of the snapshot being loaded
    _txb_config_loaded = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._txb_refresh()

    # --- configuration ------------------------------------------------------------------------

    def txb_note_snapshot(self, raft_data: Any) -> None:
        """The deserializer's report of the snapshot it read: ``(last entry, previous entry, cluster)``."""
        self._txb_snapshot = (int(raft_data[0][1]), snapshot_voters(raft_data))

    def _txb_me(self) -> str:
        return str(patches.self_node(self).id)

    def _txb_refresh(self) -> None:
        voters = {str(n.id) for n in patches.other_nodes(self)}
        if self.txb_member:
            voters.add(self._txb_me())
        self.txb_voters = frozenset(voters)
        self.txb_learners = frozenset(str(n.id) for n in patches.readonly_nodes(self))

    def txb_changes_after(self, index: int) -> list[tuple[int, Change]]:
        """The membership entries of the log after ``index``, in log order."""
        log = patches.raft_log(self)
        if len(log) == 0:
            return []
        start = max(0, index + 1 - int(log[0][1]))
        found = []
        for entry in log[start:]:
            change = membership.parse_change(entry[0])
            if change is not None:
                found.append((int(entry[1]), change))
        return found

    def txb_change_pending(self) -> bool:
        """Is a membership entry in the log but not yet committed?"""
        return bool(self.txb_changes_after(patches.raft_commit_index(self)))

    def txb_configuration_at(self, index: int) -> frozenset[str]:
        """The configuration as of log ``index`` (at or after the log's first entry)."""
        return membership.rewind(self.txb_voters, (c for _, c in self.txb_changes_after(index)))

    def _txb_set_configuration(self, voters: frozenset[str]) -> None:
        self._txb_refresh()  # PySyncObj's own snapshot load may have replaced the voters meanwhile
        if voters == self.txb_voters:
            return
        me = self._txb_me()
        before = set(patches.other_nodes(self))
        patches.update_cluster_configuration(self, sorted(voters - {me}))
        for node in before - patches.other_nodes(self):
            self._txb_forget(node)
        self.txb_member = me in voters
        self._txb_refresh()

    def _txb_forget(self, node: Any) -> None:
        patches.connected_nodes(self).discard(node)
        patches.last_response_times(self).pop(node, None)

    def _txb_load_configuration(self) -> None:
        """First tick: the snapshot's configuration, then the journal's changes after it."""
        self._txb_config_loaded = True
        path = self.conf.fullDumpFile  # type: ignore[attr-defined]  # SyncObj provides it
        if patches.take_dump_load_pending(self) and path is not None and os.path.isfile(path):
            patches.load_dump_file(self)  # PySyncObj's own load; ``_SyncObj__loadDumpFile`` below replays
            return
        self._txb_replay_from(self.txb_voters, 0)

    def _txb_replay_from(self, base: frozenset[str], index: int) -> None:
        voters = membership.replay(base, (c for _, c in self.txb_changes_after(index)))
        if voters != self.txb_voters:
            logger.info(
                "raft group %r: configuration from the log: %s (was %s)",
                getattr(self, "txb_name", ""),
                sorted(voters),
                sorted(self.txb_voters),
            )
        self._txb_set_configuration(voters)

    # --- PySyncObj overrides ------------------------------------------------------------------

    def _onTick(self, timeToWait: float = 0.0) -> None:  # PySyncObj's names
        if not self._txb_config_loaded:
            self._txb_load_configuration()
        if not self.txb_member and patches.raft_state(self) != _LEADER:
            # No voter: never campaign (nor ask for pre-votes).
            patches.set_election_deadline(self, patches.syncobj_clock() + patches.random_election_timeout(self))
        super()._onTick(timeToWait)  # type: ignore[misc]  # SyncObj provides it

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:  # overrides SyncObj's
        self._txb_snapshot = None
        super()._SyncObj__loadDumpFile(clearJournal)  # type: ignore[misc]  # SyncObj provides it
        loaded, self._txb_snapshot = self._txb_snapshot, None
        if loaded is not None:  # else the deserializer failed (and reported it)
            index, voters = loaded
            self._txb_replay_from(voters, index)

    def _SyncObj__changeCluster(self, request: Any) -> bool:  # overrides SyncObj's (leader, at append)
        noop = patches.leader_noop_index(self)
        if noop is None or patches.raft_last_applied(self) < noop or self.txb_change_pending():
            return False
        changed: bool = self._SyncObj__doChangeCluster(request)
        return changed

    def _SyncObj__doChangeCluster(self, request: Any, reverse: bool = False) -> bool:  # overrides SyncObj's
        op, address = request[0], str(request[1])
        adding = (op == membership.ADD) != reverse
        learner = None
        progress: tuple[int | None, int | None] = (None, None)
        if adding:
            learner = next((n for n in patches.readonly_nodes(self) if str(n.id) == address), None)
            if learner is not None:  # a learner becomes a voter: keep its connection and progress
                patches.readonly_nodes(self).discard(learner)
                progress = (patches.raft_next_index(self).get(learner), patches.raft_match_index(self).get(learner))
        before = set(patches.other_nodes(self))
        changed: bool = super()._SyncObj__doChangeCluster(request, reverse)  # type: ignore[misc]
        if learner is not None:
            if not changed:
                patches.readonly_nodes(self).add(learner)
            else:
                next_index, match_index = progress
                if next_index is not None and match_index is not None:
                    patches.raft_next_index(self)[learner] = next_index
                    patches.raft_match_index(self)[learner] = match_index
        if address == self._txb_me() and op in (membership.ADD, membership.REMOVE):
            self.txb_member = adding
        for node in before - patches.other_nodes(self):
            self._txb_forget(node)
        self._txb_refresh()
        return changed

    def _SyncObj__doApplyCommand(self, command: Any) -> Any:  # overrides SyncObj's
        if membership.parse_change(command) is not None:
            return None  # in effect since it was appended (or loaded)
        return super()._SyncObj__doApplyCommand(command)  # type: ignore[misc]  # SyncObj provides it

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # overrides SyncObj's
        kind = message.get("type") if isinstance(message, dict) else None
        if kind in _VOTE_MESSAGES and node not in patches.other_nodes(self):
            return
        super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]  # SyncObj provides it

    # --- learners (leader) --------------------------------------------------------------------

    def txb_add_learner(self, address: str) -> bool:
        """Replicate to ``address`` without counting it; False if it is a voter or learner already."""
        node = patches.new_node(self, address)
        if address in self.txb_voters or node in patches.readonly_nodes(self):
            return False
        patches.readonly_nodes(self).add(node)
        patches.raft_next_index(self)[node] = patches.last_log_position(self)[1] + 1
        patches.raft_match_index(self)[node] = 0
        patches.transport_of(self).addNode(node)
        self._txb_refresh()
        return True

    def txb_remove_learner(self, address: str) -> bool:
        """Stop replicating to learner ``address``; False if it is none."""
        node = next((n for n in patches.readonly_nodes(self) if str(n.id) == address), None)
        if node is None:
            return False
        patches.readonly_nodes(self).discard(node)
        patches.transport_of(self).dropNode(node)
        patches.raft_next_index(self).pop(node, None)
        patches.raft_match_index(self).pop(node, None)
        self._txb_forget(node)
        self._txb_refresh()
        return True
