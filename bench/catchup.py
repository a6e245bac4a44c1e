"""How long a replaced machine takes to catch up, against the time it took to write what it catches up on.

``txbroker bench catchup [--mib N] [--record-size B] [--batch-bytes B] [--concurrency K]
[--node-setting KEY=VALUE] [--json]`` (also ``python -m bench.catchup``) starts a 3-node cluster on loopback,
creates one partition with 3 replicas and writes ``--mib`` MiB (default 1024) of record payload to it through
the binary produce path (``bench.produce_load.PartitionWriter``: idempotent 64 KiB batches, K requests in
flight), timing the write from the first request to the last acknowledgement. Then it stops a follower
(SIGKILL), removes its data directory, starts it again with the same config file -- a replaced machine -- and
times until the follower's replica reports (``GET /v1/metadata`` on that node) the leader's high watermark.

It prints both times, the ratio catch-up / write (the target: 2.0 or less), the bytes the leader's replica
holds, and the catch-up's phases from the nodes' logs: the process answering ``/readyz``, the leader's full
snapshot built, the follower's state restored from it, the high watermark reached. ``--json`` prints one
JSON object.
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
from datetime import datetime
from pathlib import Path
from typing import Any

from .harness import BenchCluster, add_partition_write_arguments, http_json, node_settings_or_exit, wait_for
from .measure import machine_info
from .produce_load import TOPIC, Load, PartitionWriter, ProduceHttp, make_records

__all__ = ["TARGET_RATIO", "log_events", "main"]

TARGET_RATIO = 2.0
MIB = 1 << 20
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_SNAPSHOT_STARTED = "building a full snapshot"
_SNAPSHOT_BUILT = "built for a follower"
_RESTORED = "restored state machine from snapshot"


def log_events(text: str, group_hint: str, marker: str) -> list[float]:
    """Unix times of the log lines (``cluster.node``'s format) that mention ``group_hint`` and ``marker``."""
    out = []
    for line in text.splitlines():
        m = _STAMP.match(line)
        if m and marker in line and group_hint in line:
            out.append(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return out


def _partition(cluster: BenchCluster, node: int) -> dict[str, Any]:
    status, meta = http_json("GET", cluster.url(node) + f"/v1/metadata?topics={TOPIC}", timeout=5)
    if status != 200:
        raise ValueError(f"node {node}: metadata answered {status}")
    topics = [t for t in meta["topics"] if t["name"] == TOPIC]
    if not topics:  # a replaced node's controller replica has not caught up yet
        raise KeyError(TOPIC)
    part: dict[str, Any] = topics[0]["partitions"][0]
    return part


def _group_id(cluster: BenchCluster, node: int) -> str:
    """The partition's Raft group id (``t<topic id>p0``), as the nodes' logs name it."""
    status, topic = http_json("GET", cluster.url(node) + f"/v1/topics/{TOPIC}", timeout=5)
    if status != 200:
        raise ValueError(f"topic {TOPIC}: {status} {topic}")
    return f"'t{topic['topic_id']}p0'"


async def write(cluster: BenchCluster, leader: str, opts: argparse.Namespace, topic: str = TOPIC) -> dict[str, Any]:
    """Write ``opts.mib`` MiB of payload to partition 0 of ``topic`` through ``leader``; the write's figures."""
    pid, epoch = cluster.init_producer()
    records = make_records(opts.record_size, opts.batch_bytes)
    load = Load()
    http = ProduceHttp(timeout=60.0)
    goal = opts.mib * MIB
    writer = PartitionWriter(cluster, http.post, 0, leader, pid, epoch, records, opts.record_size, load, topic)
    sent = [0]

    async def slot() -> None:
        while sent[0] < goal:
            sent[0] += writer.payload
            latency, _ = await writer.send_one()
            load.acks.append((time.monotonic(), writer.payload, len(records), latency))

    t0 = time.monotonic()
    try:
        await asyncio.gather(*(slot() for _ in range(opts.concurrency)))
    finally:
        await http.close()
    seconds = time.monotonic() - t0
    payload = sum(a[1] for a in load.acks)
    return {
        "seconds": round(seconds, 2),
        "payload_mib": round(payload / MIB, 1),
        "mib_per_s": round(payload / MIB / seconds, 1),
        "batches": len(load.acks),
        "batch_wire_bytes": writer.wire_bytes,
        "retries": load.retries,
        "errors": dict(load.errors),
    }


def replace_follower(cluster: BenchCluster, follower: int, target_hw: int, timeout: float) -> dict[str, Any]:
    """SIGKILL ``follower``, remove its data directory, start it again; the times (s after the start) until it
    answers ``/readyz`` and until its replica reports ``target_hw``."""
    cluster.kill(follower)
    data_dir = cluster.configs[follower - 1].data_dir
    shutil.rmtree(data_dir)
    t0 = time.monotonic()
    wall0 = time.time()
    cluster.start_node(follower)
    ready_s: float | None = None
    seen_hw = -1

    def caught_up() -> bool:
        nonlocal ready_s, seen_hw
        if ready_s is None and cluster.ready(follower):
            ready_s = time.monotonic() - t0
        seen_hw = int(_partition(cluster, follower)["high_watermark"])
        return seen_hw >= target_hw

    wait_for(caught_up, timeout, f"node {follower} at high watermark {target_hw}", interval=0.1)
    seconds = time.monotonic() - t0
    if ready_s is None:
        wait_for(lambda: cluster.ready(follower), 60, f"node {follower} /readyz")
        ready_s = time.monotonic() - t0
    return {"seconds": round(seconds, 2), "ready_s": round(ready_s, 2), "started_at": wall0}


def _phases(workdir: Path, group: str, leader: int, follower: int, catchup: dict[str, Any]) -> dict[str, Any]:
    """Seconds after the replaced node started at which each phase of its catch-up ended (from the logs)."""
    started = catchup.pop("started_at")
    leader_log = (workdir / f"node-{leader}.log").read_text()
    follower_log = (workdir / f"node-{follower}.log").read_text()

    def first(text: str, marker: str) -> float | None:
        times = [t - started for t in log_events(text, group, marker) if t >= started - 1]
        return round(times[0], 2) if times else None

    stalls = [float(m) for m in re.findall(r"raft ticker: .* took (\d+\.\d+) s", follower_log)]
    return {
        "ready": catchup["ready_s"],
        "leader_snapshot_build_started": first(leader_log, _SNAPSHOT_STARTED),
        "leader_snapshot_built": first(leader_log, _SNAPSHOT_BUILT),
        "follower_state_restored": first(follower_log, _RESTORED),
        "high_watermark_reached": catchup["seconds"],
        "follower_longest_ticker_stall_s": max(stalls, default=0.0),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="txbroker bench catchup", description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=1024, help="MiB of record payload to write (default 1024)")
    add_partition_write_arguments(p, "the catch-up")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    settings = node_settings_or_exit(parser, opts)
    if opts.mib < 1:
        parser.error("--mib must be at least 1")
    out: dict[str, Any] = {
        "command": "txbroker bench catchup " + " ".join(argv or []),
        "machine": machine_info(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "config": {
            "mib": opts.mib,
            "record_size": opts.record_size,
            "batch_bytes": opts.batch_bytes,
            "concurrency": opts.concurrency,
            "node_settings": settings,
        },
    }
    workdir = Path(opts.keep) if opts.keep else Path(tempfile.mkdtemp(prefix="txbroker-bench-catchup-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with BenchCluster(workdir, settings=settings) as cluster:
            cluster.start()
            cluster.create_topic(TOPIC, 1)
            leaders, _balanced = cluster.preferred_leaders(TOPIC)  # where the leader balancer leaves it
            out["write"] = asyncio.run(write(cluster, leaders[0], opts))
            leader = cluster.node_of_url(wait_for(lambda: cluster.leaders(TOPIC).get(0), 30, "the leader"))
            target = wait_for(lambda: int(_partition(cluster, leader)["high_watermark"]), 60, "the leader's HW")
            others = [c.node_id for c in cluster.configs if c.node_id != leader]
            wait_for(lambda: all(int(_partition(cluster, n)["high_watermark"]) >= target for n in others), 600,
                     "every replica at the high watermark before the replacement")  # fmt: skip
            stored = [v for labels, v in cluster.scrape_nodes()[leader - 1].get(
                "txbroker_partition_log_size_bytes", []) if labels.get("topic") == TOPIC]  # fmt: skip
            out["leader_replica_mib"] = round(sum(stored) / MIB, 1)
            group = _group_id(cluster, leader)
            follower = others[-1]
            out["leader"], out["replaced"], out["high_watermark"] = leader, follower, target
            catchup = replace_follower(cluster, follower, target, opts.timeout)
            catchup["phases_s"] = _phases(workdir, group, leader, follower, catchup)
            out["catchup"] = catchup
    finally:
        if not opts.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    ratio = round(out["catchup"]["seconds"] / max(1e-9, out["write"]["seconds"]), 2)
    out["catchup_vs_write"] = ratio
    out["target_ratio"] = TARGET_RATIO
    out["meets_target"] = ratio <= TARGET_RATIO
    if opts.json:
        print(json.dumps(out))
        return 0
    print(json.dumps(out, indent=2))
    verdict = "meets" if out["meets_target"] else "MISSES"
    print(f"write {out['write']['seconds']} s ({out['write']['mib_per_s']} MiB/s), catch-up "
          f"{out['catchup']['seconds']} s: ratio {ratio} ({verdict} the {TARGET_RATIO} target)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
