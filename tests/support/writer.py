"""A minimal idempotent HTTP writer and reader for tests, independent of the client library.

The writer retries every batch with the SAME producer id, epoch and sequence
until it is acknowledged, following leader changes, exactly as Kafka's
idempotent producer does -- so retries can never duplicate a record.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from .cluster import LocalCluster, http, wait_for

RETRIABLE = {
    "NOT_LEADER_OR_FOLLOWER",
    "REQUEST_TIMED_OUT",
    "LEADER_NOT_AVAILABLE",
    "NETWORK_EXCEPTION",
    "THROTTLING_QUOTA_EXCEEDED",
    "NOT_ENOUGH_REPLICAS",
    "UNKNOWN_TOPIC_OR_PARTITION",
}


class IdempotentWriter:
    def __init__(self, cluster: LocalCluster, topic: str, via: int = 1) -> None:
        self.cluster = cluster
        self.topic = topic

        def init() -> dict[str, Any] | None:
            status, body = http("POST", cluster.url(via) + "/v1/producers/init", {"transactional_id": None})
            if status == 200:
                return dict(body)
            assert body.get("retriable"), body  # only retriable errors may be retried
            return None

        body = wait_for(init, 20, "a producer id")
        self.producer_id = body["producer_id"]
        self.epoch = body["producer_epoch"]
        self.seq: dict[int, int] = {}
        self.leader_url: dict[int, str] = {}
        self.retries = 0

    def _refresh(self, partition: int) -> None:
        for i, p in self.cluster.procs.items():
            if p.poll() is not None:
                continue
            try:
                meta = self.cluster.partition_meta(self.topic, partition, i)
            except Exception:
                continue
            if meta.get("leader_url"):
                self.leader_url[partition] = meta["leader_url"]
                return

    def send(self, partition: int, values: list[bytes], timeout: float = 30.0) -> int:
        """Write ``values`` as one batch; return its base offset once acknowledged."""
        seq = self.seq.get(partition, 0)
        body = {
            "acks": "all",
            "timeout_ms": 5000,
            "partitions": [
                {
                    "topic": self.topic,
                    "partition": partition,
                    "producer_id": self.producer_id,
                    "producer_epoch": self.epoch,
                    "base_sequence": seq,
                    "records": [{"value": base64.b64encode(v).decode()} for v in values],
                }
            ],
        }
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if partition not in self.leader_url:
                self._refresh(partition)
            url = self.leader_url.get(partition, self.cluster.urls[0])
            try:
                status, res = http("POST", url + "/v1/produce", body, timeout=10)
            except OSError as exc:
                last = exc
                self.leader_url.pop(partition, None)
                self.retries += 1
                time.sleep(0.05)
                continue
            part = res["partitions"][0] if isinstance(res, dict) and res.get("partitions") else res
            code = part.get("error_code", "NONE") if isinstance(part, dict) else "?"
            if status == 200 and code == "NONE":
                self.seq[partition] = seq + len(values)
                return int(part["base_offset"])
            last = (status, res)
            if code not in RETRIABLE:
                raise AssertionError(f"non-retriable produce error: {last}")
            self.retries += 1
            hint = part.get("leader_url") if isinstance(part, dict) else None
            if hint:
                self.leader_url[partition] = hint
            else:
                self.leader_url.pop(partition, None)
            time.sleep(0.05)
        raise AssertionError(f"batch not acknowledged within {timeout}s: {last}")


def read_partition(
    cluster: LocalCluster, topic: str, partition: int, via: int, until: int | None = None
) -> list[tuple[int, bytes]]:
    """Every (offset, value) of a partition as node ``via``'s replica holds it."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        status, res = http(
            "GET",
            f"{cluster.url(via)}/v1/topics/{topic}/partitions/{partition}/records"
            f"?offset={offset}&max_bytes=4194304&read_replica=any",
        )
        assert status == 200, res
        for r in res["records"]:
            out.append((r["offset"], base64.b64decode(r["value"])))
        end = until if until is not None else res["high_watermark"]
        if res["next_offset"] >= end or not res["records"]:
            return out
        offset = res["next_offset"]
