"""The exactly-once part of the main job: clients, transactions, the copier, Spark, metrics.

Called by ``ops/demo.py`` on a running 3-node cluster; every stage prints what
it did and checks its own result (a stage that finds a wrong answer raises).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from clients import Admin, Consumer, Producer

Say = Callable[[str], None]


def _read_all(
    bootstrap: str, topic: str, isolation: str, expect: int | None = None, timeout_s: float = 30
) -> list[bytes]:
    """Every record of ``topic`` (all partitions) as ``isolation`` sees it, sorted."""
    admin = Admin(bootstrap)
    parts = len(admin.describe_topic(topic)["partitions"])
    c = Consumer(bootstrap=bootstrap, isolation_level=isolation, auto_offset_reset="earliest")
    try:
        c.assign([(topic, p) for p in range(parts)])
        ends = c.end_offsets([(topic, p) for p in range(parts)])
        out: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for r in c.poll(timeout_ms=300):
                out.append(r.value or b"")
            done = all(c.position(tp) >= end for tp, end in ends.items())
            if done and (expect is None or len(out) >= expect):
                break
        return sorted(out)
    finally:
        c.close()


def stage_clients(bootstrap: str, say: Say) -> None:
    say("== Python clients: a batching idempotent Producer and a Consumer")
    Admin(bootstrap).create_topic("events", partitions=3, replication_factor=3)
    Admin(bootstrap).wait_for_leaders("events")
    n = 20_000
    t0 = time.monotonic()
    with Producer(bootstrap=bootstrap, linger_ms=5) as p:
        futures = [p.send("events", value=f"event-{i}".encode(), key=str(i % 100).encode()) for i in range(n)]
        p.flush()
        offsets = [f.result() for f in futures]
    dt = time.monotonic() - t0
    say(
        f"   {n} records acknowledged in {dt:.2f}s ({n / dt:,.0f} records/s) across "
        f"{len({m.partition for m in offsets})} partitions"
    )
    got = _read_all(bootstrap, "events", "read_uncommitted", expect=n)
    assert got == sorted(f"event-{i}".encode() for i in range(n)), "consumer did not read back exactly what was sent"
    say(f"   the Consumer read back all {len(got)} records, each exactly once")


def stage_transactions(bootstrap: str, say: Say) -> None:
    say("== transactions: commit across 3 partitions, abort, read_committed vs read_uncommitted")
    Admin(bootstrap).create_topic("payments", partitions=3, replication_factor=3)
    Admin(bootstrap).wait_for_leaders("payments")
    p = Producer(bootstrap=bootstrap, transactional_id="demo-payments")
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(900):
            p.send("payments", value=f"committed-{i}".encode(), partition=i % 3)
        p.commit_transaction()
        p.begin_transaction()
        for i in range(300):
            p.send("payments", value=f"aborted-{i}".encode(), partition=i % 3)
        p.flush()
        say("   300 records written in a second transaction, not yet ended:")
        say(
            f"     read_uncommitted sees {len(_read_all(bootstrap, 'payments', 'read_uncommitted', expect=1200))}, "
            f"read_committed sees {len(_read_all(bootstrap, 'payments', 'read_committed', expect=900))} "
            "(the open transaction pins the last stable offset)"
        )
        p.abort_transaction()
    finally:
        p.close()
    committed = _read_all(bootstrap, "payments", "read_committed", expect=900)
    assert committed == sorted(f"committed-{i}".encode() for i in range(900)), "read_committed saw the wrong records"
    say(
        f"   after the abort: read_committed sees exactly the {len(committed)} committed records; "
        f"read_uncommitted still shows all {len(_read_all(bootstrap, 'payments', 'read_uncommitted', expect=1200))}"
    )


def stage_pipelined_commits(bootstrap: str, say: Say) -> None:
    say("== pipelined commits: the next transaction fills while the previous one commits (commit_and_begin)")
    Admin(bootstrap).create_topic("ledger", partitions=3, replication_factor=3)
    Admin(bootstrap).wait_for_leaders("ledger")
    txns, per = 10, 300
    sent = [f"t{n:02d}-{i:03d}".encode() for n in range(txns) for i in range(per)]
    t0 = time.monotonic()
    with Producer(bootstrap=bootstrap, transactional_id="demo-ledger") as p:
        p.init_transactions()
        p.begin_transaction()
        outcomes = []
        for n in range(txns):
            for v in sent[n * per : (n + 1) * per]:
                p.send("ledger", value=v)
            outcomes.append(p.commit_and_begin())  # returns at once; the records sent next are held meanwhile
        p.commit_transaction()  # waits for the last pipelined commit, then ends the empty transaction
        for f in outcomes:
            f.result(timeout=30)
    dt = time.monotonic() - t0
    got = _read_all(bootstrap, "ledger", "read_committed", expect=len(sent))
    assert got == sorted(sent), "read_committed saw the wrong records"
    say(
        f"   {txns} transactions of {per} records in {dt:.2f}s, none waiting for the one before to commit: "
        f"read_committed sees all {len(got)}, each once"
    )


def stage_copier(bootstrap: str, say: Say) -> None:
    from cluster.copier import CopierConfig, run_copier

    say("== consume-transform-produce: the transactional copier (events -> events-upper)")
    Admin(bootstrap).create_topic("events-upper", partitions=3, replication_factor=3)
    Admin(bootstrap).wait_for_leaders("events-upper")
    t0 = time.monotonic()
    cfg = CopierConfig(
        bootstrap=bootstrap,
        input_topic="events",
        output_topic="events-upper",
        group_id="demo-copier",
        transactional_id="demo-copier-1",
        transform="upper",
        commit_every=2000,
        commit_every_ms=200,
        idle_exit_ms=3000,
    )
    run_copier(cfg, emit=lambda _line: None, handle_signals=False)
    dt = time.monotonic() - t0
    src = _read_all(bootstrap, "events", "read_committed")
    out = _read_all(bootstrap, "events-upper", "read_committed", expect=len(src))
    assert out == sorted(v.upper() for v in src), "copier output is not exactly the transformed input"
    say(
        f"   copied {len(out)} records in {dt:.1f}s (including the idle wait); output == upper(input), none twice; "
        "input offsets were committed inside the same transactions"
    )


def stage_spark(bootstrap: str, say: Say, work: Path) -> None:
    if importlib.util.find_spec("pyspark") is None:
        say("== Spark: skipped (pyspark not installed; run with TXBROKER_EXTRAS=dev,spark)")
        return
    # Spark's Python workers must run this interpreter (its venv has txbroker installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_io

    say("== Spark: batch read of 'events' and an exactly-once batch write to 'spark-out'")
    Admin(bootstrap).create_topic("spark-out", partitions=3, replication_factor=3)
    Admin(bootstrap).wait_for_leaders("spark-out")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("txbroker-demo")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.local.dir", str(work / "spark"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        spark_io.register(spark)
        t0 = time.monotonic()
        df = spark.read.format("txbroker").option("bootstrap", bootstrap).option("subscribe", "events").load()
        count = df.count()
        say(
            f"   read {count} records into a DataFrame in {time.monotonic() - t0:.1f}s "
            f"(columns: {', '.join(df.columns)})"
        )
        t0 = time.monotonic()
        (
            df.selectExpr("key", "upper(cast(value as string)) as value")
            .write.format("txbroker")
            .option("bootstrap", bootstrap)
            .option("topic", "spark-out")
            .mode("append")
            .save()
        )
        written = _read_all(bootstrap, "spark-out", "read_committed", expect=count)
        assert len(written) == count, f"spark wrote {len(written)} of {count}"
        say(
            f"   wrote {len(written)} records in {time.monotonic() - t0:.1f}s: every task's transaction was prepared, "
            "then one commit-group decision made them all visible at once"
        )
    finally:
        spark.stop()


def stage_metrics(urls: list[str], say: Say, root: Path) -> None:
    say("== observability")
    total = 0.0
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("txbroker_records_produced_total{"):
                    total += float(line.rsplit(" ", 1)[1])
    say(f"   /metrics on every node; txbroker_records_produced_total summed over the cluster: {total:,.0f}")
    say(
        f"   Prometheus config + alert rules: {root / 'ops/prometheus'}; Grafana provisioning + 5 dashboards: "
        f"{root / 'ops/grafana'}"
    )
    say("   health: txbroker cluster health --bootstrap " + urls[0])


def stage_verify(bootstrap: str, say: Say, work: Path) -> None:
    """A short ``txbroker verify`` run against the demo cluster: the Jepsen-style check of exactly-once."""
    say("== txbroker verify: transactional + idempotent producers, read_committed consumers, the copier; 10 s")
    res = subprocess.run(
        [sys.executable, "-m", "cluster", "verify", "--bootstrap", bootstrap, "--duration", "10", "--json",
         "--record", str(work / "verify-history.jsonl")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if res.returncode != 0:
        raise SystemExit(f"txbroker verify failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    summary = json.loads(res.stdout)
    counts = summary["counts"]
    anomalies = sum(summary["anomaly_counts"].values())
    say(
        f"   {counts.get('txns-committed', 0)} transactions committed, {counts.get('txns-aborted', 0)} aborted, "
        f"{counts.get('acked-sends', 0)} idempotent records acknowledged, {counts.get('records-read', 0)} records "
        f"read: {anomalies} anomalies of {len(summary['anomaly_counts'])} classes"
    )
    say("   (as root, `txbroker verify --nemesis` runs the same under network partitions, kills and pauses)")
