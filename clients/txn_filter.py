"""read_committed filtering of fetched batches (kafka_txn.md §7.4, seed 000). Pure.

The one implementation shared by the broker (server-filtered fetch) and the
Python consumer (``format=batches``).

Terms:

* **aborted transactions**: the ``(producer_id, first_offset)`` pairs a
  read_committed fetch returns next to its batches: every aborted transaction
  that overlaps the fetched range (the partition's aborted-transaction index).
* **active aborted producer ids**: producers whose aborted transaction the
  scan is inside of: it has reached the transaction's first offset but not yet
  its ABORT marker.

A read_committed fetch stops at the last stable offset, so every
transactional batch it returns is decided: committed or aborted. The scan
walks the batches in offset order with a min-heap of aborted transactions by
first offset. Before each batch that carries a producer id it moves every
aborted transaction starting at or before the batch's last offset into the
active set. Then:

* a control batch is never returned; an ABORT marker removes its producer
  from the active set (that aborted transaction is over);
* a transactional batch of an active aborted producer is skipped whole (a
  batch never mixes transactions: markers are batches of their own);
* every other batch is returned, non-transactional ones always.

With no aborted transactions (read_uncommitted) this only drops control
batches, which consumers never see either.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from clients.protocol import ControlType, Record, StoredBatch, control_type_of, decode_records

__all__ = ["visible_batches", "visible_records"]


def visible_batches(batches: Iterable[StoredBatch], aborted: Iterable[tuple[int, int]]) -> Iterator[StoredBatch]:
    """The batches a read_committed consumer sees, in order.

    ``batches`` are one fetch's batches in offset order; ``aborted`` the
    ``(producer_id, first_offset)`` pairs that came with them.
    """
    heap = [(first_offset, producer_id) for producer_id, first_offset in aborted]
    heapq.heapify(heap)
    active: set[int] = set()
    for batch in batches:
        header = batch.header
        if header.is_idempotent:
            last_offset = batch.last_offset
            while heap and heap[0][0] <= last_offset:
                active.add(heapq.heappop(heap)[1])
        if header.is_control:
            if control_type_of(batch.data) is ControlType.ABORT:
                active.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in active:
            continue
        yield batch


def visible_records(
    batches: Iterable[StoredBatch], aborted: Iterable[tuple[int, int]], *, from_offset: int = 0
) -> Iterator[tuple[int, Record]]:
    """``(offset, record)`` of every visible record at or after ``from_offset``, in order.

    ``from_offset`` is the fetch offset: the first batch may start before it.
    """
    for batch in visible_batches(batches, aborted):
        for i, record in enumerate(decode_records(batch.data)):
            offset = batch.base_offset + i
            if offset >= from_offset:
                yield offset, record
