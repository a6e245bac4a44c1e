"""Transaction benchmarks, through the real clients on a fresh 3-node cluster.

* **produce**: ``AsyncProducer`` sending 1 KB records as fast as it can,
  idempotent vs transactional with a commit every ``commit_interval_ms``
  (100 ms). Long-lived producers take turns in short windows (order shuffled per round), so
  the machine's drift hits both alike. Overhead = 1 - transactional /
  idempotent records/s over all windows. A second idempotent producer (the
  A/A control) shows the ratio no overhead would give: this machine's noise.
  Kafka reports ~3% at these settings (kafka_txn.md §9); the target is <= 2%.
* **consume**: a log of transactions with 10% of them aborted, read from the
  start to its end by ``AsyncConsumer`` with read_committed vs
  read_uncommitted, alternating. Throughput is log bytes covered per second
  (time to reach the end offsets): the work a reader does to get through the
  log, whether or not it keeps the records. Target ratio >= 0.98.
* **visible latency**: a transactional producer sends at a fixed rate and
  commits every ``commit_interval_ms``; a read_committed consumer in the same
  process tails the topic. Latency is ``send()`` to the ``poll()`` that
  returned the record (values carry the send time). A record waits for its
  transaction's commit, so the floor is the interval; target p99 <= interval + 50 ms.
* **commit cycle**: where one commit's time goes at full speed -- ``flush()``
  (the buffer drains; the broker is busy), EndTxn, and the next transaction's
  first acknowledgement (its verification and add at the coordinator, which
  also waits for the previous marker on that partition, then its own batch);
  the last two are time in which the nodes have little to replicate
  (``docs/pipelined-transactions.md``). It also reports how many cores the
  whole host kept busy in each phase (sending, flush, EndTxn): on a host the
  nodes and the client saturate, a phase with few busy cores is idle time a
  commit costs, and one with as many as sending is not.
* **commit chain**: at light load (one small record per partition per
  transaction), the serial time a commit puts between two transactions:
  EndTxn, plus what the next transaction's first records wait beyond an
  idempotent producer's round trip (verification and the add at the
  coordinator). It bounds the overhead at short commit intervals
  (``docs/pipelined-transactions.md``).
* **coordinator failover**: a commit is decided (PrepareCommit durable) but
  cannot complete because the node holding a replication-factor-1 partition
  of the transaction is SIGSTOPped; then the coordinator node is SIGKILLed
  and the paused node continued. Measured: SIGKILL to CompleteCommit seen on
  a surviving node. Target <= 5 s. (``commit_transaction`` returns once
  PrepareCommit is durable, normally before the kill; the report says so.)

``txbroker bench txn [--rounds N] [--duration S] [--only ...]`` (also
``python -m bench.txn``) runs all six and prints the report as JSON;
``run_txn_bench(opts)`` returns it. The parts live in ``bench.txn_produce``
(with its report in ``bench.txn_report``), ``bench.txn_reads`` (consume,
visible latency), ``bench.txn_commit`` (cycle, chain) and
``bench.txn_failover``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from typing import Any

from clients.protocol import BrokerError

from .harness import add_node_setting_argument, fresh_cluster, node_settings_or_exit
from .measure import machine_info
from .txn_commit import commit_chain, commit_cycle
from .txn_failover import coordinator_failover
from .txn_produce import TOPICS, produce_comparison
from .txn_reads import consume_comparison, visible_latency

__all__ = ["add_arguments", "run_txn_bench"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    # One read of the 100,000-offset log takes about 0.5 s and single rounds range 0.8-1.4 on the 2-core bench
    # machine: 5 rounds give medians from 0.95 to 1.13 for the same code; 15 settle it within a few percent.
    p.add_argument("--rounds", type=int, default=15, help="alternating rounds of the consume comparison")
    p.add_argument("--duration", type=float, default=8.0, help="measured seconds of the cycle part")
    p.add_argument("--produce-windows", type=int, default=12, help="alternating window rounds of the produce part")
    p.add_argument("--window", type=float, default=3.0, help="seconds per produce window")
    p.add_argument("--seed", type=int, default=1, help="seed of the produce part's per-round window order")
    p.add_argument("--window-warmup", type=float, default=0.5, help="unmeasured start of each produce window")
    p.add_argument(
        "--aa-control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="produce part: also a second idempotent producer, the noise floor of the ratio",
    )
    p.add_argument(
        "--pipelined",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="produce part: also a transactional producer that commits with commit_and_begin (the next "
        "transaction's records are batched while the commit runs)",
    )
    p.add_argument(
        "--floor-control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="produce part: also an idempotent producer whose commit is a flush, then one offset commit (one "
        "round trip and one replicated write): what the least a commit protocol could do costs",
    )
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--commit-interval-ms", type=int, default=100)
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--buffer-memory", type=int, default=4 * 1024 * 1024)
    add_node_setting_argument(p)
    p.add_argument("--allow-disk-short", action="store_true",
                   help="run the produce part even when the temporary directory looks too small for it")  # fmt: skip
    p.add_argument("--fill-txns", type=int, default=200, help="transactions in the consume log (10%% aborted)")
    p.add_argument("--fill-txn-records", type=int, default=500)
    p.add_argument("--latency-rate", type=int, default=2000, help="records/s of the visibility-latency run")
    p.add_argument("--latency-seconds", type=float, default=10.0)
    p.add_argument("--failovers", type=int, default=3)
    p.add_argument("--chain-cycles", type=int, default=150, help="light-load cycles of the chain measurement")
    p.add_argument("--only", nargs="+", default=["produce", "consume", "latency", "cycle", "chain", "failover"],
                   choices=["produce", "consume", "latency", "cycle", "chain", "failover"])  # fmt: skip


# What the produce part stores: one producer at a time at up to ~50 MB/s, 3 replicas, no retention (a 40-window
# run of 2.5 s windows writes about 53 GB at ~46k records/s of 1 KiB).
_PRODUCE_BYTES_PER_S = 3 * 50e6


def _check_disk_space(opts: argparse.Namespace) -> None:
    """Refuse a produce part the temporary directory cannot hold (``--allow-disk-short`` runs it anyway)."""
    if "produce" not in opts.only:
        return
    modes = 3 + bool(opts.aa_control) + bool(opts.floor_control) + bool(opts.pipelined)
    need = opts.produce_windows * modes * opts.window * _PRODUCE_BYTES_PER_S
    free = shutil.disk_usage(tempfile.gettempdir()).free
    if free >= 1.2 * need:
        return
    msg = (f"the produce part may write {need / 1e9:.0f} GB; {tempfile.gettempdir()} has {free / 1e9:.0f} GB free "
           "(fewer --produce-windows, or TMPDIR elsewhere)")  # fmt: skip
    if not opts.allow_disk_short:
        raise SystemExit(f"bench txn: {msg}; --allow-disk-short runs it anyway")
    print(f"warning: {msg}", file=sys.stderr)


def run_txn_bench(opts: argparse.Namespace, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every selected part on one fresh cluster; returns the report (errors per part, not raised).

    ``settings``: node settings off their defaults (``--node-setting``, parsed by ``main``).
    """
    report: dict[str, Any] = {}
    _check_disk_space(opts)
    with fresh_cluster("txbroker-bench-txn-", settings) as cluster:
        urls = [c.url for c in cluster.configs]
        topics = (*TOPICS.values(), "bench-aborted-10pct", "bench-visible", "bench-cycle", "bench-chain")
        cluster.create_topics(topics, opts.partitions)
        # Every topic led by its preferred replicas (one leader per node) before anything is measured: the
        # leader balancer moving a partition mid-window costs that window retries and throughput.
        report["leaders_balanced"] = {t: cluster.preferred_leaders(t)[1] for t in topics}
        parts = {
            "produce": lambda: asyncio.run(
                produce_comparison(urls, opts, cluster.nodes_cpu, cluster.nodes_cpu_by_kind, cluster.counters)
            ),
            "consume": lambda: asyncio.run(consume_comparison(urls, opts)),
            "latency": lambda: asyncio.run(visible_latency(urls, opts)),
            "cycle": lambda: asyncio.run(commit_cycle(urls, opts)),
            "chain": lambda: asyncio.run(commit_chain(urls, opts, cluster.nodes_cpu)),
            "failover": lambda: coordinator_failover(cluster, opts),
        }
        for name in opts.only:
            changes, stalls = cluster.leader_changes(), cluster.ticker_stalls()
            try:
                report[name] = parts[name]()
            except (BrokerError, RuntimeError, AssertionError, TimeoutError) as exc:
                report[name] = {"error": f"{type(exc).__name__}: {exc}"}
            # A leadership move during a part stalls its windows for about a second; a report that
            # shows one tells a disturbed run from a slow one. (The failover part kills and restarts
            # nodes on purpose, which also resets their counters.)
            if name != "failover":
                report[name]["leader_changes_seen_by_nodes"] = cluster.leader_changes() - changes
                report[name]["ticker_stalls_seen_by_nodes"] = cluster.ticker_stalls() - stalls
    return report


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.txn", description=__doc__.splitlines()[0])
    add_arguments(ap)
    opts = ap.parse_args(argv)
    settings = node_settings_or_exit(ap, opts)
    report = {"command": "python -m bench.txn " + " ".join(argv), "machine": machine_info(),
              **run_txn_bench(opts, settings)}  # fmt: skip
    print(json.dumps(report, indent=2))
    return 0 if not any("error" in v for v in report.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
