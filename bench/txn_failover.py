"""``txbroker bench txn``'s failover part: a decided commit completes after its coordinator is SIGKILLed.

The node holding a replication-factor-1 partition of the transaction is
SIGSTOPped, so the commit stays at PrepareCommit; then the coordinator node is
killed and the paused node continued. Measured: SIGKILL to CompleteCommit seen
on a surviving node. The killed node is restarted before the next attempt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import threading
import time
from typing import Any

from clients.aio.producer import AsyncProducer
from clients.protocol import BrokerError

from .harness import BenchCluster, http_json, wait_for


def _coordinator(cluster: BenchCluster, tid: str, via: int) -> int:
    """The coordinator node of ``tid``; retriable answers (a restarted node's partitions electing) are waited out."""

    def ask() -> int | None:
        status, body = http_json("GET", f"{cluster.url(via)}/v1/coordinators/transaction/{tid}", timeout=5)
        if status == 200:
            return int(body["node_id"])
        if isinstance(body, dict) and body.get("retriable"):
            return None
        raise RuntimeError(f"coordinator of {tid}: {status} {body}")

    found: int = wait_for(ask, 30, f"coordinator of {tid}", 0.1)
    return found


def _state(cluster: BenchCluster, tid: str, via: int) -> str | None:
    with contextlib.suppress(OSError, ValueError):
        status, body = http_json("GET", f"{cluster.url(via)}/v1/transactions/{tid}", timeout=2)
        if status == 200:
            return str(body["state"])
    return None


def _failover_once(cluster: BenchCluster, urls: list[str], attempt: int) -> dict[str, Any]:
    single = {p: cluster.node_of_url(u) for p, u in cluster.leaders("bench-rf1").items() if u}
    tid, coord, x, xp = next(
        (t, co, single[q], q)
        for t in (f"bench-failover-{attempt}-{i}" for i in range(200))
        for co in [_coordinator(cluster, t, next(iter(single.values())))]
        for q in sorted(single)
        if single[q] != co
    )
    y = next(n for n in cluster.procs if n not in (coord, x))
    loop = asyncio.new_event_loop()
    outcome: dict[str, Any] = {}

    async def prepare(p: AsyncProducer) -> None:
        await p.init_transactions()
        p.begin_transaction()
        for q in range(3):
            await p.send("bench-fo", b"x" * 100, partition=q)
        await p.send("bench-rf1", b"x" * 100, partition=xp)
        await p.flush()

    producer = AsyncProducer(urls, transactional_id=tid)
    try:
        loop.run_until_complete(prepare(producer))
        cluster.procs[x].send_signal(signal.SIGSTOP)

        def commit() -> None:
            try:
                loop.run_until_complete(producer.commit_transaction(timeout=120))
                outcome["returned"] = time.monotonic()
            except BrokerError as exc:
                outcome["error"] = str(exc)

        thread = threading.Thread(target=commit, daemon=True)
        thread.start()
        wait_for(lambda: _state(cluster, tid, y) == "PrepareCommit", 30, "PrepareCommit", 0.01)
        t0 = time.monotonic()
        cluster.kill(coord)
        cluster.procs[x].send_signal(signal.SIGCONT)
        wait_for(lambda: _state(cluster, tid, y) == "CompleteCommit", 60, "CompleteCommit", 0.01)
        t_complete = time.monotonic()
        thread.join(120)
    finally:
        cluster.procs[x].send_signal(signal.SIGCONT)
        with contextlib.suppress(Exception):
            loop.run_until_complete(producer.close(5))
        loop.close()
    cluster.start_node(coord)
    cluster.wait_ready()
    returned: float | None = outcome.get("returned")
    return {
        "sigkill_to_complete_commit_s": round(t_complete - t0, 2),
        # EndTxn answers once PrepareCommit is durable, so commit_transaction() has normally returned before
        # the kill; the pending part is the markers, which the new coordinator finishes.
        "commit_returned_before_kill": returned is not None and returned <= t0,
        "sigkill_to_commit_returned_s": round(returned - t0, 2) if returned is not None and returned > t0 else None,
        "error": outcome.get("error"),
        "killed_coordinator": coord,
        "paused_partition_node": x,
    }


def coordinator_failover(cluster: BenchCluster, opts: argparse.Namespace) -> dict[str, Any]:
    urls = [c.url for c in cluster.configs]
    cluster.create_topic("bench-fo", 3)
    cluster.create_topic("bench-rf1", 3, rf=1)
    runs = [_failover_once(cluster, urls, i) for i in range(opts.failovers)]
    times = [r["sigkill_to_complete_commit_s"] for r in runs]
    return {
        "runs": runs,
        "sigkill_to_complete_commit_s_median": statistics.median(times),
        "sigkill_to_complete_commit_s_max": max(times),
        "target_le_5s": max(times) <= 5.0,
    }
