"""The client's metadata cache when a node answers without a topic it listed before (a restart, a lagging view)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from clients.aio import _metadata
from clients.aio._metadata import MetadataCache


def body(*topics: str) -> dict[str, Any]:
    return {
        "nodes": [{"id": 1, "url": "http://n1"}],
        "topics": [{"name": t, "partitions": [{"partition": 0, "leader": 1, "leader_url": "http://n1"}]}
                   for t in topics],
    }  # fmt: skip


def test_a_topic_missing_from_one_answer_stays_leaderless_for_a_while_then_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(_metadata.time, "monotonic", lambda: now[0])
    cache = MetadataCache(None, "http://n1")  # type: ignore[arg-type]  # no request is made here
    cache._apply(body("a", "b"), partial=False)
    assert cache.cached("a", 0) is not None and cache.cached("a", 0).leader_url == "http://n1"
    # A node that has not caught up answers without "a": it is kept, leaderless (a retriable lookup) ...
    now[0] += 1
    cache._apply(body("b"), partial=False)
    info = cache.cached("a", 0)
    assert info is not None and info.leader_url is None and info.leader is None
    # ... and comes back whole when a node that knows it answers.
    now[0] += 1
    cache._apply(body("a", "b"), partial=False)
    assert cache.cached("a", 0).leader_url == "http://n1"
    # Missing for longer than the grace period: gone (UNKNOWN_TOPIC_OR_PARTITION from then on).
    cache._apply(body("b"), partial=False)
    now[0] += _metadata._MISSING_TOPIC_GRACE_S + 1
    cache._apply(body("b"), partial=False)
    assert cache.cached("a", 0) is None and cache.cached("b", 0) is not None


class _Session:
    """Answers ``GET <url>/v1/metadata`` from a table; records the URLs asked."""

    def __init__(self, answers: dict[str, dict[str, Any]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def request_json(self, method: str, url: str, body: Any = None, timeout: float | None = None) -> Any:
        base = url.split("/v1/")[0]
        self.asked.append(base)
        return self.answers[base]


def _leaders(leader: int | None) -> dict[str, Any]:
    url = f"http://n{leader}" if leader else None
    return {
        "nodes": [{"id": i, "url": f"http://n{i}"} for i in (1, 2, 3)],
        "topics": [{"name": "t", "partitions": [{"partition": 0, "leader": leader, "leader_url": url}]}],
    }


def test_each_refresh_starts_at_the_next_node() -> None:
    session = _Session({f"http://n{i}": _leaders(2) for i in (1, 2, 3)})
    cache = MetadataCache(session, "http://n1,http://n2,http://n3")  # type: ignore[arg-type]

    async def three() -> None:
        for _ in range(3):
            await cache.refresh()

    asyncio.run(three())
    assert session.asked == ["http://n1", "http://n2", "http://n3"]


def test_an_answer_without_a_leader_keeps_the_known_one_until_it_is_invalidated() -> None:
    cache = MetadataCache(None, "http://n1")  # type: ignore[arg-type]  # no request is made here
    cache._apply(_leaders(2), partial=False)
    cache._apply(_leaders(None), partial=False)  # a cut-off node knows no leader: not news
    assert cache.cached("t", 0).leader_url == "http://n2"  # type: ignore[union-attr]
    cache.invalidate("t", 0)  # NOT_LEADER_OR_FOLLOWER from n2
    cache._apply(_leaders(None), partial=False)
    assert cache.cached("t", 0).leader_url is None  # type: ignore[union-attr]
    cache._apply(_leaders(3), partial=False)
    assert cache.cached("t", 0).leader_url == "http://n3"  # type: ignore[union-attr]
