"""Checks on broker state for the Spark tests, written on the raw HTTP API (independent of spark_io)."""

from __future__ import annotations

import base64
import time
from typing import Any

from tests.support.cluster import LocalCluster, http, wait_for


def committed_records(c: LocalCluster, topic: str, partitions: int, via: int = 1) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record a read_committed consumer sees, from each leader."""
    out: list[tuple[int, int, bytes]] = []
    for p in range(partitions):
        base = c.url(c.wait_leaders(topic, partitions)[p])
        offset = 0
        deadline = time.monotonic() + 30
        while True:
            url = (f"{base}/v1/topics/{topic}/partitions/{p}/records"
                   f"?offset={offset}&max_bytes=4194304&isolation=read_committed")  # fmt: skip
            status, res = http("GET", url)
            if status == 421 and time.monotonic() < deadline:  # leadership moved: follow it
                base = res.get("leader_url") or base
                time.sleep(0.05)  # polling interval while leadership settles, bounded by the deadline
                continue
            assert status == 200, res
            out.extend((p, r["offset"], base64.b64decode(r["value"])) for r in res["records"])
            if res["next_offset"] >= res["last_stable_offset"] or res["next_offset"] == offset:
                break
            offset = res["next_offset"]
    return out


def committed_values(c: LocalCluster, topic: str, partitions: int) -> list[bytes]:
    return [v for _p, _o, v in committed_records(c, topic, partitions)]


def open_transactions(c: LocalCluster, prefix: str = "", via: int = 1) -> list[dict[str, Any]]:
    status, res = http("GET", f"{c.url(via)}/v1/transactions?state=Ongoing,Prepared&prefix={prefix}")
    assert status == 200, res
    return list(res["transactions"])


def wait_stable(c: LocalCluster, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Every partition's last stable offset reaches its high watermark: no open transaction pins it."""

    def stable() -> bool:
        meta = c.metadata(1)
        parts = next(t for t in meta["topics"] if t["name"] == topic)["partitions"]
        return len(parts) == partitions and all(p["last_stable_offset"] == p["high_watermark"] for p in parts)

    wait_for(stable, timeout, f"LSO == HW on every partition of {topic}")


def produce_plain(c: LocalCluster, topic: str, partition: int, values: list[bytes], headers: Any = None) -> list[int]:
    """Plain (non-transactional) records through the convenience endpoint; returns their offsets."""
    recs = [{"value": base64.b64encode(v).decode(), "partition": partition} for v in values]
    status, res = http("POST", c.url(1) + f"/v1/topics/{topic}/records", {"records": recs})
    assert status == 200, res
    return [o["offset"] for o in res["offsets"]]
