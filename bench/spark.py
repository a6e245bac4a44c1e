"""Spark benchmark: batch read into Spark and batch write from Spark, against the Python clients, in one run.

On one cluster and one topic filled once (``records`` x ``record_size`` bytes,
AsyncProducer):

* **read**: the same offset range read by (a) the Python ``AsyncConsumer``
  (``bench.consume``'s checked read: every offset once, in order), (b) the
  ``txbroker consume`` command (a subprocess printing every value to
  /dev/null; its wall time includes interpreter start) and (c) Spark on
  ``master`` (default ``local[2]``): ``spark.read.format("txbroker")`` over the
  same range with an action that moves every value into the JVM
  (``sum(length(value))``). A warm-up query first starts Spark's Python
  workers, so the timed query measures steady reading. MB/s count key+value
  payload bytes.
* **write**: ``write_records`` rows of ``record_size`` bytes written by Spark
  (job-atomic: per-task transactions, group commit) vs the Python
  ``AsyncProducer`` (idempotent, not transactional) writing the same number of
  records of the same size.

``txbroker bench spark`` (or ``python -m bench.spark``) starts its own 3-node
cluster (``scenario_spark``) and prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from clients.aio import AsyncConsumer

from .consume import ensure_topic, fill_and_read, fill_topic
from .harness import REPO, fresh_cluster
from .measure import host_cpu, machine_info

READ_TOPIC = "spark-bench"
WRITE_TOPIC = "spark-bench-out"
READ_TARGET_MB_S = 100.0


def _offsets_json(offsets: dict[tuple[str, int], int]) -> str:
    doc: dict[str, dict[str, int]] = {}
    for (t, p), off in offsets.items():
        doc.setdefault(t, {})[str(p)] = off
    return json.dumps(doc)


def _spark_read(
    spark: Any, urls: list[str], start: dict[tuple[str, int], int], end: dict[tuple[str, int], int],
    min_partitions: int | None,
) -> dict[str, Any]:  # fmt: skip
    reader = (
        spark.read.format("txbroker")
        .option("bootstrap", ",".join(urls))
        .option("subscribe", READ_TOPIC)
        .option("startingOffsets", _offsets_json(start))
        .option("endingOffsets", _offsets_json(end))
        .option("includeHeaders", "false")
    )
    if min_partitions:
        reader = reader.option("minPartitions", str(min_partitions))
    df = reader.load()
    h0, t0 = host_cpu(), time.perf_counter()
    row = df.selectExpr("count(*) AS n", "sum(length(value)) + coalesce(sum(length(key)), 0) AS bytes").collect()[0]
    wall, h1 = time.perf_counter() - t0, host_cpu()
    expected = sum(end[tp] - start[tp] for tp in start)
    if row.n != expected:
        raise RuntimeError(f"Spark read {row.n} records, expected {expected}")
    return {
        "records": row.n,
        "tasks": df.rdd.getNumPartitions(),
        "seconds": round(wall, 3),
        "mb_per_s": round(row.bytes / wall / 1e6, 2),
        "records_per_s": round(row.n / wall),
        # the whole host: Spark (JVM + Python workers) and the 3 broker nodes share its cores
        "host_cpu_busy_pct": round(100 * (h1[0] - h0[0]) / max(h1[1] - h0[1], 1e-9), 1),
    }


def _cli_consume(urls: list[str], records: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "cluster", "consume", READ_TOPIC, "--bootstrap", urls[0], "--from-beginning",
           "--max", str(records), "--timeout", "600"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=str(REPO),
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=900, check=False)  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"txbroker consume failed: {proc.stderr.decode(errors='replace')[-500:]}")
    return {"records": records, "seconds": round(wall, 3), "records_per_s": round(records / wall)}


def _spark_write(spark: Any, urls: list[str], rows: int, record_size: int) -> dict[str, Any]:
    def write(n: int) -> float:
        # A distinct value per row (id in front), padded to record_size bytes, generated before timing.
        df = spark.range(0, n, 1, 4).selectExpr(f"rpad(CAST(id AS STRING), {record_size}, 'x') AS value").cache()
        df.count()
        t0 = time.perf_counter()
        (df.write.format("txbroker").option("bootstrap", ",".join(urls)).option("topic", WRITE_TOPIC)
         .mode("append").save())  # fmt: skip
        wall = time.perf_counter() - t0
        df.unpersist()
        return wall

    write(100)  # first write of the session: commit process and imports
    wall = write(rows)
    return {"records": rows, "seconds": round(wall, 3), "mb_per_s": round(rows * record_size / wall / 1e6, 2),
            "records_per_s": round(rows / wall)}  # fmt: skip


def run_spark_bench(
    urls: list[str],
    *,
    records: int = 200_000,
    record_size: int = 1024,
    partitions: int = 3,
    write_records: int = 50_000,
    master: str = "local[2]",
    min_partitions: int | None = 4,
) -> dict[str, Any]:
    """Fill, read four ways, write two ways; returns every measurement (see the module docstring)."""
    asyncio.run(ensure_topic(urls, READ_TOPIC, partitions, 3))
    asyncio.run(ensure_topic(urls, WRITE_TOPIC, partitions, 3))

    async def fill_and_consume() -> dict[str, Any]:
        async with AsyncConsumer(urls, isolation_level="read_committed") as consumer:
            return await fill_and_read(consumer, urls, [(READ_TOPIC, p) for p in range(partitions)], records,
                                       record_size)  # fmt: skip

    base = asyncio.run(fill_and_consume())
    start, end = base["start"], base["end"]
    from spark_io.session import local_session

    spark = local_session(master, "txbroker-bench-spark", **{"spark.driver.memory": "2g"})
    try:
        warm = {tp: max(start[tp], end[tp] - 100) for tp in start}
        _spark_read(spark, urls, warm, end, None)  # starts the Python workers
        spark_read = [_spark_read(spark, urls, start, end, mp) for mp in (None, min_partitions) if mp != 0]
        spark_write = _spark_write(spark, urls, write_records, record_size)
    finally:
        spark.stop()
    cli = _cli_consume(urls, records)
    producer = asyncio.run(fill_topic(urls, WRITE_TOPIC, write_records, record_size))
    best_read = max(r["mb_per_s"] for r in spark_read)
    return {
        "master": master,
        "record_size": record_size,
        "partitions": partitions,
        "fill": base["fill"],
        "read": {
            "python_consumer": base["read"],
            "txbroker_consume_cli": cli,
            "spark": spark_read,
            "spark_vs_consumer": round(best_read / base["read"]["mb_per_s"], 2),
            "target_mb_per_s": READ_TARGET_MB_S,
            "target_met": best_read >= READ_TARGET_MB_S,
        },
        "write": {
            "spark_transactional": spark_write,
            "python_producer": producer,
            "spark_vs_producer": round(spark_write["mb_per_s"] / producer["mb_per_s"], 2),
        },
    }


def scenario_spark(opts: argparse.Namespace, shared: dict[str, Any]) -> dict[str, Any]:
    """``txbroker bench spark``: a fresh 3-node cluster, then ``run_spark_bench``."""
    with fresh_cluster("txbroker-bench-spark-") as cluster:
        return run_spark_bench(
            cluster.live_urls(),
            records=getattr(opts, "spark_records", 200_000),
            record_size=getattr(opts, "record_size", 1024),
            partitions=getattr(opts, "partitions", 3),
            write_records=getattr(opts, "spark_write_records", 50_000),
            master=getattr(opts, "spark_master", "local[2]"),
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__.splitlines()[0])
    p.add_argument("--records", dest="spark_records", type=int, default=200_000)
    p.add_argument("--write-records", dest="spark_write_records", type=int, default=50_000)
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--master", dest="spark_master", default="local[2]")
    args = p.parse_args(argv)
    res = scenario_spark(args, {})
    print(json.dumps({"command": " ".join(sys.argv), "machine": machine_info(), "spark": res}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
