"""Turn one binary fetch response into the records a consumer may deliver (pure, no I/O).

Terms: the *fetch offset* is the offset the request asked for; the *next
fetch offset* is where the following request starts. The log stores whole
batches, so the first batch of a response may start before the fetch offset
(its earlier records were delivered by a previous fetch and are dropped here,
as in Kafka's ``CompletedFetch``). Control batches (transaction markers) take
offsets but are never delivered; the next fetch offset still moves past them,
or a consumer reading a log that ends in a marker would fetch it forever.

Under ``read_committed`` nothing at or above the last stable offset (LSO) is
delivered and the next fetch offset stops at the LSO: the records above it may
still be aborted. Aborted transactional batches are dropped by
``clients.txn_filter``, the same filter the broker uses for server-filtered
fetches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import txn_filter
from .protocol import BrokerError, ErrorCode, FetchBatches, StoredBatch, decode_records
from .records import ConsumerRecord

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)

Deserializer = Callable[[bytes | None], Any]


@dataclass(frozen=True, slots=True)
class DecodedFetch:
    """What one fetch yields: deliverable records, where to fetch next, and the batch bytes read.

    ``error`` is set when a deserializer failed: ``records`` then ends before
    the failing record and ``next_offset`` is its offset, so the records before
    it are still delivered and the failure repeats until the caller seeks past
    it (Kafka's ``RecordDeserializationException``).
    """

    records: list[ConsumerRecord]
    next_offset: int
    size_bytes: int
    error: BrokerError | None = None


def visible_batches(fetch: FetchBatches, isolation: str) -> Iterator[StoredBatch]:
    """The batches whose records a consumer with ``isolation`` may see, oldest first.

    Control batches are never visible; under read_committed neither are the
    batches of the aborted transactions the broker listed with the fetch.
    """
    aborted = fetch.aborted_transactions if isolation == READ_COMMITTED else ()
    return txn_filter.visible_batches(fetch.batches, aborted)


def decode_fetch(
    topic: str,
    partition: int,
    fetch_offset: int,
    fetch: FetchBatches,
    isolation: str,
    key_deserializer: Deserializer | None = None,
    value_deserializer: Deserializer | None = None,
) -> DecodedFetch:
    upper = fetch.last_stable_offset if isolation == READ_COMMITTED else fetch.high_watermark
    next_offset = fetch_offset
    if fetch.batches:
        next_offset = max(fetch_offset, min(fetch.batches[-1].last_offset + 1, upper))
    size = sum(len(b.data) for b in fetch.batches)
    out: list[ConsumerRecord] = []
    for batch in visible_batches(fetch, isolation):
        if batch.last_offset < fetch_offset:
            continue
        offset = batch.base_offset
        for rec in decode_records(batch.data):
            if offset >= upper:
                break
            if offset >= fetch_offset:
                key, value = rec.key, rec.value
                try:
                    if key_deserializer is not None:
                        key = key_deserializer(key)
                    if value_deserializer is not None:
                        value = value_deserializer(value)
                except Exception as exc:
                    err = BrokerError(
                        ErrorCode.CORRUPT_MESSAGE,
                        f"{topic}-{partition} offset {offset}: deserializer failed: {exc!r}",
                        topic=topic, partition=partition, offset=offset,
                    )  # fmt: skip
                    return DecodedFetch(out, offset, size, err)
                out.append(ConsumerRecord(topic, partition, offset, key, value, rec.headers, rec.timestamp))
            offset += 1
    return DecodedFetch(out, next_offset, size)
