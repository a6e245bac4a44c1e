"""The broker calls the connector makes, over the HTTP API (API.md), synchronous and retrying.

Spark runs connector code in short-lived planner processes, in executor
workers and in commit processes; each builds a ``BrokerClient`` from the
``bootstrap`` option. Nothing here keeps state that matters across processes
except the metadata cache (leaders), which is refreshed whenever an answer
says it is stale.

Terms: a *topic-partition* (``tp``) is ``(topic, partition)``; the *end* of a
partition for a reader is its last stable offset under read_committed and its
high watermark under read_uncommitted (Kafka's ``endOffsets`` by isolation).
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

from clients.aio import parse_bootstrap
from clients.protocol import (
    BATCHES_CONTENT_TYPE,
    BrokerError,
    ErrorCode,
    FetchBatches,
    decode_fetch_batches,
    decode_records,
)

from . import _http
from .options import NO_CREDENTIALS, Credentials

log = logging.getLogger("spark_io")
T = TypeVar("T")
TP = tuple[str, int]

READ_COMMITTED = "read_committed"
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588  # the broker's topic default (Kafka's)
READ_UNCOMMITTED = "read_uncommitted"

# Errors after which the same request may succeed once the cluster has moved on (a new leader, a
# coordinator elected, a replica caught up). NOT_LEADER/NOT_COORDINATOR also refresh metadata.
_STALE_METADATA = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NETWORK_EXCEPTION}


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition as its leader reports it."""

    leader_url: str | None
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int

    def end(self, isolation: str) -> int:
        return self.last_stable_offset if isolation == READ_COMMITTED else self.high_watermark


_REPLICA_RETRY_S = 5.0  # how long a partition is read from its leader after a failed follower read


def retry_delay(attempt: int) -> float:
    """Exponential backoff with jitter: 50 ms doubling to 1 s."""
    return float(min(1.0, 0.05 * 2**attempt)) * (0.5 + random.random() / 2)


class BrokerClient:
    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_s: float = 30.0,
        read_replica: str = "leader",
        credentials: Credentials = NO_CREDENTIALS,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.credentials = credentials  # every request carries them (Basic header, CA, client certificate)
        self.timeout = request_timeout_s
        self.read_replica = read_replica  # "any": fetch from a replica among the bootstrap URLs (follower read)
        self._known: list[str] = list(self.bootstrap)
        self._leaders: dict[TP, str | None] = {}
        self._replica_urls: dict[TP, list[str]] = {}
        self._leader_only_until: dict[TP, float] = {}  # follower reads that failed: from the leader until then
        self._partition_counts: dict[str, int] = {}
        self._max_message_bytes: dict[str, int] = {}

    # ---- plumbing ------------------------------------------------------------------------------

    def _any_node(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """Ask the bootstrap URLs (then every node learnt from metadata) until one answers."""
        last: BrokerError | None = None
        for url in list(dict.fromkeys(self._known)):
            try:
                return _http.request_json(
                    method, url + path, body, timeout=timeout or self.timeout, credentials=self.credentials
                )
            except BrokerError as exc:
                if exc.error_code is not ErrorCode.NETWORK_EXCEPTION:
                    raise
                last = exc
        assert last is not None
        raise last

    def retrying(self, call: Callable[[], T], what: str, deadline_s: float | None = None) -> T:
        """Run ``call`` until it succeeds, a non-retriable error occurs, or ``deadline_s`` passes."""
        deadline = time.monotonic() + (deadline_s if deadline_s is not None else 2 * self.timeout)
        attempt = 0
        while True:
            try:
                return call()
            except BrokerError as exc:
                if not exc.retriable or time.monotonic() >= deadline:
                    raise
                if exc.error_code in _STALE_METADATA:
                    self._leaders.clear()
                log.debug("%s: %s; retrying", what, exc)
                time.sleep(retry_delay(attempt))
                attempt += 1

    # ---- metadata --------------------------------------------------------------------------------

    def metadata(self, topics: Iterable[str] | None = None) -> dict[str, Any]:
        query = "" if topics is None else "?topics=" + ",".join(quote(t, safe="") for t in topics)
        meta: dict[str, Any] = self._any_node("GET", "/v1/metadata" + query)
        node_urls = {int(n["id"]): n["url"].rstrip("/") for n in meta.get("nodes", []) if n.get("url")}
        self._known = list(dict.fromkeys([*self.bootstrap, *node_urls.values()]))
        for t in meta.get("topics", []):
            self._partition_counts[t["name"]] = len(t["partitions"])
            limit = (t.get("config") or {}).get("max.message.bytes", DEFAULT_MAX_MESSAGE_BYTES)
            self._max_message_bytes[t["name"]] = int(limit)
            for p in t["partitions"]:
                tp = (t["name"], int(p["partition"]))
                self._leaders[tp] = p.get("leader_url")
                self._replica_urls[tp] = [node_urls[r] for r in p.get("replicas", []) if r in node_urls]
        return meta

    def topic_names(self) -> list[str]:
        return sorted(t["name"] for t in self.metadata()["topics"] if not t["name"].startswith("__"))

    def resolve_topics(self, subscribe: Sequence[str] | None, pattern: str | None) -> list[str]:
        """The topics a ``subscribe`` list or ``subscribePattern`` regex (Python ``re``, full match) names."""
        if pattern is not None:
            rx = re.compile(pattern)
            return [t for t in self.topic_names() if rx.fullmatch(t)]
        return list(subscribe or ())

    def partition_count(self, topic: str) -> int:
        if topic not in self._partition_counts:
            self.metadata([topic])
        n = self._partition_counts.get(topic)
        if not n:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
        return n

    def max_message_bytes(self, topic: str) -> int:
        """The topic's largest accepted batch (``max.message.bytes``)."""
        if topic not in self._max_message_bytes:
            self.partition_count(topic)
        return self._max_message_bytes.get(topic, DEFAULT_MAX_MESSAGE_BYTES)

    def topic_partitions(self, topics: Iterable[str]) -> list[TP]:
        meta = self.metadata(list(topics))
        found = {t["name"]: len(t["partitions"]) for t in meta["topics"]}
        out: list[TP] = []
        for t in topics:
            if t not in found:
                raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {t!r}")
            out.extend((t, p) for p in range(found[t]))
        return out

    def leader_url(self, tp: TP) -> str:
        url = self._leaders.get(tp)
        if url is None:
            self.metadata([tp[0]])
            url = self._leaders.get(tp)
        if url is None:
            self._leaders.pop(tp, None)
            raise BrokerError(ErrorCode.LEADER_NOT_AVAILABLE, f"{tp[0]}-{tp[1]} has no leader")
        return url.rstrip("/")

    def forget_leader(self, tp: TP) -> None:
        self._leaders.pop(tp, None)

    def partition_states(self, tps: Iterable[TP]) -> dict[TP, PartitionState]:
        """Offsets of ``tps`` from each one's leader (a follower's view may lag behind)."""
        wanted = set(tps)

        def once() -> dict[TP, PartitionState]:
            topics = sorted({t for t, _ in wanted})
            meta = self.metadata(topics)
            by_leader: dict[str, set[TP]] = {}
            for t in meta["topics"]:
                for p in t["partitions"]:
                    tp = (t["name"], int(p["partition"]))
                    if tp in wanted:
                        if not p.get("leader_url"):
                            raise BrokerError(ErrorCode.LEADER_NOT_AVAILABLE, f"{tp[0]}-{tp[1]} has no leader")
                        by_leader.setdefault(p["leader_url"].rstrip("/"), set()).add(tp)
            out: dict[TP, PartitionState] = {}
            for url, owned in by_leader.items():
                view = _http.request_json("GET", url + "/v1/metadata?topics=" + ",".join(quote(t) for t in topics),
                                          timeout=self.timeout, credentials=self.credentials)  # fmt: skip
                for t in view["topics"]:
                    for p in t["partitions"]:
                        tp = (t["name"], int(p["partition"]))
                        if tp in owned and (p.get("leader_url") or "").rstrip("/") == url:
                            out[tp] = PartitionState(url, int(p["log_start_offset"]), int(p["high_watermark"]),
                                                     int(p["last_stable_offset"]))  # fmt: skip
            missing = wanted - out.keys()
            if missing:
                tp = min(missing)
                raise BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"leadership of {tp[0]}-{tp[1]} is moving")
            return out

        return self.retrying(once, "partition offsets")

    # ---- fetch -------------------------------------------------------------------------------------

    def fetch_url(self, tp: TP) -> str:
        """Where a fetch of ``tp`` goes: its leader; with ``read_replica="any"`` a replica among the bootstrap
        URLs when there is one (and no follower read of ``tp`` failed in the last ``_REPLICA_RETRY_S``)."""
        if self.read_replica == "any" and time.monotonic() >= self._leader_only_until.get(tp, 0.0):
            if tp not in self._replica_urls:
                self.metadata([tp[0]])
            replicas = self._replica_urls.get(tp, [])
            for url in self.bootstrap:
                if url in replicas:
                    return url
        return self.leader_url(tp)

    def fetch(self, tp: TP, offset: int, *, max_bytes: int, isolation: str, max_wait_ms: int = 0) -> FetchBatches:
        """One binary fetch from the leader of ``tp``, or per ``fetch_url`` (no retry: callers decide, see
        ``read_range``). A node that does not lead ``tp`` answers ``NOT_LEADER_OR_FOLLOWER``: the leader is
        looked up again for the next call."""
        url = (
            f"{self.fetch_url(tp)}/v1/topics/{quote(tp[0], safe='')}/partitions/{tp[1]}/records"
            f"?offset={offset}&max_bytes={max_bytes}&max_wait_ms={max_wait_ms}&isolation={isolation}&format=binary"
        )
        if self.read_replica == "any":
            url += "&read_replica=any"
        try:
            ctype, data = _http.request(
                "GET", url, timeout=self.timeout + max_wait_ms / 1000, credentials=self.credentials
            )
        except BrokerError as exc:
            if exc.error_code in _STALE_METADATA:
                self._leaders.pop(tp, None)
                hint = exc.extra.get("leader_url")
                if exc.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER and isinstance(hint, str) and hint:
                    self._leaders[tp] = hint  # the answering node's word on the new leader
            if self.read_replica == "any" and exc.retriable:
                self._leader_only_until[tp] = time.monotonic() + _REPLICA_RETRY_S
            raise
        if not ctype.startswith(BATCHES_CONTENT_TYPE):
            raise BrokerError(ErrorCode.CORRUPT_MESSAGE, f"unexpected fetch answer type {ctype!r}")
        return decode_fetch_batches(data)

    def offset_for_timestamp(self, tp: TP, timestamp_ms: int, isolation: str) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp_ms`` (Kafka's ListOffsets by time).

        The broker keeps no time index, so this binary-searches the log by batch
        ``max_timestamp`` and then scans forward to the exact record. Like Kafka's
        time index (which records the running maximum), it assumes timestamps
        mostly grow with offsets; with producer-set out-of-order timestamps it may
        answer a later offset than the first match. ``None``: no such record.
        """
        state = self.partition_states([tp])[tp]
        lo, hi = state.log_start_offset, state.end(isolation)
        if lo >= hi:
            return None

        def fetch_at(offset: int, max_bytes: int) -> FetchBatches:
            return self.retrying(lambda: self.fetch(tp, offset, max_bytes=max_bytes, isolation=isolation), "fetch")

        def batch_at(offset: int) -> tuple[int, int] | None:
            """(first offset, max timestamp) of the first data batch at or after ``offset``."""
            fetched = fetch_at(offset, 1)
            for b in fetched.batches:
                if not b.header.is_control and b.last_offset >= offset:
                    return b.base_offset, b.header.max_timestamp
            return None

        while lo < hi:  # smallest offset whose batch has max_timestamp >= ts
            mid = (lo + hi) // 2
            found = batch_at(mid)
            if found is None or found[1] >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        pos = lo
        end = state.end(isolation)
        while pos < end:
            fetched = fetch_at(pos, 1 << 20)
            if not fetched.batches:
                return None
            for b in fetched.batches:
                if b.header.is_control or b.header.max_timestamp < timestamp_ms:
                    continue
                for i, rec in enumerate(decode_records(b.data)):
                    if b.base_offset + i >= pos and rec.timestamp >= timestamp_ms:
                        return b.base_offset + i
            pos = max(pos, fetched.batches[-1].last_offset + 1)
        return None

    # ---- transactions ------------------------------------------------------------------------------

    def coordinator_call(self, path: str, body: Any, what: str, deadline_s: float | None = None) -> Any:
        """A transaction-coordinator request; any node proxies it to the coordinator."""
        return self.retrying(lambda: self._any_node("POST", path, body), what, deadline_s)

    def list_transactions(self, prefix: str, states: str = "Ongoing,Prepared") -> list[dict[str, Any]]:
        """Transactions whose id starts with ``prefix``, cluster-wide.

        Nodes that do not answer are retried for a few seconds: a dead node's
        coordinator partitions move to live nodes, which then list them.
        """
        path = f"/v1/transactions?state={states}&prefix={quote(prefix, safe='')}"
        deadline = time.monotonic() + 5
        while True:
            res = self.retrying(lambda: self._any_node("GET", path), "list transactions")
            if not res.get("unreachable") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if res.get("unreachable"):
            log.warning("transaction listing for %r without %s", prefix, json.dumps(res["unreachable"])[:300])
        return list(res["transactions"])

    def abort_transaction(self, transactional_id: str) -> None:
        path = f"/v1/transactions/{quote(transactional_id, safe='')}/abort"
        self.coordinator_call(path, {}, f"abort {transactional_id}")
