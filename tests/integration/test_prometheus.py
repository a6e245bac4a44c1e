"""A real Prometheus scrapes a live 3-node cluster while a workload runs.

Every dashboard query and alert expression is evaluated through Prometheus's
HTTP API; counters must be exact (N records produced -> the counter summed over
nodes rises by N); killing a node must raise the under-replicated gauge and put
the node-down and under-replicated alerts into pending. Each dashboard is
rendered as a PNG under test-artifacts/dashboards/ for a person to look at.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.prometheus_config import render_prometheus_config
from tests.support.cluster import LocalCluster, cluster_init_secure, http, wait_for
from tests.support.dashboard_render import render_dashboard
from tests.support.prometheus import (
    ALERTS,
    PrometheusServer,
    Query,
    alert_queries,
    artifacts_dir,
    dashboard_queries,
    dashboards,
    metric_names,
    prometheus,
    promtool,
    require_binary,
    substitute_grafana_vars,
)
from tests.support.writer import IdempotentWriter, read_partition

pytestmark = pytest.mark.integration

RATE_INTERVAL = "30s"
TOPIC = "orders"
PARTITIONS = 3
# Families fed by the transaction and group coordinators, and counters
# only an unusual event creates (a retried duplicate, an out-of-order batch, a produce error).
# A query naming one of them must return data only once a node exports it.
EVENT_DRIVEN = (
    "txbroker_transactions_open",
    "txbroker_transaction_oldest_open_age_seconds",
    "txbroker_transaction_max_timeout_seconds",
    "txbroker_transaction_markers_written",
    "txbroker_coordinator_partitions",
    "txbroker_consumer_group_",
    "txbroker_duplicate_batches",
    "txbroker_out_of_order_rejections",
    "txbroker_produce_errors",
    # per-request Kafka listener series: none until a Kafka client sends a request (this workload speaks HTTP)
    "txbroker_kafka_requests",
    "txbroker_kafka_request_duration",
)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return str(r.read().decode())


def node_sum(urls: list[str], sample: str, **labels: str) -> float:
    """A sample summed over the nodes' /metrics (straight from the nodes, not via Prometheus)."""
    total = 0.0
    for url in urls:
        for fam in text_string_to_metric_families(scrape(url)):
            for s in fam.samples:
                if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
    return total


class Workload:
    """Idempotent produce to every partition plus read-committed fetches, in a thread, until stopped."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.writer = IdempotentWriter(cluster, TOPIC)
        self.produced = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            i = 0
            position = dict.fromkeys(range(PARTITIONS), 0)
            while not self._stop.is_set():
                p = i % PARTITIONS
                values = [f"r{i}-{k}".encode() for k in range(20)]
                self.writer.send(p, values)
                self.produced += len(values)
                url = self.writer.leader_url.get(p, self.cluster.urls[0])
                status, res = http("GET", f"{url}/v1/topics/{TOPIC}/partitions/{p}/records"
                                   f"?offset={position[p]}&max_bytes=65536&isolation=read_committed")  # fmt: skip
                if status == 200:
                    position[p] = res["next_offset"]
                i += 1
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Workload:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "workload thread did not stop"
        if self.error is not None:
            raise self.error


def evaluate(prom: PrometheusServer, q: Query) -> int:
    """Number of series (or label values) the query returns right now."""
    expr = substitute_grafana_vars(q.expr, RATE_INTERVAL)
    if q.kind == "variable":
        selector, label = expr.split("(", 1)[1].rsplit(",", 1)
        return len(prom.api(f"label/{label.strip().rstrip(')')}/values", **{"match[]": selector.strip()}))
    return len(prom.query(expr))


def expects_data(prom: PrometheusServer, q: Query) -> bool:
    """Core metrics always; an event-driven one once Prometheus holds 2+ samples of it (what rate() needs)."""
    for n in metric_names(substitute_grafana_vars(q.expr)):
        if n.startswith(EVENT_DRIVEN) and not prom.query(f"count_over_time({n}[{RATE_INTERVAL}]) >= 2"):
            return False
    return True


def wait_value(prom: PrometheusServer, expr: str, ok: Callable[[float | None], bool], what: str) -> float | None:
    box: list[float | None] = []

    def check() -> bool:
        box[:] = [prom.scalar(expr)]
        return ok(box[0])

    try:
        wait_for(check, 30, what, interval=0.25)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last value of {expr!r}: {box}") from None
    return box[0]


def test_real_prometheus_scrapes_cluster_dashboards_and_alerts(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    require_binary("prometheus")
    require_binary("promtool")
    cluster = make_cluster(3)
    cluster.create_topic(TOPIC, partitions=PARTITIONS, rf=3)
    t_start = time.time()

    config = tmp_path / "prometheus.yml"
    config.write_text(
        render_prometheus_config(cluster.urls, scrape_interval="1s", rule_files=[str(ALERTS)], cluster="test")
    )
    res = promtool("check", "config", str(config))
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()

    with prometheus(config, tmp_path) as prom:
        wait_value(prom, 'sum(up{job="txbroker"})', lambda v: v == 3, "3 targets up")
        for url in cluster.urls:  # the live exposition passes promtool's lint, without _created series
            text = scrape(url)
            assert "_created" not in text
            lint = promtool("check", "metrics", stdin=text.encode())
            assert lint.returncode == 0, f"{url}: {lint.stdout.decode()}{lint.stderr.decode()}"

        # ---- workload, then exact counters -----------------------------------------------------
        with Workload(cluster) as load:
            t0 = time.monotonic()
            wait_for(lambda: (load.produced >= 600 and time.monotonic() - t0 > 10) or load.error, 120,
                     "600 records and 10 s of workload", interval=0.2)  # fmt: skip
        n1 = load.produced
        assert n1 >= 600 and load.writer.retries < n1
        expr = f'sum(txbroker_records_produced_total{{topic="{TOPIC}"}})'
        wait_value(prom, expr, lambda v: v == n1, f"produced counter == {n1}")
        assert node_sum(cluster.urls, "txbroker_records_produced_total", topic=TOPIC) == n1

        n2 = 137
        status, body = http(
            "POST",
            cluster.url(2) + f"/v1/topics/{TOPIC}/records",
            {"records": [{"key": f"k{i}", "value": f"v{i}"} for i in range(n2)], "format": "string"},
        )
        assert status == 200, body
        wait_value(prom, expr, lambda v: v == n1 + n2, f"produced counter rises by exactly {n2}")
        assert node_sum(cluster.urls, "txbroker_records_produced_total", topic=TOPIC) == n1 + n2

        fetched_expr = f'sum(txbroker_records_fetched_total{{topic="{TOPIC}"}})'
        before = wait_value(prom, fetched_expr, lambda v: v is not None, "fetched counter")
        assert before is not None
        read = sum(len(read_partition(cluster, TOPIC, p, via=1)) for p in range(PARTITIONS))
        assert read == n1 + n2
        wait_value(prom, fetched_expr, lambda v: v == before + read, f"fetched counter rises by exactly {read}")

        # ---- every dashboard query and alert expression through the HTTP API --------------------
        missing, summary = [], []
        for q in dashboard_queries():
            n = evaluate(prom, q)
            expected = expects_data(prom, q)
            summary.append(f"{n:4d} series  {'' if expected else '(no data expected yet) '}{q.source}: {q.expr}")
            if n == 0 and expected:
                missing.append(f"{q.source}: {q.expr}")
        (artifacts_dir("dashboards") / "queries.txt").write_text("\n".join(summary) + "\n")
        assert not missing, "dashboard queries without data:\n" + "\n".join(missing)
        for q in alert_queries():
            evaluate(prom, q)  # parses and evaluates (raises on an API error)
        healthy = [q for q in alert_queries() if "Transaction" not in q.source and "Lag" not in q.source]
        wait_for(lambda: all(evaluate(prom, q) == 0 for q in healthy), 30, "no alert condition in a healthy cluster")
        rules = prom.api("rules")["groups"][0]["rules"]
        assert {r["name"] for r in rules} == {q.source.removeprefix("alert ") for q in alert_queries()}
        assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]

        # ---- a node dies ------------------------------------------------------------------------
        cluster.kill(3)
        wait_value(
            prom,
            "sum(txbroker_partitions_under_replicated)",
            lambda v: v == PARTITIONS,
            "every partition under-replicated (node 3 followed or led all of them)",
        )
        assert node_sum(cluster.urls[:2], "txbroker_partitions_under_replicated") == PARTITIONS

        def pending(name: str) -> bool:
            return any(a["labels"]["alertname"] == name for a in prom.api("alerts")["alerts"])

        wait_for(lambda: pending("TxbrokerNodeDown"), 30, "TxbrokerNodeDown pending")
        wait_for(lambda: pending("TxbrokerUnderReplicatedPartitions"), 30, "under-replicated alert pending")
        down = prom.query('up{job="txbroker"} == 0')
        assert [d["metric"]["instance"] for d in down] == [cluster.urls[2].split("//")[1]]
        # Node 3 may have been the controller: the survivors elect one and the next scrape shows it.
        wait_value(prom, "sum(txbroker_controller_is_leader)", lambda v: v == 1, "one controller among the survivors")

        # ---- pictures for a person ----------------------------------------------------------------
        out = artifacts_dir("dashboards")
        for name, d in dashboards().items():
            png = out / name.replace(".json", ".png")
            with_data = render_dashboard(prom, d, t_start, time.time(), png, RATE_INTERVAL)
            assert png.stat().st_size > 10_000 and with_data > 0, name


def test_real_prometheus_scrapes_secure_cluster_over_https(tmp_path: Path) -> None:
    """The prometheus.yml of `cluster init --secure` (https, the cluster CA, the metrics user) scrapes every node."""
    require_binary("prometheus")
    require_binary("promtool")
    d = tmp_path / "secure"
    res = cluster_init_secure(d)
    assert res.returncode == 0, res.stderr
    config = d / "prometheus.yml"
    check = promtool("check", "config", str(config))
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    cluster = LocalCluster.from_dir(d)
    try:
        cluster.start_live()
        workdir = tmp_path / "prometheus"
        workdir.mkdir()
        with prometheus(config, workdir) as prom:
            wait_value(prom, 'sum(up{job="txbroker"})', lambda v: v == 3, "3 targets up over HTTPS")
            targets = prom.api("targets")["activeTargets"]
            assert sorted(t["scrapeUrl"] for t in targets) == [u + "/metrics" for u in cluster.urls]
            assert all(t["health"] == "up" and not t["lastError"] for t in targets), targets
            wait_value(prom, "count(txbroker_controller_is_leader)", lambda v: v == 3, "node metrics from every node")
    finally:
        cluster.close()
