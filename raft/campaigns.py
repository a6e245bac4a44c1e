"""Campaign scheduling: which replica campaigns first, and how many campaigns a node runs at once.

When a node dies, every group it led needs a new leader, and every surviving
replica's election timer runs out within the same ``election_timeout`` window.
Left alone, each survivor campaigns for every one of those groups: the
replicas of a group collide (split votes, another timeout each) and a node
sends thousands of pre-vote and vote rounds in the same few ticks.

* **Successor rank.** A group's replicas campaign in a fixed order: the voters
  after the last leader in the group's preference order (its replica list,
  cyclic), so the followers of a dead leader agree on who goes first, and a
  dead node's leaderships spread over the survivors the way its replica lists
  do. A fresh group (no leader yet) starts from the head of the list: its
  preferred replica. Rank 0 campaigns when its election timer runs out; rank
  ``k`` waits ``k * stagger_s`` more, once per leaderless episode, so it only
  campaigns when the replicas before it could not win. A new group (no
  leader yet) first waits until every peer's replica exists (answers its
  connection), for at most ``NEW_GROUP_WAIT_S``: the nodes of a big topic
  build its groups at their own pace, and a campaign towards a replica not
  built yet only fails.
* **Campaign slots.** A node runs at most ``limit`` campaigns (a pre-vote round
  and the election it allows) at once. A campaign holds its slot until the group
  has a leader (itself or another), its pre-vote fails, or ``hold_s`` passes; a group that finds
  no free slot waits in line and is woken, in order, when one frees up.

Rank and slots only ever delay a campaign; never does a replica campaign
sooner than Raft's own election timer allows, with one exception: a new
group's preferred replica (term 0, no leader ever) campaigns as soon as every
peer's replica answers, as CockroachDB's first replica of a new range does.
There is no leader to disturb, and a topic's partitions get their leaders
about an election timeout sooner. Raft's safety never rests on timers. The pure rules here run on
explicit times; ``CampaignScheduling`` (a SyncObj mixin) applies them.
"""

from __future__ import annotations

import random
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from raft import pysyncobj_patches as patches

#: Campaigns a node (ticker shard) runs at once.
DEFAULT_LIMIT = 256
#: The longest a campaign holds its slot (its rounds went unanswered: the slot goes to the next in line).
DEFAULT_HOLD_S = 0.5
#: How much longer each successor rank waits than the one before it.
DEFAULT_STAGGER_S = 2.0
#: The longest a new group waits for its peers' replicas to exist before campaigning without them.
NEW_GROUP_WAIT_S = 10.0
NEW_GROUP_RECHECK_S = 0.2
_LEADER = 2


def successor_order(preference: Sequence[str], voters: Iterable[str], last_leader: str | None) -> list[str]:
    """The voters other than ``last_leader`` in the order they campaign.

    The voters of ``preference`` from the one after ``last_leader`` on (cyclic; from the head when
    ``last_leader`` is None or not in it), then the voters it does not list, sorted.
    """
    voting = set(voters)
    listed = [a for a in dict.fromkeys(preference) if a in voting]
    if last_leader is not None and last_leader in listed:
        at = listed.index(last_leader)
        listed = listed[at + 1 :] + listed[:at]
    rest = sorted(voting - set(listed) - {last_leader} if last_leader else voting - set(listed))
    return [a for a in listed if a != last_leader] + rest


def successor_rank(preference: Sequence[str], voters: Iterable[str], last_leader: str | None, me: str) -> int:
    """``me``'s place in ``successor_order`` (0: campaigns first); the last place when it is not a voter."""
    order = successor_order(preference, voters, last_leader)
    return order.index(me) if me in order else len(order)


def new_group_may_campaign(age_s: float, connected: int, peers: int, wait_s: float | None = None) -> bool:
    """A new group (no leader, term 0) campaigns once every peer's replica answers its connection (a pre-vote
    to a replica not created yet goes unanswered and costs a slot and an election timeout), or once it
    is ``wait_s`` old (a peer down for good must not keep it leaderless)."""
    return connected >= peers or age_s >= (NEW_GROUP_WAIT_S if wait_s is None else wait_s)


def rank_delay(rank: int, stagger_s: float) -> float:
    """How much longer than Raft's timer a replica of ``rank`` waits before its first campaign of an episode."""
    return max(0, rank) * stagger_s


class CampaignSlots:
    """At most ``limit`` campaigns at once; the others wait in line (one instance per ticker shard).

    ``try_acquire(key, now, wake)`` takes a slot for ``key`` (True), or queues ``key`` and returns
    False; when a slot frees up (``release``, or a holder's ``hold_s`` passing) it is reserved for the
    first in line and its ``wake`` is called, after which its ``try_acquire`` succeeds. Pure
    bookkeeping on explicit times; one thread (the shard's).
    """

    def __init__(self, limit: int = DEFAULT_LIMIT, hold_s: float = DEFAULT_HOLD_S) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self.hold_s = hold_s
        self._held: dict[str, float] = {}  # key -> when its slot expires
        self._next_expiry = float("inf")
        self._line: deque[tuple[str, Callable[[], None]]] = deque()
        self._waiting: set[str] = set()
        #: Campaigns started, campaigns that had to wait, and the most ever in flight at once.
        self.granted = 0
        self.waited = 0
        self.peak = 0

    @property
    def in_flight(self) -> int:
        return len(self._held)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def try_acquire(self, key: str, now: float, wake: Callable[[], None]) -> bool:
        self._expire(now)
        if key in self._held:  # reserved for it when it was woken, or a retry of its own campaign
            self._held[key] = now + self.hold_s
            self._next_expiry = min(self._next_expiry, now + self.hold_s)
            return True
        if len(self._held) < self.limit and not self._line:
            self._grant(key, now)
            return True
        if key not in self._waiting:
            self._waiting.add(key)
            self._line.append((key, wake))
            self.waited += 1
        return False

    def release(self, key: str, now: float) -> None:
        """``key``'s campaign is over (it leads, or follows a leader): its slot goes to the next in line."""
        if self._held.pop(key, None) is not None:
            self._hand_on(now)

    def forget(self, key: str, now: float) -> None:
        """``key`` is gone (its group destroyed): out of the line, its slot freed."""
        if key in self._waiting:
            self._waiting.discard(key)
            self._line = deque(w for w in self._line if w[0] != key)
        self.release(key, now)

    def poll(self, now: float) -> None:
        """Free the slots whose ``hold_s`` has passed for the next in line (cheap when none has: every tick asks)."""
        if now >= self._next_expiry:
            self._expire(now)

    def _expire(self, now: float) -> None:
        expired = [k for k, until in self._held.items() if until <= now]
        for k in expired:
            del self._held[k]
        self._next_expiry = min(self._held.values(), default=float("inf"))
        if expired:
            self._hand_on(now)

    def _grant(self, key: str, now: float) -> None:
        self._held[key] = now + self.hold_s
        self._next_expiry = min(self._next_expiry, now + self.hold_s)
        self.granted += 1
        self.peak = max(self.peak, len(self._held))

    def _hand_on(self, now: float) -> None:
        while self._line and len(self._held) < self.limit:
            key, wake = self._line.popleft()
            self._waiting.discard(key)
            self._grant(key, now)
            wake()


@dataclass(frozen=True, slots=True)
class CampaignStats:
    """A node's campaign counters (summed over its ticker shards)."""

    granted: int = 0
    waited: int = 0
    peak: int = 0
    in_flight: int = 0
    staggered: int = 0


_slots: weakref.WeakKeyDictionary[Any, CampaignSlots] = weakref.WeakKeyDictionary()
_staggered: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()


def slots_for(shard: Any, limit: int = DEFAULT_LIMIT) -> CampaignSlots:
    """The campaign slots of one ticker shard (created on first use, with ``limit`` slots)."""
    slots = _slots.get(shard)
    if slots is None:
        slots = _slots[shard] = CampaignSlots(limit)
    return slots


def stats_for(shards: Iterable[Any]) -> CampaignStats:
    out = CampaignStats()
    for shard in shards:
        s = _slots.get(shard)
        staggered = _staggered.get(shard, [0])[0]
        if s is None:
            out = CampaignStats(out.granted, out.waited, out.peak, out.in_flight, out.staggered + staggered)
            continue
        out = CampaignStats(
            out.granted + s.granted,
            out.waited + s.waited,
            max(out.peak, s.peak),
            out.in_flight + s.in_flight,
            out.staggered + staggered,
        )
    return out


def totals() -> CampaignStats:
    """Campaign counters of every ticker shard of this process (``txbroker_raft_campaigns_*``)."""
    return stats_for(list(_slots.keys()) + [s for s in list(_staggered.keys()) if s not in _slots])


_NO_CONTACT = -1.0


class CampaignScheduling:
    """SyncObj mixin: successor rank and campaign slots (module doc). List it before ``QuorumGuard``.

    ``txb_preference`` is the group's replica list (Raft addresses, preferred first), ``txb_shard``
    the ticker shard whose slots it shares (``txb_campaign_slots`` of them), ``stagger_s`` the delay
    per rank. QuorumGuard asks ``_txb_campaign_hold`` before every pre-vote round. Ticker thread only.
    """

    txb_preference: tuple[str, ...] = ()
    txb_shard: Any = None
    txb_campaign_slots = DEFAULT_LIMIT
    stagger_s = DEFAULT_STAGGER_S
    txb_name = ""
    _txb_last_leader: str | None = None
    _txb_staggered_for: float | None = None
    _txb_slot_contact: float | None = None
    _txb_leader_contact: float | None = None
    _txb_born: float | None = None
    _txb_opened = False

    def _onTick(self, timeToWait: float = 0.0) -> None:  # PySyncObj's names
        leader = patches.raft_leader_node(self)
        if leader is not None and leader is not patches.self_node(self):
            self._txb_last_leader = str(leader.id)
        if not self._txb_opened:
            self._txb_open_new_group(leader)
        super()._onTick(timeToWait)  # type: ignore[misc]  # SyncObj provides it
        if self.txb_shard is None:
            return
        slots, now = slots_for(self.txb_shard, self.txb_campaign_slots), patches.syncobj_clock()
        slots.poll(now)
        contact = self._txb_slot_contact
        if contact is None:
            return
        pre_vote = self._txb_round  # type: ignore[attr-defined]  # QuorumGuard's round in progress
        if (
            patches.raft_state(self) == _LEADER
            or (self._txb_leader_contact or _NO_CONTACT) != contact
            or (pre_vote is not None and pre_vote.lost)
        ):
            self._txb_slot_contact = None  # it leads, follows a leader, or its pre-vote failed: the slot is free
            slots.release(self.txb_name, now)

    def _txb_open_new_group(self, leader: Any) -> None:
        """A new group's preferred replica campaigns as soon as every peer's replica answers, not a timer later."""
        if leader is not None or int(self.raftCurrentTerm) != 0:  # type: ignore[attr-defined]  # SyncObj's
            self._txb_opened = True  # it has had a leader or an election: Raft's timers from here on
            return
        others = patches.other_nodes(self)
        if len(patches.connected_nodes(self)) < len(others):
            return  # not every peer's replica exists yet (``new_group_may_campaign``)
        self._txb_opened = True
        me = str(patches.self_node(self).id)
        voters = self.txb_voters  # type: ignore[attr-defined]  # MembershipLog provides it
        if others and successor_rank(self.txb_preference, voters, None, me) == 0:
            patches.set_election_deadline(self, 0.0)

    def _txb_campaign_hold(self, now: float) -> float:
        """Seconds to wait before this campaign (0: start it now)."""
        contact = self._txb_leader_contact or _NO_CONTACT
        if contact == _NO_CONTACT and int(self.raftCurrentTerm) == 0:  # type: ignore[attr-defined]  # SyncObj's
            if self._txb_born is None:
                self._txb_born = now
            others = patches.other_nodes(self)
            if not new_group_may_campaign(now - self._txb_born, len(patches.connected_nodes(self)), len(others)):
                return NEW_GROUP_RECHECK_S * random.uniform(1.0, 1.5)
        if self._txb_staggered_for != contact:
            self._txb_staggered_for = contact
            me = str(patches.self_node(self).id)
            voters = self.txb_voters  # type: ignore[attr-defined]  # MembershipLog provides it
            rank = successor_rank(self.txb_preference, voters, self._txb_last_leader, me)
            delay = rank_delay(rank, self.stagger_s)
            if delay > 0:
                if self.txb_shard is not None:
                    _staggered.setdefault(self.txb_shard, [0])[0] += 1
                return delay * random.uniform(1.0, 1.25)
        if self.txb_shard is None:
            return 0.0
        slots = slots_for(self.txb_shard, self.txb_campaign_slots)
        if not slots.try_acquire(self.txb_name, now, self._txb_slot_free):
            # Woken when a slot is reserved for it; the timer stays only as a backstop.
            return slots.hold_s * random.uniform(2.0, 3.0)
        self._txb_slot_contact = contact
        return 0.0

    def _txb_slot_free(self) -> None:
        self._txb_slot_contact = self._txb_leader_contact or _NO_CONTACT  # released next tick if it has a leader
        patches.set_election_deadline(self, 0.0)
        self._wake_at(patches.syncobj_clock())

    def _txb_forget_campaign(self) -> None:
        """The group is destroyed: give up its slot and its place in line."""
        if self.txb_shard is not None:
            slots_for(self.txb_shard).forget(self.txb_name, patches.syncobj_clock())

    def _wake_at(self, when: float) -> None:
        """Hook: make sure the SyncObj is ticked at ``when`` (PySyncObj's clock)."""
