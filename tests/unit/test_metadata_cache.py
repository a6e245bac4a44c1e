"""The client's metadata cache when a node answers without a topic it listed before (a restart, a lagging view)."""

from __future__ import annotations

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
