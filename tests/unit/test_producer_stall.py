"""A producer request that stalls looks the leader / coordinator up again (``stall_refresh_ms``), on virtual time.

The producer runs against a fake transport: node 1 stops answering produce (or InitProducerId) while
clients still reach it, and keeps naming itself in its metadata (a stale view); at some point nodes 2 and
3 name node 2. After ``stall_refresh_ms`` without an answer, the producer asks the other nodes first: if
the leader / coordinator moved, the stalled request is abandoned and sent to the new one; if not, it
keeps waiting. A NOT_COORDINATOR answer is retried at the new coordinator at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

import clients.aio.producer as producer_module
from clients.aio.producer import AsyncProducer
from clients.protocol import BrokerError, ErrorCode, decode_produce_request
from tests.support.virtual_time import VirtualTimeLoop

STALL_S = 2.5
REQUEST_TIMEOUT_S = 30.0


def url(node: int) -> str:
    return f"http://node-{node}:80"


def node_of(u: str) -> int:
    return int(u.split("//node-")[1].split(":")[0])


def now() -> float:
    return asyncio.get_running_loop().time()


class Cluster:
    """Who leads partition t-0 and coordinates the transactional id, per answering node; what each was asked."""

    def __init__(self) -> None:
        self.leader = 1
        self.coordinator = 1
        self.stale = {1}  # nodes that keep naming node 1 (the isolated one's own view)
        self.silent_until: dict[int, float] = {}  # node -> until when it does not answer produce / init
        self.produce: list[tuple[int, float]] = []
        self.init: list[tuple[int, float]] = []
        self.offsets = 0

    def view(self, node: int) -> tuple[int, int]:
        return (1, 1) if node in self.stale else (self.leader, self.coordinator)

    async def silent(self, node: int, timeout: float) -> None:
        until = self.silent_until.get(node)
        if until is None or now() >= until:
            return
        if until - now() >= timeout:
            await asyncio.sleep(timeout)
            raise BrokerError(ErrorCode.REQUEST_TIMED_OUT, f"node {node}: no answer within {timeout}s")
        await asyncio.sleep(until - now())


class FakeSession:
    """``HttpSession``'s calls the producer makes, answered by ``Cluster``."""

    cluster: Cluster

    def __init__(self, *, request_timeout_ms: int = 30_000, **_: Any) -> None:
        self.request_timeout = request_timeout_ms / 1000

    async def request_json(self, method: str, u: str, body: Any = None, *, timeout: float | None = None) -> Any:
        c, node = self.cluster, node_of(u)
        leader, coordinator = c.view(node)
        if "/v1/metadata" in u:
            return {
                "nodes": [{"id": i, "url": url(i)} for i in (1, 2, 3)],
                "topics": [{"name": "t", "partitions": [{"partition": 0, "leader": leader, "leader_url": url(leader),
                                                         "replicas": [1, 2, 3]}]}],
            }  # fmt: skip
        if "/v1/coordinators/transaction/" in u:
            return {"node_id": coordinator, "url": url(coordinator)}
        if u.endswith("/v1/producers/init"):
            c.init.append((node, now()))
            await c.silent(node, self.request_timeout if timeout is None else timeout)
            if body.get("transactional_id") is not None and node != c.coordinator:
                raise BrokerError(ErrorCode.NOT_COORDINATOR, "moved", coordinator_url=url(c.coordinator))
            return {"producer_id": 5, "producer_epoch": 0}
        raise AssertionError(f"unexpected {method} {u}")

    async def post_bytes(self, u: str, data: bytes, content_type: str) -> tuple[str, bytes]:
        c, node = self.cluster, node_of(u)
        c.produce.append((node, now()))
        await c.silent(node, self.request_timeout)
        req = decode_produce_request(data)
        if node != c.leader:
            body = {"error_code": "NOT_LEADER_OR_FOLLOWER", "message": "not the leader", "retriable": True,
                    "leader_url": url(c.leader)}  # fmt: skip
            raise BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "not the leader", leader_url=url(c.leader),
                              partitions=[{**body, "topic": p.topic, "partition": p.partition}
                                          for p in req.partitions])  # fmt: skip
        parts = []
        for p in req.partitions:
            parts.append({"topic": p.topic, "partition": p.partition, "base_offset": c.offsets, "log_append_time": 1,
                          "error_code": "NONE"})  # fmt: skip
            c.offsets += 1
        return "application/json", json.dumps({"partitions": parts}).encode()

    async def close(self) -> None:
        pass


def on_fake_cluster(test: Callable[[Cluster], Coroutine[Any, Any, None]]) -> Callable[[pytest.MonkeyPatch], None]:
    def run(monkeypatch: pytest.MonkeyPatch) -> None:
        cluster = Cluster()
        FakeSession.cluster = cluster
        monkeypatch.setattr(producer_module, "HttpSession", FakeSession)
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(test(cluster))

    run.__name__ = test.__name__
    return run


def make_producer(**kw: Any) -> AsyncProducer:
    return AsyncProducer(",".join(url(i) for i in (1, 2, 3)), linger_ms=0, stall_refresh_ms=int(STALL_S * 1000),
                         request_timeout_ms=int(REQUEST_TIMEOUT_S * 1000), **kw)  # fmt: skip


async def elect_later(c: Cluster, at: float) -> None:
    await asyncio.sleep(at)
    c.leader = c.coordinator = 2


@on_fake_cluster
async def test_a_stalled_produce_goes_to_the_new_leader_after_the_stall_interval(c: Cluster) -> None:
    p = make_producer()
    await p.start()
    c.silent_until[1] = 3600.0  # node 1 is cut off from its peers: its write never commits
    asyncio.get_running_loop().create_task(elect_later(c, 1.0))
    started = now()
    meta = await (await p.send("t", b"v", partition=0))
    took = now() - started
    assert meta.offset == 0
    assert [n for n, _ in c.produce] == [1, 2]  # abandoned at node 1, written at node 2 once
    assert STALL_S <= took < STALL_S + 1.0  # not the 30 s request timeout
    assert p._sender.abandoned_requests == 1
    await p.close()


@on_fake_cluster
async def test_a_slow_leader_that_still_leads_is_waited_for(c: Cluster) -> None:
    p = make_producer()
    await p.start()
    c.silent_until[1] = 7.0  # slow, not moved: nodes 2 and 3 still name node 1
    c.stale = set()
    meta = await (await p.send("t", b"v", partition=0))
    assert meta.offset == 0
    assert [n for n, _ in c.produce] == [1]  # one request, never abandoned
    assert now() == pytest.approx(7.0)
    assert p._sender.abandoned_requests == 0
    await p.close()


@on_fake_cluster
async def test_without_stall_refresh_a_stalled_produce_waits_for_its_timeout(c: Cluster) -> None:
    p = AsyncProducer(",".join(url(i) for i in (1, 2, 3)), linger_ms=0, stall_refresh_ms=0,
                      request_timeout_ms=int(REQUEST_TIMEOUT_S * 1000))  # fmt: skip
    await p.start()
    c.silent_until[1] = 3600.0
    asyncio.get_running_loop().create_task(elect_later(c, 1.0))
    c.stale = set()  # every node but the silent one knows the new leader
    started = now()
    await (await p.send("t", b"v", partition=0))
    assert now() - started >= REQUEST_TIMEOUT_S  # the behaviour stall_refresh_ms improves on
    assert [n for n, _ in c.produce] == [1, 2]
    await p.close()


@on_fake_cluster
async def test_a_stalled_init_producer_id_goes_to_the_new_coordinator(c: Cluster) -> None:
    p = make_producer(transactional_id="tx-1")
    c.silent_until[1] = 3600.0  # the coordinator's node is cut off: InitProducerId never answers there
    asyncio.get_running_loop().create_task(elect_later(c, 1.0))
    started = now()
    await p.init_transactions(timeout=60)
    took = now() - started
    assert [n for n, _ in c.init] == [1, 2]
    assert STALL_S <= took < STALL_S + 1.0
    assert p._coordinators.abandoned_requests == 1
    await p.close()


@on_fake_cluster
async def test_not_coordinator_is_retried_at_the_new_coordinator_at_once(c: Cluster) -> None:
    p = make_producer(transactional_id="tx-1")
    c.coordinator = 2  # every lookup still names node 1, which answers NOT_COORDINATOR naming node 2
    c.stale = {1, 2, 3}
    started = now()
    await p.init_transactions(timeout=5)
    assert [n for n, _ in c.init] == [1, 2]
    assert now() - started < 0.05  # no backoff before asking the new coordinator
    await p.close()


@on_fake_cluster
async def test_not_leader_is_retried_at_the_hinted_leader_after_the_retry_backoff(c: Cluster) -> None:
    p = make_producer(retry_backoff_ms=100)
    await p.start()
    c.stale = set()
    await (await p.send("t", b"v", partition=0))  # the producer's metadata names node 1
    c.leader = 2  # node 1 answers 421 naming node 2
    started = now()
    meta = await (await p.send("t", b"v", partition=0))
    assert meta.offset == 1
    assert [n for n, _ in c.produce] == [1, 1, 2]
    assert now() - started <= 0.1 + 0.05
    await p.close()
