"""The convenience produce's routing and retries (``cluster.routed_produce``), with fakes of its seams.

Records go to their explicit partition, else by key, else one partition per request; a partition whose
leader is unknown is retried every ``retry.backoff.ms`` until the request timeout, but only while the answer
proves nothing was written, so a plain write is never duplicated. Runs on virtual time.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from clients.partitioner import partition_for_key
from clients.protocol import BrokerError, ErrorCode, ProducePartition, ProduceRequest, Record
from cluster.partitions import PartitionProduceResult
from cluster.routed_produce import RETRY_BACKOFF_S, RoutedProducer
from tests.support.virtual_time import run_on_virtual_time

TOPIC = SimpleNamespace(name="orders", partitions=[0, 1, 2], config_int=lambda key: 1 << 20)


class Topics:
    def topic(self, name: str) -> Any:
        if name != "orders":
            raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name)
        return TOPIC


class Partitions:
    """Answers each partition from a script of results (then success); records every write attempt."""

    def __init__(self, script: dict[int, list[BrokerError]]) -> None:
        self.script = script
        self.writes: list[tuple[int, int]] = []  # (partition, records)
        self.offsets: dict[int, int] = {}

    async def produce(self, req: ProduceRequest) -> list[PartitionProduceResult]:
        out = []
        for p in req.partitions:
            self.writes.append((p.partition, len(p.batch)))
            errors = self.script.get(p.partition, [])
            if errors:
                out.append(PartitionProduceResult(p.topic, p.partition, error=errors.pop(0)))
                continue
            base = self.offsets.get(p.partition, 0)
            self.offsets[p.partition] = base + 1
            out.append(PartitionProduceResult(p.topic, p.partition, base_offset=base, log_append_time=7))
        return out


class Forwarder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []

    async def produce_on(self, url: str, part: ProducePartition) -> PartitionProduceResult | None:
        self.sent.append((url, part.partition))
        return PartitionProduceResult(part.topic, part.partition, base_offset=100, log_append_time=9)


def no_leader() -> BrokerError:
    return BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "election", leader_id=None, leader_url=None)


def records(*keys: bytes | None, partition: int | None = None) -> list[tuple[Record, int | None]]:
    return [(Record(value=b"v", key=k), partition) for k in keys]


@run_on_virtual_time
async def test_a_partition_without_a_leader_is_retried_until_it_has_one() -> None:
    parts = Partitions({1: [no_leader(), no_leader()]})
    router = RoutedProducer(parts, Topics(), request_timeout_ms=30_000)
    started = asyncio.get_running_loop().time()
    out = await router.produce_records("orders", records(None, partition=1), 30_000, Forwarder())
    assert [w[0] for w in parts.writes] == [1, 1, 1]  # two answers with no leader, then written
    assert out.records == [{"partition": 1, "offset": 0}]
    assert asyncio.get_running_loop().time() - started == pytest.approx(2 * RETRY_BACKOFF_S)


@run_on_virtual_time
async def test_an_answer_that_may_mean_written_is_not_retried() -> None:
    timed_out = BrokerError(ErrorCode.REQUEST_TIMED_OUT, "the write may still succeed")
    parts = Partitions({1: [timed_out]})
    out = await RoutedProducer(parts, Topics(), 30_000).produce_records(
        "orders", records(None, partition=1), 30_000, Forwarder()
    )
    assert len(parts.writes) == 1
    assert out.records[0]["error_code"] == "REQUEST_TIMED_OUT"


@run_on_virtual_time
async def test_retries_stop_at_the_request_timeout() -> None:
    parts = Partitions({1: [no_leader()] * 100})
    out = await RoutedProducer(parts, Topics(), 30_000).produce_records(
        "orders", records(None, partition=1), 1_000, Forwarder()
    )
    assert 5 <= len(parts.writes) <= 11  # every 100 ms for 1 s
    assert out.records[0]["error_code"] == "NOT_LEADER_OR_FOLLOWER"


@run_on_virtual_time
async def test_a_forwarded_request_is_neither_retried_nor_forwarded_again() -> None:
    elsewhere = BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "not here", leader_id=2, leader_url="http://n2")
    parts = Partitions({1: [elsewhere]})
    out = await RoutedProducer(parts, Topics(), 30_000).produce_records(
        "orders", records(None, partition=1), 30_000, None
    )
    assert len(parts.writes) == 1
    assert out.records[0]["error_code"] == "NOT_LEADER_OR_FOLLOWER"


@run_on_virtual_time
async def test_a_partition_led_elsewhere_is_forwarded_once_to_its_leader() -> None:
    elsewhere = BrokerError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "not here", leader_id=2, leader_url="http://n2")
    parts, fwd = Partitions({1: [elsewhere]}), Forwarder()
    out = await RoutedProducer(parts, Topics(), 30_000).produce_records(
        "orders", records(None, partition=1), 30_000, fwd
    )
    assert fwd.sent == [("http://n2", 1)]
    assert out.records == [{"partition": 1, "offset": 100}]


@run_on_virtual_time
async def test_records_go_by_key_and_keyless_ones_share_one_partition_per_request() -> None:
    parts = Partitions({})
    router = RoutedProducer(parts, Topics(), 30_000)
    out = await router.produce_records("orders", records(b"a", None, b"b", None), 30_000, Forwarder())
    placed = [r["partition"] for r in out.records]
    assert placed[0] == partition_for_key(b"a", 3) and placed[2] == partition_for_key(b"b", 3)
    assert placed[1] == placed[3]  # sticky within the request
    nxt = await router.produce_records("orders", records(None), 30_000, Forwarder())
    assert nxt.records[0]["partition"] == (placed[1] + 1) % 3  # round robin across requests


@run_on_virtual_time
async def test_an_explicit_partition_beyond_the_topic_changes_nothing() -> None:
    parts = Partitions({})
    with pytest.raises(BrokerError) as err:
        await RoutedProducer(parts, Topics(), 30_000).produce_records(
            "orders", records(None, partition=3), 30_000, None
        )
    assert err.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert parts.writes == []
