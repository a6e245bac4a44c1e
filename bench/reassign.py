"""How long a 1 GiB partition takes to move onto a new node, and what the move costs the produce load meanwhile.

``txbroker bench reassign [--mib N] [--window S] [--warmup S] [--record-size B] [--batch-bytes B]
[--concurrency K] [--timeout S] [--keep DIR] [--node-setting KEY=VALUE] [--json]`` (also
``python -m bench.reassign``) starts a 3-node cluster on loopback, creates topic ``big`` (1 partition, 3
replicas) and topic ``load`` (3 partitions, 3 replicas), writes ``--mib`` MiB (default 1024) of record payload to
``big`` through the binary produce path (``bench.catchup.write``) and waits until every replica of it holds the
leader's high watermark. It then adds a 4th node the way an operator does (``txbroker cluster add-node`` and
``node start``, ``BenchCluster.add_node``).

The load: idempotent 64 KiB batches to each partition of ``load`` through its leader, K requests in flight per
partition (``bench.produce_load.PartitionWriter``, as ``txbroker bench produce``). After ``--warmup`` s it
measures a ``--window`` s window (default 15) before the move, then asks for the move of ``big`` to replicas
``[4, 2, 3]`` (``POST /v1/topics/big/partitions/0/reassign``) and measures a window of the same length from the
move's start; the load runs on until the move ends (``GET /v1/reassignments`` empty and the partition's replicas
``[4, 2, 3]``), and the whole move is reported as a third window.

It prints the write, the move's time and its phases (seconds after the move's start: node 4 added as a learner,
the leader's full snapshot built, node 4's state restored from it, node 4's replica at the leader's high
watermark -- the learner's catch-up --, node 4 a voter, the leaving node removed, the move complete), and the
load's throughput, latency and node CPU in each window, with the ratio during / before (the target: 0.7 or
more). ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.health import scrape

from .catchup import MIB, log_events, write
from .harness import BenchCluster, add_partition_write_arguments, http_json, node_settings_or_exit, wait_for
from .measure import host_cpu, machine_info, proc_stat, self_cpu, threads_cpu_by_kind
from .produce_load import Load, PartitionWriter, ProduceHttp, make_records

__all__ = ["TARGET", "TARGET_RATIO", "longest_stall", "main", "move_phases", "timeline"]

TARGET_RATIO = 0.7
BIG, LOAD = "big", "load"
NEW_NODE = 4
TARGET = [NEW_NODE, 2, 3]
_STALL = re.compile(r"raft ticker: .* took (\d+\.\d+) s")


# ---- reading the cluster ---------------------------------------------------------------------------


def _partition(cluster: BenchCluster, topic: str, node: int = 1, partition: int = 0) -> dict[str, Any]:
    status, meta = http_json("GET", cluster.url(node) + f"/v1/metadata?topics={topic}", timeout=5)
    if status != 200:
        raise ValueError(f"node {node}: metadata answered {status}")
    topics = [t for t in meta["topics"] if t["name"] == topic]
    if not topics:
        raise KeyError(topic)
    part: dict[str, Any] = topics[0]["partitions"][partition]
    return part


def local_high_watermark(cluster: BenchCluster, node: int, topic: str) -> int | None:
    """The high watermark of ``node``'s own replica of ``topic``'s partition 0 (its ``/metrics``; None while it
    holds none: its ``/v1/metadata`` then answers with what its peers report)."""
    samples = scrape(cluster.url(node), timeout=5, access=cluster.access) or {}
    for labels, value in samples.get("txbroker_partition_high_watermark", []):
        if labels.get("topic") == topic and labels.get("partition") == "0":
            return int(value)
    return None


def _moves(cluster: BenchCluster) -> list[dict[str, Any]]:
    status, res = http_json("GET", cluster.url(1) + "/v1/reassignments", timeout=5)
    if status != 200:
        raise ValueError(f"reassignments: {status} {res}")
    return list(res["reassignments"])


def start_move(cluster: BenchCluster, replicas: list[int]) -> None:
    body = {"replicas": replicas}
    status, res = http_json("POST", cluster.url(1) + f"/v1/topics/{BIG}/partitions/0/reassign", body, timeout=30)
    if not 200 <= status < 300:
        raise RuntimeError(f"reassign {BIG}-0 to {replicas}: {status} {res}")


def watch_move(cluster: BenchCluster, target_hw: int, t0: float, timeout: float) -> dict[str, Any]:
    """Poll the move started at ``t0`` (monotonic) until it ends: seconds until node 4's replica reports
    ``target_hw``, and until the move is over. Cheap polls, since they share the cores with what they measure:
    ``/metrics`` of node 4 only until its replica shows, then its ``/v1/metadata`` (which speaks for its own
    replica from then on), then node 1's ``/v1/metadata``, and ``/v1/reassignments`` only at the end."""
    wait_for(lambda: local_high_watermark(cluster, NEW_NODE, BIG) is not None, timeout, "node 4's replica of big",
             interval=0.2)  # fmt: skip
    wait_for(lambda: int(_partition(cluster, BIG, NEW_NODE)["high_watermark"]) >= target_hw, timeout,
             "node 4's replica at the high watermark", interval=0.2)  # fmt: skip
    learner_s = time.monotonic() - t0
    replicas: list[int] = []

    def over() -> bool:
        nonlocal replicas
        replicas = list(_partition(cluster, BIG)["replicas"])
        return sorted(replicas) == sorted(TARGET) and not _moves(cluster)

    wait_for(over, timeout, f"the move of {BIG}-0 to {TARGET}", interval=0.2)
    return {"seconds": round(time.monotonic() - t0, 2), "learner_caught_up_s": round(learner_s, 2),
            "replicas": replicas}  # fmt: skip


# ---- the load ---------------------------------------------------------------------------------------


@dataclass
class _Mark:
    """What the windows are measured between: the time, and the CPU used so far by the nodes, the bench and
    the host."""

    at: float
    nodes: dict[int, float]
    by_kind: dict[str, float]  # the moving partition's leader's threads
    client: float
    host: tuple[float, float]

    @classmethod
    def now(cls, cluster: BenchCluster, leader: int) -> _Mark:
        nodes = {i: proc_stat(p.pid)[0] for i, p in cluster.procs.items() if p.poll() is None}
        kinds = {k: v for k, v in threads_cpu_by_kind(cluster.procs[leader].pid).items() if not k.endswith(":sys")}
        return cls(time.monotonic(), nodes, kinds, self_cpu(), host_cpu())


def _cpu(a: _Mark, b: _Mark) -> dict[str, Any]:
    """CPU between two marks, in % of one core."""
    wall = b.at - a.at
    nodes = {f"node{i}": round(100 * (b.nodes[i] - a.nodes[i]) / wall, 1) for i in sorted(a.nodes) if i in b.nodes}
    used = sum(b.nodes[i] - a.nodes[i] for i in a.nodes if i in b.nodes) + b.client - a.client
    kinds = sorted(set(a.by_kind) | set(b.by_kind))
    by_kind = {k: round(100 * (b.by_kind.get(k, 0.0) - a.by_kind.get(k, 0.0)) / wall, 1) for k in kinds}
    return {
        "node_cpu_pct": nodes,
        "big_leader_cpu_pct_by_thread": by_kind,
        "client_cpu_pct": round(100 * (b.client - a.client) / wall, 1),
        "host_cpu_other_pct": round(100 * ((b.host[0] - a.host[0]) - used) / wall, 1),  # outside the bench
    }


def timeline(load: Load, t0: float, t1: float, step: float) -> list[int]:
    """Records/s acknowledged in each ``step`` s from ``t0`` to ``t1`` (a last partial step is left out)."""
    out = []
    a = t0
    while a + step <= t1 + 1e-9:
        out.append(round(sum(r for t, _, r, _ in load.acks if a <= t < a + step) / step))
        a += step
    return out


async def measure(cluster: BenchCluster, leaders: dict[int, str], big_leader: int, target_hw: int,
                  opts: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """The load on ``LOAD`` before and during the move of ``BIG``, and the move's time."""
    pid, epoch = cluster.init_producer()
    records = make_records(opts.record_size, opts.batch_bytes)
    load = Load()
    http = ProduceHttp(timeout=30.0)
    writers = [PartitionWriter(cluster, http.post, p, url, pid, epoch, records, opts.record_size, load, LOAD)
               for p, url in sorted(leaders.items())]  # fmt: skip
    tasks = [asyncio.create_task(w.run_slot()) for w in writers for _ in range(opts.concurrency)]
    try:
        await asyncio.sleep(opts.warmup)
        m0 = _Mark.now(cluster, big_leader)
        await asyncio.sleep(opts.window)
        m1 = _Mark.now(cluster, big_leader)
        started_at = time.time()
        await asyncio.to_thread(start_move, cluster, TARGET)
        watcher = asyncio.create_task(asyncio.to_thread(watch_move, cluster, target_hw, m1.at, opts.timeout))
        await asyncio.sleep(max(0.0, m1.at + opts.window - time.monotonic()))  # the window, however long the move
        m2 = _Mark.now(cluster, big_leader)
        move = await watcher  # the load runs on until the move ends
        m3 = _Mark.now(cluster, big_leader)
    finally:
        for w in writers:
            w.stop = True
        done, _ = await asyncio.wait(tasks, timeout=30)
        for t in tasks:
            t.cancel()
        await http.close()
    failed = sorted({repr(t.exception()) for t in done if not t.cancelled() and t.exception() is not None})
    out: dict[str, Any] = {"errors": dict(load.errors), "retries": load.retries, "writers_failed": failed}
    for name, (a, b) in {"before": (m0, m1), "during": (m1, m2), "whole_move": (m1, m3)}.items():
        window = load.window(a.at, b.at)
        del window["errors"], window["retries"]  # the run's totals, above
        out[name] = {**window, **_cpu(a, b)}
    out["leaders"] = {p: cluster.node_of_url(u) for p, u in leaders.items()}
    out["records_per_s_every_5s_from_the_before_window"] = timeline(load, m0.at, m3.at, 5.0)
    return {"load": out, "move": {**move, "started_at": started_at}}


# ---- the move's phases, from the nodes' logs ---------------------------------------------------------


def longest_stall(text: str, since: float) -> float:
    """The longest Raft ticker stall (s) that the log ``text`` reports at or after ``since`` (Unix time)."""
    out = 0.0
    for line in text.splitlines():
        m = _STALL.search(line)
        if m and any(t >= since for t in log_events(line, "raft ticker:", " took ")):
            out = max(out, float(m.group(1)))
    return out


def move_phases(logs: dict[int, str], group: str, leaving: int, started: float) -> dict[str, float | None]:
    """Seconds after ``started`` (Unix time) at which each logged phase of the move of ``group`` (``t<id>p0``)
    first happened on any node; None for one that never did."""

    def first(hint: str, marker: str) -> float | None:
        times = [t - started for text in logs.values() for t in log_events(text, hint, marker) if t >= started - 1]
        return round(min(times), 2) if times else None

    move, raft = f"move of {group}", f"'{group}'"
    return {
        "learner_added": first(move + ":", f"node {NEW_NODE} replicates as a learner"),
        "leader_snapshot_build_started": first(raft, "building a full snapshot"),
        "leader_snapshot_built": first(raft, "built for a follower"),
        "new_node_state_restored": first(raft, "restored state machine from snapshot"),
        "new_node_voter": first(move + ":", f"node {NEW_NODE} added to the voters"),
        "leadership_handed_over": first(move + ":", "leadership handed to node"),
        "leaving_node_removed": first(move + ":", f"node {leaving} removed from the voters"),
        "complete_recorded": first(move + " complete", "complete"),
    }


def _snapshot_builds(logs: dict[int, str], group: str, started: float) -> list[str]:
    """The "(X MiB in Y s)" of every full snapshot of ``group`` built after ``started`` (Unix time)."""
    out = []
    for text in logs.values():
        for line in text.splitlines():
            if any(t >= started - 1 for t in log_events(line, f"'{group}'", "built for a follower")):
                m = re.search(r"\(([^)]*)\)\s*$", line)
                out.append(m.group(1) if m else line)
    return out


# ---- the command ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="txbroker bench reassign", description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=1024, help="MiB of record payload in the moving partition (default 1024)")
    p.add_argument("--window", type=float, default=15.0, help="seconds of load measured before and during the move")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the first window (default 3)")
    add_partition_write_arguments(p, "the move")
    return p


def _prepare(cluster: BenchCluster, opts: argparse.Namespace, out: dict[str, Any]) -> tuple[int, int, str]:
    """``big`` written and on every replica, ``load`` created, node 4 added: (``big``'s high watermark, its
    leader, its Raft group id)."""
    cluster.start()
    cluster.create_topic(BIG, 1)
    cluster.create_topic(LOAD, 3)
    big_leaders, _balanced = cluster.preferred_leaders(BIG)
    out["write"] = asyncio.run(write(cluster, big_leaders[0], opts, BIG))
    leader = cluster.node_of_url(wait_for(lambda: cluster.leaders(BIG).get(0), 30, "the leader of big"))
    target = wait_for(lambda: int(_partition(cluster, BIG, leader)["high_watermark"]), 60, "the leader's HW")
    wait_for(lambda: all(int(_partition(cluster, BIG, n)["high_watermark"]) >= target for n in (1, 2, 3)), 600,
             "every replica of big at the high watermark")  # fmt: skip
    stored = [v for labels, v in cluster.scrape_nodes()[leader - 1].get(
        "txbroker_partition_log_size_bytes", []) if labels.get("topic") == BIG]  # fmt: skip
    out["big_replica_mib"] = round(sum(stored) / MIB, 1)
    t0 = time.monotonic()
    node = cluster.add_node()
    out["node_added_s"] = round(time.monotonic() - t0, 2)
    if node != NEW_NODE:
        raise RuntimeError(f"the new node is {node}, not {NEW_NODE}")
    status, topic = http_json("GET", cluster.url(1) + f"/v1/topics/{BIG}", timeout=5)
    if status != 200:
        raise ValueError(f"topic {BIG}: {status} {topic}")
    return target, leader, f"t{topic['topic_id']}p0"


def run(opts: argparse.Namespace, settings: dict[str, Any], workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with BenchCluster(workdir, settings=settings) as cluster:
        target_hw, leader, group = _prepare(cluster, opts, out)
        replicas = list(_partition(cluster, BIG)["replicas"])
        out["big"] = {"replicas": replicas, "leader": leader, "high_watermark": target_hw, "group": group}
        leaving = next(n for n in replicas if n not in TARGET)
        load_leaders, balanced = cluster.preferred_leaders(LOAD)
        changes = cluster.leader_changes()
        out.update(asyncio.run(measure(cluster, load_leaders, leader, target_hw, opts)))
        out["load"]["leaders_balanced"] = balanced
        # every group's, once per node that saw it: the move hands ``big``'s leadership over once or twice
        out["leader_changes_seen_by_nodes"] = cluster.leader_changes() - changes
    logs = {c.node_id: (workdir / f"node-{c.node_id}.log").read_text() for c in cluster.configs}
    started = out["move"].pop("started_at")
    phases = move_phases(logs, group, leaving, started)
    phases["new_node_at_high_watermark"] = out["move"]["learner_caught_up_s"]
    phases["move_over"] = out["move"]["seconds"]
    out["move"]["phases_s"] = phases
    out["move"]["snapshot_builds"] = _snapshot_builds(logs, group, started)
    out["move"]["longest_ticker_stall_s"] = {f"node{n}": longest_stall(t, started) for n, t in logs.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    settings = node_settings_or_exit(parser, opts)
    if opts.mib < 1 or opts.window <= 0 or opts.warmup < 0:
        parser.error("--mib must be at least 1, --window above 0, --warmup 0 or more")
    out: dict[str, Any] = {
        "command": "txbroker bench reassign " + " ".join(argv or []),
        "machine": machine_info(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "config": {
            "mib": opts.mib,
            "window_s": opts.window,
            "warmup_s": opts.warmup,
            "record_size": opts.record_size,
            "batch_bytes": opts.batch_bytes,
            "concurrency": opts.concurrency,
            "target_replicas": TARGET,
            "node_settings": settings,
        },
    }
    workdir = Path(opts.keep) if opts.keep else Path(tempfile.mkdtemp(prefix="txbroker-bench-reassign-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        out.update(run(opts, settings, workdir))
    finally:
        if not opts.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    before, during = out["load"]["before"], out["load"]["during"]
    ratio = round(during["records_per_s"] / max(1, before["records_per_s"]), 2)
    out["throughput_during_vs_before"] = ratio
    out["target_ratio"] = TARGET_RATIO
    out["meets_target"] = ratio >= TARGET_RATIO
    if opts.json:
        print(json.dumps(out))
        return 0
    print(json.dumps(out, indent=2))
    verdict = "meets" if out["meets_target"] else "MISSES"
    print(f"write {out['write']['seconds']} s, move {out['move']['seconds']} s (learner caught up at "
          f"{out['move']['learner_caught_up_s']} s); load {before['records_per_s']} -> {during['records_per_s']} "
          f"records/s, p99 {before['p99_ms']} -> {during['p99_ms']} ms: ratio {ratio} "
          f"({verdict} the {TARGET_RATIO} target)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
