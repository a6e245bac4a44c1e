"""Generate the txbroker Grafana dashboards (classic JSON model, provisioned from files).

    python ops/grafana/build_dashboards.py          # rewrite ops/grafana/dashboards/*.json
    python ops/grafana/build_dashboards.py --check  # exit 1 if a committed file differs

Written as code so the five dashboards share one layout and one datasource
reference (the fixed uid from provisioning/datasources/txbroker.yaml), and so
the tests can list every query. Every query may only name metrics that
cluster/metrics.py exports (tests/unit/test_dashboards.py enforces it).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "txbroker-prometheus"}
SCHEMA_VERSION = 39
OUT_DIR = Path(__file__).resolve().parent / "dashboards"
RI = "$__rate_interval"
NODE = 'job="txbroker", instance=~"$instance"'


@dataclass
class Target:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass
class Panel:
    title: str
    targets: list[Target]
    kind: str = "timeseries"  # timeseries | stat | table
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    thresholds: list[tuple[float, str]] = field(default_factory=list)  # (from value, color), first from -inf


def ts(title: str, *targets: Target, unit: str = "short", description: str = "", width: int = 12) -> Panel:
    return Panel(title, list(targets), "timeseries", unit, description, width)


def stat(title: str, expr: str, *, unit: str = "short", description: str = "", bad_above: float | None = None,
         must_equal: float | None = None) -> Panel:  # fmt: skip
    thresholds: list[tuple[float, str]] = []
    if bad_above is not None:
        thresholds = [(0, "green"), (bad_above + 1e-9, "red")]
    if must_equal is not None:
        thresholds = [(0, "red"), (must_equal, "green"), (must_equal + 1e-9, "red")]
    return Panel(title, [Target(expr, instant=True)], "stat", unit, description, 6, 4, thresholds)


def table(title: str, expr: str, *, description: str = "", width: int = 24) -> Panel:
    return Panel(title, [Target(expr, instant=True)], "table", "short", description, width, 8)


def t(expr: str, legend: str = "") -> Target:
    return Target(expr, legend)


def quantiles(metric: str, by: str = "", match: str = "", qs: tuple[float, ...] = (0.5, 0.99)) -> list[Target]:
    out = []
    group = f"le, {by}" if by else "le"
    sel = f"{{{match}}}" if match else ""
    for q in qs:
        legend = f"p{round(q * 100, 1):g}" + (f" {{{{{by}}}}}" if by else "")
        out.append(t(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{sel}[{RI}])))", legend))
    return out


# ---- variables ---------------------------------------------------------------------------


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }


INSTANCE = variable("instance", "Node", "label_values(txbroker_build_info, instance)")
TOPIC = variable("topic", "Topic", 'label_values(txbroker_partition_high_watermark{topic!="__controller"}, topic)')
GROUP = variable("group", "Consumer group", "label_values(txbroker_consumer_group_members, group)")


# ---- the dashboards ----------------------------------------------------------------------


def overview() -> tuple[str, str, list[dict[str, Any]], list[Panel]]:
    return (
        "txbroker-overview",
        "txbroker / Cluster overview",
        [INSTANCE],
        [
            stat("Nodes scraped", 'sum(up{job="txbroker"})', description="Nodes Prometheus reaches"),
            stat(
                "Controller leaders",
                "sum(txbroker_controller_is_leader)",
                must_equal=1,
                description="Exactly one node must lead the controller group",
            ),
            stat(
                "Unavailable partitions",
                "sum(max by (topic) (txbroker_partitions_unavailable))",
                bad_above=0,
                description="Partitions without a leader (no quorum)",
            ),
            stat(
                "Under-replicated partitions",
                "sum(txbroker_partitions_under_replicated)",
                bad_above=0,
                description="Partitions whose leader has a follower disconnected or far behind",
            ),
            ts(
                "Records per second",
                t(f"sum(rate(txbroker_records_produced_total[{RI}]))", "produced"),
                t(f"sum(rate(txbroker_records_fetched_total[{RI}]))", "fetched"),
                unit="ops",
            ),
            ts(
                "Bytes per second",
                t(f"sum(rate(txbroker_produced_bytes_total[{RI}]))", "in"),
                t(f"sum(rate(txbroker_fetched_bytes_total[{RI}]))", "out"),
                unit="Bps",
            ),
            ts(
                "Produce latency (per partition, acks=all)",
                *quantiles("txbroker_produce_duration_seconds", match='outcome="ok"'),
                unit="s",
            ),
            ts(
                "Fetch latency (long-poll wait included)",
                *quantiles("txbroker_fetch_duration_seconds", match='outcome="ok"'),
                unit="s",
            ),
            ts(
                "HTTP requests by status class",
                t(f"sum by (status) (rate(txbroker_http_requests_total[{RI}]))", "{{status}}"),
                unit="reqps",
            ),
            ts(
                "HTTP server error ratio",
                t(
                    f'(sum(rate(txbroker_http_requests_total{{status="5xx"}}[{RI}])) or vector(0)) '
                    f"/ sum(rate(txbroker_http_requests_total[{RI}]))",
                    "5xx / all",
                ),
                unit="percentunit",
            ),
            ts(
                "Leadership changes",
                t(f"sum by (topic) (increase(txbroker_raft_leader_changes_total[{RI}]))", "{{topic}}"),
                description="Partition leader elections seen, per topic",
            ),
            ts(
                "Open transactions",
                t("sum(txbroker_transactions_open)", "open"),
                t("max(txbroker_transaction_oldest_open_age_seconds)", "oldest age (s)"),
            ),
            ts(
                "Kafka listener: requests by API",
                t(f"sum by (api) (rate(txbroker_kafka_requests_total[{RI}]))", "{{api}}"),
                unit="reqps",
                description="Kafka protocol requests per second on the nodes' Kafka listeners, per API",
            ),
            ts(
                "Kafka listener: errors and connections",
                t(f'sum by (outcome) (rate(txbroker_kafka_requests_total{{outcome!="ok"}}[{RI}]))', "{{outcome}}"),
                t("sum(txbroker_kafka_connections)", "open connections"),
                description="Kafka requests that failed, were malformed or unsupported (per second), "
                "and the open Kafka client connections",
            ),
            ts(
                "Kafka listener: latency",
                *quantiles("txbroker_kafka_request_duration_seconds", by="api"),
                unit="s",
            ),
            ts(
                "Kafka listener: bytes per second",
                t(f"sum(rate(txbroker_kafka_received_bytes_total[{RI}]))", "received"),
                t(f"sum(rate(txbroker_kafka_sent_bytes_total[{RI}]))", "sent"),
                unit="Bps",
            ),
        ],
    )


def raft() -> tuple[str, str, list[dict[str, Any]], list[Panel]]:
    return (
        "txbroker-raft",
        "txbroker / Raft",
        [INSTANCE],
        [
            ts(
                "Partition leaders per node",
                t(f'sum by (instance) (txbroker_raft_is_leader{{topic!="__controller", {NODE}}})', "{{instance}}"),
                description="Should be even across nodes (leaders move back to the preferred replica)",
            ),
            ts("Controller leader", t(f"txbroker_controller_is_leader{{{NODE}}}", "{{instance}}")),
            ts(
                "Raft commit latency",
                *quantiles("txbroker_raft_commit_duration_seconds", qs=(0.5, 0.99, 0.999)),
                unit="s",
                description="Propose to local apply, as the produce path waits for it",
            ),
            ts(
                "Follower lag (max per partition)",
                t("max by (topic, partition) (txbroker_raft_follower_lag_entries)", "{{topic}}-{{partition}}"),
                description="Raft entries the slowest follower is behind, reported by the leader",
            ),
            ts(
                "Commit index growth",
                t(f"sum by (topic) (max by (topic, partition) (deriv(txbroker_raft_commit_index[{RI}])))", "{{topic}}"),
                unit="ops",
                description="Committed Raft entries per second",
            ),
            ts(
                "Raft term",
                t("max by (topic, partition) (txbroker_raft_term)", "{{topic}}-{{partition}}"),
                description="A climbing term means repeated elections",
            ),
            ts(
                "Leadership changes per topic",
                t(f"sum by (topic) (increase(txbroker_raft_leader_changes_total[{RI}]))", "{{topic}}"),
            ),
            ts(
                "Under-replicated partitions per topic",
                t("sum by (topic) (txbroker_partitions_under_replicated)", "{{topic}}"),
            ),
        ],
    )


def topics() -> tuple[str, str, list[dict[str, Any]], list[Panel]]:
    tp = 'topic=~"$topic"'
    grp = 'group=~"$group", topic=~"$topic"'
    return (
        "txbroker-topics",
        "txbroker / Topics & consumers",
        [TOPIC, GROUP],
        [
            ts(
                "Records produced per topic",
                t(f"sum by (topic) (rate(txbroker_records_produced_total{{{tp}}}[{RI}]))", "{{topic}}"),
                unit="ops",
            ),
            ts(
                "Records fetched per topic",
                t(f"sum by (topic) (rate(txbroker_records_fetched_total{{{tp}}}[{RI}]))", "{{topic}}"),
                unit="ops",
            ),
            ts(
                "Bytes in per topic",
                t(f"sum by (topic) (rate(txbroker_produced_bytes_total{{{tp}}}[{RI}]))", "{{topic}}"),
                unit="Bps",
            ),
            ts(
                "Bytes out per topic",
                t(f"sum by (topic) (rate(txbroker_fetched_bytes_total{{{tp}}}[{RI}]))", "{{topic}}"),
                unit="Bps",
            ),
            ts(
                "High watermark per partition",
                t(f"max by (topic, partition) (txbroker_partition_high_watermark{{{tp}}})", "{{topic}}-{{partition}}"),
            ),
            ts(
                "Log size per topic (one replica)",
                t(
                    f"sum by (topic) (max by (topic, partition) (txbroker_partition_log_size_bytes{{{tp}}}))",
                    "{{topic}}",
                ),
                unit="bytes",
            ),
            ts(
                "Idempotent producer: duplicates and out-of-order",
                t(f"sum by (topic) (rate(txbroker_duplicate_batches_total{{{tp}}}[{RI}]))", "duplicates {{topic}}"),
                t(
                    f"sum by (topic) (rate(txbroker_out_of_order_rejections_total{{{tp}}}[{RI}]))",
                    "out of order {{topic}}",
                ),
                unit="ops",
            ),
            ts(
                "Produce errors by error code",
                t(f"sum by (error_code) (rate(txbroker_produce_errors_total[{RI}]))", "{{error_code}}"),
                unit="ops",
            ),
            ts(
                "Consumer lag",
                t('topk(10, max by (group) (txbroker_consumer_group_total_lag{group=~"$group"}))', "{{group}}"),
                description="Records the 10 most lagging groups have yet to consume (high watermark minus committed "
                "offset, summed over every partition the group committed); exported by each group's coordinator",
            ),
            ts(
                "Consumer lag per group and topic",
                t(f"max by (group, topic) (txbroker_consumer_group_lag_records{{{grp}}})", "{{group}} {{topic}}"),
                description="High watermark minus committed offset, summed over the topic's partitions",
            ),
            ts(
                "Consumer lag per partition (top 20)",
                t(
                    f"topk(20, max by (group, topic, partition) (txbroker_consumer_group_lag{{{grp}}}))",
                    "{{group}} {{topic}}-{{partition}}",
                ),
                description="Per-partition series stop at metrics_max_lag_series per node (the sums cover all)",
            ),
            ts("Group members", t('max by (group) (txbroker_consumer_group_members{group=~"$group"})', "{{group}}")),
            ts(
                "Group rebalances",
                t(
                    f'sum by (group) (increase(txbroker_consumer_group_rebalances_total{{group=~"$group"}}[{RI}]))',
                    "{{group}}",
                ),
            ),
            table(
                "Committed offsets",
                f"max by (group, topic, partition) (txbroker_consumer_group_committed_offset{{{grp}}})",
            ),
        ],
    )


def transactions() -> tuple[str, str, list[dict[str, Any]], list[Panel]]:
    return (
        "txbroker-transactions",
        "txbroker / Transactions",
        [INSTANCE],
        [
            stat("Open transactions", "sum(txbroker_transactions_open)"),
            stat("Oldest open transaction", "max(txbroker_transaction_oldest_open_age_seconds)", unit="s"),
            stat(
                "Unstable records",
                "sum(max by (topic, partition) (txbroker_partition_unstable_records))",
                description="Records above the last stable offset: invisible to read_committed consumers",
            ),
            stat("Transaction coordinators loaded", 'sum(txbroker_coordinator_partitions{kind="transaction"})'),
            ts(
                "Transactions started and completed",
                t(f"sum(rate(txbroker_transactions_started_total[{RI}]))", "started"),
                t(f"sum by (outcome) (rate(txbroker_transactions_completed_total[{RI}]))", "{{outcome}}"),
                unit="ops",
            ),
            ts("Transaction duration", *quantiles("txbroker_transaction_duration_seconds", by="outcome"), unit="s"),
            ts(
                "Oldest open transaction vs hanging threshold",
                t(f"max by (instance) (txbroker_transaction_oldest_open_age_seconds{{{NODE}}})", "{{instance}}"),
                t("max(txbroker_transaction_max_timeout_seconds) + 300", "alert threshold"),
                unit="s",
            ),
            ts("Open transactions per coordinator", t(f"txbroker_transactions_open{{{NODE}}}", "{{instance}}")),
            ts(
                "Markers written",
                t(
                    f"sum by (topic, marker) (rate(txbroker_transaction_markers_written_total[{RI}]))",
                    "{{marker}} {{topic}}",
                ),
                unit="ops",
            ),
            ts(
                "Unstable records per topic",
                t("sum by (topic) (max by (topic, partition) (txbroker_partition_unstable_records))", "{{topic}}"),
            ),
            ts(
                "Coordinator partitions per node",
                t(f"sum by (instance, kind) (txbroker_coordinator_partitions{{{NODE}}})", "{{kind}} {{instance}}"),
                description="Jumps show coordinators moving between nodes",
            ),
            ts(
                "Coordinator loads",
                t(f"sum by (kind) (increase(txbroker_coordinator_loads_total[{RI}]))", "{{kind}}"),
                *quantiles("txbroker_coordinator_load_duration_seconds", by="kind", qs=(0.99,)),
            ),
            ts(
                "Producer ids allocated",
                t(f"sum by (instance) (rate(txbroker_producer_ids_allocated_total[{RI}]))", "{{instance}}"),
                unit="ops",
            ),
        ],
    )


def node() -> tuple[str, str, list[dict[str, Any]], list[Panel]]:
    return (
        "txbroker-node",
        "txbroker / Node & process",
        [INSTANCE],
        [
            ts("Resident memory", t(f"process_resident_memory_bytes{{{NODE}}}", "{{instance}}"), unit="bytes"),
            ts(
                "CPU",
                t(f"rate(process_cpu_seconds_total{{{NODE}}}[{RI}])", "{{instance}}"),
                unit="percentunit",
                description="1.0 = one core busy",
            ),
            ts(
                "Event-loop lag",
                *quantiles("txbroker_event_loop_lag_seconds", by="instance", match=NODE, qs=(0.99,)),
                unit="s",
                description="How late the asyncio loop wakes up: blocking work on the loop thread",
            ),
            ts(
                "Threads and open files",
                t(f"txbroker_python_threads{{{NODE}}}", "threads {{instance}}"),
                t(f"process_open_fds{{{NODE}}}", "fds {{instance}}"),
            ),
            ts(
                "HTTP requests by route",
                t(f"sum by (route) (rate(txbroker_http_requests_total{{{NODE}}}[{RI}]))", "{{route}}"),
                unit="reqps",
            ),
            ts(
                "HTTP latency p99 by route",
                *quantiles("txbroker_http_request_duration_seconds", by="route", match=NODE, qs=(0.99,)),
                unit="s",
            ),
            ts("Replicas per node by role", t(f"txbroker_partitions{{{NODE}}}", "{{role}} {{instance}}")),
            ts(
                "Python GC collections",
                t(
                    f"sum by (instance, generation) (rate(python_gc_collections_total{{{NODE}}}[{RI}]))",
                    "gen {{generation}} {{instance}}",
                ),
                unit="ops",
            ),
            ts("Uptime", t(f"time() - process_start_time_seconds{{{NODE}}}", "{{instance}}"), unit="s"),
            ts("Peers seen as up", t(f'txbroker_cluster_nodes{{state="up", {NODE}}}', "{{instance}}")),
            table("Build", f"txbroker_build_info{{{NODE}}}"),
        ],
    )


DASHBOARDS = {"overview": overview, "raft": raft, "topics": topics, "transactions": transactions, "node": node}


# ---- JSON ------------------------------------------------------------------------------------


def _thresholds(p: Panel) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if p.thresholds:
        steps = [{"color": p.thresholds[0][1], "value": None}]
        steps += [{"color": c, "value": v} for v, c in p.thresholds[1:]]
    return {"mode": "absolute", "steps": steps}


def panel_json(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    targets = []
    for i, tg in enumerate(p.targets):
        targets.append({
            "refId": chr(ord("A") + i),
            "datasource": DATASOURCE,
            "expr": tg.expr,
            "legendFormat": tg.legend or "__auto",
            "range": not tg.instant,
            "instant": tg.instant,
            **({"format": "table"} if p.kind == "table" else {}),
        })  # fmt: skip
    options: dict[str, Any] = {
        "tooltip": {"mode": "multi", "sort": "desc"},
        "legend": {"displayMode": "list", "placement": "bottom"},
    }
    if p.kind == "stat":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "background", "graphMode": "none", "textMode": "value"}  # fmt: skip
    elif p.kind == "table":
        options = {"showHeader": True}
    out: dict[str, Any] = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": p.unit, "thresholds": _thresholds(p)}, "overrides": []},
        "options": options,
    }
    if p.kind == "table":
        out["transformations"] = [{"id": "merge", "options": {}},
                                  {"id": "organize", "options": {"excludeByName": {"Time": True}}}]  # fmt: skip
    return out


def dashboard_json(uid: str, title: str, variables: list[dict[str, Any]], panels: list[Panel]) -> dict[str, Any]:
    out, x, y, row_h = [], 0, 0, 0
    for i, p in enumerate(panels, start=1):
        if x + p.width > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(panel_json(p, i, x, y))
        x += p.width
        row_h = max(row_h, p.height)
    return {
        "uid": uid,
        "title": title,
        "description": "txbroker metrics (docs/metrics.md); generated by ops/grafana/build_dashboards.py",
        "tags": ["txbroker"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": ["txbroker"], "title": "txbroker", "asDropdown": True}],
        "templating": {"list": variables},
        "panels": out,
    }


def build() -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON."""
    return {f"txbroker-{name}.json": dashboard_json(*fn()) for name, fn in DASHBOARDS.items()}


def render(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for name, d in build().items():
        path = OUT_DIR / name
        text = render(d)
        if "--check" in argv:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            OUT_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date (run python {Path(__file__).name}): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
