"""``txbroker bench produce|fetch|failover|idle|create|all``: throughput, latency, failover time, idle cost and
topic creation at scale.

Every scenario starts its own fresh 3-node cluster (node processes on loopback,
ports chosen at run time, data in a temp dir) and stops every process it
started, on error and Ctrl-C too. ``all`` runs fetch on the produce cluster.
The produce scenario also measures, in the same run, bare replication of the
same batch bytes by stock PySyncObj and by the raft/ layer, and raw rocksdict
puts and ``PartitionLog.apply`` (``bench.baselines``), and reports the broker's
rate as ratios of them.
``idle``, ``create`` and ``failover --partitions N`` (many partitions) are in
``bench.scale``; ``all`` runs every scenario but ``create``.
See BENCHMARKS.md for results and what limits them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from clients.protocol import BATCHES_CONTENT_TYPE, decode_fetch_batches

from .baselines import baseline, rocksdict_rates
from .harness import BenchCluster, fresh_cluster
from .measure import machine_info, pct, self_cpu
from .produce_load import TOPIC, Load, PartitionWriter, drive_produce, make_records
from .profiling import start_profile, summarize_profile
from .scale import scenario_create, scenario_failover_many, scenario_idle

SCENARIOS = ("produce", "fetch", "failover", "idle", "create")
ALL = ("produce", "fetch", "failover", "idle")


# ---- scenarios ----------------------------------------------------------------------


def scenario_produce(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    with fresh_cluster() as cluster:
        cluster.create_topic(TOPIC, opts.produce_partitions)
        leaders, balanced = cluster.preferred_leaders(TOPIC)
        prof: list[Any] = []

        def on_window() -> None:
            if opts.profile:  # every node: leaders and followers do different work
                for node, proc in cluster.procs.items():
                    out = Path(opts.profile).resolve() / f"produce-node{node}.txt"
                    out.parent.mkdir(parents=True, exist_ok=True)
                    prof.append((start_profile(proc.pid, opts.duration, out), out, node))

        res = asyncio.run(drive_produce(cluster, leaders, opts, on_window))
        res["leaders_balanced"] = balanced
        for proc, out, node in prof:
            if proc is not None and proc.wait(60) == 0 and out.exists():
                res.setdefault("profile", {})[f"node{node}"] = {"file": str(out), **summarize_profile(out)}
        if "fetch" in opts.scenarios:
            shared["fetch_cluster"] = asyncio.run(drive_fetch(cluster, opts))
    size, outstanding = res["batch_wire_bytes"], opts.baseline_outstanding
    bare = baseline(True, size, outstanding, opts.duration)
    layer = baseline(False, size, outstanding, opts.duration)
    rocks = rocksdict_rates(size, 1000)
    wire = res["mb_per_s"] * size / (opts.record_size * max(1, opts.batch_bytes // opts.record_size))
    res["wire_mb_per_s"] = round(wire, 2)
    res["bare_pysyncobj"] = bare
    res["raft_layer"] = layer
    res["rocksdict"] = rocks
    res["ratio_vs_bare_pysyncobj"] = round(wire / bare["mb_per_s"], 3) if bare.get("mb_per_s") else None
    res["ratio_vs_raft_layer"] = round(wire / layer["mb_per_s"], 3) if layer.get("mb_per_s") else None
    res["ratio_vs_rocksdict_put"] = round(wire / rocks["raw_put_mb_per_s"], 3)
    res["targets"] = {  # the raft layer runs the broker's own transport and settings: the honest ratio
        ">=25MB/s": res["mb_per_s"] >= 25,
        ">=70%_of_raft_layer": (res["ratio_vs_raft_layer"] or 0) >= 0.7,
        ">=70%_of_stock_pysyncobj": (res["ratio_vs_bare_pysyncobj"] or 0) >= 0.7,
    }
    res.pop("_extra", None)
    return res


async def drive_fetch(cluster: BenchCluster, opts: argparse.Namespace) -> dict[str, Any]:
    """Read every partition from offset 0 to its high watermark from its leader (binary batches).

    Passes over the whole log repeat for at least min(duration, 5) s.
    """
    leaders = cluster.leaders(TOPIC)
    total_bytes = total_records = requests = passes = 0
    lat: list[float] = []
    until = time.monotonic() + min(opts.duration, 5.0)
    async with aiohttp.ClientSession() as session:

        async def read(partition: int, url: str) -> None:
            nonlocal total_bytes, total_records, requests, passes
            offset = 0
            while time.monotonic() < until or offset > 0:
                t0 = time.perf_counter()
                async with session.get(f"{url}/v1/topics/{TOPIC}/partitions/{partition}/records",
                                       params={"offset": offset, "max_bytes": opts.fetch_max_bytes,
                                               "format": "binary"}) as resp:  # fmt: skip
                    if resp.content_type != BATCHES_CONTENT_TYPE:
                        raise RuntimeError(f"fetch {partition}@{offset}: {resp.status} {await resp.text()}")
                    data = decode_fetch_batches(await resp.read())
                lat.append(time.perf_counter() - t0)
                requests += 1
                for b in data.batches:
                    total_records += b.header.record_count
                    total_bytes += len(b.data)
                if not data.batches:
                    return
                offset = data.batches[-1].last_offset + 1
                if offset >= data.high_watermark:  # whole log read: start another pass while time is left
                    offset, passes = 0, passes + 1

        c0, t0 = self_cpu(), time.monotonic()
        await asyncio.gather(*(read(p, str(u)) for p, u in leaders.items()))
        wall, cpu = time.monotonic() - t0, self_cpu() - c0
    lat.sort()
    return {"seconds": round(wall, 2), "wire_mb_per_s": round(total_bytes / wall / 1e6, 2),
            "records_per_s": round(total_records / wall), "records": total_records, "requests": requests,
            "log_passes": passes,
            "p50_ms": round(pct(lat, 0.5) * 1e3, 1), "p99_ms": round(pct(lat, 0.99) * 1e3, 1),
            "client_cpu_pct": round(100 * cpu / wall, 1)}  # fmt: skip


def scenario_fetch(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    if "fetch_cluster" in shared:  # `all`: read what the produce scenario wrote, on its cluster
        return dict(shared["fetch_cluster"])
    with fresh_cluster() as cluster:
        leaders = cluster.create_topic(TOPIC, opts.produce_partitions)
        produced = asyncio.run(drive_produce(cluster, leaders, opts))
        res = asyncio.run(drive_fetch(cluster, opts))
    res["produced_mb_per_s"] = produced["mb_per_s"]
    return res


def scenario_failover(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    if opts.partitions is not None:  # many partitions: kill the node leading the most (``bench.scale``)
        return scenario_failover_many(opts, shared)
    with fresh_cluster() as cluster:
        leaders = cluster.create_topic(TOPIC, 1)
        pid, epoch = cluster.init_producer()
        records = make_records(opts.record_size, opts.batch_bytes)
        rounds: list[dict[str, Any]] = []

        async def run() -> None:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                w = PartitionWriter(cluster, session, 0, leaders[0], pid, epoch, records, opts.record_size, Load())
                for _ in range(opts.failovers):
                    for c in cluster.configs:  # every node up and ready, a few seconds of steady writes
                        if not cluster.alive(c.node_id):
                            cluster.start_node(c.node_id)
                    await asyncio.to_thread(cluster.wait_ready)
                    steady = time.monotonic() + 3
                    while time.monotonic() < steady:
                        await w.send_one()
                    victim = cluster.node_of_url(w.leader)
                    t_kill = time.monotonic()
                    cluster.kill(victim)
                    while True:
                        _, acked_by = await w.send_one()
                        if cluster.node_of_url(acked_by) != victim:
                            break
                    took = time.monotonic() - t_kill
                    rounds.append({"killed": victim, "new_leader": cluster.node_of_url(acked_by),
                                   "seconds": round(took, 3)})  # fmt: skip

        asyncio.run(run())
    times = [r["seconds"] for r in rounds]
    med = statistics.median(times)
    return {"rounds": rounds, "median_s": round(med, 3), "max_s": max(times), "target_le_3s": med <= 3.0}


RUNNERS: dict[str, Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]]] = {
    "produce": scenario_produce, "fetch": scenario_fetch, "failover": scenario_failover, "idle": scenario_idle,
    "create": scenario_create,
}  # fmt: skip


# ---- output -------------------------------------------------------------------------


def render(value: Any, indent: int = 0) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if (isinstance(v, dict) and v) or (isinstance(v, list) and v and isinstance(v[0], dict)):
                lines.append(f"{pad}{k}:")
                lines += render(v, indent + 1)
            elif isinstance(v, list) and v:
                lines.append(f"{pad}{k}:")
                lines += [f"{pad}  {x}" for x in v]
            else:
                lines.append(f"{pad}{str(k) + ':':<28} {v}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            lines.append(f"{pad}- [{i}]")
            lines += render(v, indent + 1)
    else:
        lines.append(f"{pad}{value}")
    return lines


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="txbroker bench", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("scenario", nargs="?", default="all", choices=[*SCENARIOS, "all"])
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--duration", type=float, default=15.0, help="measured seconds of load (after the warm-up)")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--batch-bytes", type=int, default=64 * 1024, help="record payload bytes per batch")
    p.add_argument("--partitions", type=int, default=None,
                   help="partitions of the produce topic (RF 3; default 3); for failover: the many-partitions "
                        "mode, one topic of N partitions, the node leading the most killed")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=5, choices=range(1, 6), metavar="K",
                   help="requests in flight per partition (1..5; 5 = the Python client's default "
                        "max_in_flight_requests_per_connection)")  # fmt: skip
    p.add_argument("--no-idempotence", dest="idempotence", action="store_false",
                   help="plain writes (producer id -1) instead of idempotent ones")  # fmt: skip
    p.add_argument("--baseline-outstanding", type=int, default=32,
                   help="commands in flight in the bare replication baselines")  # fmt: skip
    p.add_argument("--fetch-max-bytes", type=int, default=1 << 20)
    p.add_argument("--failovers", type=int, default=3)
    p.add_argument(
        "--idle-partitions",
        default="64",
        help="comma-separated topic sizes, each measured on a fresh cluster (e.g. 64,512,4096)",
    )
    p.add_argument("--idle-seconds", type=float, default=20.0)
    p.add_argument("--idle-produce", action="store_true",
                   help="idle: also produce on 3 partitions beside the largest size's idle ones, against a cluster "
                        "with none (opts --duration, --warmup)")  # fmt: skip
    p.add_argument("--create-partitions", type=int, default=1024, help="create: partitions of the topic (RF 3)")
    p.add_argument(
        "--create-timeout",
        type=float,
        default=300.0,
        help="seconds a topic creation may take until every partition has a leader",
    )
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=5.0,
        help="failover --partitions: idle seconds between the last leader elected and the kill",
    )
    p.add_argument(
        "--failover-timeout",
        type=float,
        default=60.0,
        help="failover --partitions: seconds to wait for every partition to be led again",
    )
    p.add_argument("--idle-settle-s", type=float, default=90.0,
                   help="idle: longest wait for leadership and quiescence to settle before measuring")  # fmt: skip
    p.add_argument("--profile", metavar="DIR", help="py-spy every node during the produce window; stacks to DIR")
    args = p.parse_args(argv)
    args.scenarios = list(ALL) if args.scenario == "all" else [args.scenario]
    args.produce_partitions = args.partitions or 3
    return args


def main(argv: list[str]) -> int:
    opts = parse_args(argv)

    def on_term(*_a: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    report: dict[str, Any] = {"command": "txbroker bench " + shlex.join(argv), "machine": machine_info(),
                              "scenarios": {}}  # fmt: skip
    shared: dict[str, Any] = {}
    status = 0
    for name in opts.scenarios:
        if not opts.json:
            print(f"== {name} ...", file=sys.stderr, flush=True)
        try:
            report["scenarios"][name] = RUNNERS[name](opts, shared)
        except KeyboardInterrupt:
            print("interrupted; every node process was stopped", file=sys.stderr)
            return 130
        except Exception as exc:  # report and go on with the next scenario
            report["scenarios"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            status = 1
    if opts.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(render(report)))
    return status
