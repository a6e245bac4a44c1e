"""Submit each producer's batches to a partition's Raft log in sequence order.

A producer keeps up to 5 batches of a partition in flight. Over HTTP/1.1
they travel on separate keep-alive connections, so the leader may finish
reading batch k+1 before batch k and submit it to Raft first. The log's
duplicate check (``storage.producer_state``) then rejects k+1 with
``OUT_OF_ORDER_SEQUENCE_NUMBER`` and every later batch of the window fails
behind it: the producer retries them safely, but its pipeline drains.

Kafka never meets this because a producer's requests to a broker share one
TCP connection. Here the leader restores the order instead: a batch whose
base sequence is ahead of the next sequence this leader has submitted for
its (partition, producer id, epoch) waits until its predecessor is
submitted, for at most ``max_wait_s``. It is only a reordering hint:
correctness stays with the log's check at apply time, so a stale or missing
entry (a new leader, an evicted producer, a predecessor that never comes)
costs at most one bounded wait, after which the batch is submitted and
judged as before.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

from clients.protocol import MAX_INT32

__all__ = ["SubmitSequencer"]

_SEQ_MOD = MAX_INT32 + 1
_Key = tuple[str, int, int]  # topic, partition, producer id


def _ahead(seq: int, of: int) -> bool:
    """Whether sequence ``seq`` comes after ``of`` (sequences wrap at 2**31 like Kafka's)."""
    return 0 < (seq - of) % _SEQ_MOD < _SEQ_MOD // 2


class SubmitSequencer:
    """Per (topic, partition, producer id): the epoch and next sequence submitted on this leader."""

    def __init__(
        self,
        max_wait_s: float = 0.2,
        max_producers: int = 100_000,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self.max_wait_s = max_wait_s
        self.max_producers = max_producers
        self._on_wait = on_wait  # called with "in_order" or "timed_out" after each wait
        self._next: OrderedDict[_Key, tuple[int, int]] = OrderedDict()
        self._waiters: dict[_Key, list[tuple[int, int, asyncio.Future[None]]]] = {}

    def must_wait(self, key: _Key, epoch: int, base_sequence: int) -> bool:
        entry = self._next.get(key)
        return entry is not None and entry[0] == epoch and _ahead(base_sequence, entry[1])

    async def wait_turn(
        self,
        key: _Key,
        epoch: int,
        base_sequence: int,
        timeout: float,
        applied_next: Callable[[], int | None] | None = None,
    ) -> None:
        """Return once every earlier batch of this producer was submitted, or after the bounded wait.

        ``applied_next``: the next sequence by the partition's applied state, to
        start from when this leader has not seen the producer yet (its first
        batches may overtake each other too).
        """
        if key not in self._next and applied_next is not None:
            start = applied_next()
            if start is not None:
                self._remember(key, epoch, start)
        if not self.must_wait(key, epoch, base_sequence):
            return
        waiter = (epoch, base_sequence, asyncio.get_running_loop().create_future())
        queue = self._waiters.setdefault(key, [])
        queue.append(waiter)
        outcome = "in_order"
        try:
            async with asyncio.timeout(min(timeout, self.max_wait_s)):
                await waiter[2]
        except TimeoutError:
            outcome = "timed_out"
        finally:
            queue.remove(waiter)
            if not queue:
                del self._waiters[key]
            if self._on_wait is not None:
                self._on_wait(outcome)

    def submitted(self, key: _Key, epoch: int, base_sequence: int, record_count: int) -> None:
        """Record that a batch went to Raft; wake the waiters it was holding up."""
        nxt = (base_sequence + record_count) % _SEQ_MOD
        entry = self._next.get(key)
        if entry is None or entry[0] != epoch or _ahead(nxt, entry[1]):
            self._remember(key, epoch, nxt)
        else:
            self._next.move_to_end(key)
        for e, seq, fut in self._waiters.get(key, ()):
            if not fut.done() and not self.must_wait(key, e, seq):
                fut.set_result(None)

    def forget(self, key: _Key) -> None:
        """A batch of this producer was rejected or its outcome is unknown: the next one re-reads the log.

        Without this, a batch that went to Raft but failed there (out of order
        after a timed-out wait, say) would leave the next sequence past the
        log's, and the producer's resend of it would not be held in order.
        """
        self._next.pop(key, None)

    def _remember(self, key: _Key, epoch: int, next_sequence: int) -> None:
        self._next[key] = (epoch, next_sequence)
        self._next.move_to_end(key)
        while len(self._next) > self.max_producers:
            self._next.popitem(last=False)
