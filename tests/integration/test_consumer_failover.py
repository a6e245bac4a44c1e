"""A partition leader is SIGKILLed while a consumer reads: it follows the new leader with no gap or duplicate."""

from __future__ import annotations

import threading
import time

import pytest

from clients.consumer import Consumer
from clients.records import ConsumerRecord
from tests.support.writer import IdempotentWriter

pytestmark = [pytest.mark.integration, pytest.mark.fault]

PARTITIONS = 3
BEFORE = 4000  # records per partition written before the kill
AFTER = 1500  # records per partition written after it (only a new leader can serve them)
BATCH = 250


def write(w: IdempotentWriter, expected: dict[int, list[bytes]], per_partition: int) -> None:
    for _ in range(per_partition // BATCH):
        for p in range(PARTITIONS):
            n = len(expected[p])
            values = [f"{p}-{n + i}".encode() for i in range(BATCH)]
            assert w.send(p, values, timeout=60) == n
            expected[p].extend(values)


def test_consumer_follows_leader_sigkill_without_gap_or_duplicate(make_cluster):
    c = make_cluster()
    c.create_topic("fo", partitions=PARTITIONS, rf=3)
    w = IdempotentWriter(c, "fo")
    expected: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    write(w, expected, BEFORE)
    victim = c.leader("fo", 0)
    assert victim is not None
    # The victim is the first bootstrap URL, so metadata refreshes must fail over too.
    bootstrap = [c.url(victim)] + [u for u in c.urls if u != c.url(victim)]
    got: list[ConsumerRecord] = []
    total = PARTITIONS * (BEFORE + AFTER)
    consumer = Consumer(
        bootstrap,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4096,  # many small fetches: the kill lands mid-stream
        fetch_max_wait_ms=200,
        request_timeout_ms=5000,
    )
    writer_error: list[BaseException] = []
    try:
        consumer.assign([("fo", p) for p in range(PARTITIONS)])
        # Given a consumer part-way through the log
        while len(got) < PARTITIONS * BEFORE // 3:
            got.extend(consumer.poll(timeout_ms=1000, max_records=100))
        # When the leader of partition 0 is SIGKILLed and more records are written to the new leaders
        c.kill(victim)
        consumed_at_kill = len(got)

        def write_after() -> None:
            try:
                write(w, expected, AFTER)
            except BaseException as exc:
                writer_error.append(exc)

        t = threading.Thread(target=write_after)
        t.start()
        deadline = time.monotonic() + 120
        while len(got) < total and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=1000))
        t.join(60)
        assert not writer_error, writer_error
        # Nothing beyond what was written
        assert consumer.poll(timeout_ms=500) == []
    finally:
        consumer.close()
    # Then every record arrives exactly once, in offset order, with its contents
    assert consumed_at_kill < PARTITIONS * BEFORE
    by_partition: dict[int, list[ConsumerRecord]] = {p: [] for p in range(PARTITIONS)}
    for r in got:
        by_partition[r.partition].append(r)
    for p in range(PARTITIONS):
        offsets = [r.offset for r in by_partition[p]]
        assert offsets == list(range(BEFORE + AFTER)), f"partition {p}: gap or duplicate"
        assert [r.value for r in by_partition[p]] == expected[p]
