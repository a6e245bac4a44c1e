"""Faults during Spark writes: the driver dies between the group commit decision and the markers; a
partition leader dies while tasks write.

The Spark job runs with ``_test.handoffCommit``: its ``commit`` writes the
members it would commit to a manifest instead (the state a driver is in just
before its commit call: every task's transaction prepared, nothing visible).
"The driver" is then ``python -m spark_io.commit MANIFEST`` -- the same commit
code -- in a subprocess. A node leading some output partitions is stopped
first, so their COMMIT markers cannot be written; once another partition shows
the job's rows (the decision is recorded and its markers are being written)
the driver is SIGKILLed, before it got an answer, and the stopped node is
SIGKILLed and restarted. Recovery must then make all of the job's output
visible, none of it twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark.support import committed_records, committed_values, open_transactions, wait_stable
from tests.support.cluster import REPO, http, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.fault]

ROWS = 3000
PARTS = 6


def _coordinator(c: Any, key: str) -> int:
    status, res = http("GET", c.url(1) + f"/v1/coordinators/transaction/{key}")
    assert status == 200, res
    return int(res["node_id"])


def test_driver_killed_between_decision_and_markers(spark: Any, make_cluster: Any, tmp_path: Path) -> None:
    c = make_cluster(3)
    c.create_topic("dk", partitions=PARTS)
    manifest = tmp_path / "commit.json"
    df = spark.range(0, ROWS, 1, 2).selectExpr("CAST(id AS STRING) AS value", f"CAST(id % {PARTS} AS INT) AS partition")
    (df.write.format("txbroker").option("bootstrap", ",".join(c.urls)).option("topic", "dk")
     .option("writeId", "dk-job").option("_test.handoffCommit", str(manifest)).mode("append").save())  # fmt: skip
    doc = json.loads(manifest.read_text())
    assert len(doc["members"]) == 2
    assert committed_values(c, "dk", PARTS) == []  # prepared, invisible
    assert {t["state"] for t in open_transactions(c, "dk-job:")} == {"Prepared"}

    # The node to stop must lead output partitions but take no part in the decision: it coordinates
    # neither a member nor the group (a stopped coordinator would only delay the decision by the
    # broker's forwarding timeout). The members are not bound yet, so the group may be any name:
    # pick one whose coordinator is a member's.
    def all_lead() -> dict[int, int] | None:
        leaders = c.wait_leaders("dk", PARTS)
        return leaders if set(leaders.values()) == {1, 2, 3} else None

    leaders = wait_for(all_lead, 60, "every node leading some partition of dk")
    needed = {_coordinator(c, m["transactional_id"]) for m in doc["members"]}
    doc["group"] = next(g for g in (f"dk-job-{i}" for i in range(500)) if _coordinator(c, g) in needed)
    victim = min({1, 2, 3} - needed)
    visible_p = next(p for p, n in leaders.items() if n != victim)
    doc["bootstrap"] = ",".join(u for i, u in enumerate(c.urls, 1) if i != victim)
    manifest.write_text(json.dumps(doc))

    c.signal(victim, signal.SIGSTOP)
    driver = subprocess.Popen([sys.executable, "-m", "spark_io.commit", str(manifest)], cwd=str(REPO),
                              env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)  # fmt: skip
    try:

        def decided() -> bool:
            leader = c.leader("dk", visible_p, via=min(needed))
            if leader is None or leader == victim:
                return False
            status, res = http("GET", f"{c.url(leader)}/v1/topics/dk/partitions/{visible_p}/records"
                                      "?offset=0&isolation=read_committed&max_bytes=4194304", timeout=5)  # fmt: skip
            return status == 200 and len(res["records"]) > 0

        wait_for(decided, 60, f"the job's rows visible on partition {visible_p} (the decision is recorded)")
        # The stopped node's partitions cannot have their COMMIT markers yet, and the driver has no answer.
        assert driver.poll() is None, "the driver got its answer before it was killed"
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        assert driver.stdout is not None
        driver.stdout.close()
    c.kill(victim)  # a stopped process dies on SIGKILL
    c.start_node(victim)
    c.wait_ready()

    def all_visible() -> list[bytes] | None:
        values = committed_values(c, "dk", PARTS)
        return values if len(values) >= ROWS else None

    values = wait_for(all_visible, 90, "all of the job's rows visible after recovery")
    assert sorted(int(v) for v in values) == list(range(ROWS))  # all of it, none twice
    wait_stable(c, "dk", PARTS)
    assert open_transactions(c, "dk-job:") == []
    by_partition = {p for p, _o, v in committed_records(c, "dk", PARTS) if int(v) % PARTS == p}
    assert by_partition == set(range(PARTS))


def test_write_and_read_survive_a_partition_leader_kill(spark: Any, make_cluster: Any) -> None:
    """SIGKILL the leader of a partition while a Spark job writes to it: retried batches keep their sequence
    numbers (no duplicates), the group commit still decides, and the read after sees every row once."""
    import threading
    import time

    c = make_cluster(3)
    c.create_topic("fo", partitions=3)
    rows = 20_000
    leader = c.wait_leaders("fo", 3)[0]
    killed: dict[str, float] = {}

    def killer() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                hw = c.partition_meta("fo", 0, via=leader)["high_watermark"]
            except (OSError, AssertionError, KeyError):
                hw = 0
            if hw > 300:
                c.kill(leader)
                killed["at"] = time.monotonic()
                return
            time.sleep(0.02)

    t = threading.Thread(target=killer)
    t.start()
    df = spark.range(0, rows, 1, 4).selectExpr("CAST(id AS STRING) AS value", "CAST(id % 3 AS INT) AS partition")
    (df.write.format("txbroker").option("bootstrap", ",".join(c.urls)).option("topic", "fo")
     .option("writeId", "fo-job").option("batchBytes", "1024").mode("append").save())  # fmt: skip
    done = time.monotonic()
    t.join(130)
    assert "at" in killed and killed["at"] < done, "the leader was not killed while the job wrote"
    survivors = [i for i in (1, 2, 3) if i != leader]
    values = (spark.read.format("txbroker").option("bootstrap", ",".join(c.url(i) for i in survivors))
              .option("subscribe", "fo").load().selectExpr("CAST(value AS STRING) AS v").collect())  # fmt: skip
    assert sorted(int(r.v) for r in values) == list(range(rows))
    assert open_transactions(c, "fo-job:", via=survivors[0]) == []
