"""The coordinator's implicit adds (KIP-890 part 2), made cheap: one Raft command per transaction.

A transactional producer's first batch to each partition makes that
partition's leader ask the coordinator to verify it (``verify_here``), and a
partition not yet in the transaction is added by an ``AddPartitions`` command.
One command per partition would cost a Raft round on the coordinator's group
apiece (about 2 ms of the nodes' CPU each, the largest part of the
transactional overhead; ``docs/pipelined-transactions.md``). Two rules bring
it to one command per transaction:

* **The first add of a transaction also adds the partitions the producer's
  previous transaction wrote to** (``PartitionHints``). A pipeline writes to
  the same partitions in every transaction; once they are in, the later
  verifications find them there and answer without a Raft round. The hint is
  used only when a real batch starts the transaction, so an idle producer is
  never given an open transaction. A hinted partition the transaction does not
  write to costs one marker, which writes nothing to that partition's log (a
  marker that closes no transaction of the producer takes no offset), like a
  partition added and not written to under Kafka's TV1. Offsets partitions are
  never hinted: ``AddOffsetsToTxn`` adds those explicitly.
* **A verification waits for an add already under way that covers its
  partition** (``AddsInFlight``) instead of proposing its own: the first
  batches of a transaction reach the coordinator a millisecond or two apart,
  while the first add is still in its Raft round.

Hints live in the leader's memory only: they are a guess, never state. After a
coordinator failover the first transaction of each id pays the old cost once.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from typing import TypeVar

from coordinator.group_metadata import OFFSETS_TOPIC
from coordinator.metadata import TopicPartition, TransactionMetadata
from coordinator.states import PREPARE_STATES, TransactionState

__all__ = ["AddsInFlight", "PartitionHints", "starts_transaction"]

_Identity = tuple[str, int, int]  # transactional id, producer id, producer epoch
_V = TypeVar("_V")

#: States in which an add from the client starts a new transaction (in a prepare state: a pipelined
#: add, when the next transaction has added nothing yet).
_IDLE_STATES = frozenset({TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT})


def starts_transaction(meta: TransactionMetadata | None) -> bool:
    """Whether an add for the client's current or next identity would open a transaction."""
    if meta is None:
        return False
    if meta.state in PREPARE_STATES:
        return not meta.next_partitions
    return meta.state in _IDLE_STATES


class PartitionHints:
    """Per transactional id, the partitions its last transaction wrote to (an LRU of ``capacity`` ids).

    "Wrote to" means a batch was verified there (``written``): partitions that
    were only hinted and never written are not passed on, so a pipeline that
    stops writing to a partition stops adding it after one transaction.
    """

    def __init__(self, capacity: int = 100_000, max_partitions: int = 256) -> None:
        self.capacity = capacity
        self.max_partitions = max_partitions
        self._writing: OrderedDict[str, tuple[int, int, set[TopicPartition]]] = OrderedDict()
        self._last: OrderedDict[str, frozenset[TopicPartition]] = OrderedDict()

    def written(self, transactional_id: str, producer_id: int, producer_epoch: int, tp: TopicPartition) -> None:
        """A batch of the transaction of (producer id, epoch) was verified for ``tp``."""
        if tp.topic == OFFSETS_TOPIC:
            return
        cur = self._writing.get(transactional_id)
        if cur is None or cur[:2] != (producer_id, producer_epoch):
            cur = (producer_id, producer_epoch, set())
            self._writing[transactional_id] = cur
        if len(cur[2]) <= self.max_partitions:
            cur[2].add(tp)
        self._writing.move_to_end(transactional_id)
        _trim(self._writing, self.capacity)

    def ended(self, transactional_id: str, producer_id: int, producer_epoch: int) -> None:
        """The transaction of (producer id, epoch) ended (EndTxn answered): its partitions become the hint."""
        cur = self._writing.pop(transactional_id, None)
        tps = frozenset(cur[2]) if cur is not None and cur[:2] == (producer_id, producer_epoch) else frozenset()
        if not tps or len(tps) > self.max_partitions:
            self._last.pop(transactional_id, None)
            return
        self._last[transactional_id] = tps
        self._last.move_to_end(transactional_id)
        _trim(self._last, self.capacity)

    def for_first_add(self, meta: TransactionMetadata | None, tp: TopicPartition) -> tuple[TopicPartition, ...]:
        """The partitions to add with ``tp`` when its verification starts the id's next transaction."""
        if meta is None or not starts_transaction(meta):
            return ()
        last = self._last.get(meta.transactional_id)
        if last is None:
            return ()
        return tuple(sorted(last - {tp}))

    def __len__(self) -> int:
        return len(self._last)


def _trim(d: OrderedDict[str, _V], capacity: int) -> None:
    while len(d) > capacity:
        d.popitem(last=False)


class AddsInFlight:
    """The adds being proposed, per identity, so a verification can join one instead of proposing its own."""

    def __init__(self) -> None:
        self._adds: dict[_Identity, list[tuple[frozenset[TopicPartition], asyncio.Future[None]]]] = {}

    def covering(self, ident: _Identity, tp: TopicPartition) -> asyncio.Future[None] | None:
        """The future of an add under way for ``ident`` that includes ``tp``, if any."""
        for tps, fut in self._adds.get(ident, ()):
            if tp in tps:
                return fut
        return None

    def begin(self, ident: _Identity, tps: Iterable[TopicPartition]) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._adds.setdefault(ident, []).append((frozenset(tps), fut))
        return fut

    def end(self, ident: _Identity, fut: asyncio.Future[None]) -> None:
        """The add of ``fut`` was applied or failed: its waiters look at the state again."""
        entries = self._adds.get(ident)
        if entries is not None:
            entries[:] = [e for e in entries if e[1] is not fut]
            if not entries:
                del self._adds[ident]
        if not fut.done():
            fut.set_result(None)

    def __len__(self) -> int:
        return sum(len(v) for v in self._adds.values())
