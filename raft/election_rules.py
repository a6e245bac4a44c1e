"""Pure rules of pre-vote and check-quorum (etcd's ``PreVote`` and ``CheckQuorum``), on explicit times.

PySyncObj has neither. Without them a node that is alive but cut off from its
peers hurts the majority twice:

* **As a leader** it keeps the requests it holds until their callers time out,
  because nothing it proposes can commit. *Check quorum*: a leader that has not
  heard from a majority (itself included) within ``check_quorum_s`` steps down,
  and the group fails every proposal it held (``raft.quorum_guard``).
* **As a follower** it raises its term with every failed election while cut
  off, and on heal that higher term deposes the majority's leader: a second
  leader change per fault. *Pre-vote*: before raising its term a node asks its
  peers whether they would vote for it at ``term + 1``; only a majority of yes
  lets it campaign. A peer says yes only when it has not heard from a leader
  within the lease (``election_timeout_min``) and the candidate's log is at
  least as up to date as its own, so a node the majority still follows never
  campaigns at all.

A pre-vote changes no state on the peer that answers it (no term, no vote):
it is a question, not a ballot. Every function here is deterministic; the
callers pass the clock's reading.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, order=True)
class LogPosition:
    """The term and index of a log's last entry; ordered as Raft compares logs (term first)."""

    term: int
    index: int


def log_up_to_date(candidate: LogPosition, mine: LogPosition) -> bool:
    """Raft's election restriction: the candidate's log is at least as up to date as ``mine``."""
    return candidate >= mine


def in_leader_lease(now: float, last_leader_contact: float | None, lease_s: float) -> bool:
    """True while a follower heard from its leader less than ``lease_s`` ago."""
    return last_leader_contact is not None and now - last_leader_contact < lease_s


def grant_pre_vote(
    *,
    now: float,
    my_term: int,
    i_am_leader: bool,
    last_leader_contact: float | None,
    lease_s: float,
    mine: LogPosition,
    request_term: int,
    candidate: LogPosition,
) -> bool:
    """Would this node vote for a candidate that campaigns at ``request_term``?

    No while this node leads (check quorum deposes a leader that lost its
    majority) or follows a leader it heard from within the lease; no for a term
    not above its own; no for a log behind its own.
    """
    if i_am_leader or in_leader_lease(now, last_leader_contact, lease_s):
        return False
    if request_term <= my_term:
        return False
    return log_up_to_date(candidate, mine)


def majority(cluster_size: int) -> int:
    """Votes (or contacts) needed in a group of ``cluster_size`` voters."""
    return cluster_size // 2 + 1


def has_quorum_contact(now: float, last_responses: Iterable[float], cluster_size: int, window_s: float) -> bool:
    """A leader's check: itself plus the peers that answered within ``window_s`` form a majority."""
    recent = 1 + sum(1 for t in last_responses if now - t < window_s)
    return recent >= majority(cluster_size)


@dataclass(slots=True)
class PreVoteRound:
    """One pre-vote round of a node that would campaign at ``term``.

    Counts the yes answers (its own included) for this round's term only; a
    late answer to an earlier round, or a repeated one, counts nothing.
    """

    term: int
    cluster_size: int
    started: float
    granted: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)

    def answer(self, node: str, term: int, granted: bool) -> bool:
        """Record ``node``'s answer; True once the yes answers are a majority."""
        if term != self.term or node in self.granted or node in self.refused:
            return self.won
        (self.granted if granted else self.refused).add(node)
        return self.won

    @property
    def won(self) -> bool:
        return 1 + len(self.granted) >= majority(self.cluster_size)

    @property
    def lost(self) -> bool:
        """No majority is possible any more in this round."""
        return len(self.refused) > self.cluster_size - majority(self.cluster_size)
