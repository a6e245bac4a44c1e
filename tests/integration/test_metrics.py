"""Metrics and logs of real node processes (without Prometheus): JSON logs, open-transaction gauges."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.config import free_ports, make_cluster_configs, write_configs
from tests.support.cluster import REPO, LocalCluster, http, samples, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the tests that stop no node (each uses its own topic and transactional id)."""
    with LocalCluster(tmp_path_factory.mktemp("metrics"), 3) as c:
        yield c.start()


def total(cluster: LocalCluster, name: str, **labels: str) -> float:
    return sum(
        v for url in cluster.urls for lv, v in samples(url, name) if all(lv.get(k) == x for k, x in labels.items())
    )


def test_node_logs_json_lines_with_log_format_json(tmp_path: Path) -> None:
    http_port, raft_port = free_ports(2)
    [cfg] = make_cluster_configs(1, tmp_path, http_ports=[http_port], raft_ports=[raft_port])
    [path] = write_configs([cfg], tmp_path)
    log_path = tmp_path / "node.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cluster", "node", "start", "--config", str(path), "--log-format", "json"],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)),
        )  # fmt: skip
        try:
            wait_for(lambda: http("GET", cfg.url + "/readyz", timeout=2)[0] == 200, 60, "node ready")
            # The request metrics count exactly the requests this test makes, by route template and status class.
            readyz = {"route": "/readyz", "method": "GET"}
            requests0 = _value(cfg.url, "txbroker_http_requests_total", status="2xx", **readyz)
            timed0 = _value(cfg.url, "txbroker_http_request_duration_seconds_count", **readyz)
            for _ in range(3):
                assert http("GET", cfg.url + "/readyz", timeout=2)[0] == 200
            assert _value(cfg.url, "txbroker_http_requests_total", status="2xx", **readyz) == requests0 + 3
            assert _value(cfg.url, "txbroker_http_request_duration_seconds_count", **readyz) == timed0 + 3
            # The event-loop monitor observes every 0.25 s while the node runs.
            lag0 = _value(cfg.url, "txbroker_event_loop_lag_seconds_count")
            wait_for(
                lambda: _value(cfg.url, "txbroker_event_loop_lag_seconds_count") >= lag0 + 2, 10, "loop-lag samples"
            )
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    lines = [ln for ln in log_path.read_text().splitlines() if ln.strip()]
    assert len(lines) >= 2, lines
    for ln in lines:
        rec = json.loads(ln)  # every line is one JSON object
        assert {"ts", "level", "logger", "msg"} <= rec.keys(), rec
    assert any("serving" in json.loads(ln)["msg"] for ln in lines)
    assert any("stopped" in json.loads(ln)["msg"] for ln in lines)


def _value(url: str, name: str, **labels: str) -> float:
    """The one sample ``name`` with exactly these labels on one node (0 when it does not exist yet)."""
    found = [v for lv, v in samples(url, name) if lv == labels]
    assert len(found) <= 1, found
    return found[0] if found else 0.0


def _txn_call(cluster: LocalCluster, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST to any node, following NOT_COORDINATOR hints and retrying retriable errors."""

    def attempt() -> tuple[int, Any] | None:
        for url in cluster.urls:
            status, res = http("POST", url + path, body)
            if status < 400 or not (isinstance(res, dict) and res.get("retriable")):
                return status, res
        return None

    result: tuple[int, Any] = wait_for(attempt, 30, f"POST {path}", interval=0.2)
    return result


def test_open_transaction_shows_in_open_transactions_and_oldest_age(shared_cluster: LocalCluster) -> None:
    cluster = shared_cluster
    cluster.create_topic("txn-metrics", partitions=1, rf=3)
    status, res = http("GET", cluster.url(1) + "/v1/transactions")
    assert status == 200, res
    assert "metrics-open-txn" not in [t["transactional_id"] for t in res["transactions"]]
    tid = "metrics-open-txn"
    status, res = _txn_call(cluster, "/v1/producers/init", {"transactional_id": tid, "transaction_timeout_ms": 60000})
    assert status == 200, res
    pid, epoch = res["producer_id"], res["producer_epoch"]
    started0 = total(cluster, "txbroker_transactions_started_total")
    aborted0 = total(cluster, "txbroker_transactions_completed_total", outcome="aborted")
    durations0 = total(cluster, "txbroker_transaction_duration_seconds_count", outcome="aborted")
    duration_sum0 = total(cluster, "txbroker_transaction_duration_seconds_sum", outcome="aborted")
    status, res = _txn_call(
        cluster,
        f"/v1/transactions/{tid}/partitions",
        {"producer_id": pid, "producer_epoch": epoch, "partitions": [{"topic": "txn-metrics", "partition": 0}]},
    )
    assert status == 200, res
    wait_for(lambda: total(cluster, "txbroker_transactions_open") == 1, 30, "one open transaction")
    wait_for(
        lambda: (
            max(v for u in cluster.urls for _, v in samples(u, "txbroker_transaction_oldest_open_age_seconds")) >= 1.0
        ),
        30,
        "oldest open transaction at least 1 s old",
    )
    assert total(cluster, "txbroker_transactions_started_total") == started0 + 1
    status, res = http("GET", cluster.url(2) + "/v1/transactions?prefix=metrics-")
    assert status == 200, res
    [listed] = res["transactions"]
    assert (listed["transactional_id"], listed["state"]) == (tid, "Ongoing")
    assert listed["partitions"] == [{"topic": "txn-metrics", "partition": 0}]
    status, res = _txn_call(
        cluster, f"/v1/transactions/{tid}/end", {"producer_id": pid, "producer_epoch": epoch, "commit": False}
    )
    assert status == 200, res
    wait_for(lambda: total(cluster, "txbroker_transactions_open") == 0, 30, "no open transaction after abort")
    # EndTxn answers once the abort is decided; the completion is counted when its markers are written
    wait_for(
        lambda: total(cluster, "txbroker_transactions_completed_total", outcome="aborted") == aborted0 + 1,
        30,
        "the abort counted as completed",
    )
    # Its duration, from the first partition to the completion, spans the second the test waited for.
    assert total(cluster, "txbroker_transaction_duration_seconds_count", outcome="aborted") == durations0 + 1
    assert total(cluster, "txbroker_transaction_duration_seconds_sum", outcome="aborted") >= duration_sum0 + 1.0


def test_raft_traffic_counters_carry_every_replicated_byte(shared_cluster: LocalCluster) -> None:
    # Given a 3-node cluster with a replicated partition
    cluster = shared_cluster
    cluster.create_topic("traffic", partitions=1, rf=3)
    names = ("txbroker_raft_message_bytes_sent_total", "txbroker_raft_messages_sent_total",
             "txbroker_raft_message_bytes_received_total", "txbroker_raft_messages_received_total")  # fmt: skip
    before = {n: total(cluster, n) for n in names}
    assert all(v > 0 for v in before.values()), before  # elections and heartbeats already crossed the wire
    # When 256 KiB of incompressible values are written to it
    payload = os.urandom(256 * 1024)
    chunks = [payload[i : i + 4096] for i in range(0, len(payload), 4096)]
    recs = [{"value": base64.b64encode(c).decode(), "partition": 0} for c in chunks]
    status, res = http("POST", cluster.url(1) + "/v1/topics/traffic/records", {"records": recs})
    assert status == 200, res

    # Then the leader sent each byte to both followers, and the followers received them: the sums
    # over the nodes grow by at least twice the payload, sent and received
    def grown() -> dict[str, float] | None:
        delta = {n: total(cluster, n) - before[n] for n in names}
        ok = delta[names[0]] >= 2 * len(payload) and delta[names[2]] >= 2 * len(payload)
        return delta if ok else None

    delta = wait_for(grown, 30, "the replicated bytes in the Raft traffic counters")
    assert delta[names[1]] >= 2 and delta[names[3]] >= 2, delta


def test_internal_groups_report_their_raft_leadership_and_term(shared_cluster: LocalCluster) -> None:
    cluster = shared_cluster

    def leaders() -> dict[tuple[str, str], int] | None:
        led: dict[tuple[str, str], int] = {}
        for url in cluster.urls:
            for lv, v in samples(url, "txbroker_raft_is_leader"):
                if lv["topic"] in ("__transaction_state", "__consumer_offsets"):
                    led[(lv["topic"], lv["partition"])] = led.get((lv["topic"], lv["partition"]), 0) + int(v)
        return led if led and all(n == 1 for n in led.values()) else None

    led = wait_for(leaders, 60, "one leader per internal group in the metrics")
    topics = {t for t, _ in led}
    assert topics == {"__transaction_state", "__consumer_offsets"}
    # Every replica of an internal group (RF 3 on 3 nodes) reports a term >= 1.
    terms = [v for url in cluster.urls for lv, v in samples(url, "txbroker_raft_term") if lv["topic"] in topics]
    assert len(terms) == 3 * len(led) and min(terms) >= 1


def test_each_node_reports_its_node_links_up_and_no_dropped_messages(shared_cluster: LocalCluster) -> None:
    # Given a 3-node cluster whose groups all replicate between the same three nodes
    cluster = shared_cluster

    # Then each node has its links to the two other nodes up (one per peer and ticker shard), every
    # group's messages travel on them, and a healthy cluster drops none of them
    def links() -> list[float] | None:
        ups = [sum(v for _, v in samples(url, "txbroker_raft_links_up")) for url in cluster.urls]
        return ups if all(u >= 2 and u % 2 == 0 for u in ups) else None

    ups = wait_for(links, 30, "node links to both peers on every node")
    assert len(set(ups)) == 1, ups  # the same number of shards on every node
    for url in cluster.urls:
        dropped = {lv["reason"]: v for lv, v in samples(url, "txbroker_raft_link_messages_dropped_total")}
        assert set(dropped) == {"unknown_group", "not_member", "backpressure"}, dropped
        assert dropped["not_member"] == 0 and dropped["backpressure"] == 0, dropped
