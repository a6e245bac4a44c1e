"""What Prometheus scraping costs: produce throughput with and without a 1 s scrape, in one run.

One fresh 3-node cluster (``bench.harness.BenchCluster``) takes a steady
idempotent produce load; the run alternates windows without and with a
scraper that GETs every node's ``/metrics`` every ``scrape_interval_s``
(what a Prometheus with that interval does to the nodes). Alternating
windows on the same cluster keep machine drift (other processes, page cache,
log growth) out of the comparison. The server-side render time per scrape,
read from the nodes' own ``txbroker_http_request_duration_seconds``, gives a
second, noise-free estimate of the cost.

    txbroker bench metrics [--duration 40] [--window 5] [--json]

``python -m bench.metrics`` takes the same flags; ``measure_metrics_overhead``
(async) runs the comparison and returns the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from cluster.health import scrape

from .harness import BenchCluster
from .measure import proc_stat
from .produce_load import TOPIC, Load, PartitionWriter, make_records


async def _scraper(session: aiohttp.ClientSession, urls: list[str], interval: float, on: asyncio.Event,
                   stats: dict[str, float]) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    while True:
        await on.wait()
        t0 = loop.time()
        for url in urls:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url + "/metrics") as resp:
                    stats["bytes"] += len(await resp.read())
                    stats["scrapes"] += 1
        await asyncio.sleep(max(0.0, interval - (loop.time() - t0)))


def _scrape_latency(urls: list[str]) -> dict[str, float]:
    """Mean server-side time per /metrics request during the run, per node (the nodes' own histogram).

    Under load this is mostly waiting behind produce work on the event loop, not rendering.
    """
    out = {}
    for url in urls:
        m = scrape(url) or {}
        h = "txbroker_http_request_duration_seconds_"
        total, count = (sum(v for lv, v in m.get(h + k, []) if lv.get("route") == "/metrics") for k in ("sum", "count"))
        out[url] = total / count if count else float("nan")
    return out


def _idle_cpu_per_scrape(cluster: BenchCluster, n: int = 50) -> list[float]:
    """Node CPU seconds per /metrics request, measured with back-to-back scrapes of an idle node."""
    out = []
    for c in cluster.configs:
        pid = cluster.procs[c.node_id].pid
        cpu0 = proc_stat(pid)[0]
        for _ in range(n):
            scrape(c.url)
        out.append((proc_stat(pid)[0] - cpu0) / n)
    return out


async def measure_metrics_overhead(
    *,
    duration_s: float = 40.0,
    window_s: float = 5.0,
    warmup_s: float = 3.0,
    scrape_interval_s: float = 1.0,
    partitions: int = 3,
    record_size: int = 1024,
    batch_bytes: int = 64 * 1024,
    concurrency: int = 1,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """Run the comparison on a fresh 3-node cluster (stopped before returning); return the numbers.

    Windows run in off/on/on/off quads (``duration_s / window_s`` of them, rounded to quads): the
    ABBA order cancels a linear drift of throughput over the run (the log grows, RocksDB compacts),
    which plain alternation turns into a bias. ``overhead_pct`` > 0 means scraping cost throughput.
    """
    quads = max(1, round(duration_s / window_s / 4))
    with contextlib.ExitStack() as stack:
        tmp = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="txbroker-bench-metrics-")))
        cluster = stack.enter_context(BenchCluster(tmp))
        await asyncio.to_thread(cluster.start)
        leaders = await asyncio.to_thread(cluster.create_topic, TOPIC, partitions)
        pid, epoch = await asyncio.to_thread(cluster.init_producer)
        urls = [c.url for c in cluster.configs]
        records = make_records(record_size, batch_bytes)
        load = Load()
        scrape_on = asyncio.Event()
        stats = {"bytes": 0.0, "scrapes": 0.0}
        windows: list[dict[str, Any]] = []
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as session:
            writers = [PartitionWriter(cluster, session, p, url, pid, epoch, records, record_size, load)
                       for p, url in sorted(leaders.items())]  # fmt: skip
            tasks = [asyncio.create_task(w.run_slot()) for w in writers for _ in range(concurrency)]
            scraper = asyncio.create_task(_scraper(session, urls, scrape_interval_s, scrape_on, stats))
            try:
                await asyncio.sleep(warmup_s)
                for i in range(4 * quads):
                    scraping = i % 4 in (1, 2)
                    if scraping:
                        scrape_on.set()
                    else:
                        scrape_on.clear()
                    cpu0 = cluster.nodes_cpu()
                    s0, t0 = stats["scrapes"], time.monotonic()
                    await asyncio.sleep(window_s)
                    t1 = time.monotonic()
                    cpu1 = cluster.nodes_cpu()
                    w = load.window(t0, t1)
                    windows.append({
                        "scrape": scraping, "mb_per_s": w["mb_per_s"], "records_per_s": w["records_per_s"],
                        "p99_ms": w["p99_ms"], "node_cpu_pct": round(100 * (cpu1 - cpu0) / (t1 - t0), 1),
                        "scrapes": int(stats["scrapes"] - s0),
                    })  # fmt: skip
            finally:
                scrape_on.clear()
                scraper.cancel()
                for wr in writers:
                    wr.stop = True
                await asyncio.wait(tasks, timeout=30)
                for t in (*tasks, scraper):
                    t.cancel()
                await asyncio.gather(*tasks, scraper, return_exceptions=True)
        latency = await asyncio.to_thread(_scrape_latency, urls)
        cpu_per_scrape = await asyncio.to_thread(_idle_cpu_per_scrape, cluster)
    off = [w["mb_per_s"] for w in windows if not w["scrape"]]
    on = [w["mb_per_s"] for w in windows if w["scrape"]]
    mean_off, mean_on = statistics.mean(off), statistics.mean(on)
    # one estimate per quad: (off1 + off2) vs (on1 + on2), taken from the same few seconds
    per_pair = [
        100 * ((off[2 * q] + off[2 * q + 1]) - (on[2 * q] + on[2 * q + 1])) / (off[2 * q] + off[2 * q + 1])
        for q in range(len(off) // 2)
        if off[2 * q] + off[2 * q + 1] > 0
    ]
    return {
        "scrape_interval_s": scrape_interval_s,
        "window_s": window_s,
        "windows": windows,
        "mb_per_s_without_scrape": round(mean_off, 2),
        "mb_per_s_with_scrape": round(mean_on, 2),
        "overhead_pct": round(100 * (mean_off - mean_on) / mean_off, 2) if mean_off else None,
        "overhead_pct_per_pair": [round(x, 1) for x in per_pair],
        "overhead_pct_median_pair": round(statistics.median(per_pair), 2) if per_pair else None,
        "metrics_bytes_per_scrape": round(stats["bytes"] / stats["scrapes"]) if stats["scrapes"] else None,
        "scrape_latency_ms_under_load": [round(v * 1e3, 1) for v in latency.values()],
        "node_cpu_ms_per_scrape": [round(v * 1e3, 2) for v in cpu_per_scrape],
        # what one scrape per interval costs a node, as % of one core: the cost without throughput noise
        "scrape_cpu_pct_of_core": round(max(cpu_per_scrape) / scrape_interval_s * 100, 2),
        "target_lt_3pct": (mean_off - mean_on) / mean_off < 0.03 if mean_off else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.metrics", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=40.0, help="measured seconds (off and on windows together)")
    p.add_argument("--window", type=float, default=5.0)
    p.add_argument("--scrape-interval", type=float, default=1.0)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    res = asyncio.run(measure_metrics_overhead(duration_s=a.duration, window_s=a.window,
                                               scrape_interval_s=a.scrape_interval, partitions=a.partitions,
                                               concurrency=a.concurrency))  # fmt: skip
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        for w in res.pop("windows"):
            print(f"  {'scrape' if w['scrape'] else 'quiet ':<7} {w['mb_per_s']:7.2f} MB/s  p99 {w['p99_ms']:6.1f} ms  "
                  f"node cpu {w['node_cpu_pct']:5.1f}%  scrapes {w['scrapes']}")  # fmt: skip
        for k, v in res.items():
            print(f"{k + ':':<28} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
