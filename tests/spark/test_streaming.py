"""Structured Streaming from and into txbroker.

The query reads topic ``<name>-in`` and writes every value to ``<name>-out``
through the exactly-once sink: each micro-batch's transactions are committed
as one group named by the query id and the batch id, so a replayed batch finds
the recorded decision and writes nothing.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from spark_io.options import ReaderOptions
from spark_io.source import kafka_schema
from spark_io.stream_reader import StreamReader, from_json
from tests.spark.support import committed_values, open_transactions, produce_plain, wait_stable
from tests.support.cluster import LocalCluster, http

pytestmark = pytest.mark.spark


def _start(spark: Any, c: LocalCluster, name: str, ckpt: Path, *, available_now: bool = False, **opts: str) -> Any:
    reader = (
        spark.readStream.format("txbroker")
        .option("bootstrap", ",".join(c.urls))
        .option("subscribe", f"{name}-in")
        .option("startingOffsets", "earliest")
    )
    for k, v in opts.items():
        reader = reader.option(k, v)
    writer = (
        reader.load()
        .selectExpr("value", "key")
        .writeStream.format("txbroker")
        .option("bootstrap", ",".join(c.urls))
        .option("topic", f"{name}-out")
        .option("checkpointLocation", str(ckpt))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def _batches(q: Any) -> list[tuple[int, int]]:
    return [(p["batchId"], p["numInputRows"]) for p in q.recentProgress if p["numInputRows"] > 0]


def test_growing_topic_with_max_offsets_per_trigger_then_forced_replay(spark, shared_cluster, tmp_path):
    c = shared_cluster
    for t in ("grow-in", "grow-out"):
        c.create_topic(t, partitions=3)
    sent: list[bytes] = []

    def produce(rounds: int, per_round: int) -> None:
        for r in range(rounds):
            vals = [f"{len(sent) + i}".encode() for i in range(per_round)]
            produce_plain(c, "grow-in", r % 3, vals)
            sent.extend(vals)
            time.sleep(0.2)

    produce(1, 90)
    checkpoint = tmp_path / "ckpt"
    q = _start(spark, c, "grow", checkpoint, maxOffsetsPerTrigger="40")
    try:
        grower = threading.Thread(target=produce, args=(6, 50))
        grower.start()
        grower.join(60)
        q.processAllAvailable()
        batches = _batches(q)
        query_id = q.id
    finally:
        q.stop()
    assert len(batches) >= 3 and all(n <= 40 for _b, n in batches), batches
    assert sum(n for _b, n in batches) == len(sent) == 390
    out = committed_values(c, "grow-out", 3)
    assert sorted(out) == sorted(sent)  # every record once

    # Forced replay: forget that the last micro-batch was committed. Spark re-runs it with the same
    # offsets and batch id; the sink's group decision for (query id, batch id) is recorded, so the
    # replay's transactions are aborted and nothing is written twice.
    last = max(b for b, _n in batches)
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)  # else Spark sees a concurrent writer
    q2 = _start(spark, c, "grow", checkpoint, available_now=True, maxOffsetsPerTrigger="40")
    try:
        q2.awaitTermination(120)
        replayed = _batches(q2)
        assert q2.id == query_id
    finally:
        q2.stop()
    assert replayed and replayed[0] == next(x for x in batches if x[0] == last), (replayed, batches)
    assert sorted(committed_values(c, "grow-out", 3)) == sorted(sent)
    wait_stable(c, "grow-out", 3)
    assert open_transactions(c, f"{query_id}:") == []
    status, res = http("GET", f"{c.url(1)}/v1/transactions?prefix={query_id}:{last}:")
    assert status == 200, res
    states = sorted(t["state"] for t in res["transactions"])
    assert "CompleteAbort" in states and "CompleteCommit" in states, states  # the replay's attempts were aborted


def test_available_now_with_sink_id_survives_a_lost_checkpoint(spark, shared_cluster, tmp_path):
    """A user ``sinkId`` identifies the sink even when the checkpoint (and with it the query id) is lost."""
    c = shared_cluster
    for t in ("anow-in", "anow-out"):
        c.create_topic(t, partitions=2)
    vals = [f"a{i}".encode() for i in range(120)]
    produce_plain(c, "anow-in", 0, vals[:70])
    produce_plain(c, "anow-in", 1, vals[70:])
    for attempt in range(2):  # the second run starts from scratch: same offsets, same batch ids
        ckpt = tmp_path / f"ckpt{attempt}"
        q = (
            spark.readStream.format("txbroker")
            .option("bootstrap", c.url(1))
            .option("subscribe", "anow-in")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "50")
            .option("groupId", "anow-lag")
            .load()
            .writeStream.format("txbroker")
            .option("bootstrap", c.url(2))
            .option("topic", "anow-out")
            .option("sinkId", "anow-sink")
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert q.awaitTermination(120)
            sizes = [n for _b, n in _batches(q)]
            assert len(sizes) == 3 and max(sizes) <= 50 and sum(sizes) == 120, sizes  # 3 rate-limited batches
        finally:
            q.stop()
        shutil.rmtree(ckpt)
        assert sorted(committed_values(c, "anow-out", 2)) == sorted(vals)
    # The source committed its progress to the consumer group (lag monitoring only; Spark's checkpoint
    # owns the offsets): at least the batches before the last one, never past the end.
    status, res = http("GET", f"{c.url(3)}/v1/groups/anow-lag/offsets")
    assert status == 200, res
    committed = {o["partition"]: o["offset"] for o in res["offsets"] if o["topic"] == "anow-in"}
    assert set(committed) == {0, 1} and sum(sizes[:2]) <= sum(committed.values()) <= 120, (committed, sizes)
    assert committed[0] <= 70 and committed[1] <= 50


def test_admission_control_limits(shared_cluster):
    """The reader's latestOffset under each read limit (driver-side logic, called directly)."""
    c = shared_cluster
    c.create_topic("adm", partitions=2)
    produce_plain(c, "adm", 0, [b"x"] * 30)
    produce_plain(c, "adm", 1, [b"y"] * 10)
    opts = {"bootstrap": c.url(1), "subscribe": "adm", "startingOffsets": "earliest", "minOffsetsPerTrigger": "45",
            "maxOffsetsPerTrigger": "48", "maxTriggerDelay": "1s"}  # fmt: skip
    r = StreamReader(ReaderOptions.parse(opts, streaming=True), kafka_schema())
    try:
        start = r.initialOffset()
        assert from_json(start) == {("adm", 0): 0, ("adm", 1): 0}
        assert r.getDefaultReadLimit() == ReadMinRows(45)
        assert from_json(r.latestOffset(start, ReadMinRows(45))) == from_json(start)  # 40 < 45: wait
        time.sleep(1.1)  # maxTriggerDelay passed: go with what there is
        assert from_json(r.latestOffset(start, ReadMinRows(45))) == {("adm", 0): 30, ("adm", 1): 10}
        produce_plain(c, "adm", 1, [b"z"] * 20)  # backlog 60 >= 45: no wait, capped at 48 in proportion
        assert from_json(r.latestOffset(start, ReadMinRows(45))) == {("adm", 0): 24, ("adm", 1): 24}
        assert from_json(r.latestOffset(start, ReadMaxRows(6))) == {("adm", 0): 3, ("adm", 1): 3}
        assert from_json(r.latestOffset(start, ReadAllAvailable())) == {("adm", 0): 30, ("adm", 1): 30}
        r.prepareForTriggerAvailableNow()
        produce_plain(c, "adm", 1, [b"late"] * 5)  # after the AvailableNow target: never read by this run
        assert from_json(r.latestOffset(start, ReadAllAvailable())) == {("adm", 0): 30, ("adm", 1): 30}
        assert from_json(r.latestOffset(start, ReadMinRows(45))) == {("adm", 0): 24, ("adm", 1): 24}
        assert r.reportLatestOffset() == {"adm": {"0": 30, "1": 35}}
        planned = r.partitions(start, {"adm": {"0": 30, "1": 35}})
        assert [(p.range.partition, p.range.start, p.range.end) for p in planned] == [(0, 0, 30), (1, 0, 35)]
        assert r.partitions(start, start) == []
    finally:
        r.stop()
