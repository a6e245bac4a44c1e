"""The consume benchmark's measuring code runs end to end on a small load (numbers in BENCHMARKS.md)."""

from __future__ import annotations

import asyncio

import pytest

from bench.consume import run_consume_bench

pytestmark = pytest.mark.integration


def test_consume_bench_reads_every_record_and_times_each_one(make_cluster):
    c = make_cluster()
    bench = run_consume_bench(
        c.urls, "cb", records=3000, record_size=200, partitions=2, latency_seconds=1.0, latency_rate=300
    )
    res = asyncio.run(bench)
    assert res["partitions"] == 2
    assert res["throughput"]["records"] == 3000
    assert res["throughput"]["records_per_s"] > 0
    lat = res["latency"]
    assert lat["sent"] >= 250
    assert (lat["records"], lat["not_received"]) == (lat["sent"], 0)
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
