"""Exactly-once copying under faults: a port of Kafka's ``transactions_test.py`` (kafka_txn.md §10.1).

The copier is the real ``txbroker copy`` process (``python -m cluster copy``):
a read_committed group member that copies the input topic to the output
topic in transactions of 500 records, committing its input offsets in the
same transaction. While it runs, brokers are bounced (SIGTERM or SIGKILL, then
restarted) and the copier itself is killed with SIGKILL and restarted with
the same transactional id. Oracles, as in Kafka's test: a read_committed
consumer running *concurrently* and a final one both see exactly the input
set, nothing twice; with one input and one output partition the output
list equals the input list (order preserved end to end).

Faults are paced by progress (the group's committed offsets), so each one
hits a copier that is mid-stream, and the copier is throttled to ~2,000
records/s (``tests.support.copier_transforms``) so the run outlasts the faults.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clients.consumer import Consumer
from clients.producer import Producer
from cluster.copier import CopierConfig, CopierStats, run_copier
from tests.support.cluster import REPO, LocalCluster, http, wait_for
from tests.support.txn_reads import wait_settled

pytestmark = [pytest.mark.integration, pytest.mark.fault]

# Short session timeouts so a killed copier's membership ends quickly; fast timed-out transaction scans.
CLUSTER = {"group_min_session_timeout_ms": 1000, "transaction_abort_scan_interval_ms": 500}
COPIER_ARGS = [
    "--session-timeout-ms", "2000", "--heartbeat-interval-ms", "300", "--transaction-timeout-ms", "5000",
    "--idle-exit-ms", "1500", "--progress-interval-ms", "0",
    "--transform", "python:tests.support.copier_transforms:throttled",
]  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("copier")), 3, **CLUSTER)
    try:
        yield c.start()
    finally:
        c.close()


_LOG_SEQ = itertools.count()


class CopierProcess:
    """One copier instance (a transactional id); ``restart`` runs a new process with the same id."""

    def __init__(self, c: LocalCluster, workdir: Path, src: str, dst: str, group: str, tid: str) -> None:
        self.c, self.workdir = c, workdir
        self.args = ["--from", src, "--to", dst, "--group", group, "--transactional-id", tid,
                     "--commit-every", "500", "--commit-every-ms", "0", *COPIER_ARGS]  # fmt: skip
        self.tid = tid
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []

    def start(self) -> None:
        log = self.workdir / f"copier-{self.tid}-{next(_LOG_SEQ)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cluster", "copy", "--bootstrap", ",".join(self.c.urls), *self.args],
                stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)),
            )  # fmt: skip

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, "the copier died on its own: " + self.tail()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"copier {self.tid} still running after {timeout}s: {self.tail()}") from None

    def progress(self) -> list[dict[str, Any]]:
        """The JSON progress lines of the current process."""
        out = []
        for line in self.logs[-1].read_text(errors="replace").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def tail(self) -> str:
        return self.logs[-1].read_text(errors="replace")[-3000:] if self.logs else ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def copiers(cluster: LocalCluster, tmp_path: Path) -> Iterator[Any]:
    made: list[CopierProcess] = []

    def factory(src: str, dst: str, group: str, tid: str) -> CopierProcess:
        cp = CopierProcess(cluster, tmp_path, src, dst, group, tid)
        made.append(cp)
        cp.start()
        return cp

    yield factory
    for cp in made:
        cp.close()


class ConcurrentReader(threading.Thread):
    """A read_committed consumer of the whole output topic that runs while the copier works."""

    def __init__(self, c: LocalCluster, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(",".join(c.urls), isolation_level="read_committed", auto_offset_reset="earliest")
        self.consumer.assign([(topic, p) for p in range(partitions)])
        self.values: dict[int, list[int]] = {p: [] for p in range(partitions)}
        self.count = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                for r in self.consumer.poll(200):
                    assert r.value is not None
                    self.values[r.partition].append(int(r.value))
                    self.count += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def finish(self, expected: int, timeout: float = 60) -> dict[int, list[int]]:
        """Wait for ``expected`` records, then read on to the last stable offsets (a late duplicate shows)."""
        try:
            wait_for(lambda: self.error is not None or self.count >= expected, timeout, f"{expected} records read")
            self.stopping.set()
            self.join(10)
            assert self.error is None, f"the concurrent reader failed: {self.error!r}"
            drain_to_end(self.consumer, self.values)
        finally:
            self.stopping.set()
            self.consumer.close()
        return self.values


def drain_to_end(consumer: Consumer, out: dict[int, list[int]]) -> None:
    """Poll the assigned partitions until every position reaches its last stable offset."""
    tps = sorted(consumer.assignment())
    ends = consumer.end_offsets(tps)

    def done() -> bool:
        for r in consumer.poll(200):
            assert r.value is not None
            out[r.partition].append(int(r.value))
        return all(consumer.position(tp) >= ends[tp] for tp in tps)

    wait_for(done, 60, f"the output up to {ends}")


def fill(c: LocalCluster, topic: str, partitions: int, n: int) -> None:
    with Producer(",".join(c.urls), linger_ms=10) as producer:
        futures = [producer.send(topic, value=str(i).encode(), partition=i % partitions) for i in range(n)]
        producer.flush()
        assert all(f.result().offset >= 0 for f in futures)


def group_copied(c: LocalCluster, group: str) -> int:
    """Input records whose offsets the group has committed (input offsets start at 0, no markers)."""
    for url in c.urls:
        try:
            status, res = http("GET", url + f"/v1/groups/{group}/offsets", timeout=5)
        except OSError:
            continue
        if status == 200:
            return sum(int(o["offset"]) for o in res["offsets"])
    return -1


def read_output(c: LocalCluster, topic: str, partitions: int) -> dict[int, list[int]]:
    """A fresh read_committed consumer: every partition up to its last stable offset.

    First waits until no transaction is open on the topic: the copier's last
    commit answered once decided, its markers may still be on their way.
    """
    wait_settled(c, topic, range(partitions), timeout=60)
    with Consumer(",".join(c.urls), isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        out: dict[int, list[int]] = {p: [] for p in range(partitions)}
        drain_to_end(consumer, out)
    return out


def assert_exactly_the_input(values: list[int], n: int, who: str) -> None:
    dups = sorted(v for v, k in Counter(values).items() if k > 1)
    assert not dups, f"{who}: {len(dups)} values copied more than once, e.g. {dups[:5]}"
    missing = sorted(set(range(n)) - set(values))
    assert not missing, f"{who}: {len(missing)} values lost, e.g. {missing[:5]}"
    assert len(values) == n, f"{who}: {len(values)} values, expected {n}"


def bounce(c: LocalCluster, node: int, sig: signal.Signals) -> None:
    if sig is signal.SIGKILL:
        c.kill(node)
    else:
        assert c.stop_node(node) == 0, f"node {node} did not shut down cleanly on SIGTERM"
    c.start_node(node)
    c.wait_ready([node])


def run_faults(
    c: LocalCluster, copier: CopierProcess, group: str, n: int, schedule: list[tuple[float, str]], sig: signal.Signals
) -> list[str]:
    """Apply each fault once the group has committed ``fraction * n`` records; return what was done."""
    rng = random.Random(f"{group}-{sig.name}")
    done = []
    for fraction, fault in schedule:
        wait_for(lambda f=fraction: group_copied(c, group) >= f * n, 90, f"{fraction:.0%} copied ({copier.tail()})")
        if fault == "broker":
            node = rng.choice([1, 2, 3])
            bounce(c, node, sig)
            done.append(f"{sig.name} node {node}")
        else:
            copier.restart()
            done.append("SIGKILL copier")
    return done


def finish(copier: CopierProcess, timeout: float = 120) -> dict[str, Any]:
    rc = copier.wait(timeout)
    assert rc == 0, f"copier exit code {rc}: {copier.tail()}"
    last = copier.progress()[-1]
    assert last["stage"] == "ShutdownComplete" and last["remaining"] == 0, last
    return last


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["clean_bounce", "hard_bounce"])
def test_copier_copies_exactly_once_through_broker_bounces_and_copier_kills(
    cluster: LocalCluster, copiers: Any, sig: signal.Signals
) -> None:
    # Given 12,000 integers in a 2-partition input and an empty 3-partition output (RF 3)
    n, src, dst, group = 12_000, f"in-{sig.name}", f"out-{sig.name}", f"copy-{sig.name}"
    cluster.create_topic(src, partitions=2, rf=3)
    cluster.create_topic(dst, partitions=3, rf=3)
    fill(cluster, src, 2, n)
    reader = ConcurrentReader(cluster, dst, 3)
    reader.start()
    # When one copier runs while 2 brokers are bounced and the copier is killed and restarted in between
    copier = copiers(src, dst, group, f"copier-{sig.name}")
    schedule = [(0.1, "broker"), (0.35, "copier"), (0.6, "broker")]
    faults = run_faults(cluster, copier, group, n, schedule, sig)
    finish(copier)
    # Then the concurrent and the final read_committed consumers each saw every input value exactly once
    concurrent = reader.finish(n)
    assert_exactly_the_input([v for vs in concurrent.values() for v in vs], n, f"concurrent consumer ({faults})")
    final = read_output(cluster, dst, 3)
    assert_exactly_the_input([v for vs in final.values() for v in vs], n, f"final consumer ({faults})")
    wait_for(lambda: group_copied(cluster, group) == n, 30, f"the group's offsets at {n}")


def test_one_partition_copy_preserves_order_through_faults(cluster: LocalCluster, copiers: Any) -> None:
    # Given ~20,000/3 integers in order in a 1-partition input (Kafka's check_order variant)
    n, src, dst, group = 6_667, "in-ordered", "out-ordered", "copy-ordered"
    cluster.create_topic(src, partitions=1, rf=3)
    cluster.create_topic(dst, partitions=1, rf=3)
    fill(cluster, src, 1, n)
    reader = ConcurrentReader(cluster, dst, 1)
    reader.start()
    # When the copier is killed once and a broker is killed once
    copier = copiers(src, dst, group, "copier-ordered")
    run_faults(cluster, copier, group, n, [(0.15, "broker"), (0.45, "copier")], signal.SIGKILL)
    finish(copier)
    # Then the output, read concurrently and afterwards, is the input list
    assert reader.finish(n)[0] == list(range(n))
    assert read_output(cluster, dst, 1)[0] == list(range(n))


def test_survivor_takes_over_the_partitions_of_a_killed_group_member(cluster: LocalCluster, copiers: Any) -> None:
    # Given two copiers (two transactional ids) in one group sharing a 2-partition input
    n, src, dst, group = 10_000, "in-pair", "out-pair", "copy-pair"
    cluster.create_topic(src, partitions=2, rf=3)
    cluster.create_topic(dst, partitions=3, rf=3)
    fill(cluster, src, 2, n)
    survivor = copiers(src, dst, group, "pair-a")
    victim = copiers(src, dst, group, "pair-b")

    def split() -> bool:
        status, res = http("GET", cluster.url(1) + f"/v1/groups/{group}")
        return status == 200 and len(res["members"]) == 2 and all(m["assignment"] for m in res["members"])

    wait_for(split, 60, "both copiers to own a partition")
    wait_for(lambda: group_copied(cluster, group) >= 0.2 * n, 60, "20% copied")
    # When one member is killed mid-transaction (its open transaction is left for the coordinator to abort)
    victim.close()
    # Then the survivor takes over both partitions after the session timeout and finishes the whole input
    last = finish(survivor)
    assert last["assignment"] == [], last  # it left the group on exit
    owned = [p["assignment"] for p in survivor.progress() if p["stage"] == "Rebalanced"]
    assert [f"{src}-0", f"{src}-1"] in owned, owned
    final = read_output(cluster, dst, 3)
    assert_exactly_the_input([v for vs in final.values() for v in vs], n, "final consumer")
    wait_for(lambda: group_copied(cluster, group) == n, 30, f"the group's offsets at {n}")


def test_rebalance_aborts_the_open_transaction_and_the_output_stays_exact(cluster: LocalCluster) -> None:
    # Given an in-process copier whose transaction stays open while input keeps arriving (no count/age trigger)
    n, src, dst, group = 4_000, "in-rebalance", "out-rebalance", "copy-rebalance"
    cluster.create_topic(src, partitions=2, rf=3)
    cluster.create_topic(dst, partitions=3, rf=3)
    fill(cluster, src, 2, n)
    config = CopierConfig(
        ",".join(cluster.urls), src, dst, group, "copier-rebalance", commit_every=0, commit_every_ms=0,
        transform="python:tests.support.copier_transforms:throttled", idle_exit_ms=1000,
        session_timeout_ms=2000, heartbeat_interval_ms=200, progress_interval_ms=0,
    )  # fmt: skip
    result: list[CopierStats | BaseException] = []

    def run() -> None:
        try:
            result.append(run_copier(config, emit=lambda _e: None))
        except BaseException as exc:  # reported below
            result.append(exc)

    copier = threading.Thread(target=run, daemon=True)
    copier.start()
    wait_for(lambda: http("GET", cluster.url(1) + f"/v1/groups/{group}")[1].get("members"), 30, "the copier to join")
    # When another member joins mid-transaction, holds a partition for a while, then leaves
    with Consumer(",".join(cluster.urls), group_id=group, enable_auto_commit=False, session_timeout_ms=2000,
                  heartbeat_interval_ms=200, isolation_level="read_committed") as other:  # fmt: skip
        other.subscribe([src])
        wait_for(lambda: other.poll(0) == [] and len(other.assignment()) == 1, 30, "a partition for the other member")
    copier.join(120)
    # Then the copier aborted its open transaction at the rebalance and still copied everything exactly once
    assert result and isinstance(result[0], CopierStats), result
    stats = result[0]
    assert stats.aborted >= 1 and stats.rebalances >= 3, stats
    final = read_output(cluster, dst, 3)
    assert_exactly_the_input([v for vs in final.values() for v in vs], n, "final consumer")
    wait_for(lambda: group_copied(cluster, group) == n, 30, f"the group's offsets at {n}")


def test_a_fenced_copier_exits_non_zero_and_its_successor_finishes(cluster: LocalCluster, copiers: Any) -> None:
    # Given a copier mid-run
    n, src, dst, group = 6_000, "in-fenced", "out-fenced", "copy-fenced"
    cluster.create_topic(src, partitions=2, rf=3)
    cluster.create_topic(dst, partitions=3, rf=3)
    fill(cluster, src, 2, n)
    zombie = copiers(src, dst, group, "copier-fenced")
    wait_for(lambda: group_copied(cluster, group) >= 0.1 * n, 60, "10% copied")
    # When a second instance with the same transactional id starts (init_transactions fences the first)
    successor = CopierProcess(cluster, zombie.workdir, src, dst, group, "copier-fenced")
    try:
        successor.start()
        # Then the first one stops with a non-zero exit and a Fatal line; the second copies the rest exactly once
        assert zombie.wait(60) == 1, zombie.tail()
        assert zombie.progress()[-1]["stage"] == "Fatal", zombie.tail()
        finish(successor)
    finally:
        successor.close()
    final = read_output(cluster, dst, 3)
    assert_exactly_the_input([v for vs in final.values() for v in vs], n, "final consumer")
