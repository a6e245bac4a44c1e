"""Read a partition back the two ways a read_committed reader can (kafka_txn.md §7.4), for transaction tests.

* ``http_read``: the server-filtered JSON fetch (``GET .../records``), paged
  with ``next_offset`` up to the last stable offset (read_committed) or the
  high watermark (read_uncommitted).
* ``consume_all``: ``clients.Consumer`` with ``isolation_level``, which fetches
  batches and filters aborted transactions itself (seed 000's algorithm).

Both return ``(offset, value)`` lists in offset order. EndTxn answers once the
decision is durable and the markers follow: a check right after a commit first
waits for them (``wait_settled``), or polls for the expected records.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any

from clients import Consumer
from clients.records import TopicPartition

from .cluster import LocalCluster, http, wait_for


def fetch_page(
    url: str, topic: str, partition: int, offset: int, isolation: str, read_replica: str = "leader"
) -> dict[str, Any]:
    """One fetch page. A leader read asked of a node that does not lead (any more) follows its ``leader_url``
    (for a few seconds, while leadership settles); ``read_replica="any"``: that node's own copy."""
    path = (f"/v1/topics/{topic}/partitions/{partition}/records?offset={offset}&isolation={isolation}"
            f"&max_bytes=1048576&read_replica={read_replica}")  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        status, body = http("GET", url + path, timeout=10)
        if status != 421 or time.monotonic() > deadline:
            break
        url = body.get("leader_url") or url
        time.sleep(0.05)  # polling interval while leadership settles, bounded by the deadline
    assert status == 200, (path, status, body)
    return dict(body)


def http_read(
    url: str, topic: str, partition: int, isolation: str = "read_committed", read_replica: str = "leader"
) -> list[tuple[int, bytes]]:
    """Every record the server returns to ``isolation`` from offset 0, asking the node at ``url`` (its leader
    read follows the partition's leader; ``read_replica="any"``: the node's own copy)."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    for _ in range(100_000):
        body = fetch_page(url, topic, partition, offset, isolation, read_replica)
        out.extend((r["offset"], base64.b64decode(r["value"])) for r in body["records"])
        end = body["last_stable_offset"] if isolation == "read_committed" else body["high_watermark"]
        nxt = int(body["next_offset"])
        if nxt >= end or (nxt <= offset and not body["records"]):
            return out
        offset = nxt
    raise AssertionError(f"{topic}-{partition}: fetch never reached the end")


def wait_settled(c: LocalCluster, topic: str, partitions: Sequence[int], timeout: float = 30.0) -> None:
    """Wait until no transaction is open on the partitions: the last stable offset reaches the high watermark.

    After a commit or abort answered, this means its markers are written (the
    transaction's records keep the LSO below the high watermark until then).
    """

    def settled() -> bool:
        for p in partitions:
            page = fetch_page(leader_url(c, topic, p), topic, p, 0, "read_committed")
            if page["last_stable_offset"] != page["high_watermark"]:
                return False
        return True

    wait_for(settled, timeout, f"no open transaction on {topic} {list(partitions)}")


def leader_url(c: LocalCluster, topic: str, partition: int) -> str:
    leader = c.leader(topic, partition)
    assert leader is not None, f"no leader for {topic}-{partition}"
    return c.url(leader)


def consume_all(
    urls: Sequence[str], tps: Sequence[TopicPartition], isolation: str, timeout: float = 30.0
) -> dict[TopicPartition, list[tuple[int, bytes]]]:
    """Poll a fresh Consumer from the beginning until each partition's position reaches its end offset
    (the last stable offset under read_committed), as of the start."""
    out: dict[TopicPartition, list[tuple[int, bytes]]] = {tp: [] for tp in tps}
    with Consumer(list(urls), isolation_level=isolation, auto_offset_reset="earliest") as c:
        c.assign(list(tps))
        ends = c.end_offsets(list(tps))
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"consumer stuck below {ends}: {[c.position(tp) for tp in tps]}"
            for r in c.poll(timeout_ms=200):
                assert r.value is not None
                out[r.topic_partition].append((r.offset, r.value))
    return out
