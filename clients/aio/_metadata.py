"""Cluster metadata as a client sees it: which node leads which partition.

Like Kafka's client ``Metadata``: a cache refreshed on demand (unknown topic,
``NOT_LEADER_OR_FOLLOWER``, a dead leader) and at most every
``metadata_max_age_ms``; concurrent refreshes are coalesced into one request.
Any node answers ``GET /v1/metadata`` for the whole cluster, so the cache asks
the bootstrap URLs and every node URL it has learnt, in turn, until one
answers; each refresh starts at the next node (like Kafka's least-loaded
node), so one node with a stale view (cut off from its peers, it names no
leaders) is not asked first every time. An answer that names no leader for a
partition keeps the leader the cache already had: "no leader known here" is
not news, while ``invalidate`` (a ``NOT_LEADER_OR_FOLLOWER``) does forget it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ..protocol import BrokerError, ErrorCode
from ..security import is_auth_failure
from ._session import HttpSession


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[str]:
    """``"http://a:1,http://b:2"`` or a list of URLs -> normalized URL list (no trailing slash)."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    urls = [u.strip().rstrip("/") for u in items if u.strip()]
    if not urls:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "bootstrap must name at least one URL")
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"bootstrap URL must start with http:// or https://: {u!r}")
    return urls


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int | None
    leader_url: str | None
    replicas: tuple[int, ...]
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


_MISSING_TOPIC_GRACE_S = 30.0
#: How long one node may take to answer a metadata request before the next node is asked. Every node
#: answers it from memory; one that takes longer is paused, cut off or overloaded, and every request of
#: the client waits on a refresh (refreshes are shared), so it must not wait out the request timeout.
METADATA_NODE_TIMEOUT_S = 2.5


class MetadataCache:
    def __init__(
        self, session: HttpSession, bootstrap: str | Sequence[str], *, metadata_max_age_ms: int = 300_000
    ) -> None:
        self._session = session
        self.bootstrap = parse_bootstrap(bootstrap)
        self._max_age = metadata_max_age_ms / 1000
        self._node_urls: dict[int, str] = {}
        self._topics: dict[str, dict[int, PartitionInfo]] = {}
        # Topics a full refresh no longer listed, and since when: kept without leaders for a while, because
        # the node that answered may simply not have caught up yet (just restarted, or a topic just created).
        self._missing_since: dict[str, float] = {}
        self._fetched_at = 0.0
        self._refreshing: asyncio.Future[None] | None = None
        self._rotation = 0

    # ---- queries -------------------------------------------------------------------------

    def urls(self) -> list[str]:
        """Every URL worth trying for a cluster-wide request: bootstrap first, then known nodes."""
        seen = dict.fromkeys(self.bootstrap)
        seen.update(dict.fromkeys(self._node_urls.values()))
        return list(seen)

    def _rotated(self) -> list[str]:
        """``urls()`` starting at the next node in turn."""
        urls = self.urls()
        k = self._rotation % len(urls)
        self._rotation += 1
        return urls[k:] + urls[:k]

    def node_url(self, node_id: int) -> str | None:
        return self._node_urls.get(node_id)

    def cached_partition_count(self, topic: str) -> int | None:
        parts = self._topics.get(topic)
        return len(parts) if parts is not None else None

    def cached(self, topic: str, partition: int) -> PartitionInfo | None:
        return self._topics.get(topic, {}).get(partition)

    async def partition_count(self, topic: str) -> int:
        """The topic's partition count; raises ``UNKNOWN_TOPIC_OR_PARTITION`` if it does not exist."""
        if topic not in self._topics or self.stale():
            await self.refresh()
        parts = self._topics.get(topic)
        if not parts:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
        return len(parts)

    async def partition(self, topic: str, partition: int) -> PartitionInfo:
        info = self.cached(topic, partition)
        if info is None or info.leader_url is None or self.stale():
            await self.refresh()
            info = self.cached(topic, partition)
        if info is None:
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {topic}-{partition}")
        return info

    async def leader_url(self, topic: str, partition: int) -> str:
        """URL of the partition's leader; ``LEADER_NOT_AVAILABLE`` (retriable) during an election."""
        info = await self.partition(topic, partition)
        if info.leader_url is None:
            raise BrokerError(ErrorCode.LEADER_NOT_AVAILABLE, f"no leader for {topic}-{partition} yet")
        return info.leader_url

    # ---- updates -------------------------------------------------------------------------

    def invalidate(self, topic: str, partition: int, leader_url: str | None = None) -> None:
        """Forget a partition's leader after ``NOT_LEADER_OR_FOLLOWER``; adopt the server's hint if given."""
        parts = self._topics.get(topic)
        if parts is None or partition not in parts:
            return
        old = parts[partition]
        leader = next((i for i, u in self._node_urls.items() if u == leader_url), None) if leader_url else None
        parts[partition] = PartitionInfo(
            old.topic, old.partition, leader, leader_url, old.replicas,
            old.high_watermark, old.last_stable_offset, old.log_start_offset,
        )  # fmt: skip
        if leader_url is None:
            self._fetched_at = 0.0  # the next lookup refreshes

    def stale(self) -> bool:
        """The last full refresh is older than ``metadata_max_age_ms``: the next lookup (or the producer's
        sender) refreshes, so a topic's new partitions and moved leaders show up without an error."""
        return time.monotonic() - self._fetched_at > self._max_age

    async def refresh(self, topics: Iterable[str] | None = None) -> None:
        """Fetch metadata now; concurrent callers share one request."""
        if self._refreshing is not None:
            await asyncio.shield(self._refreshing)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._refreshing = fut
        try:
            await self._refresh_once(topics)
            fut.set_result(None)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: waiters get it via shield
            raise
        finally:
            self._refreshing = None

    async def refresh_avoiding(self, avoid: str | None, timeout: float) -> None:
        """Fetch metadata now, asking ``avoid`` (a node that does not answer) last and each node at most ``timeout``.

        For a request that stalls: not coalesced with ``refresh`` (which may itself wait on that node).
        """
        urls = sorted(self.urls(), key=lambda u: u == avoid)
        await self._refresh_once(None, urls, timeout)

    async def _refresh_once(
        self, topics: Iterable[str] | None, urls: list[str] | None = None, timeout: float | None = None
    ) -> None:
        query = ""
        if topics is not None:
            query = "?topics=" + ",".join(quote(t, safe="") for t in topics)
        last: BrokerError | None = None
        per_node = timeout if timeout is not None else METADATA_NODE_TIMEOUT_S
        for url in urls if urls is not None else self._rotated():
            try:
                body = await self._session.request_json("GET", f"{url}/v1/metadata{query}", timeout=per_node)
            except BrokerError as exc:
                if is_auth_failure(exc):
                    raise  # every node answers it alike: credentials or rights, not this node
                last = exc
                continue
            self._apply(body, partial=topics is not None)
            return
        assert last is not None
        raise BrokerError(ErrorCode.NETWORK_EXCEPTION, f"no node answered metadata: {last.message}") from last

    def _apply(self, body: dict[str, Any], *, partial: bool) -> None:
        for n in body.get("nodes", []):
            if n.get("url"):
                self._node_urls[int(n["id"])] = str(n["url"]).rstrip("/")
        topics: dict[str, dict[int, PartitionInfo]] = {} if not partial else dict(self._topics)
        for t in body.get("topics", []):
            parts: dict[int, PartitionInfo] = {}
            known = self._topics.get(t["name"], {})
            for p in t["partitions"]:
                url = p.get("leader_url")
                leader = p.get("leader")
                old = known.get(int(p["partition"]))
                if not url and old is not None and old.leader_url is not None:
                    leader, url = old.leader, old.leader_url  # no leader known there: keep ours
                parts[int(p["partition"])] = PartitionInfo(
                    topic=t["name"],
                    partition=int(p["partition"]),
                    leader=leader,
                    leader_url=str(url).rstrip("/") if url else None,
                    replicas=tuple(p.get("replicas", ())),
                    high_watermark=int(p.get("high_watermark", 0)),
                    last_stable_offset=int(p.get("last_stable_offset", 0)),
                    log_start_offset=int(p.get("log_start_offset", 0)),
                )
            topics[t["name"]] = parts
        now = time.monotonic()
        if not partial:
            for name, parts in self._topics.items():
                if name in topics:
                    continue
                since = self._missing_since.setdefault(name, now)
                if now - since < _MISSING_TOPIC_GRACE_S:
                    # Leaderless until a node that knows it answers: LEADER_NOT_AVAILABLE (retriable), not
                    # UNKNOWN_TOPIC_OR_PARTITION; after the grace period it is gone.
                    topics[name] = {p: dataclasses.replace(i, leader=None, leader_url=None) for p, i in parts.items()}
            listed = {str(t["name"]) for t in body.get("topics", [])}
            for name in [n for n in self._missing_since if n in listed or n not in topics]:
                del self._missing_since[name]
        self._topics = topics
        if not partial:
            self._fetched_at = now
