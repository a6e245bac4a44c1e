"""Produce-side verification (KIP-890): a transactional batch opens a transaction only once it is added.

A partition leader about to append a producer's first batch of a transaction
asks the transaction coordinator (here, or over a signed internal call)
whether the partition is in the producer's ongoing transaction; the first
such produce adds it (TV2's implicit AddPartitions). Answers are cached per
(id, pid, epoch, partition) together with the partition's state of the
producer when it asked, and the batches sent behind a transaction's first
batch share its verification instead of each asking the coordinator. The
state makes a cached answer last one transaction: under TV2 every transaction
has an epoch of its own, but a producer of the classic protocol keeps its
epoch across transactions, and a zombie of it must not open a transaction on
a partition verified for an earlier one.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from clients.protocol import ErrorCode
from coordinator.metadata import TopicPartition

from .add_partitions import PartitionAdder
from .markers import MarkerDriver
from .state_manager import TransactionStateManager

__all__ = ["VERIFY_PATH", "PartitionVerification"]

VERIFY_PATH = "/v1/internal/txn/verify"
_VERIFIED_CACHE = 100_000

_Key = tuple[str, int, int, str, int, bool]  # transactional id, producer id, epoch, topic, partition, add


class PartitionVerification:
    """Both halves of KIP-890's check: the partition leader's (``verify_partition``) and the coordinator's."""

    def __init__(self, state: TransactionStateManager, driver: MarkerDriver, adder: PartitionAdder) -> None:
        self._state = state
        self._driver = driver
        self._adder = adder
        self._verified: OrderedDict[_Key, object] = OrderedDict()
        self._verifying: dict[_Key, asyncio.Future[None]] = {}

    async def verify_partition(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int,
        state: object = None, add: bool = True,
    ) -> None:  # fmt: skip
        """Raise unless (topic, partition) is in the producer's ongoing transaction; adds it if needed.

        ``state``: the partition's (immutable) state of this producer, replaced whenever a transaction ends
        there; a cached answer counts only while it is the same object. ``add`` False: verify only (KIP-890
        part 1 for the classic protocol, whose client adds explicitly): INVALID_TXN_STATE when it is not there.
        """
        key = (transactional_id, producer_id, producer_epoch, topic, partition, add)
        if key in self._verified and self._verified[key] is state:
            self._verified.move_to_end(key)
            return
        pending = self._verifying.get(key)
        if pending is not None:
            try:
                await asyncio.shield(pending)  # its outcome (error included) is ours
                return
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # we were cancelled
            # The request that was verifying went away before an answer: verify for ourselves.
            return await self.verify_partition(
                transactional_id, producer_id, producer_epoch, topic, partition, state, add
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._verifying[key] = fut
        try:
            await self._verify(key, state)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: nobody else may be waiting
            raise
        else:
            fut.set_result(None)
        finally:
            del self._verifying[key]

    async def _verify(self, key: _Key, state: object) -> None:
        transactional_id, producer_id, producer_epoch, topic, partition, add = key
        if self._state.leading_local(transactional_id) is not None:
            await self.verify_here(transactional_id, producer_id, producer_epoch, topic, partition, add)
        else:
            body: dict[str, object] = {
                "transactional_id": transactional_id,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "topic": topic,
                "partition": partition,
            }
            if not add:
                body["verify_only"] = True
            await self._state.remote(transactional_id, VERIFY_PATH, body)
        self._verified[key] = state
        self._verified.move_to_end(key)
        if len(self._verified) > _VERIFIED_CACHE:
            self._verified.popitem(last=False)

    async def verify_here(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int,
        add: bool = True,
    ) -> None:  # fmt: skip
        """The coordinator's half of ``verify_partition`` (this node leads the id's partition).

        The implicit add of the next transaction's first produce to a partition
        is recorded at once, even while the previous transaction completes; the
        answer waits for the previous transaction's marker on that partition
        (``PartitionAdder.add_ahead``). If it is still owed when the wait ends,
        the answer is CONCURRENT_TRANSACTIONS (the partition leader hands it to
        the producer, which retries). ``add`` False adds nothing: INVALID_TXN_STATE unless an add under
        way or done includes the partition.
        """
        part = self._state.leading(transactional_id)
        tp = TopicPartition(topic, partition)
        ident = (transactional_id, producer_id, producer_epoch)
        if add:
            self._adder.hints.written(transactional_id, producer_id, producer_epoch, tp)
        while True:
            err = part.sm.partition_in_txn(transactional_id, producer_id, producer_epoch, topic, partition)
            if err is None:
                meta = part.sm.get(transactional_id)
                plan = meta.marker_plan() if meta is not None else None
                if plan is not None and tp in plan.partitions:  # added ahead; the previous marker may be owed
                    await self._driver.await_markers(part, plan, (tp,))
                return
            if err.error_code is not ErrorCode.INVALID_TXN_STATE:
                raise err
            joined = self._adder.in_flight.covering(ident, tp)
            if joined is None:
                if not add:
                    raise err
                break
            await asyncio.shield(joined)  # an add under way includes tp: look again once it is applied
        hinted = self._adder.hints.for_first_add(part.sm.get(transactional_id), tp)
        tps = self._adder.checked([tp, *self._adder.still_existing(hinted)])
        await self._adder.add_ahead(part, transactional_id, producer_id, producer_epoch, tps, wait_for=(tp,))
