"""AddPartitionsToTxn on the coordinator: explicit adds, AddOffsetsToTxn, and KIP-890's implicit add.

While an id is in PrepareCommit/PrepareAbort after an EndTxn, an add records
the client's *next* transaction's partitions at once (``next_partitions``;
CompleteTxn opens it) and answers once the previous transaction's marker is
written on each of those partitions it also touched: the Raft round of the
add and the marker writes overlap, and a partition admits a batch of the next
transaction only after the previous one's marker is in its log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from clients.protocol import BrokerError, ErrorCode
from coordinator.commands import AddPartitions
from coordinator.group_metadata import OFFSETS_TOPIC
from coordinator.metadata import TopicPartition
from coordinator.results import AddPartitionsResult
from coordinator.states import OPEN_STATES

from ..seams import TopicDirectory
from .adds import AddsInFlight, PartitionHints
from .markers import MarkerDriver
from .state_manager import TransactionStateManager, TxnPartition

__all__ = ["AddMetrics", "PartitionAdder"]


class AddMetrics(Protocol):
    def txn_started(self) -> None: ...


class PartitionAdder:
    """Adds partitions to transactions, overlapping the add with the previous transaction's markers."""

    def __init__(
        self,
        state: TransactionStateManager,
        driver: MarkerDriver,
        topics: TopicDirectory,
        metrics: AddMetrics,
        offsets_partitions: int,
    ) -> None:
        self._state = state
        self._driver = driver
        self._topics = topics
        self._metrics = metrics
        self._offsets_partitions = offsets_partitions
        self.hints = PartitionHints()  # a transaction's first add also adds the previous one's partitions
        self.in_flight = AddsInFlight()

    def checked(self, partitions: Iterable[TopicPartition]) -> tuple[TopicPartition, ...]:
        """``partitions`` sorted and deduplicated; UNKNOWN_TOPIC_OR_PARTITION for one that does not exist."""
        tps = tuple(sorted(set(partitions), key=lambda tp: (tp.topic, tp.partition)))
        for tp in tps:
            if tp.topic == OFFSETS_TOPIC:  # AddOffsetsToTxn / TxnOffsetCommit: a group's offsets partition
                if not 0 <= tp.partition < self._offsets_partitions:
                    raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp} does not exist")
                continue
            meta = self._topics.topic(tp.topic)  # UNKNOWN_TOPIC_OR_PARTITION for a missing topic
            if not 0 <= tp.partition < len(meta.partitions):
                raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp.topic} has no partition {tp.partition}")
        return tps

    def still_existing(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """The hinted partitions that exist and have a leader now (a hint never fails or blocks a transaction)."""
        out = []
        for tp in tps:
            try:
                meta = self._topics.topic(tp.topic)
            except BrokerError:
                continue  # the topic is gone
            # A partition beyond the topic's count has no replica anywhere, hence no leader.
            if self._topics.partition_leader(meta, tp.partition) is not None:
                out.append(tp)
        return out

    async def add_ahead(
        self,
        part: TxnPartition,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        tps: tuple[TopicPartition, ...],
        wait_for: tuple[TopicPartition, ...] | None = None,
    ) -> AddPartitionsResult:
        """Add ``tps``; meanwhile wait for the markers the previous transaction still owes on them.

        In a prepare state the add is recorded for the next transaction
        (``coordinator.transitions._add_next``); the two waits overlap, and the
        answer comes when both are done, so no batch of the next transaction
        can reach a partition ahead of the previous transaction's marker there.
        ``wait_for`` narrows the marker wait to the partitions the caller is
        about to write (a hinted partition waits when its own batch comes).
        """
        meta = part.sm.get(transactional_id)
        plan = meta.marker_plan() if meta is not None else None
        owed = [tp for tp in (tps if wait_for is None else wait_for) if plan is not None and tp in plan.partitions]
        if plan is None or not owed:
            return await self._add(part, transactional_id, producer_id, producer_epoch, tps)
        markers = asyncio.ensure_future(self._driver.await_markers(part, plan, owed))
        try:
            result = await self._add(part, transactional_id, producer_id, producer_epoch, tps)
        except BaseException:
            markers.cancel()
            raise
        await markers
        return result

    async def _add(
        self, part: TxnPartition, transactional_id: str, producer_id: int, producer_epoch: int,
        tps: tuple[TopicPartition, ...],
    ) -> AddPartitionsResult:  # fmt: skip
        before = part.sm.get(transactional_id)
        starts = before is None or (before.state not in OPEN_STATES and not before.next_partitions)
        ident = (transactional_id, producer_id, producer_epoch)
        in_flight = self.in_flight.begin(ident, tps)
        try:
            result = await self._state.propose(
                part,
                AddPartitions,
                transactional_id=transactional_id,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                partitions=tps,
            )
        finally:
            self.in_flight.end(ident, in_flight)
        assert isinstance(result, AddPartitionsResult), result
        if starts and result.added:
            self._metrics.txn_started()
        return result
