"""``python -m spark_io --bootstrap URL``: a Spark write and a Spark read against a running cluster.

Writes ``--rows`` rows into topic ``--topic`` (created if missing) with the
exactly-once batch writer, reads the topic back into a DataFrame and prints
what it found. Needs the ``spark`` extra and Java 17+.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from clients.admin import Admin
from clients.protocol import BrokerError, ErrorCode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark_io", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--bootstrap", default="http://127.0.0.1:9091")
    p.add_argument("--topic", default="spark-demo")
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    admin = Admin(args.bootstrap)
    try:
        admin.create_topic(args.topic, partitions=3, replication_factor=min(3, len(admin.describe_cluster()["nodes"])))
    except BrokerError as exc:
        if exc.error_code is not ErrorCode.TOPIC_ALREADY_EXISTS:
            raise
    admin.wait_for_leaders(args.topic)
    from .session import local_session

    spark = local_session(args.master, "txbroker-spark-demo")
    try:
        write_id = f"demo-{uuid.uuid4().hex[:8]}"
        df = spark.range(args.rows).selectExpr(f"concat('{write_id}-', CAST(id AS STRING)) AS value")
        t0 = time.perf_counter()
        (df.write.format("txbroker").option("bootstrap", args.bootstrap).option("topic", args.topic)
         .option("writeId", write_id).mode("append").save())  # fmt: skip
        print(f"wrote {args.rows} rows to {args.topic} in one atomic commit ({time.perf_counter() - t0:.1f} s), "
              f"write id {write_id}")  # fmt: skip
        read = spark.read.format("txbroker").option("bootstrap", args.bootstrap).option("subscribe", args.topic).load()
        values = read.selectExpr("CAST(value AS STRING) AS v")
        mine = values.filter(values.v.startswith(write_id + "-"))
        print(f"read back: {read.count()} records in {args.topic}, {mine.count()} from this run "
              f"({mine.distinct().count()} distinct)")  # fmt: skip
        read.groupBy("partition").count().orderBy("partition").show()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
