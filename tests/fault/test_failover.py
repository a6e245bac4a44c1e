"""Kills, restarts and full-cluster restarts with real node processes (SIGKILL / SIGTERM)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.cluster import wait_for
from tests.support.writer import IdempotentWriter, read_partition

pytestmark = [pytest.mark.integration, pytest.mark.fault]


class Acked:
    """Values acknowledged per partition, in order, with their offsets."""

    def __init__(self) -> None:
        self.values: dict[int, list[bytes]] = {}
        self.ack_times: list[float] = []

    def add(self, p: int, base: int, values: list[bytes]) -> None:
        lst = self.values.setdefault(p, [])
        assert base == len(lst), f"partition {p}: acked base offset {base}, expected {len(lst)}"
        lst.extend(values)
        self.ack_times.append(time.monotonic())


def converge(c, topic: str, partitions: int, nodes, timeout: float = 30.0) -> dict[int, int]:
    def same() -> dict[int, int] | None:
        hws = {}
        for p in range(partitions):
            vals = {c.partition_meta(topic, p, n)["high_watermark"] for n in nodes}
            if len(vals) != 1:
                return None
            hws[p] = vals.pop()
        return hws

    return wait_for(same, timeout, f"high watermarks of {topic} converge on nodes {list(nodes)}")


def test_sigkill_leader_while_producing_loses_and_duplicates_nothing(make_cluster):
    # Given a producer writing continuously to a partition led by some node
    c = make_cluster()
    c.create_topic("t", partitions=1, rf=3)
    w = IdempotentWriter(c, "t")
    acked = Acked()
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        i = 0
        try:
            while not stop.is_set():
                values = [f"r{i}-{j}".encode() for j in range(20)]
                acked.add(0, w.send(0, values, timeout=20), values)
                i += 1
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    th = threading.Thread(target=produce)
    th.start()
    try:
        wait_for(lambda: len(acked.values.get(0, [])) >= 400, 20, "some writes before the kill")
        leader = c.leader("t", 0)
        # When the leader is SIGKILLed mid-stream
        killed_at = time.monotonic()
        c.kill(leader)
        wait_for(lambda: any(t > killed_at for t in acked.ack_times), 15, "a write acknowledged after the kill")
        first_ack = min(t for t in acked.ack_times if t > killed_at)
        wait_for(lambda: len(acked.values[0]) >= 1500, 20, "writes continue on the new leader")
    finally:
        stop.set()
        th.join(30)
    assert not errors, errors
    # Then a new leader accepted writes within 3 s ...
    print(f"FAILOVER {first_ack - killed_at:.2f}s")
    assert first_ack - killed_at < 3.0, f"failover took {first_ack - killed_at:.2f}s"
    survivors = [n for n in (1, 2, 3) if n != leader]
    new_leader = c.leader("t", 0)
    assert new_leader in survivors
    # ... and every acknowledged record is there exactly once, in order, on both survivors
    hw = converge(c, "t", 1, survivors)[0]
    for n in survivors:
        got = [v for _, v in read_partition(c, "t", 0, n)]
        assert got[: len(acked.values[0])] == acked.values[0]
        assert len(set(got)) == len(got), "duplicate record"
        assert len(got) == hw
    # And the killed node restarts and converges to the same high watermark and data
    c.start_node(leader)
    c.wait_ready([leader])
    converge(c, "t", 1, (1, 2, 3))
    assert [v for _, v in read_partition(c, "t", 0, leader)][: len(acked.values[0])] == acked.values[0]


def test_full_cluster_sigterm_restart_keeps_every_acknowledged_record(make_cluster):
    c = make_cluster()
    c.create_topic("t", partitions=3, rf=3)
    w = IdempotentWriter(c, "t")
    acked = Acked()
    for i in range(60):
        p = i % 3
        values = [f"{i}-{j}".encode() for j in range(25)]
        acked.add(p, w.send(p, values), values)
    # When every node is stopped with SIGTERM and started again
    for n in (1, 2, 3):
        assert c.stop_node(n) == 0, f"node {n} did not exit 0 on SIGTERM"
    c.start()
    c.wait_leaders("t", 3)
    # Then every replica holds every acknowledged record
    converge(c, "t", 3, (1, 2, 3))
    for p in range(3):
        for n in (1, 2, 3):
            assert [v for _, v in read_partition(c, "t", p, n)] == acked.values[p]
    # And the producer's sequence continues after the restart without duplicates
    acked.add(0, w.send(0, [b"after-restart"]), [b"after-restart"])


def test_full_cluster_sigkill_restart_keeps_every_acknowledged_record(make_cluster):
    c = make_cluster()
    c.create_topic("t", partitions=2, rf=3)
    w = IdempotentWriter(c, "t")
    acked = Acked()
    for i in range(40):
        values = [f"{i}-{j}".encode() for j in range(25)]
        acked.add(i % 2, w.send(i % 2, values), values)
    for n in (1, 2, 3):
        c.kill(n)
    c.start()
    c.wait_leaders("t", 2)
    converge(c, "t", 2, (1, 2, 3))
    for p in range(2):
        for n in (1, 2, 3):
            assert [v for _, v in read_partition(c, "t", p, n)] == acked.values[p]


def test_follower_down_during_10k_records_catches_up(make_cluster):
    # A small compaction threshold forces the returning follower to install a snapshot.
    c = make_cluster(raft_log_compaction_min_entries=50)
    c.create_topic("t", partitions=1, rf=3)
    leader = c.leader("t", 0)
    follower = next(n for n in (1, 2, 3) if n != leader)
    c.kill(follower)
    w = IdempotentWriter(c, "t", via=leader)
    acked = Acked()
    for i in range(100):
        values = [f"{i}-{j}".encode() for j in range(100)]
        acked.add(0, w.send(0, values), values)
    assert len(acked.values[0]) == 10_000
    c.start_node(follower)
    c.wait_ready([follower])
    wait_for(
        lambda: c.partition_meta("t", 0, follower)["high_watermark"] == 10_000, 60, "the returning follower catches up"
    )
    assert [v for _, v in read_partition(c, "t", 0, follower)] == acked.values[0]
