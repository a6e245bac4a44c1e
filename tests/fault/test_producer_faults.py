"""The idempotent producer under faults: lost responses, a killed leader, a paused broker.

Each test sends unique values and then reads every partition back: the log
must hold each acknowledged record exactly once, in send order
(``tests.support.exactly_once``), as kafka_txn.md §3 (idempotent producer)
and KIP-360 (epoch bump after an unresolved sequence) promise.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from clients.aio.producer import AsyncProducer
from clients.partitioner import partition_for_key
from clients.producer import Producer
from clients.protocol import BrokerError, ErrorCode
from clients.records import RecordMetadata
from tests.support.cluster import LocalCluster, http, wait_for
from tests.support.exactly_once import assert_exactly_once_in_order, read_log
from tests.support.proxy import LossyProxy

pytestmark = [pytest.mark.integration, pytest.mark.fault]


def check_partitions(
    c: LocalCluster, topic: str, partitions: int, sent: list[tuple[int, bytes]], acked: dict[bytes, RecordMetadata]
) -> dict[int, int]:
    """Assert exactly-once-in-order on every partition; returns records in the log per partition."""
    counts = {}
    for p in range(partitions):
        mine = [v for q, v in sent if q == p]
        acked_here = {v: md for v, md in acked.items() if md.partition == p}
        log = read_log(c, topic, p, at_least=len(acked_here))
        assert_exactly_once_in_order(mine, acked_here, log, f"{topic}-{p}")
        counts[p] = len(log)
    return counts


# ---- lossy network -----------------------------------------------------------------------------


def lossy_values(n: int) -> list[tuple[bytes, bytes]]:
    return [(str(i % 13).encode(), f"lossy-{i:06d}-".encode() + b"x" * 100) for i in range(n)]


@pytest.fixture(scope="module")
def lossy_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for both lossy-network runs (no node is stopped; each run has a topic of its own)."""
    with LocalCluster(tmp_path_factory.mktemp("lossy"), 3) as c:
        yield c.start()


@pytest.mark.parametrize("api", ["sync", "async"])
def test_lossy_network_10k_records_land_exactly_once_in_send_order(lossy_cluster, api):
    # Given a 3-node cluster reachable only through proxies that drop ~10% of responses after
    # forwarding the request (the broker applied it; the client never hears back)
    c = lossy_cluster
    topic = f"lossy-{api}"
    c.create_topic(topic, partitions=3)
    proxies = [LossyProxy(cfg.http_port, drop_rate=0.1, seed=i).start() for i, cfg in enumerate(c.configs)]
    rewrites = {url: px.url for url, px in zip(c.urls, proxies, strict=True)}
    records = lossy_values(10_000)
    config = dict(url_rewrites=rewrites, linger_ms=2, batch_size=4096, retry_backoff_ms=20)
    try:
        # When 10,000 keyed records are sent through them
        if api == "sync":
            p = Producer([px.url for px in proxies], **config)
            try:
                futures = [p.send(topic, value=v, key=k) for k, v in records]
                p.flush(120)
                results = [f.result(timeout=1) for f in futures]
                metrics = p.metrics()
            finally:
                p.close(30)
        else:

            async def run() -> tuple[list[RecordMetadata], dict]:
                async with AsyncProducer([px.url for px in proxies], **config) as ap:
                    futs = [await ap.send(topic, value=v, key=k) for k, v in records]
                    await ap.flush(120)
                    return [f.result() for f in futs], ap.metrics()

            results, metrics = asyncio.run(run())
    finally:
        for px in proxies:
            px.close()
    dropped = sum(px.stats.responses_dropped for px in proxies)
    forwarded = sum(px.stats.responses_forwarded for px in proxies)
    print(f"LOSSY {api}: dropped {dropped}/{dropped + forwarded} responses, producer {metrics}")
    # (the scenario happened: responses were lost and batches were retried)
    assert dropped >= 5
    assert metrics["retries"] >= 1
    # Then every record was acknowledged, went to murmur2(key)'s partition, and is in the log once, in order
    acked = {v: md for (_, v), md in zip(records, results, strict=True)}
    sent = []
    for (k, v), md in zip(records, results, strict=True):
        assert md.partition == partition_for_key(k, 3)
        sent.append((md.partition, v))
    counts = check_partitions(c, topic, 3, sent, acked)
    assert sum(counts.values()) == 10_000


# ---- leader SIGKILL ------------------------------------------------------------------------------


def test_leader_sigkill_during_20k_record_produce_keeps_every_ack_exactly_once(make_cluster):
    # Given an async producer streaming 20,000 keyed records to a 3-node cluster
    c = make_cluster()
    c.create_topic("kill", partitions=3)
    victim = c.leader("kill", 0)
    records = [(str(i % 29).encode(), f"kill-{i:06d}-".encode() + b"y" * 200) for i in range(20_000)]
    killed = threading.Event()

    async def run() -> tuple[list[RecordMetadata | BaseException], dict]:
        async with AsyncProducer(c.urls, linger_ms=5, batch_size=16384, retry_backoff_ms=50) as ap:
            futs: list[asyncio.Future[RecordMetadata]] = []
            for i, (k, v) in enumerate(records):
                futs.append(await ap.send("kill", value=v, key=k))
                if i % 100 == 99:
                    await asyncio.sleep(0.02)  # ~4 s of traffic: the kill lands mid-stream
                if i == 5_000:
                    # When the leader of partition 0 is SIGKILLed with batches in flight
                    await asyncio.to_thread(c.kill, victim)
                    killed.set()
            res = await asyncio.gather(*futs, return_exceptions=True)
            return list(res), ap.metrics()

    results, metrics = asyncio.run(run())
    print(f"KILL node {victim}: producer {metrics}")
    assert killed.is_set()
    # Then every future resolved, and successfully (retries outlast the ~2 s failover) ...
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} records failed, e.g. {failures[:2]!r}"
    assert metrics["errors"], "the kill went unnoticed: no produce request failed"
    # ... and every acknowledged record is in the new leaders' logs exactly once, in send order
    acked = {v: md for (_, v), md in zip(records, results, strict=True)}
    sent = [(md.partition, v) for (_, v), md in zip(records, results, strict=True)]
    counts = check_partitions(c, "kill", 3, sent, acked)
    assert sum(counts.values()) == 20_000


# ---- paused broker and delivery timeout -----------------------------------------------------------


def test_broker_paused_past_delivery_timeout_fails_futures_then_continues_without_dup_or_reorder(make_cluster):
    # Given a one-node cluster (so a paused node means no leader anywhere) and a producer with short timeouts
    c = make_cluster(1)
    # (a lone node may answer NOT_CONTROLLER for a moment after /readyz: retry the creation)
    wait_for(lambda: http("POST", c.url(1) + "/v1/topics", {"name": "pause", "partitions": 2,
                                                            "replication_factor": 1})[0] in (201, 409),
             30, "topic creation")  # fmt: skip
    c.wait_leaders("pause", 2)
    p = Producer(c.urls, linger_ms=5, batch_size=8192, request_timeout_ms=1000, delivery_timeout_ms=3000)
    sent: list[tuple[int, bytes]] = []
    futures: list[tuple[bytes, Future[RecordMetadata]]] = []
    n = 0

    def send(count: int, pace: float = 0.0) -> list[Future[RecordMetadata]]:
        nonlocal n
        out = []
        for _ in range(count):
            key, value = str(n % 5).encode(), f"pause-{n:06d}-".encode() + b"z" * 300
            f = p.send("pause", value=value, key=key)
            sent.append((partition_for_key(key, 2), value))
            futures.append((value, f))
            out.append(f)
            n += 1
            if pace:
                time.sleep(pace)
        return out

    try:
        first = send(1000)
        p.flush(30)
        assert all(f.result().offset >= 0 for f in first)
        epoch0 = p.producer_epoch
        # When the node is SIGSTOPped while records are in flight, and stays stopped past delivery_timeout_ms
        during = send(200)
        c.signal(1, signal.SIGSTOP)
        try:
            during += send(300, pace=0.002)
            wait_for(lambda: all(f.done() for f in during), 15, "every future of the pause resolves")
        finally:
            c.signal(1, signal.SIGCONT)
        # Then the futures not acknowledged before the pause failed with the delivery timeout error
        errors = [f.exception() for f in during if f.exception() is not None]
        assert errors, "nothing timed out: the pause did not hit in-flight records"
        for e in errors:
            assert isinstance(e, BrokerError), e
            assert e.error_code is ErrorCode.REQUEST_TIMED_OUT, e
        # And after SIGCONT the producer continues (new epoch, sequences from 0) ...
        after = send(1000)
        p.flush(60)
        assert all(f.result().offset >= 0 for f in after)
        assert p.producer_epoch > epoch0, "the unresolved sequences did not bump the epoch"
        metrics = p.metrics()
    finally:
        p.close(10)
    print(f"PAUSE: {len(errors)} records timed out, producer {metrics}")
    # ... with no duplicate and no reordering: the log is a subsequence of the send order, acked records included
    acked = {v: f.result() for v, f in futures if f.exception() is None}
    counts = check_partitions(c, "pause", 2, sent, acked)
    assert sum(counts.values()) >= 2000


# ---- the convenience endpoint without a leader ------------------------------------------------


def test_convenience_produce_waits_for_a_leader_instead_of_failing(make_cluster):
    # Given a 3-node cluster where nodes 2 and 3 are SIGSTOPped, so node 1 knows no leader of "nl-0"
    # (a leader without a quorum steps down after leader_fallback_s)
    c = make_cluster()
    c.create_topic("nl", partitions=1)
    url = c.url(1) + "/v1/topics/nl/records"

    def body(tag: str, timeout_ms: int | None = None) -> dict:
        recs = [{"value": base64.b64encode(f"{tag}-{i}".encode()).decode(), "partition": 0} for i in range(5)]
        return {"records": recs} if timeout_ms is None else {"records": recs, "timeout_ms": timeout_ms}

    c.signal(2, signal.SIGSTOP)
    c.signal(3, signal.SIGSTOP)
    try:
        wait_for(lambda: c.partition_meta("nl", 0, 1)["leader"] is None, 30, "node 1 knows no leader of nl-0")
        # When a plain write arrives with a 1.5 s timeout, it is not refused at once: the node looks
        # for a leader until the timeout and then answers the retriable NOT_LEADER_OR_FOLLOWER
        started = time.monotonic()
        status, res = http("POST", url, body("early", 1500), timeout=30)
        waited = time.monotonic() - started
        assert status == 421 and res["error_code"] == "NOT_LEADER_OR_FOLLOWER" and res["retriable"], (status, res)
        assert waited >= 1.4, f"answered after {waited:.2f}s: the endpoint did not wait for a leader"
        # And a write with the default timeout, sent while still leaderless, lands once the nodes wake
        answer: Future = Future()

        def post_late() -> None:
            try:
                answer.set_result(http("POST", url, body("late"), timeout=60))
            except BaseException as exc:  # handed to the test thread
                answer.set_exception(exc)

        sender = threading.Thread(target=post_late)
        sender.start()
    finally:
        c.signal(2, signal.SIGCONT)
        c.signal(3, signal.SIGCONT)
    status, res = answer.result(timeout=60)
    sender.join(10)
    assert status == 200, res
    assert [o["offset"] for o in res["offsets"]] == [0, 1, 2, 3, 4]
    # Then the log holds the late records exactly once and nothing of the refused write
    log = read_log(c, "nl", 0, at_least=5)
    assert [v for _o, v in log] == [f"late-{i}".encode() for i in range(5)]
