"""Client-driven produce throughput: the Python ``AsyncProducer`` vs the same records as JSON over raw HTTP.

``run_client_produce_bench`` drives ``clients.aio.AsyncProducer`` (binary
batches, idempotent, linger/batching, up to 5 batches in flight per
partition) as fast as it accepts records. ``run_json_http_produce_bench``
posts the same records to ``POST /v1/produce`` in its JSON form (base64
values, API.md), as a script using plain HTTP would: plain writes (producer
id -1, which spares the baseline the sequence bookkeeping), to each
partition's leader, ``records_per_request`` records per request and
``concurrency`` requests in flight.

``main`` also runs the producer's ``create_batch``/``send_batch`` path, and
compares both producer runs with the broker's ceiling (``bench produce``'s raw
binary writer) round by round: the producer's batches hold the same 64 records
as the ceiling's, and each round's ratio pairs runs made seconds apart, so slow
drift of a shared machine cancels; the rounds are resampled for a 95 % interval.

Both measure acknowledged records over ``duration_s`` after ``warmup_s`` and
report client CPU, so the ratio between them is the value of the client. Run
both against one cluster with ``python -m bench.clients``
(starts a 3-node cluster like ``txbroker bench``) or call them with the URLs
of a running cluster; the topic must exist.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from clients.aio.producer import AsyncProducer

from .harness import fresh_cluster
from .measure import bootstrap_95, quantile, self_cpu
from .produce_load import TOPIC, drive_produce, make_records

__all__ = ["run_client_produce_bench", "run_json_http_produce_bench"]


def _ms(seconds: list[float], q: float) -> float | None:
    """The ``q`` quantile of latencies in seconds, in ms (one decimal)."""
    value = quantile(seconds, q)
    return None if value is None else round(value * 1000, 1)


async def run_client_produce_bench(
    urls: list[str],
    topic: str,
    duration_s: float,
    record_size: int = 1024,
    *,
    warmup_s: float = 2.0,
    linger_ms: int = 5,
    batch_size: int = 65536,
    buffer_memory: int = 4 * 1024 * 1024,
    api: str = "send",
    client_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Records/s and MB/s acknowledged through ``AsyncProducer``; every 64th record's latency is sampled.

    ``client_options``: further ``AsyncProducer`` keyword arguments, e.g. the security ones
    (``sasl_plain_username``, ``sasl_plain_password``, ``ssl_cafile``) of a secure cluster.

    ``api="send"``: one ``send()`` per record (null keys: the sticky partitioner
    fills one partition's batch at a time). ``api="send_batch"``: the records go
    into ``create_batch()`` builders, full batches to the partitions in turn, one
    future per batch (its latency is sampled).
    """
    if api not in ("send", "send_batch"):
        raise ValueError(f"api must be 'send' or 'send_batch', not {api!r}")
    value = os.urandom(record_size)
    latencies: list[float] = []
    window = [False]

    def sampler(sent_at: float) -> Any:
        def done(fut: asyncio.Future[Any]) -> None:
            if window[0] and not fut.cancelled() and fut.exception() is None:
                latencies.append(time.perf_counter() - sent_at)

        return done

    options = dict(client_options or {})
    async with AsyncProducer(
        urls, linger_ms=linger_ms, batch_size=batch_size, buffer_memory=buffer_memory, **options
    ) as p:
        await p.partitions_for(topic)
        loop_start = time.monotonic()
        t0 = loop_start + warmup_s
        t1 = t0 + duration_s
        m0: dict[str, Any] = {}
        c0 = 0.0
        i = 0
        now = loop_start
        parts = sorted(await p.partitions_for(topic))
        per_batch = 0
        while now < t1:
            if api == "send":
                fut = await p.send(topic, value)
                i += 1
                if i % 64:
                    continue
            else:
                batch = p.create_batch()
                if not per_batch:  # how many records fill a batch: the first one finds out
                    while batch.append(value=value) is not None:
                        per_batch += 1
                else:
                    for _ in range(per_batch):
                        batch.append(value=value)
                fut = await p.send_batch(batch, topic, partition=parts[i % len(parts)])
                i += 1
            fut.add_done_callback(sampler(time.perf_counter()))
            now = time.monotonic()
            if not window[0] and now >= t0:
                window[0] = True
                m0, c0, t0 = p.metrics(), self_cpu(), now
        m1, c1, t_end = p.metrics(), self_cpu(), time.monotonic()
        window[0] = False
        await p.flush()
    wall = t_end - t0
    records = m1["records_acked"] - m0["records_acked"]
    payload = records * record_size
    return {
        "seconds": round(wall, 2),
        "records_per_s": round(records / wall),
        "mb_per_s": round(payload / wall / 1e6, 2),
        "p50_ms": _ms(latencies, 0.5),
        "p99_ms": _ms(latencies, 0.99),
        "client_cpu_pct": round(100 * (c1 - c0) / wall, 1),
        "requests": m1["requests"] - m0["requests"],
        "records_per_request": round(records / max(1, m1["requests"] - m0["requests"]), 1),
        "batches": m1["batches"] - m0["batches"],
        "retries": m1["retries"] - m0["retries"],
        "errors": m1["errors"],
        "config": {
            "api": api,
            "linger_ms": linger_ms,
            "batch_size": batch_size,
            "buffer_memory": buffer_memory,
            "record_size": record_size,
            "idempotent": True,
        },
    }


async def run_json_http_produce_bench(
    urls: list[str],
    topic: str,
    duration_s: float,
    record_size: int = 1024,
    *,
    warmup_s: float = 2.0,
    records_per_request: int = 1,
    concurrency_per_partition: int = 5,
) -> dict[str, Any]:
    """Records/s and MB/s acknowledged when the records go to ``POST /v1/produce`` as JSON."""
    value = os.urandom(record_size)
    errors: Counter[str] = Counter()
    lat: list[float] = []
    acked = [0]
    window = [False]

    def request_body(p: int) -> bytes:
        # Built per request, as a client must: base64 of each record, then the JSON document.
        records = [{"value": base64.b64encode(value).decode()} for _ in range(records_per_request)]
        part = {"topic": topic, "partition": p, "producer_id": -1, "producer_epoch": -1, "base_sequence": -1}
        return json.dumps({"acks": "all", "partitions": [{**part, "records": records}]}).encode()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        leaders = await _find_leaders(session, urls, topic)
        stop = [False]

        async def worker(p: int) -> None:
            while not stop[0]:
                started = time.perf_counter()
                try:
                    async with session.post(
                        leaders[p] + "/v1/produce", data=request_body(p), headers={"Content-Type": "application/json"}
                    ) as resp:
                        answer = await resp.json()
                    code = answer["partitions"][0].get("error_code") or "NONE"
                except (aiohttp.ClientError, ValueError, KeyError, IndexError) as exc:
                    code = type(exc).__name__
                if code == "NONE":
                    if window[0]:
                        acked[0] += records_per_request
                        lat.append(time.perf_counter() - started)
                    continue
                errors[code] += 1
                await asyncio.sleep(0.05)
                with contextlib.suppress(Exception):
                    leaders.update(await _find_leaders(session, urls, topic))

        tasks = [asyncio.create_task(worker(p)) for p in leaders for _ in range(concurrency_per_partition)]
        try:
            await asyncio.sleep(warmup_s)
            window[0] = True
            t0, c0 = time.monotonic(), self_cpu()
            await asyncio.sleep(duration_s)
            window[0] = False
            wall, cpu = time.monotonic() - t0, self_cpu() - c0
        finally:
            stop[0] = True
            await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "seconds": round(wall, 2),
        "records_per_s": round(acked[0] / wall),
        "mb_per_s": round(acked[0] * record_size / wall / 1e6, 2),
        "p50_ms": _ms(lat, 0.5),
        "p99_ms": _ms(lat, 0.99),
        "client_cpu_pct": round(100 * cpu / wall, 1),
        "errors": dict(errors),
        "config": {
            "records_per_request": records_per_request,
            "requests_in_flight": concurrency_per_partition * len(leaders),
            "record_size": record_size,
            "idempotent": False,
        },
    }


def paired_ratio(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """Ratio of totals sum(a)/sum(b) over rounds of (a, b), each round's ratio, and a 95 % bootstrap interval."""

    def ratio_of_totals(rounds: list[tuple[float, float]]) -> float:
        return sum(a for a, _ in rounds) / max(1e-9, sum(b for _, b in rounds))

    return {
        "ratio_of_totals": round(ratio_of_totals(pairs), 3),
        "ratio_95pct_interval": bootstrap_95(pairs, ratio_of_totals),
        "per_round": [round(a / b, 3) if b else None for a, b in pairs],
    }


async def _find_leaders(session: aiohttp.ClientSession, urls: list[str], topic: str) -> dict[int, str]:
    deadline = time.monotonic() + 30
    while True:
        for url in urls:
            with contextlib.suppress(aiohttp.ClientError, ValueError, KeyError):
                async with session.get(f"{url}/v1/metadata") as resp:
                    meta = await resp.json()
                for t in meta["topics"]:
                    if t["name"] == topic and all(p.get("leader_url") for p in t["partitions"]):
                        return {int(p["partition"]): str(p["leader_url"]) for p in t["partitions"]}
        if time.monotonic() > deadline:
            raise RuntimeError(f"no leaders for every partition of {topic!r}")
        await asyncio.sleep(0.1)


def main(argv: list[str]) -> int:
    """Start a 3-node cluster and run every scenario against it, interleaved for ``--rounds`` rounds.

    The scenarios take turns (ceiling, producer, JSON, ...; reversed in odd
    rounds) so that load from other processes on the machine and drift of the
    cluster itself hit them alike; each scenario reports the round with its
    median records/s, and the ratios use those medians.
    """
    # Imported here: elsewhere in this module ``record_size`` is a parameter.
    from clients.aio._batch import BATCH_OVERHEAD, NO_HEADERS, record_size

    ap = argparse.ArgumentParser(prog="python -m bench.clients", description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=6.0, help="measured seconds per scenario and round")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--json-batch", type=int, default=64, help="records per request of the batched JSON run")
    ap.add_argument("--ceiling-concurrency", type=int, nargs="+", default=[1, 5], choices=range(1, 6),
                    help="batches in flight per partition of the raw ceiling runs (bench produce)")  # fmt: skip
    opts = ap.parse_args(argv)
    out: dict[str, Any] = {"command": "python -m bench.clients " + " ".join(argv)}
    runs: dict[str, list[dict[str, Any]]] = {}
    with fresh_cluster("txbroker-bench-client-") as cluster:
        urls = [c.url for c in cluster.configs]
        # The broker's ceiling: `txbroker bench produce`'s raw binary writer (64 KiB idempotent batches,
        # no per-record work), on a topic of its own (TOPIC), at each requested in-flight depth.
        cluster.create_topics(("client", "json1", "jsonb", TOPIC), opts.partitions)
        # Every topic led by its preferred replicas (one leader per node, as `bench produce` waits for):
        # otherwise a scenario may start on a topic whose leaders are still piled on one node.
        balanced = {name: cluster.preferred_leaders(name)[1] for name in ("client", "json1", "jsonb", TOPIC)}
        out["leaders_balanced"] = balanced
        leaders = cluster.preferred_leaders(TOPIC)[0]
        args = (opts.duration, opts.record_size)
        scenarios: dict[str, Callable[[], Any]] = {}
        for k in opts.ceiling_concurrency:
            ns = argparse.Namespace(idempotence=True, record_size=opts.record_size, batch_bytes=64 * 1024,
                                    concurrency=k, warmup=opts.warmup, duration=opts.duration)  # fmt: skip
            scenarios[f"broker_ceiling_raw_binary_{k}_in_flight"] = functools.partial(
                drive_produce, cluster, leaders, ns
            )
        # The producer's batches hold as many records as the ceiling's (64 x 1 KiB): batch_size counts the
        # batch header and each record's framing, so 64 KiB would hold 62 and cost 3 % more requests.
        value_bytes = bytes(opts.record_size)
        same_batch = BATCH_OVERHEAD + len(make_records(opts.record_size, 64 * 1024)) * record_size(
            None, value_bytes, NO_HEADERS
        )
        scenarios["python_producer"] = functools.partial(
            run_client_produce_bench, urls, "client", *args, warmup_s=opts.warmup, batch_size=same_batch
        )
        scenarios["python_producer_send_batch"] = functools.partial(
            run_client_produce_bench, urls, "client", *args, warmup_s=opts.warmup, batch_size=same_batch,
            api="send_batch",
        )  # fmt: skip
        scenarios["json_http_1_record_per_request"] = functools.partial(
            run_json_http_produce_bench, urls, "json1", *args, warmup_s=opts.warmup
        )
        scenarios[f"json_http_{opts.json_batch}_records_per_request"] = functools.partial(
            run_json_http_produce_bench, urls, "jsonb", *args, warmup_s=opts.warmup,
            records_per_request=opts.json_batch,
        )  # fmt: skip
        for r in range(opts.rounds):
            # Odd rounds run the scenarios in reverse order (ABBA): a cluster whose speed drifts during the
            # run then favours no scenario.
            order = list(scenarios.items())
            for name, run in order if r % 2 == 0 else reversed(order):
                n0, t0 = cluster.nodes_cpu(), time.monotonic()
                result = asyncio.run(run())
                busy = (cluster.nodes_cpu() - n0) / (time.monotonic() - t0)
                # The nodes' CPU per record, from the whole call (warm-up and drain included): what one
                # acknowledged record costs the broker in this scenario's request shape.
                result["nodes_busy_cores"] = round(busy, 2)
                result["nodes_cpu_us_per_record"] = round(1e6 * busy / max(1, result["records_per_s"]), 1)
                runs.setdefault(name, []).append(result)
    in_order = {name: list(results) for name, results in runs.items()}  # round r at index r, before sorting
    keys = ("mb_per_s", "records_per_s", "p50_ms", "p99_ms", "client_cpu_pct", "nodes_busy_cores",
            "nodes_cpu_us_per_record", "records_per_request", "errors", "config")  # fmt: skip
    median: dict[str, int] = {}
    for name, results in runs.items():
        results.sort(key=lambda r: r["records_per_s"])
        mid = results[len(results) // 2]
        median[name] = mid["records_per_s"]
        out[name] = {k: mid[k] for k in keys if k in mid}
        out[name]["records_per_s_all_rounds"] = [r["records_per_s"] for r in results]
    mine = median["python_producer"]
    top = max(v for k, v in median.items() if k.startswith("broker_ceiling"))
    out["producer_send_batch_vs_best_ceiling"] = round(median["python_producer_send_batch"] / top, 3) if top else None
    base = median["json_http_1_record_per_request"]
    batched = median[f"json_http_{opts.json_batch}_records_per_request"]
    out["producer_vs_best_ceiling"] = round(mine / top, 3) if top else None
    # Paired by round: each round's producer against the same round's best ceiling, which ran minutes apart
    # at most, so slow drift of the machine cancels; the interval resamples the rounds.
    best = max((k for k in in_order if k.startswith("broker_ceiling")), key=lambda k: median[k])
    for name in ("python_producer", "python_producer_send_batch"):
        pairs = [(a["records_per_s"], b["records_per_s"]) for a, b in zip(in_order[name], in_order[best], strict=True)]
        out[f"{name}_vs_ceiling_paired"] = paired_ratio(pairs)
    out["speedup_vs_json_1_record"] = round(mine / base, 2) if base else None
    out[f"speedup_vs_json_{opts.json_batch}_records"] = round(mine / batched, 2) if batched else None
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
