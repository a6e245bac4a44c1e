"""Client CPU per record of ``AsyncProducer`` alone: no cluster, an instant in-process broker.

The produce benches run the client on the cores the nodes use, so what the
client spends per record is taken from the nodes. This measures that cost
without them: metadata for a 3-partition topic is preset, the producer id is
set, and every produce request is answered at once (after one event-loop
turn) with consecutive offsets. What remains is ``send()``, batching,
sealing, the sender, answer handling and the futures -- everything but the
network. ``python -m bench.send_path`` prints microseconds of CPU per
record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from clients.aio import PartitionInfo
from clients.aio.producer import AsyncProducer
from clients.protocol import BATCH_HEADER, decode_produce_request

__all__ = ["run_send_path_bench"]


async def run_send_path_bench(records: int, record_size: int = 1024, warmup: int = 20_000) -> dict[str, Any]:
    p = AsyncProducer(["http://127.0.0.1:9"], linger_ms=5, batch_size=65536, buffer_memory=4 * 1024 * 1024)
    md = p._metadata
    md._node_urls = {i + 1: f"http://node{i + 1}" for i in range(3)}
    md._topics = {"t": {i: PartitionInfo("t", i, i + 1, f"http://node{i + 1}", (1, 2, 3), 0, 0, 0) for i in range(3)}}
    md._fetched_at = time.monotonic() + 1e9  # never stale
    p._idem.set_producer_id(1000, 0)
    offsets: dict[int, int] = {}

    async def answer(url: str, data: bytes, content_type: str) -> tuple[str, bytes]:
        await asyncio.sleep(0)
        parts = []
        for part in decode_produce_request(data).partitions:
            base = offsets.get(part.partition, 0)
            offsets[part.partition] = base + BATCH_HEADER.unpack_from(part.batch)[6]  # record_count
            parts.append({"topic": part.topic, "partition": part.partition, "error_code": "NONE",
                          "base_offset": base, "log_append_time": -1})  # fmt: skip
        return "application/json", json.dumps({"partitions": parts}).encode()

    p._session.post_bytes = answer  # type: ignore[method-assign]
    value = os.urandom(record_size)
    try:
        p.ensure_started()
        for _ in range(warmup):
            await p.send("t", value)
        await p.flush()
        acked0, c0, t0 = p.metrics()["records_acked"], time.process_time(), time.perf_counter()
        for _ in range(records):
            await p.send("t", value)
        await p.flush()
        c1, t1 = time.process_time(), time.perf_counter()
        acked = p.metrics()["records_acked"] - acked0
    finally:
        await p.close()
    if acked != records:
        raise RuntimeError(f"{acked} of {records} records acknowledged")
    return {
        "records": records,
        "cpu_us_per_record": round(1e6 * (c1 - c0) / records, 2),
        "wall_us_per_record": round(1e6 * (t1 - t0) / records, 2),
        "requests": p.metrics()["requests"],
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.send_path", description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args(argv)
    runs = [asyncio.run(run_send_path_bench(opts.records, opts.record_size)) for _ in range(opts.rounds)]
    per = sorted(r["cpu_us_per_record"] for r in runs)
    print(json.dumps({"command": "python -m bench.send_path " + " ".join(argv), "runs": runs,
                      "cpu_us_per_record_median": per[len(per) // 2]}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
