"""Many partitions: ``txbroker bench create``, ``failover --partitions N`` and ``idle`` at several sizes.

* ``create``: time from the create-topic request until every partition of an
  N-partition RF-3 topic has a leader, and the longest event-loop stall of
  each node meanwhile: a probe thread per node asks ``/livez`` every
  ``PROBE_INTERVAL_S`` and records how long each answer took (a loop held by
  blocking work answers late). Also where the leaders landed (per node, and how
  many on their preferred replica).
* ``failover --partitions N``: SIGKILL of the node leading the most partitions
  of an N-partition topic; for each partition it led, the time until a live
  node reports a new leader (polled from both survivors' ``/v1/metadata``);
  p50, p99 and max, and the survivors' campaign counters.
* ``idle`` at sizes ``--idle-partitions 64,512,4096``: per node % of one core
  and RSS, MB per partition replica, and the slopes between sizes; with
  ``--idle-produce`` also produce throughput on 3 partitions beside the
  largest size's idle partitions against the same run on a cluster with none.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from cluster.health import scrape

from .harness import BenchCluster, fresh_cluster, http_json
from .measure import host_cpu, pct, proc_stat, sum_samples
from .produce_load import drive_produce
from .profiling import start_profile, summarize_profile
from .raft_idle import wait_settled

IDLE_TOPIC = "idle"
CREATE_TOPIC = "many"
LOAD_TOPIC = "bench"
PROBE_INTERVAL_S = 0.05
POLL_S = 0.1
POLL_DUTY_FACTOR = 4  # failover: a survivor is polled again after 4x its last answer's time (at least POLL_S)
PROFILE_FAILOVER_S = 8  # ``--profile``: seconds of the survivors' stacks from the kill on
CAMPAIGN_COUNTERS = ("raft_campaigns_total", "raft_campaigns_waited_total", "raft_campaigns_staggered_total")


class LoopProbe:
    """One thread per node: ``GET /livez`` every ``PROBE_INTERVAL_S``; the slowest answer per node (an event-loop
    stall shows as a late answer). ``start``/``stop`` bracket the window measured."""

    def __init__(self, cluster: BenchCluster) -> None:
        self._urls = {c.node_id: c.url for c in cluster.configs if cluster.alive(c.node_id)}
        self.worst: dict[int, float] = dict.fromkeys(self._urls, 0.0)
        self.samples: dict[int, int] = dict.fromkeys(self._urls, 0)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(n, u), daemon=True) for n, u in self._urls.items()]

    def _run(self, node: int, url: str) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/livez", timeout=30) as resp:
                    resp.read()
                took = time.monotonic() - t0
                self.worst[node] = max(self.worst[node], took)
                self.samples[node] += 1
            self._stop.wait(max(0.0, PROBE_INTERVAL_S - (time.monotonic() - t0)))

    def start(self) -> LoopProbe:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        for t in self._threads:
            t.join(35)
        return {f"node{n}": {"max_ms": round(w * 1e3, 1), "probes": self.samples[n]} for n, w in self.worst.items()}


def request_topic(cluster: BenchCluster, topic: str, partitions: int, timeout: float = 60.0) -> None:
    """Create ``topic`` (RF 3) through the controller, following its 421 redirect; no waiting for leaders."""
    body = {"name": topic, "partitions": partitions, "replication_factor": 3}
    deadline = time.monotonic() + timeout
    url, retried = cluster.url(1), False
    while time.monotonic() < deadline:
        status, res = http_json("POST", url + "/v1/topics", body, timeout=timeout, access=cluster.access)
        if status == 201 or (retried and res.get("error_code") == "TOPIC_ALREADY_EXISTS"):
            return  # (already there after a retry: the earlier attempt made it)
        if status == 421 and res.get("leader_url"):
            url = str(res["leader_url"])
            continue
        if not res.get("retriable"):
            raise RuntimeError(f"create topic {topic}: {status} {res}")
        retried = True
        time.sleep(0.2)
    raise TimeoutError(f"create topic {topic}: no controller answered within {timeout}s")


def metadata(cluster: BenchCluster, node: int, topic: str) -> list[dict[str, Any]]:
    """``topic``'s partitions as node ``node`` reports them (empty when it does not answer)."""
    with contextlib.suppress(OSError, ValueError):
        status, meta = http_json("GET", cluster.url(node) + "/v1/metadata", timeout=10, access=cluster.access)
        if status == 200:
            for t in meta["topics"]:
                if t["name"] == topic:
                    return list(t["partitions"])
    return []


def wait_all_led(cluster: BenchCluster, topic: str, partitions: int, timeout: float) -> list[dict[str, Any]]:
    """Poll node 1's metadata until every partition has a live leader; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        parts = metadata(cluster, 1, topic)
        if len(parts) == partitions and all(p["leader"] is not None and cluster.alive(p["leader"]) for p in parts):
            return parts
        time.sleep(max(0.5, partitions / 4000))  # a metadata answer of N partitions costs the node ~N/20000 s
    raise TimeoutError(f"not every partition of {topic} has a leader after {timeout}s")


def leader_spread(parts: list[dict[str, Any]]) -> dict[str, Any]:
    per_node: dict[str, int] = {}
    for p in parts:
        per_node[f"node{p['leader']}"] = per_node.get(f"node{p['leader']}", 0) + 1
    preferred = sum(1 for p in parts if p["leader"] == p["replicas"][0])
    return {"leaders_per_node": dict(sorted(per_node.items())), "on_preferred_replica": preferred}


def campaign_counters(cluster: BenchCluster, nodes: list[int] | None = None) -> dict[str, int]:
    """The campaign counters summed over ``nodes`` (default: every live node)."""
    urls = [cluster.url(n) for n in nodes] if nodes is not None else cluster.live_urls()
    scrapes = [scrape(u, timeout=5, access=cluster.access) or {} for u in urls]
    return {name: int(sum_samples(scrapes, f"txbroker_{name}")) for name in CAMPAIGN_COUNTERS}


def scenario_create(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    n = opts.create_partitions
    with fresh_cluster() as cluster:
        probe = LoopProbe(cluster).start()
        time.sleep(1.0)  # the probe's baseline: the idle cluster's answer times
        t0 = time.monotonic()
        try:
            request_topic(cluster, CREATE_TOPIC, n, timeout=opts.create_timeout)
            accepted = time.monotonic() - t0
            parts = wait_all_led(cluster, CREATE_TOPIC, n, opts.create_timeout)
            elected = time.monotonic() - t0
        finally:
            lag = probe.stop()
        out: dict[str, Any] = {
            "partitions": n, "replication_factor": 3, "request_s": round(accepted, 2),
            "all_leaders_after_s": round(elected, 1), "event_loop_max_stall": lag,
            **leader_spread(parts), **campaign_counters(cluster),
            "ticker_stalls": cluster.ticker_stalls(),
        }  # fmt: skip
    out["target_le_30s"] = elected <= 30.0
    return out


def scenario_failover_many(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    n = opts.partitions
    with fresh_cluster() as cluster:
        t0 = time.monotonic()
        request_topic(cluster, CREATE_TOPIC, n, timeout=opts.create_timeout)
        parts = wait_all_led(cluster, CREATE_TOPIC, n, opts.create_timeout)
        elected = time.monotonic() - t0
        time.sleep(opts.settle_seconds)  # the creation's elections and catch-up traffic settle
        parts = wait_all_led(cluster, CREATE_TOPIC, n, 60)
        counts: dict[int, int] = {}
        for p in parts:
            counts[p["leader"]] = counts.get(p["leader"], 0) + 1
        victim = max(counts, key=lambda k: counts[k])
        led = {p["partition"] for p in parts if p["leader"] == victim}
        survivors = [c.node_id for c in cluster.configs if c.node_id != victim]
        before = campaign_counters(cluster, survivors)
        prof: list[Any] = []
        if opts.profile:  # the survivors, over the failover's first seconds
            for node in survivors:
                path = Path(opts.profile).resolve() / f"failover-node{node}.txt"
                path.parent.mkdir(parents=True, exist_ok=True)
                prof.append((start_profile(cluster.procs[node].pid, PROFILE_FAILOVER_S, path), path, node))
        t_kill = time.monotonic()
        cluster.kill(victim)
        times = poll_new_leaders(cluster, survivors, victim, led, opts.failover_timeout, t_kill)
        after = campaign_counters(cluster, survivors)
        profiles = {
            f"node{node}": {"file": str(path), **summarize_profile(path)}
            for proc, path, node in prof
            if proc is not None and proc.wait(60) == 0 and path.exists()
        }
    got = sorted(times.values())
    missing = len(led) - len(got)
    out: dict[str, Any] = {
        "partitions": n, "created_and_led_after_s": round(elected, 1), "killed": victim,
        "partitions_it_led": len(led), "led_again": len(got), "not_led_again": missing,
    }  # fmt: skip
    if got:
        out.update({"min_s": round(got[0], 2), "p50_s": round(pct(got, 0.5), 2), "p90_s": round(pct(got, 0.9), 2),
                    "p99_s": round(pct(got, 0.99), 2), "max_s": round(got[-1], 2),
                    "mean_s": round(statistics.fmean(got), 2),
                    # how many were led again by 1 s, 2 s, ... after the kill
                    "led_by_second": [sum(1 for t in got if t <= s) for s in range(1, int(got[-1]) + 2)]})  # fmt: skip
    out["survivors_campaigns"] = {k: after[k] - before[k] for k in after}
    if profiles:
        out["profile"] = profiles
    out["target_all_le_5s"] = missing == 0 and bool(got) and got[-1] <= 5.0
    return out


def poll_new_leaders(
    cluster: BenchCluster, survivors: list[int], victim: int, led: set[int], timeout: float, t_kill: float
) -> dict[int, float]:
    """partition -> seconds after the kill until a survivor reported a live leader for it."""
    found: dict[int, float] = {}
    stop = threading.Event()
    lock = threading.Lock()

    def poll(node: int) -> None:
        while not stop.is_set():
            started = time.monotonic()
            parts = metadata(cluster, node, CREATE_TOPIC)
            now = time.monotonic() - t_kill
            with lock:
                for p in parts:
                    if p["partition"] in led and p["partition"] not in found and p["leader"] not in (None, victim):
                        found[p["partition"]] = now
                if len(found) == len(led):
                    stop.set()
            # The metadata of thousands of partitions costs the node tens of milliseconds to answer: the
            # poll keeps to a fifth of its event loop, so that measuring does not slow the failover down.
            stop.wait(max(POLL_S, POLL_DUTY_FACTOR * (time.monotonic() - started)))

    threads = [threading.Thread(target=poll, args=(s,), daemon=True) for s in survivors]
    for t in threads:
        t.start()
    stop.wait(timeout)
    stop.set()
    for t in threads:
        t.join(30)
    return found


def idle_sizes(opts: argparse.Namespace) -> list[int]:
    return [int(x) for x in str(opts.idle_partitions).split(",") if x.strip()]


def idle_once(opts: argparse.Namespace, n: int) -> dict[str, Any]:
    with fresh_cluster() as cluster:
        t0 = time.monotonic()
        request_topic(cluster, IDLE_TOPIC, n, timeout=opts.create_timeout)
        wait_all_led(cluster, IDLE_TOPIC, n, opts.create_timeout)
        elected = time.monotonic() - t0
        # Let the startup traffic settle: elections, leader balancing, then groups quiescing.
        settled, quiescent = wait_settled([cluster.url(i) + "/metrics" for i in cluster.procs], opts.idle_settle_s)
        before = {i: proc_stat(p.pid)[0] for i, p in cluster.procs.items()}
        t0, h0 = time.monotonic(), host_cpu()
        time.sleep(opts.idle_seconds)
        wall, h1 = time.monotonic() - t0, host_cpu()
        nodes = {}
        for i, p in cluster.procs.items():
            cpu, rss, threads = proc_stat(p.pid)
            nodes[f"node{i}"] = {"cpu_pct": round(100 * (cpu - before[i]) / wall, 2), "rss_mb": round(rss, 1),
                                 "threads": threads}  # fmt: skip
        produce = idle_produce(cluster, opts) if opts.idle_produce and n == max(idle_sizes(opts)) else None
    replicas = n  # RF 3 on 3 nodes: every node holds a replica of every partition
    worst = max(nodes.values(), key=lambda v: v["cpu_pct"])
    out: dict[str, Any] = {
        "partitions": n, "replicas_per_node": replicas, "all_leaders_after_s": round(elected, 1),
        "settled_after_s": round(settled, 1), "quiescent_groups_per_node": quiescent,
        "seconds": round(wall, 1), "nodes": nodes,
        "max_node_cpu_pct": worst["cpu_pct"],
        "max_node_rss_mb": max(v["rss_mb"] for v in nodes.values()),
        "mb_per_replica": round(max(v["rss_mb"] for v in nodes.values()) / replicas, 3),
        "total_cpu_pct": round(sum(v["cpu_pct"] for v in nodes.values()), 2),
        "host_cpu_busy_pct": round(100 * (h1[0] - h0[0]) / (h1[1] - h0[1]), 1),
    }  # fmt: skip
    if produce is not None:
        out["produce_beside_idle_mb_per_s"] = produce
    return out


def idle_produce(cluster: BenchCluster, opts: argparse.Namespace) -> float:
    """Produce MB/s on a 3-partition topic of ``cluster`` (``drive_produce``: opts' warm-up and duration)."""
    leaders = cluster.create_topic(LOAD_TOPIC, 3)
    res = asyncio.run(drive_produce(cluster, leaders, opts))
    return float(res["mb_per_s"])


def scenario_idle(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    sizes = idle_sizes(opts)
    runs = [idle_once(opts, n) for n in sizes]
    out: dict[str, Any] = {"sizes": runs}
    slopes = []
    for a, b in itertools.pairwise(runs):
        d = b["replicas_per_node"] - a["replicas_per_node"]
        slopes.append({
            "from": a["partitions"], "to": b["partitions"],
            "cpu_pct_per_1000_replicas": round(1000 * (b["max_node_cpu_pct"] - a["max_node_cpu_pct"]) / d, 2),
            "mb_per_replica": round((b["max_node_rss_mb"] - a["max_node_rss_mb"]) / d, 4),
        })  # fmt: skip
    if slopes:
        out["slopes"] = slopes
    biggest = max(runs, key=lambda r: r["partitions"])
    out["targets"] = {
        "<=10%_core_per_node_at_largest": biggest["max_node_cpu_pct"] <= 10.0,
        "<=0.1MB_per_replica_at_largest": biggest["mb_per_replica"] <= 0.1,
    }
    if opts.idle_produce:
        with fresh_cluster() as cluster:
            alone = idle_produce(cluster, opts)
        beside = float(biggest["produce_beside_idle_mb_per_s"])
        out["produce"] = {"idle_partitions": biggest["partitions"], "beside_idle_mb_per_s": beside,
                          "alone_mb_per_s": alone, "ratio": round(beside / alone, 3) if alone else None}  # fmt: skip
        out["targets"][">=0.9_produce_ratio"] = bool(alone) and beside / alone >= 0.9
    return out
