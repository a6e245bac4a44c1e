"""Every Prometheus metric a node exports, defined in one place.

Conventions (reference/http_metrics_ops.md §2): one ``txbroker_`` prefix, base
units (seconds, bytes), ``_total`` counters, bounded labels only (topic,
partition, route template, outcome, role) -- never producer ids, offsets or
client addresses. ``_created`` series are disabled. Each node has its own
registry (several nodes may share a process in tests).

Per-partition and Raft gauges are computed at scrape time by
``NodeCollector`` from the node's live state, so they are never stale.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus-client is partly untyped

VERSION = "0.1.0"
PREFIX = "txbroker"

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


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
class NodeSample:
    controller_is_leader: bool
    controller_term: int
    controller_commit_index: int
    nodes_up: int
    nodes_down: int
    unavailable_partitions: dict[str, int]  # topic -> partitions without a known leader (seen here)
    partitions: list[PartitionSample]


class NodeMetrics:
    """The metric objects of one node, registered in ``self.registry``."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.build_info = Gauge(
            f"{PREFIX}_build_info", "Build information (always 1)", ["version", "python_version"], registry=r
        )
        self.build_info.labels(VERSION, platform.python_version()).set(1)
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
            "Produce request latency (acks=all: until committed and applied)",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.fetch_duration = Histogram(
            f"{PREFIX}_fetch_duration_seconds",
            "Fetch request latency, long-poll wait included",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.http_requests = Counter(
            f"{PREFIX}_http_requests",
            "HTTP requests by route template, method and status class",
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
        self.duplicate_batches = Counter(
            f"{PREFIX}_duplicate_batches",
            "Idempotent retries answered with the original offsets",
            ["topic"],
            registry=r,
        )
        self.produce_errors = Counter(
            f"{PREFIX}_produce_errors",
            "Partition produce results that were errors, by Kafka error name",
            ["error_code"],
            registry=r,
        )
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
        self.producer_ids_allocated = Counter(
            f"{PREFIX}_producer_ids_allocated",
            "Producer ids handed out by this node",
            registry=r,
        )

    def add_collector(self, sample: Callable[[], NodeSample]) -> None:
        self.registry.register(NodeCollector(sample))


class NodeCollector(Collector):
    """Scrape-time gauges computed from the node's live state."""

    def __init__(self, sample: Callable[[], NodeSample]) -> None:
        self._sample = sample

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self._sample()
        g = GaugeMetricFamily
        yield g(
            f"{PREFIX}_controller_is_leader",
            "1 if this node is the controller leader",
            value=int(s.controller_is_leader),
        )
        nodes = g(f"{PREFIX}_cluster_nodes", "Nodes as seen from this node", labels=["state"])
        nodes.add_metric(["up"], s.nodes_up)
        nodes.add_metric(["down"], s.nodes_down)
        yield nodes
        roles = g(f"{PREFIX}_partitions", "Local partition replicas by role", labels=["role"])
        leaders = sum(1 for p in s.partitions if p.is_leader)
        roles.add_metric(["leader"], leaders)
        roles.add_metric(["follower"], len(s.partitions) - leaders)
        yield roles
        under = g(
            f"{PREFIX}_partitions_under_replicated",
            "Partitions led here with a follower disconnected or behind",
            labels=["topic"],
        )
        unavailable = g(
            f"{PREFIX}_partitions_unavailable",
            "Local partitions with no known leader",
            labels=["topic"],
        )
        per_topic_under: dict[str, int] = {}
        for p in s.partitions:
            if p.is_leader:
                per_topic_under[p.topic] = per_topic_under.get(p.topic, 0) + int(p.under_replicated)
        for topic, n in sorted(per_topic_under.items()):
            under.add_metric([topic], n)
        for topic, n in sorted(s.unavailable_partitions.items()):
            unavailable.add_metric([topic], n)
        yield under
        yield unavailable
        labels = ["topic", "partition"]
        fams = {
            "hw": g(f"{PREFIX}_partition_high_watermark", "High watermark of the local replica", labels=labels),
            "lso": g(
                f"{PREFIX}_partition_last_stable_offset", "Last stable offset of the local replica", labels=labels
            ),
            "start": g(f"{PREFIX}_partition_log_start_offset", "Log start offset of the local replica", labels=labels),
            "size": g(f"{PREFIX}_partition_log_size_bytes", "Stored batch bytes of the local replica", labels=labels),
            "leader": g(f"{PREFIX}_raft_is_leader", "1 if this node leads the partition's Raft group", labels=labels),
            "term": g(f"{PREFIX}_raft_term", "Raft term of the partition's group on this node", labels=labels),
            "commit": g(f"{PREFIX}_raft_commit_index", "Raft commit index on this node", labels=labels),
            "lag": g(
                f"{PREFIX}_raft_follower_lag_entries",
                "Max Raft entries a follower is behind (leader only)",
                labels=labels,
            ),
        }
        for p in s.partitions:
            lv = [p.topic, str(p.partition)]
            fams["hw"].add_metric(lv, p.high_watermark)
            fams["lso"].add_metric(lv, p.last_stable_offset)
            fams["start"].add_metric(lv, p.log_start_offset)
            fams["size"].add_metric(lv, p.size_bytes)
            fams["leader"].add_metric(lv, int(p.is_leader))
            fams["term"].add_metric(lv, p.term)
            fams["commit"].add_metric(lv, p.commit_index)
            if p.is_leader:
                fams["lag"].add_metric(lv, p.follower_lag_entries)
        ctl = ["__controller", "0"]
        fams["leader"].add_metric(ctl, int(s.controller_is_leader))
        fams["term"].add_metric(ctl, s.controller_term)
        fams["commit"].add_metric(ctl, s.controller_commit_index)
        yield from fams.values()
