"""A producer learns the partitions a topic gains: every ``metadata_max_age_ms``, and at once for a partition it
is asked to write but does not know yet (Kafka's wait for a partition), on virtual time against a fake transport.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

import clients.aio.producer as producer_module
from clients.aio import _metadata
from clients.aio.producer import AsyncProducer
from clients.protocol import BrokerError, ErrorCode, decode_produce_request
from tests.support.virtual_time import VirtualTimeLoop

URL = "http://node-1:80"
MAX_AGE_S = 10.0


class FakeSession:
    """One node leading every partition of topic ``t``, which has ``partitions`` partitions."""

    partitions = 2
    metadata_requests = 0

    def __init__(self, **_: Any) -> None:
        pass

    async def request_json(self, method: str, u: str, body: Any = None, *, timeout: float | None = None) -> Any:
        if "/v1/metadata" in u:
            FakeSession.metadata_requests += 1
            parts = [{"partition": p, "leader": 1, "leader_url": URL, "replicas": [1]}
                     for p in range(FakeSession.partitions)]  # fmt: skip
            return {"nodes": [{"id": 1, "url": URL}], "topics": [{"name": "t", "partitions": parts}]}
        if u.endswith("/v1/producers/init"):
            return {"producer_id": 5, "producer_epoch": 0}
        raise AssertionError(f"unexpected {method} {u}")

    async def post_bytes(self, u: str, data: bytes, content_type: str) -> tuple[str, bytes]:
        req = decode_produce_request(data)
        parts = []
        for p in req.partitions:
            code = "NONE" if p.partition < FakeSession.partitions else "UNKNOWN_TOPIC_OR_PARTITION"
            parts.append({"topic": p.topic, "partition": p.partition, "base_offset": 0, "log_append_time": 1,
                          "error_code": code})  # fmt: skip
        return "application/json", json.dumps({"partitions": parts}).encode()

    async def close(self) -> None:
        pass


def on_fake_node(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[pytest.MonkeyPatch], None]:
    def run(monkeypatch: pytest.MonkeyPatch) -> None:
        FakeSession.partitions = 2
        FakeSession.metadata_requests = 0
        monkeypatch.setattr(producer_module, "HttpSession", FakeSession)
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            # the metadata's age and the producer's max_block_ms deadline count virtual seconds too
            clock = SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
            clock.monotonic = runner.get_loop().time
            monkeypatch.setattr(_metadata, "time", clock)
            monkeypatch.setattr(producer_module, "time", clock)
            runner.run(test())

    run.__name__ = test.__name__
    return run


def make_producer(**kw: Any) -> AsyncProducer:
    return AsyncProducer(URL, linger_ms=0, metadata_max_age_ms=int(MAX_AGE_S * 1000), **kw)


@on_fake_node
async def test_the_partition_count_is_refreshed_after_metadata_max_age() -> None:
    p = make_producer()
    await p.start()
    await (await p.send("t", b"v"))
    assert p.cached_partition_count("t") == 2
    FakeSession.partitions = 4
    await (await p.send("t", b"v"))
    assert p.cached_partition_count("t") == 2  # fresh metadata is not asked again
    await asyncio.sleep(MAX_AGE_S + 1)
    await (await p.send("t", b"v"))  # the sender finds its metadata old and refreshes it
    for _ in range(10):
        await asyncio.sleep(0.01)
    assert p.cached_partition_count("t") == 4
    assert {(await (await p.send("t", b"v", partition=q))).partition for q in range(4)} == {0, 1, 2, 3}
    await p.close()


@on_fake_node
async def test_a_partition_the_producer_does_not_know_yet_is_looked_up_before_it_fails() -> None:
    p = make_producer(max_block_ms=5_000)
    await p.start()
    await (await p.send("t", b"v", partition=1))
    FakeSession.partitions = 3
    asked = FakeSession.metadata_requests
    md = await (await p.send("t", b"v", partition=2))  # fresh metadata, but no partition 2 in it: ask again
    assert md.partition == 2 and FakeSession.metadata_requests > asked
    started = asyncio.get_running_loop().time()
    with pytest.raises(BrokerError) as ei:
        await p.send("t", b"v", partition=7)  # never there: UNKNOWN_TOPIC_OR_PARTITION after max_block_ms
    assert ei.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "t-7" in ei.value.message
    assert 4.0 <= asyncio.get_running_loop().time() - started <= 5.5
    await p.close()
