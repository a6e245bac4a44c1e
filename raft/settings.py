"""Value types of the public API: settings, leadership events, group status."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RaftSettings:
    """Per-node Raft settings, applied to every group of the node.

    ``password`` is the cluster secret: every Raft frame is encrypted and
    authenticated with keys derived from it (``raft.frame_crypto``), so it must
    be non-empty and the same on all nodes.
    """

    password: str
    tick_threads: int = 1
    heartbeat_s: float = 0.1
    election_timeout_min_s: float = 0.8
    election_timeout_max_s: float = 1.6
    # Check quorum (``raft.quorum_guard``): a leader that has not heard from a majority within this
    # steps down and fails the proposals it holds. Below election_timeout_min_s, so a cut-off leader
    # has stepped down before the majority can elect another; above the heartbeat, so one late
    # answer does not depose it.
    check_quorum_s: float = 0.6
    # PySyncObj's own fallback for the same (a backstop; never sooner than check_quorum_s).
    leader_fallback_s: float = 2.5
    connection_timeout_s: float = 30.0
    connection_retry_s: float = 1.0
    # A node link (``raft.links``: the one connection per pair of nodes every group's messages share) whose
    # peer sent nothing, not even its node heartbeat (every heartbeat_s), for this long is closed and
    # re-dialed: a connection left half-open by a network cut.
    link_silence_s: float = 5.0
    log_compaction_min_entries: int = 1000
    log_compaction_min_time_s: float = 600.0
    commands_queue_size: int = 10000
    max_entry_bytes: int = 1 << 20
    # Longest a ticker shard sleeps between full ticks of all its groups when
    # idle (socket events and submissions wake it earlier). It bounds how late
    # election timeouts and heartbeats fire, so keep it well below heartbeat_s.
    tick_interval_s: float = 0.1
    # PySyncObj's logCompactionSplit lets each member compact only in its own
    # slot, 30% of every (log_compaction_min_time_s / members) -- with 600 s that
    # is 60 s out of 600, so under sustained load the in-memory Raft log (every
    # entry since the last compaction) grew by the write rate for up to 9
    # minutes (measured: node RSS 0.4 -> 2.3 GB in 60 s at 40 MB/s). Staggering
    # only pays for expensive full dumps; store-backed groups compact with light
    # snapshots, so compaction follows the entry count alone.
    log_compaction_split: bool = False
    # Longest a leader defers telling followers a new commit index while more
    # AppendEntries are due anyway (``pysyncobj_patches.CoalescedAppendEntries``).
    # Delays followers' apply by at most this; never the leader's commit. 0: never defer.
    commit_notify_delay_s: float = 0.02
    # Pace of a full snapshot sent to a follower that needs one (a new replica of a move, a replaced node), in
    # bytes/s, for its build on the leader and again for its transfer (Kafka's replication throttle): the
    # copy then takes that much less of the node from the groups it serves meanwhile. 0: as fast as it goes.
    snapshot_max_bytes_per_s: int = 0
    # Campaigns (pre-vote rounds and the elections they allow) a ticker shard runs at once (``raft.campaigns``).
    campaign_slots: int = 256
    # Quiescent groups (``raft.quiescence``): a leader with nothing to replicate and every follower caught up
    # for this long stops the group's heartbeats; one heartbeat per pair of nodes (``raft.links``) keeps
    # its followers from campaigning instead. 0: groups never quiesce (and no node heartbeats are sent).
    quiesce_after_s: float = 1.0
    # A quiescent group is ticked this often (journal timers, connection upkeep); its socket events and
    # timers tick it at once, whatever this says.
    quiescent_tick_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.password:
            raise ValueError("RaftSettings.password is required (Raft traffic must be authenticated)")
        if self.tick_threads < 1:
            raise ValueError("tick_threads must be >= 1")
        if not 0 < self.tick_interval_s <= self.heartbeat_s:
            raise ValueError("tick_interval_s must be in (0, heartbeat_s]")
        if not self.heartbeat_s < self.check_quorum_s < self.election_timeout_min_s:
            raise ValueError("check_quorum_s must be in (heartbeat_s, election_timeout_min_s)")
        if self.link_silence_s <= self.check_quorum_s:
            raise ValueError("link_silence_s must be > check_quorum_s")
        if self.leader_fallback_s < self.check_quorum_s:
            raise ValueError("leader_fallback_s must be >= check_quorum_s")
        if not 0 <= self.commit_notify_delay_s <= self.heartbeat_s:
            raise ValueError("commit_notify_delay_s must be in [0, heartbeat_s]")
        if self.campaign_slots < 1:
            raise ValueError("campaign_slots must be >= 1")
        if self.quiesce_after_s < 0 or self.quiescent_tick_s <= 0:
            raise ValueError("quiesce_after_s must be >= 0 (0: never) and quiescent_tick_s > 0")
        if self.snapshot_max_bytes_per_s < 0:
            raise ValueError("snapshot_max_bytes_per_s must be >= 0 (0: unlimited)")


@dataclass(frozen=True, slots=True)
class LeadershipEvent:
    """A change of this node's view of a group's leadership.

    ``is_leader`` is True only once this node is leader *and* the barrier it
    proposed for ``term`` has committed (DESIGN rule 7): only then is its
    applied state complete for the term and safe to serve.
    """

    group_id: str
    is_leader: bool
    leader: str | None
    term: int


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """Point-in-time status of one group on this node (reads may race the ticker)."""

    state: str
    leader: str | None
    term: int
    commit_index: int
    last_applied: int
    has_quorum: bool
    match_index: dict[str, int] = field(default_factory=dict)
    connected: frozenset[str] = frozenset()
    # leader only: followers that answered within check_quorum_s (a TCP connection into a silent
    # network still counts as connected; an answer does not lie)
    responsive: frozenset[str] = frozenset()
    # the configuration as this replica knows it (its own address included when it is a voter)
    voters: frozenset[str] = frozenset()
    # leader only: nodes it replicates to without counting them (``RaftGroup.add_learner``)
    learners: frozenset[str] = frozenset()
