"""``txbroker produce`` / ``txbroker consume`` as a user runs them: subprocesses against a real cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.support.cluster import REPO, LocalCluster, samples, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cli"), 3)
    try:
        yield c.start()
    finally:
        c.close()


def txbroker(*args: str, stdin: bytes = b"", timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "cluster", *args], input=stdin, capture_output=True, timeout=timeout, env=env, cwd=REPO
    )


def test_keyed_produce_then_consume_round_trips_every_line(cluster):
    cluster.create_topic("cli-keyed", partitions=3, rf=3)
    lines = [f"key-{i}\tvalue {i} é".encode() for i in range(20_000)]
    res = txbroker("produce", "cli-keyed", "--bootstrap", cluster.url(2), "--keyed", stdin=b"\n".join(lines) + b"\n")
    assert res.returncode == 0, res.stderr
    assert b"produced 20000 records to cli-keyed" in res.stderr
    res = txbroker("consume", "cli-keyed", "--bootstrap", cluster.url(3), "--from-beginning", "--print-key",
                   "--max", "20000")  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert len(out) == 20_000
    assert sorted(out) == sorted(lines)  # every line exactly once (keys spread them over 3 partitions)
    assert b"consumed 20000 records" in res.stderr


def test_one_partition_keeps_the_line_order_and_stops_when_idle(cluster):
    cluster.create_topic("cli-order", partitions=2, rf=3)
    lines = [f"line {i}".encode() for i in range(5000)] + [b"", b"tab\tinside"]
    res = txbroker("produce", "cli-order", "--bootstrap", cluster.url(1), "--partition", "1",
                   stdin=b"\n".join(lines) + b"\n")  # fmt: skip
    assert res.returncode == 0, res.stderr
    t0 = time.monotonic()
    res = txbroker("consume", "cli-order", "--bootstrap", cluster.url(1), "--from-beginning", "--partition", "1",
                   "--isolation", "read_committed", "--timeout-ms", "1000")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split(b"\n")[:-1] == lines
    assert time.monotonic() - t0 < 60
    # The other partition got nothing; --max stops early
    res = txbroker("consume", "cli-order", "--bootstrap", cluster.url(1), "--from-beginning", "--partition", "0",
                   "--timeout-ms", "500")  # fmt: skip
    assert (res.returncode, res.stdout) == (0, b"")
    res = txbroker("consume", "cli-order", "--bootstrap", cluster.url(1), "--from-beginning", "--max", "3")
    assert res.stdout.split(b"\n")[:-1] == lines[:3]


def test_consume_from_a_follower_replica(cluster):
    cluster.create_topic("cli-follower", partitions=1, rf=3)
    lines = [f"f{i}".encode() for i in range(300)]
    res = txbroker("produce", "cli-follower", "--bootstrap", cluster.url(1), stdin=b"\n".join(lines) + b"\n")
    assert res.returncode == 0, res.stderr
    leader = cluster.wait_leaders("cli-follower", 1)[0]
    follower = next(n for n in (1, 2, 3) if n != leader)
    wait_for(lambda: cluster.partition_meta("cli-follower", 0, follower)["high_watermark"] == 300, 10, "caught up")
    before = fetched(cluster, follower, "cli-follower")
    res = txbroker("consume", "cli-follower", "--bootstrap", cluster.url(follower), "--from-beginning",
                   "--read-replica", "any", "--max", "300")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split(b"\n")[:-1] == lines
    assert fetched(cluster, follower, "cli-follower") - before >= 300  # the follower's replica answered
    res = txbroker("consume", "cli-follower", "--bootstrap", cluster.url(1), "--read-replica", "nearest")
    assert res.returncode != 0 and b"--read-replica" in res.stderr


def fetched(c: LocalCluster, node: int, topic: str) -> float:
    return sum(v for labels, v in samples(c.url(node), "txbroker_records_fetched_total") if labels["topic"] == topic)


def test_consume_without_from_beginning_starts_at_the_end(cluster):
    cluster.create_topic("cli-latest", partitions=1, rf=3)
    assert txbroker("produce", "cli-latest", "--bootstrap", cluster.url(1), stdin=b"a\nb\n").returncode == 0
    res = txbroker("consume", "cli-latest", "--bootstrap", cluster.url(1), "--timeout-ms", "500")
    assert (res.returncode, res.stdout) == (0, b"")


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["produce", "no-such-topic"], b"x\n", b"UNKNOWN_TOPIC_OR_PARTITION"),
        (["produce", "cli-errors", "--keyed"], b"k\tv\nno separator\n", b"no key<TAB>value separator"),
        (["produce", "cli-errors", "--partition", "7"], b"x\n", b"UNKNOWN_TOPIC_OR_PARTITION"),
        (["consume", "no-such-topic", "--timeout-ms", "200"], b"", b"UNKNOWN_TOPIC_OR_PARTITION"),
        (["consume", "cli-errors", "--partition", "7", "--timeout-ms", "200"], b"", b"UNKNOWN_TOPIC_OR_PARTITION"),
    ],
)
def test_failures_exit_non_zero_with_the_error_code(cluster, args, stdin, message):
    if not any(t["name"] == "cli-errors" for t in cluster.metadata(1)["topics"]):
        cluster.create_topic("cli-errors", partitions=1, rf=3)
    res = txbroker(*args, "--bootstrap", cluster.url(1), stdin=stdin, timeout=60)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert message in res.stderr


def test_unreachable_bootstrap_exits_non_zero(cluster):
    from cluster.config import free_ports

    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    for args in (["produce", "t"], ["consume", "t", "--timeout-ms", "200"]):
        res = txbroker(*args, "--bootstrap", dead, stdin=b"x\n", timeout=60)
        assert res.returncode == 1
        assert b"NETWORK_EXCEPTION" in res.stderr
