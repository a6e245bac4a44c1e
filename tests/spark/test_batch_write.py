"""Job-atomic batch writes from Spark.

Every task attempt writes into its own prepared transaction; the driver's
``commit`` makes exactly the accepted attempts visible in one group decision
and aborts the rest. Failures are injected with the writer's ``_test.failTask``
option (``PARTITION:ATTEMPT|*:ROWS:crash`` kills the Python worker after the
first ROWS rows were sent to the broker, so nothing in the task cleans up).
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

from tests.spark.support import committed_values, open_transactions, wait_stable
from tests.support.cluster import LocalCluster, http

pytestmark = pytest.mark.spark

ROWS = 10_000


def _write(spark: Any, c: LocalCluster, topic: str, write_id: str, rows: int = ROWS, **options: str) -> None:
    df = spark.range(0, rows, 1, 4).selectExpr("CAST(id AS STRING) AS value", "CAST(id % 7 AS STRING) AS key")
    w = (df.write.format("txbroker").option("bootstrap", ",".join(c.urls)).option("topic", topic)
         .option("writeId", write_id).option("batchBytes", "16384").mode("append"))  # fmt: skip
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def _states(c: LocalCluster, prefix: str) -> dict[str, str]:
    status, res = http("GET", f"{c.url(1)}/v1/transactions?prefix={prefix}")
    assert status == 200, res
    return {t["transactional_id"]: t["state"] for t in res["transactions"]}


def test_failed_attempt_after_half_its_rows_leaves_exactly_ten_thousand(spark, shared_cluster):
    c = shared_cluster
    c.create_topic("bw-once", partitions=3)
    _write(spark, c, "bw-once", "job-once", **{"_test.failTask": "1:0:1250:crash"})
    values = committed_values(c, "bw-once", 3)
    assert len(values) == ROWS
    assert sorted(int(v) for v in values) == list(range(ROWS))
    wait_stable(c, "bw-once", 3)
    assert open_transactions(c, "job-once:") == []
    states = _states(c, "job-once:w:")
    crashed = [t for t in states if t.startswith("job-once:w:1:0:")]
    assert len(crashed) == 1 and states[crashed[0]] == "CompleteAbort"  # aborted by the driver's sweep
    assert collections.Counter(states.values()) == {"CompleteCommit": 4, "CompleteAbort": 1}

    # The same write id again (a retried job): the group decision is recorded, so nothing is written twice.
    _write(spark, c, "bw-once", "job-once")
    assert len(committed_values(c, "bw-once", 3)) == ROWS
    wait_stable(c, "bw-once", 3)
    states = _states(c, "job-once:w:")
    assert collections.Counter(states.values()) == {"CompleteCommit": 4, "CompleteAbort": 5}


def test_task_failing_on_every_attempt_leaves_nothing_and_no_open_transaction(spark, shared_cluster):
    c = shared_cluster
    c.create_topic("bw-fail", partitions=3)
    with pytest.raises(Exception, match=r"crashed|exited"):
        _write(spark, c, "bw-fail", "job-fail", **{"_test.failTask": "2:*:600:crash"})
    wait_stable(c, "bw-fail", 3)  # no open transaction pins the LSO
    assert committed_values(c, "bw-fail", 3) == []
    assert open_transactions(c, "job-fail:") == []
    states = _states(c, "job-fail:w:")
    assert len([t for t in states if t.startswith("job-fail:w:2:")]) == 3  # local[2,3]: three attempts
    assert set(states.values()) == {"CompleteAbort"}
    meta = next(t for t in c.metadata(1)["topics"] if t["name"] == "bw-fail")
    assert sum(p["high_watermark"] for p in meta["partitions"]) > 0  # rows were written, then aborted

    # The write id was never decided, so a fixed re-run with the same id commits.
    _write(spark, c, "bw-fail", "job-fail", rows=500)
    assert sorted(int(v) for v in committed_values(c, "bw-fail", 3)) == list(range(500))


def test_rows_carry_keys_headers_and_explicit_partitions(spark, shared_cluster):
    c = shared_cluster
    c.create_topic("bw-cols", partitions=3)
    df = spark.createDataFrame(
        [("a", b"k1", 2, [("h", b"1")]), ("b", None, 0, []), ("c", b"k2", None, None)],
        "value string, key binary, partition int, headers array<struct<key:string,value:binary>>",
    )
    df.write.format("txbroker").option("bootstrap", c.url(3)).option("topic", "bw-cols").mode("append").save()
    rows = {r.value: r for r in spark.read.format("txbroker").option("bootstrap", c.url(1))
            .option("subscribe", "bw-cols").load().collect()}  # fmt: skip
    assert set(rows) == {b"a", b"b", b"c"}
    assert (rows[b"a"].partition, rows[b"a"].key, [(h.key, h.value) for h in rows[b"a"].headers]) == (
        2, b"k1", [("h", b"1")])  # fmt: skip
    assert (rows[b"b"].partition, rows[b"b"].key) == (0, None)
    from clients.partitioner import partition_for_key

    assert rows[b"c"].partition == partition_for_key(b"k2", 3)
    with pytest.raises(Exception, match="append"):
        df.write.format("txbroker").option("bootstrap", c.url(1)).option("topic", "bw-cols").mode("overwrite").save()
