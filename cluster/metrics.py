"""Every Prometheus metric a node exports, defined in one place.

Conventions (reference/http_metrics_ops.md §2): one ``txbroker_`` prefix, base
units (seconds, bytes), ``_total`` counters, bounded labels only (topic,
partition, group, route template, outcome, role, kind) -- never producer ids,
transactional ids, offsets or client addresses. ``_created`` series are
disabled. Each node has its own registry (several nodes may share a process in
tests). docs/metrics.md documents every name; the dashboards and alert rules
in ops/ are checked against ``exported_series_names()`` by the tests.

Three kinds of metrics live here:

- instrumented counters/histograms, incremented where the event happens
  (broker, HTTP middleware; transactions and groups through the helper
  methods of ``NodeMetrics``);
- scrape-time gauges computed from the node's live state by ``NodeCollector``
  (partitions, Raft, controller), so they are never stale;
- scrape-time gauges of the transaction and group coordinators, emitted only
  once a coordinator registered its source (``set_transaction_source``,
  ``set_group_source``): a node without the feature exports nothing rather
  than made-up zeros.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import platform
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raft import campaigns, ticker, traffic
from raft.campaigns import CampaignStats
from raft.links import LinkStats
from raft.traffic import Traffic

disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus-client is partly untyped

VERSION = "0.1.0"
PREFIX = "txbroker"

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
_LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_TXN_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
LOOP_LAG_INTERVAL_S = 0.25


class TxnOutcome(enum.StrEnum):
    """How a transaction ended (label ``outcome`` of the transaction metrics)."""

    COMMITTED = "committed"
    ABORTED = "aborted"  # by the producer (EndTxn commit=false) or an admin abort
    TIMED_OUT = "timed_out"  # aborted by the coordinator after transaction_timeout_ms
    FENCED = "fenced"  # aborted because a newer producer epoch took over the transactional id


class CoordinatorKind(enum.StrEnum):
    TRANSACTION = "transaction"
    GROUP = "group"


# ---- samples the node and the coordinators hand to the collector -----------------------


@dataclass(frozen=True, slots=True)
class PartitionSample:
    """What the collector needs to know about one local replica."""

    topic: str
    partition: int
    is_leader: bool
    term: int
    commit_index: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    size_bytes: int
    under_replicated: bool
    follower_lag_entries: int  # max over followers (leader only), Raft entries


@dataclass(frozen=True, slots=True)
class GroupRaftSample:
    """Raft state of one internal group replica (a transaction-state or consumer-offsets partition)."""

    topic: str
    partition: int
    is_leader: bool
    term: int
    commit_index: int


@dataclass(frozen=True, slots=True)
class NodeSample:
    controller_is_leader: bool
    controller_term: int
    controller_commit_index: int
    nodes_up: int
    nodes_down: int
    unavailable_partitions: dict[str, int]  # topic -> partitions without a known leader (seen here)
    partitions: list[PartitionSample]
    internal: list[GroupRaftSample] = field(default_factory=list)
    raft_quiescent_groups: int = 0  # Raft group replicas of this node that are quiescent (raft.quiescence)
    raft_links: LinkStats = field(default_factory=LinkStats)  # the node links' counters (raft.links)


@dataclass(frozen=True, slots=True)
class TransactionSample:
    """State of the transaction coordinator on this node, read at scrape time."""

    open: int  # transactions this node coordinates that are not complete (Ongoing or Prepare*)
    oldest_open_start_ms: int | None  # start time (epoch ms) of the oldest of them
    max_timeout_ms: int  # the largest transaction timeout a producer may ask for
    coordinator_partitions: int  # transaction-state partitions this node coordinates now


@dataclass(frozen=True, slots=True)
class GroupSample:
    """One consumer group coordinated by this node.

    ``committed`` and ``partition_lag`` hold only the per-partition series within the node's
    budget (``metrics_max_lag_series``); ``lag`` and ``lag_sum`` always cover every partition.
    """

    group: str
    members: int
    committed: Mapping[tuple[str, int], int]  # (topic, partition) -> committed offset
    lag: Mapping[str, int]  # topic -> sum over committed partitions of (high watermark - committed)
    partition_lag: Mapping[tuple[str, int], int] = field(default_factory=dict)
    lag_sum: int = 0

    @property
    def series(self) -> int:
        """Per-partition series this sample exports (what counts against the budget)."""
        return len(self.committed)

    @classmethod
    def from_offsets(
        cls,
        group: str,
        members: int,
        committed: Mapping[tuple[str, int], int],
        high_watermark: Callable[[str, int], int | None],
        *,
        max_series: int | None = None,
    ) -> GroupSample:
        """Lag per partition, topic and group from committed offsets; partitions whose high watermark is
        unknown are skipped (no lag, not zero lag). At most ``max_series`` partitions (in topic, partition
        order) get per-partition series."""
        lag: dict[str, int] = {}
        kept: dict[tuple[str, int], int] = {}
        partition_lag: dict[tuple[str, int], int] = {}
        budget = len(committed) if max_series is None else max(0, max_series)
        for (topic, partition), offset in sorted(committed.items()):
            hw = high_watermark(topic, partition)
            keep = len(kept) < budget
            if keep:
                kept[(topic, partition)] = offset
            if hw is not None and hw >= 0:
                behind = max(0, hw - offset)
                lag[topic] = lag.get(topic, 0) + behind
                if keep:
                    partition_lag[(topic, partition)] = behind
        return cls(group, members, kept, lag, partition_lag, sum(lag.values()))


@dataclass(frozen=True, slots=True)
class GroupCoordinatorSample:
    coordinator_partitions: int  # group-state partitions this node coordinates now
    groups: list[GroupSample] = field(default_factory=list)


# ---- the scrape-time families -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    doc: str
    labels: tuple[str, ...] = ()

    def family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PREFIX}_{self.name}", self.doc, labels=list(self.labels))


_TP = ("topic", "partition")
NODE_GAUGES = {
    s.name: s
    for s in (
        _Spec("controller_is_leader", "1 if this node is the controller leader"),
        _Spec("cluster_nodes", "Nodes as seen from this node (peer polling)", ("state",)),
        _Spec("partitions", "Local partition replicas by role", ("role",)),
        _Spec("partitions_under_replicated", "Partitions led here with a follower disconnected or behind", ("topic",)),
        _Spec("partitions_unavailable", "Local replicas whose partition has no known leader", ("topic",)),
        _Spec("partition_high_watermark", "High watermark of the local replica", _TP),
        _Spec("partition_last_stable_offset", "Last stable offset of the local replica", _TP),
        _Spec("partition_log_start_offset", "Log start offset of the local replica", _TP),
        _Spec("partition_unstable_records", "High watermark minus LSO (hidden from read_committed)", _TP),
        _Spec("partition_log_size_bytes", "Stored batch bytes of the local replica", _TP),
        _Spec("raft_is_leader", "1 if this node leads the partition's Raft group", _TP),
        _Spec(
            "raft_quiescent_groups",
            "Raft group replicas of this node that are quiescent: no per-group heartbeats, kept by node heartbeats",
        ),
        _Spec("raft_links_up", "Node links (one Raft connection per peer node and ticker shard) that are up"),
        _Spec("raft_term", "Raft term of the group on this node (topic __controller: the controller)", _TP),
        _Spec("raft_commit_index", "Raft commit index of the group on this node", _TP),
        _Spec("raft_follower_lag_entries", "Max Raft entries a follower is behind (reported by the leader)", _TP),
        _Spec("python_threads", "Live Python threads of the node process (Raft tickers, executors)"),
    )
}
TXN_GAUGES = {
    s.name: s
    for s in (
        _Spec("transactions_open", "Transactions coordinated here that are not complete"),
        _Spec("transaction_oldest_open_age_seconds", "Age of the oldest incomplete transaction coordinated here"),
        _Spec("transaction_max_timeout_seconds", "Largest transaction timeout a producer may request"),
    )
}
GROUP_GAUGES = {
    s.name: s
    for s in (
        _Spec("consumer_group_members", "Members of a consumer group coordinated here", ("group",)),
        _Spec(
            "consumer_group_committed_offset",
            "Committed offset of a group (coordinated here) for a partition",
            ("group", "topic", "partition"),
        ),
        _Spec(
            "consumer_group_lag_records",
            "Records between a group's committed offsets and the high watermarks, per topic",
            ("group", "topic"),
        ),
        _Spec(
            "consumer_group_lag",
            "High watermark minus the group's committed offset, per partition (bounded: metrics_max_lag_series)",
            ("group", "topic", "partition"),
        ),
        _Spec("consumer_group_total_lag", "Sum of a group's lag over every committed partition", ("group",)),
    )
}
COORDINATOR_GAUGE = _Spec("coordinator_partitions", "Coordinator partitions this node currently leads", ("kind",))


class NodeCollector(Collector):
    """Scrape-time gauges: node/partition/Raft state and, when registered, the coordinators'."""

    def __init__(self) -> None:
        self.node: Callable[[], NodeSample] | None = None
        self.transactions: Callable[[], TransactionSample] | None = None
        self.groups: Callable[[], GroupCoordinatorSample] | None = None

    def describe(self) -> Iterable[Metric]:
        specs = [*NODE_GAUGES.values(), *TXN_GAUGES.values(), *GROUP_GAUGES.values(), COORDINATOR_GAUGE]
        return [
            *(s.family() for s in specs),
            *_raft_counter_families(Traffic(), 0, CampaignStats()),
            *_link_families(LinkStats()),
        ]

    def collect(self) -> Iterator[Metric]:
        threads = NODE_GAUGES["python_threads"].family()
        threads.add_metric([], threading.active_count())
        yield threads
        yield from _raft_counter_families(traffic.totals(), ticker.slow_steps(), campaigns.totals())
        if self.node is not None:
            yield from _node_families(self.node())
        coord = COORDINATOR_GAUGE.family()
        if self.transactions is not None:
            t = self.transactions()
            fams = {k: s.family() for k, s in TXN_GAUGES.items()}
            fams["transactions_open"].add_metric([], t.open)
            age = 0.0 if t.oldest_open_start_ms is None else max(0.0, time.time() - t.oldest_open_start_ms / 1000)
            fams["transaction_oldest_open_age_seconds"].add_metric([], age)
            fams["transaction_max_timeout_seconds"].add_metric([], t.max_timeout_ms / 1000)
            coord.add_metric([CoordinatorKind.TRANSACTION.value], t.coordinator_partitions)
            yield from fams.values()
        if self.groups is not None:
            g = self.groups()
            fams = {k: s.family() for k, s in GROUP_GAUGES.items()}
            for grp in sorted(g.groups, key=lambda x: x.group):
                fams["consumer_group_members"].add_metric([grp.group], grp.members)
                for (topic, partition), offset in sorted(grp.committed.items()):
                    fams["consumer_group_committed_offset"].add_metric([grp.group, topic, str(partition)], offset)
                for topic, lag in sorted(grp.lag.items()):
                    fams["consumer_group_lag_records"].add_metric([grp.group, topic], lag)
                for (topic, partition), lag in sorted(grp.partition_lag.items()):
                    fams["consumer_group_lag"].add_metric([grp.group, topic, str(partition)], lag)
                fams["consumer_group_total_lag"].add_metric([grp.group], grp.lag_sum)
            coord.add_metric([CoordinatorKind.GROUP.value], g.coordinator_partitions)
            yield from fams.values()
        if self.transactions is not None or self.groups is not None:
            yield coord


RAFT_COUNTERS = {
    "raft_messages_sent": "Raft frames this node sent to its peers, all groups (AppendEntries, acks, votes)",
    "raft_message_bytes_sent": "Bytes of the Raft frames this node sent (sealed, as on the wire)",
    "raft_messages_received": "Authenticated Raft frames this node received from its peers, all groups",
    "raft_message_bytes_received": "Bytes of the authenticated Raft frames this node received (opened)",
    "raft_ticker_stalls": "Raft ticker steps that took 0.5 s or more; each held up every Raft group of its ticker",
    "raft_campaigns": "Campaigns (pre-vote rounds) this node's groups started, each in one of its campaign slots",
    "raft_campaigns_waited": "Campaigns that found every campaign slot taken and waited in line for one",
    "raft_campaigns_staggered": "Campaigns a follower put off by its successor rank (another replica goes first)",
}
RAFT_CAMPAIGN_PEAK = "raft_campaigns_in_flight_peak"


def _raft_counter_families(t: Traffic, stalls: int, c: CampaignStats) -> Iterator[Metric]:
    values = {
        "raft_messages_sent": t.frames_sent,
        "raft_message_bytes_sent": t.bytes_sent,
        "raft_messages_received": t.frames_received,
        "raft_message_bytes_received": t.bytes_received,
        "raft_ticker_stalls": stalls,
        "raft_campaigns": c.granted,
        "raft_campaigns_waited": c.waited,
        "raft_campaigns_staggered": c.staggered,
    }
    for name, doc in RAFT_COUNTERS.items():
        fam = CounterMetricFamily(f"{PREFIX}_{name}", doc)
        fam.add_metric([], values[name])
        yield fam
    peak = GaugeMetricFamily(
        f"{PREFIX}_{RAFT_CAMPAIGN_PEAK}", "The most campaigns this node ever ran at once (bounded by its slots)"
    )
    peak.add_metric([], c.peak)
    yield peak


def _node_families(s: NodeSample) -> Iterator[Metric]:
    f = {k: spec.family() for k, spec in NODE_GAUGES.items() if k != "python_threads"}
    f["controller_is_leader"].add_metric([], int(s.controller_is_leader))
    f["raft_quiescent_groups"].add_metric([], s.raft_quiescent_groups)
    f["raft_links_up"].add_metric([], s.raft_links.links_up)
    f["cluster_nodes"].add_metric(["up"], s.nodes_up)
    f["cluster_nodes"].add_metric(["down"], s.nodes_down)
    leaders = sum(1 for p in s.partitions if p.is_leader)
    f["partitions"].add_metric(["leader"], leaders)
    f["partitions"].add_metric(["follower"], len(s.partitions) - leaders)
    per_topic_under: dict[str, int] = {}
    for p in s.partitions:
        if p.is_leader:
            per_topic_under[p.topic] = per_topic_under.get(p.topic, 0) + int(p.under_replicated)
    for topic, n in sorted(per_topic_under.items()):
        f["partitions_under_replicated"].add_metric([topic], n)
    for topic in sorted({p.topic for p in s.partitions} | set(s.unavailable_partitions)):
        f["partitions_unavailable"].add_metric([topic], s.unavailable_partitions.get(topic, 0))
    for p in s.partitions:
        lv = [p.topic, str(p.partition)]
        f["partition_high_watermark"].add_metric(lv, p.high_watermark)
        f["partition_last_stable_offset"].add_metric(lv, p.last_stable_offset)
        f["partition_log_start_offset"].add_metric(lv, p.log_start_offset)
        f["partition_unstable_records"].add_metric(lv, max(0, p.high_watermark - p.last_stable_offset))
        f["partition_log_size_bytes"].add_metric(lv, p.size_bytes)
        f["raft_is_leader"].add_metric(lv, int(p.is_leader))
        f["raft_term"].add_metric(lv, p.term)
        f["raft_commit_index"].add_metric(lv, p.commit_index)
        if p.is_leader:
            f["raft_follower_lag_entries"].add_metric(lv, p.follower_lag_entries)
    for g in s.internal:
        lv = [g.topic, str(g.partition)]
        f["raft_is_leader"].add_metric(lv, int(g.is_leader))
        f["raft_term"].add_metric(lv, g.term)
        f["raft_commit_index"].add_metric(lv, g.commit_index)
    ctl = ["__controller", "0"]
    f["raft_is_leader"].add_metric(ctl, int(s.controller_is_leader))
    f["raft_term"].add_metric(ctl, s.controller_term)
    f["raft_commit_index"].add_metric(ctl, s.controller_commit_index)
    yield from f.values()
    yield from _link_families(s.raft_links)


LINK_DROP_REASONS = {
    "unknown_group": "dropped_unknown_group",
    "not_member": "dropped_not_member",
    "backpressure": "dropped_backpressure",
}


def _link_families(links: LinkStats) -> Iterator[Metric]:
    dropped = CounterMetricFamily(
        f"{PREFIX}_raft_link_messages_dropped",
        "Raft messages a node link dropped: for a group this node does not host (unknown_group), from a node "
        "that is not a member of the group (not_member), or not sent while the link's queue was full "
        "(backpressure; heartbeats and plain AppendEntries only, which Raft sends again)",
        labels=["reason"],
    )
    for reason, attr in LINK_DROP_REASONS.items():
        dropped.add_metric([reason], getattr(links, attr))
    yield dropped


# ---- the node's metric objects ------------------------------------------------------------


class KafkaMetrics:
    """The Kafka listener's metrics (``cluster.kafka.server``): requests per API key and version."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            f"{PREFIX}_kafka_requests",
            "Kafka protocol requests by API, version and outcome (ok, an error name, malformed, unsupported)",
            ["api", "version", "outcome"],
            registry=r,
        )
        self.request_duration = Histogram(
            f"{PREFIX}_kafka_request_duration_seconds",
            "Kafka protocol request latency by API (a Fetch's long-poll included)",
            ["api"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.connections = Gauge(f"{PREFIX}_kafka_connections", "Open Kafka client connections", registry=r)
        self.rejected_frames = Counter(
            f"{PREFIX}_kafka_rejected_frames",
            "Kafka frames refused before decoding (connection closed), by reason",
            ["reason"],
            registry=r,
        )
        self.bytes_received = Counter(f"{PREFIX}_kafka_received_bytes", "Bytes of Kafka requests", registry=r)
        self.bytes_sent = Counter(f"{PREFIX}_kafka_sent_bytes", "Bytes of Kafka responses", registry=r)


class NodeMetrics:
    """The metric objects of one node, registered in ``self.registry``.

    Transactions and groups call the helper methods (``txn_started``,
    ``txn_completed``, ...) so wiring them is one call per event.
    """

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.build_info = Gauge(
            f"{PREFIX}_build_info", "Build information (always 1)", ["version", "python_version"], registry=r
        )
        self.build_info.labels(VERSION, platform.python_version()).set(1)

        # traffic
        self.records_produced = Counter(
            f"{PREFIX}_records_produced", "Records appended to partitions led by this node", ["topic"], registry=r
        )
        self.bytes_produced = Counter(
            f"{PREFIX}_produced_bytes", "Record-batch bytes appended on this node as leader", ["topic"], registry=r
        )
        self.records_fetched = Counter(
            f"{PREFIX}_records_fetched", "Records returned by fetch requests", ["topic"], registry=r
        )
        self.bytes_fetched = Counter(
            f"{PREFIX}_fetched_bytes", "Record-batch bytes returned by fetch requests", ["topic"], registry=r
        )
        self.produce_duration = Histogram(
            f"{PREFIX}_produce_duration_seconds",
            "Produce latency per partition (acks=all: until committed and applied), by outcome",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.fetch_duration = Histogram(
            f"{PREFIX}_fetch_duration_seconds",
            "Fetch request latency, long-poll wait included, by outcome",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        for outcome in ("ok", "error"):
            self.produce_duration.labels(outcome)
            self.fetch_duration.labels(outcome)
        self.produce_errors = Counter(
            f"{PREFIX}_produce_errors",
            "Partition produce results that were errors, by Kafka error name",
            ["error_code"],
            registry=r,
        )
        self.http_requests = Counter(
            f"{PREFIX}_http_requests",
            "HTTP requests by route template, method and status class (2xx, 4xx, ...)",
            ["route", "method", "status"],
            registry=r,
        )
        self.http_duration = Histogram(
            f"{PREFIX}_http_request_duration_seconds",
            "HTTP request latency by route template",
            ["route", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.kafka = KafkaMetrics(r)

        # idempotence
        self.duplicate_batches = Counter(
            f"{PREFIX}_duplicate_batches",
            "Idempotent retries detected and answered with the original offsets",
            ["topic"],
            registry=r,
        )
        self.reordered_batches = Counter(
            f"{PREFIX}_reordered_batches",
            "Idempotent batches that arrived ahead of their predecessor and waited for it before Raft",
            ["outcome"],
            registry=r,
        )
        self.out_of_order_rejections = Counter(
            f"{PREFIX}_out_of_order_rejections",
            "Idempotent batches rejected with OUT_OF_ORDER_SEQUENCE_NUMBER",
            ["topic"],
            registry=r,
        )
        self.producer_ids_allocated = Counter(
            f"{PREFIX}_producer_ids_allocated", "Producer ids handed out by this node", registry=r
        )

        # Raft
        self.raft_commit_duration = Histogram(
            f"{PREFIX}_raft_commit_duration_seconds",
            "Time from proposing a command to its local apply",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.leader_changes = Counter(
            f"{PREFIX}_raft_leader_changes",
            "Leadership changes observed by this node, per topic",
            ["topic"],
            registry=r,
        )

        # transactions (wired by the transaction coordinator and the partition leaders)
        self.txn_started_total = Counter(
            f"{PREFIX}_transactions_started", "Transactions begun on a coordinator on this node", registry=r
        )
        self.txn_completed_total = Counter(
            f"{PREFIX}_transactions_completed",
            "Transactions completed by a coordinator on this node, by outcome",
            ["outcome"],
            registry=r,
        )
        self.txn_duration = Histogram(
            f"{PREFIX}_transaction_duration_seconds",
            "Time from a transaction's first partition to its completion, by outcome",
            ["outcome"],
            buckets=_TXN_DURATION_BUCKETS,
            registry=r,
        )
        for o in TxnOutcome:
            self.txn_completed_total.labels(o.value)
            self.txn_duration.labels(o.value)
        # How partition leaders admitted the batches that open a transaction on a partition (KIP-890): a check
        # with the coordinator (an internal round trip), or the token of a carried marker (none).
        self.txn_partition_checks = Counter(
            f"{PREFIX}_transaction_partition_checks",
            "Transactional batches that opened a transaction on a partition led by this node, by how they were "
            "admitted: coordinator = checked with the transaction coordinator, token = a carried marker's token",
            ["how"],
            registry=r,
        )
        self.txn_checked_by_coordinator = self.txn_partition_checks.labels("coordinator")
        self.txn_checked_by_token = self.txn_partition_checks.labels("token")
        self.txn_markers = Counter(
            f"{PREFIX}_transaction_markers_written",
            "COMMIT/ABORT control batches appended to partitions led by this node",
            ["topic", "marker"],
            registry=r,
        )
        self.coordinator_loads = Counter(
            f"{PREFIX}_coordinator_loads",
            "Coordinator partitions loaded by this node (a coordinator moved here)",
            ["kind"],
            registry=r,
        )
        self.coordinator_load_duration = Histogram(
            f"{PREFIX}_coordinator_load_duration_seconds",
            "Time to load a coordinator partition's state",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        for k in CoordinatorKind:
            self.coordinator_loads.labels(k.value)
            self.coordinator_load_duration.labels(k.value)

        # groups
        self.group_rebalances = Counter(
            f"{PREFIX}_consumer_group_rebalances",
            "Rebalances (new generations) of groups coordinated by this node",
            ["group"],
            registry=r,
        )

        # process
        self.event_loop_lag = Histogram(
            f"{PREFIX}_event_loop_lag_seconds",
            f"How late a {LOOP_LAG_INTERVAL_S}s asyncio sleep wakes up (blocking work on the loop)",
            buckets=_LOOP_LAG_BUCKETS,
            registry=r,
        )

        self._collector = NodeCollector()
        r.register(self._collector)
        self._loop_task: asyncio.Task[None] | None = None

    # ---- sources of scrape-time gauges ---------------------------------------------------

    def add_collector(self, sample: Callable[[], NodeSample]) -> None:
        """Partition/Raft/controller gauges from the broker's live state."""
        self._collector.node = sample

    def set_transaction_source(self, sample: Callable[[], TransactionSample]) -> None:
        """Open transactions, oldest age, loaded coordinator partitions (called at scrape time)."""
        self._collector.transactions = sample

    def set_group_source(self, sample: Callable[[], GroupCoordinatorSample]) -> None:
        """Members, committed offsets and lag of the groups coordinated here (called at scrape time)."""
        self._collector.groups = sample

    # ---- event helpers -----------------------------------------------------------------------

    def produce_failed(self, topic: str, error_code: str) -> None:
        self.produce_errors.labels(error_code).inc()
        if error_code == "OUT_OF_ORDER_SEQUENCE_NUMBER":
            self.out_of_order_rejections.labels(topic).inc()

    def txn_started(self) -> None:
        self.txn_started_total.inc()

    def txn_completed(self, outcome: TxnOutcome, duration_s: float) -> None:
        outcome = TxnOutcome(outcome)
        self.txn_completed_total.labels(outcome.value).inc()
        self.txn_duration.labels(outcome.value).observe(max(0.0, duration_s))

    def txn_marker_written(self, topic: str, commit: bool) -> None:
        self.txn_markers.labels(topic, "commit" if commit else "abort").inc()

    def coordinator_loaded(self, kind: CoordinatorKind, duration_s: float) -> None:
        kind = CoordinatorKind(kind)
        self.coordinator_loads.labels(kind.value).inc()
        self.coordinator_load_duration.labels(kind.value).observe(max(0.0, duration_s))

    def group_rebalanced(self, group: str) -> None:
        self.group_rebalances.labels(group).inc()

    # ---- event-loop lag ------------------------------------------------------------------------

    def start_loop_monitor(self) -> None:
        """Observe event-loop lag from now on (call on the node's running loop)."""
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._monitor_loop())

    async def stop_loop_monitor(self) -> None:
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _monitor_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(LOOP_LAG_INTERVAL_S)
            self.event_loop_lag.observe(max(0.0, loop.time() - t0 - LOOP_LAG_INTERVAL_S))


# ---- what the dashboards and rules may name -------------------------------------------------

_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}


def exported_series_names(metrics: NodeMetrics | None = None) -> set[str]:
    """Every series name (``_total``, ``_bucket`` ... included) the registry can export.

    Read from the registry itself (collected families plus the scrape-time
    collector's descriptions), so the dashboard and alert checks follow the
    code, not a copied list.
    """
    m = metrics or NodeMetrics()
    names: set[str] = set()
    families: list[Metric] = list(m.registry.collect()) + list(m._collector.describe())
    for fam in families:
        for suffix in _SUFFIXES.get(fam.type, ("",)):
            names.add(fam.name + suffix)
        names.update(s.name for s in fam.samples)
    return names
