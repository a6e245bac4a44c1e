"""What a produce request costs the nodes at full load and below it, at the same batch size.

One fresh 3-node cluster (``bench.harness.BenchCluster``), one idempotent
``AsyncProducer`` (1 KiB records, ``linger_ms=5``, 64 KiB batches) held at each
offered rate in turn (0 = as fast as it goes), in rounds of short windows so
that machine drift falls on every rate alike. Per rate: records/s, the node
processes' CPU per record and per produce request, produce requests and Raft
messages per 1,000 records. Batches stay full down to about 30,000 records/s on
3 partitions, so what changes with the rate is how much the work coalesces: an
AppendEntries carrying several entries, one wake-up serving several requests.
BENCHMARKS.md has the numbers; a commit's cost at full load
follows from them (docs/pipelined-transactions.md).

    txbroker bench load [--rates 0,45000,40000,30000] [--rounds 5] [--window 2.5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from clients.aio.producer import AsyncProducer

from .harness import BenchCluster, add_node_setting_argument, fresh_cluster, node_settings_or_exit
from .measure import sum_samples

_TOPIC = "bench-load"
_RAFT_MESSAGES = "txbroker_raft_messages_sent_total"
_REQUESTS = "txbroker_http_requests_total"


def _counters(cluster: BenchCluster) -> dict[str, float]:
    scrapes = cluster.scrape_nodes()
    return {
        "raft_messages": sum_samples(scrapes, _RAFT_MESSAGES),
        "produce_requests": sum_samples(scrapes, _REQUESTS, route="/v1/produce"),
    }


async def _window(
    p: AsyncProducer, cluster: BenchCluster, value: bytes, rate: float, opts: argparse.Namespace
) -> dict[str, float]:
    """``opts.window`` s at ``rate`` records/s (0: unthrottled); deltas after ``opts.warmup`` s."""
    start = now = time.monotonic()
    t_w, t_end = start + opts.warmup, start + opts.window
    before: dict[str, float] | None = None
    a0 = t0 = c0 = 0.0
    i = 0
    while now < t_end:
        await p.send(_TOPIC, value)
        i += 1
        if i % 32:
            continue
        now = time.monotonic()
        if rate > 0 and (due := start + i / rate) > now:
            await asyncio.sleep(due - now)
            now = time.monotonic()
        if before is None and now >= t_w:
            # The counters' scrape (it costs the nodes a little) outside the CPU window: before it opens, after it
            # closes; records, time and CPU are read together.
            before = await asyncio.to_thread(_counters, cluster)
            a0, t0, c0 = p.metrics()["records_acked"], time.monotonic(), cluster.nodes_cpu()
    a1, t1, c1 = p.metrics()["records_acked"], time.monotonic(), cluster.nodes_cpu()
    after = await asyncio.to_thread(_counters, cluster)
    await p.flush()
    assert before is not None, "the window is shorter than its warm-up"
    out = {k: after[k] - before[k] for k in after}
    out.update(records=a1 - a0, seconds=t1 - t0, nodes_cpu_s=c1 - c0)
    return out


def _summary(ws: list[dict[str, float]]) -> dict[str, float]:
    tot = {k: sum(w[k] for w in ws) for k in ws[0]}
    n = max(1.0, tot["records"])
    return {
        "records_per_s": round(tot["records"] / tot["seconds"]),
        "nodes_cpu_us_per_record": round(1e6 * tot["nodes_cpu_s"] / n, 2),
        "nodes_cpu_ms_per_request": round(1e3 * tot["nodes_cpu_s"] / max(1.0, tot["produce_requests"]), 3),
        "nodes_busy_cores": round(tot["nodes_cpu_s"] / tot["seconds"], 3),
        "produce_requests_per_1k_records": round(1e3 * tot["produce_requests"] / n, 2),
        "raft_messages_per_1k_records": round(1e3 * tot["raft_messages"] / n, 1),
    }


async def sweep(cluster: BenchCluster, opts: argparse.Namespace) -> dict[str, Any]:
    urls = [c.url for c in cluster.configs]
    value = os.urandom(opts.record_size)
    windows: dict[float, list[dict[str, float]]] = {r: [] for r in opts.rates}
    changes_before = await asyncio.to_thread(cluster.leader_changes)  # the start-up elections are not the run's
    async with AsyncProducer(urls, linger_ms=opts.linger_ms, buffer_memory=opts.buffer_memory) as p:
        await p.partitions_for(_TOPIC)
        for _ in range(opts.rounds):
            for rate in opts.rates:
                windows[rate].append(await _window(p, cluster, value, rate, opts))
    return {
        "rates": {("unthrottled" if r == 0 else f"{r:.0f}/s"): _summary(ws) for r, ws in windows.items()},
        "config": {
            "partitions": opts.partitions,
            "record_size": opts.record_size,
            "linger_ms": opts.linger_ms,
            "rounds": opts.rounds,
            "window_s": opts.window,
            "warmup_s": opts.warmup,
            "node_settings": opts.node_setting,
        },
        "leader_changes_seen_by_nodes": await asyncio.to_thread(cluster.leader_changes) - changes_before,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="txbroker bench load", description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="0,45000,40000,30000", help="offered records/s, comma-separated; 0 = unthrottled")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--window", type=float, default=2.5)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--buffer-memory", type=int, default=4 * 1024 * 1024)
    add_node_setting_argument(p)
    p.add_argument("--json", action="store_true")
    opts = p.parse_args(argv)
    try:
        opts.rates = [float(r) for r in opts.rates.split(",")]
    except ValueError:
        p.error(f"--rates must be numbers separated by commas, got {opts.rates!r}")
    if any(r < 0 for r in opts.rates) or opts.window <= opts.warmup or opts.rounds < 1:
        p.error("rates must be >= 0, --window above --warmup, --rounds >= 1")
    settings = node_settings_or_exit(p, opts)
    with fresh_cluster("txbroker-bench-load-", settings) as cluster:
        cluster.create_topic(_TOPIC, opts.partitions)
        cluster.preferred_leaders(_TOPIC)
        res = asyncio.run(sweep(cluster, opts))
    if opts.json:
        print(json.dumps(res, indent=2))
    else:
        for name, s in res["rates"].items():
            print(f"{name:>12}: " + "  ".join(f"{k} {v}" for k, v in s.items()))
        print(f"leader changes seen by the nodes: {res['leader_changes_seen_by_nodes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
