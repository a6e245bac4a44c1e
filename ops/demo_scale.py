"""The quickstart's many-partitions stage: a topic of 512 partitions, and what its idle groups cost.

Every partition is its own Raft group. The stage creates a 512-partition topic (RF 3), waits until every
partition has a leader and every group replica is quiescent (no heartbeats of its own: one node heartbeat
per pair of nodes stands for all of them), shows each node's CPU over a few idle seconds and its RSS, and
deletes the topic again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from clients._http import request_json
from clients.protocol import BrokerError
from cluster.health import scrape

TOPIC = "many-partitions"
PARTITIONS = 512
IDLE_S = 5.0
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime + stime


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _gauge(url: str, name: str) -> float:
    samples = scrape(url) or {}
    return sum(v for _, v in samples.get(name, []))


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - start


def stage_scale(demo: Any, say: Callable[[str], None]) -> None:
    nodes = demo.live()
    url = demo.url(nodes[0])
    say(f"== many partitions: a topic of {PARTITIONS} partitions, each its own Raft group")
    before = {n: _gauge(demo.url(n), "txbroker_raft_quiescent_groups") for n in nodes}
    request_json("POST", url + "/v1/topics", {"name": TOPIC, "partitions": PARTITIONS, "replication_factor": 3})

    def all_led() -> bool:
        try:
            parts = request_json("GET", f"{url}/v1/topics/{TOPIC}")["partitions"]
        except BrokerError:  # the create is answered by the controller before this node's view has the topic
            return False
        return len(parts) == PARTITIONS and all(p["leader"] is not None for p in parts)

    led = _wait(all_led, 120, f"a leader for each of the {PARTITIONS} partitions")
    say(f"   every partition has a leader {led:.1f}s after the create request")

    def quiet() -> bool:
        return all(_gauge(demo.url(n), "txbroker_raft_quiescent_groups") >= before[n] + PARTITIONS for n in nodes)

    settled = _wait(quiet, 120, "every new group replica quiescent")
    say(f"   {settled:.1f}s later every replica is quiescent (txbroker_raft_quiescent_groups on each node)")
    pids = {n: demo.procs[n].pid for n in nodes}
    cpu0 = {n: _cpu_s(pid) for n, pid in pids.items()}
    time.sleep(IDLE_S)
    for n, pid in pids.items():
        pct = 100 * (_cpu_s(pid) - cpu0[n]) / IDLE_S
        replicas = int(_gauge(demo.url(n), "txbroker_raft_quiescent_groups"))
        rss = _rss_mb(pid)
        say(f"   node {n}, idle with {replicas} quiescent group replicas: {pct:.1f}% of a core, {rss:.0f} MB RSS")
    request_json("DELETE", f"{url}/v1/topics/{TOPIC}")

    def gone() -> bool:
        names = {t["name"] for t in request_json("GET", url + "/v1/topics")["topics"]}
        return TOPIC not in names

    _wait(gone, 120, f"topic {TOPIC} deleted")
    say(f"   topic {TOPIC} deleted")
