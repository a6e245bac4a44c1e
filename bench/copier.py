"""Copier benchmark: exactly-once copy throughput and the rebalance time after a group member dies.

Two phases against a running cluster (``python -m bench.copier``
starts its own 3-node cluster, like ``txbroker bench``):

* **throughput**: fill an input topic with ``records`` unique records, then
  run the real copier (``cluster.copier.copy``, in this process) until it
  has committed every record, once with a transaction every 100 ms and once
  with a transaction every 500 records. ``records_per_s`` counts from the
  copier's first assignment to its last commit: each record consumed
  (read_committed), produced and committed with its input offset in one
  transaction. Every run is checked: a read_committed consumer reads the
  output back and must find each input value exactly once.
* **rebalance**: two copiers (``txbroker copy`` processes, one group, two
  transactional ids) share the input; one is killed with SIGKILL mid-run.
  ``rebalance_s`` is the time from the kill until the survivor owns every
  input partition (the coordinator expels the dead member after its session
  timeout); ``takeover_s`` until the survivor's first commit on a partition
  of the dead member (it must also wait for the dead member's open
  transaction to be aborted at its ``transaction_timeout_ms``: the new owner
  reads only stable offsets, KIP-447). A clean stop (SIGTERM: the member
  leaves the group) is measured the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from clients.aio import AsyncConsumer, AsyncProducer
from clients.protocol import BrokerError, ErrorCode
from cluster.copier import CopierConfig, copy

from .consume import ensure_topic
from .harness import REPO, fresh_cluster, http_json, wait_for
from .measure import machine_info

# Short session/transaction timers for the rebalance phase (the cluster must allow them).
CLUSTER_OVERRIDES = {"group_min_session_timeout_ms": 1000, "transaction_abort_scan_interval_ms": 500}


def value_of(i: int, size: int) -> bytes:
    head = f"{i:010d}".encode()
    return head + b"x" * max(0, size - len(head))


async def _fill(urls: list[str], topic: str, records: int, size: int) -> float:
    t0 = time.perf_counter()
    async with AsyncProducer(urls, linger_ms=20, batch_size=256 * 1024) as producer:
        futures = [await producer.send(topic, value=value_of(i, size)) for i in range(records)]
        await producer.flush()
    await asyncio.gather(*futures)
    return time.perf_counter() - t0


async def _verify(urls: list[str], topic: str, records: int) -> None:
    """Read the output with read_committed: every input value exactly once, or raise.

    The last commit's markers may land a moment after the copier returns, so the read goes on to fresh
    end offsets until it holds ``records`` values (or 120 s pass)."""
    async with AsyncConsumer(urls, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        n = await consumer.partitions_for_topic(topic)
        tps = [(topic, p) for p in sorted(n)]
        consumer.assign(tps)
        seen: Counter[bytes] = Counter()
        deadline = time.monotonic() + 120
        while True:
            ends = await consumer.end_offsets(tps)
            while any([await consumer.position(tp) < ends[tp] for tp in tps]):
                if time.monotonic() > deadline:
                    raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"{topic}: output not read back within 120 s")
                for r in await consumer.poll(500, max_records=10_000):
                    seen[(r.value or b"")[:10]] += 1
            if sum(seen.values()) >= records or time.monotonic() > deadline:
                break
            for r in await consumer.poll(100, max_records=10_000):  # a short long-poll: the markers are on their way
                seen[(r.value or b"")[:10]] += 1
    dups = sum(1 for k in seen.values() if k > 1)
    if len(seen) != records or dups:
        raise BrokerError(
            ErrorCode.UNKNOWN_SERVER_ERROR,
            f"{topic}: {len(seen)} distinct values ({dups} duplicated), expected {records}",
        )


async def _throughput(
    urls: list[str], src: str, name: str, records: int, out_partitions: int, commit_every: int, commit_every_ms: int
) -> dict[str, Any]:
    dst = f"{src}-out-{name}"
    await ensure_topic(urls, dst, out_partitions, 3)
    events: list[tuple[float, dict[str, Any]]] = []
    config = CopierConfig(
        bootstrap=",".join(urls), input_topic=src, output_topic=dst, group_id=f"bench-{name}",
        transactional_id=f"bench-{name}", commit_every=commit_every, commit_every_ms=commit_every_ms,
        max_records=records, progress_interval_ms=0,
    )  # fmt: skip
    c0, t0 = os.times(), time.perf_counter()
    stats = await copy(config, emit=lambda e: events.append((time.perf_counter(), e)))
    wall, c1 = time.perf_counter() - t0, os.times()
    first = next(t for t, e in events if e["stage"] == "Rebalanced")
    last = max(t for t, e in events if e["stage"] == "ProcessLoop")
    await _verify(urls, dst, records)
    copy_s = last - first
    return {
        "commit_every": commit_every or None,
        "commit_every_ms": commit_every_ms or None,
        "records": stats.copied,
        "transactions": stats.transactions,
        "records_per_txn": round(stats.copied / max(1, stats.transactions), 1),
        "aborted": stats.aborted,
        "seconds": round(copy_s, 3),
        "records_per_s": round(stats.copied / copy_s),
        "txn_per_s": round(stats.transactions / copy_s, 1),
        "startup_s": round(first - t0, 3),
        "copier_cpu_pct": round(100 * ((c1.user - c0.user) + (c1.system - c0.system)) / wall, 1),
        "verified_exactly_once": True,
    }


class _Watch:
    """The group as any live node reports it: members, assignments, committed offsets."""

    def __init__(self, urls: list[str], group: str) -> None:
        self.urls, self.group = urls, group

    def get(self, suffix: str) -> Any:
        """The first answer of a node to ``GET /v1/groups/<group><suffix>``; None when none answers."""
        for url in self.urls:
            try:
                status, body = http_json("GET", f"{url}/v1/groups/{self.group}{suffix}", timeout=5)
            except (OSError, ValueError):
                continue
            if status == 200:
                return body
        return None

    def owners(self) -> dict[str, list[tuple[str, int]]]:
        d = self.get("") or {}
        return {
            m["member_id"]: sorted((a["topic"], a["partition"]) for a in m["assignment"]) for m in d.get("members", [])
        }

    def committed(self) -> dict[tuple[str, int], int]:
        d = self.get("/offsets") or {}
        return {(o["topic"], o["partition"]): int(o["offset"]) for o in d.get("offsets", [])}


def _rebalance(
    urls: list[str], src: str, partitions: int, sig: signal.Signals, session_ms: int, txn_timeout_ms: int, workdir: Path
) -> dict[str, Any]:
    """Two copiers; stop one with ``sig`` mid-run; time the survivor's takeover (module docstring)."""
    name = f"rebalance-{sig.name.lower()}"
    group = f"bench-{name}"
    asyncio.run(ensure_topic(urls, f"{src}-out-{name}", 3, 3))
    procs: list[subprocess.Popen[bytes]] = []
    heartbeat_ms = max(100, session_ms // 10)
    try:
        for tid in ("a", "b"):
            with (workdir / f"copier-{name}-{tid}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "cluster", "copy", "--bootstrap", ",".join(urls), "--from", src,
                         "--to", f"{src}-out-{name}", "--group", group, "--transactional-id", f"{group}-{tid}",
                         "--session-timeout-ms", str(session_ms), "--heartbeat-interval-ms", str(heartbeat_ms),
                         "--transaction-timeout-ms", str(txn_timeout_ms), "--commit-every-ms", "100",
                         "--commit-every", "0"],
                        stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)),
                    )
                )  # fmt: skip
        watch = _Watch(urls, group)
        owners = wait_for(
            lambda: (o := watch.owners()) and len(o) == 2 and all(o.values()) and o, 60, "two members", 0.02
        )
        all_tps = sorted(tp for tps in owners.values() for tp in tps)
        wait_for(lambda: sum(watch.committed().values()) > 0, 60, "first commits", 0.02)
        t_kill = time.perf_counter()
        procs[1].send_signal(sig)
        procs[1].wait(30)
        at_kill = watch.committed()
        survivor = wait_for(lambda: (o := watch.owners()) and len(o) == 1 and next(iter(o.values())) == all_tps and o,
                         120, "the survivor to own every partition", 0.02)  # fmt: skip
        t_rebalanced = time.perf_counter()
        (survivor_id,) = survivor
        victim_tps = [tp for mid, tps in owners.items() if mid != survivor_id for tp in tps]

        def resumed() -> bool:
            now = watch.committed()
            return any(now.get(tp, 0) > at_kill.get(tp, 0) for tp in victim_tps)

        wait_for(resumed, 120, "a commit on the dead member's partitions", 0.02)
        t_resumed = time.perf_counter()
        return {
            "stop": sig.name,
            "session_timeout_ms": session_ms,
            "transaction_timeout_ms": txn_timeout_ms,
            "rebalance_s": round(t_rebalanced - t_kill, 3),
            "takeover_s": round(t_resumed - t_kill, 3),
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(10)


async def run_copier_throughput(
    urls: list[str], *, records: int, record_size: int, in_partitions: int, out_partitions: int
) -> dict[str, Any]:
    src = "copier-bench-in"
    await ensure_topic(urls, src, in_partitions, 3)
    fill_s = await _fill(urls, src, records, record_size)
    modes = {
        "every_100ms": await _throughput(urls, src, "100ms", records, out_partitions, 0, 100),
        "every_500_records": await _throughput(urls, src, "500rec", records, out_partitions, 500, 0),
    }
    return {"fill_s": round(fill_s, 2), "record_size": record_size, "input_partitions": in_partitions,
            "output_partitions": out_partitions, **modes}  # fmt: skip


def run_copier_bench(
    urls: list[str],
    workdir: Path,
    *,
    records: int = 100_000,
    record_size: int = 100,
    in_partitions: int = 2,
    out_partitions: int = 3,
    rebalance_records: int = 300_000,
    session_ms: int = 3000,
    txn_timeout_ms: int = 5000,
) -> dict[str, Any]:
    """Both phases (module docstring); the cluster must allow ``session_ms`` (see ``CLUSTER_OVERRIDES``)."""
    throughput = asyncio.run(
        run_copier_throughput(
            urls, records=records, record_size=record_size, in_partitions=in_partitions, out_partitions=out_partitions
        )
    )
    src = "copier-bench-rebalance-in"
    asyncio.run(ensure_topic(urls, src, 2, 3))
    asyncio.run(_fill(urls, src, rebalance_records, record_size))
    rebalance = [
        _rebalance(urls, src, 2, sig, session_ms, txn_timeout_ms, workdir) for sig in (signal.SIGKILL, signal.SIGTERM)
    ]
    return {"throughput": throughput, "rebalance": rebalance}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.copier", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--input-partitions", type=int, default=2)
    p.add_argument("--output-partitions", type=int, default=3)
    p.add_argument("--rebalance-records", type=int, default=300_000, help="input of the rebalance phase")
    p.add_argument("--session-timeout-ms", type=int, default=3000)
    p.add_argument("--transaction-timeout-ms", type=int, default=5000)
    args = p.parse_args(argv)
    # CLUSTER_OVERRIDES: the rebalance phase's short timers
    with fresh_cluster("txbroker-bench-copier-", CLUSTER_OVERRIDES) as cluster:
        res = run_copier_bench(
            cluster.live_urls(),
            cluster.dir,
            records=args.records,
            record_size=args.record_size,
            in_partitions=args.input_partitions,
            out_partitions=args.output_partitions,
            rebalance_records=args.rebalance_records,
            session_ms=args.session_timeout_ms,
            txn_timeout_ms=args.transaction_timeout_ms,
        )
    print(json.dumps({"command": " ".join(sys.argv), "machine": machine_info(), "copier": res}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
