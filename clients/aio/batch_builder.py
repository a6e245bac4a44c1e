"""``BatchBuilder``: records gathered by the caller and sent as one batch (aiokafka's ``create_batch``/``send_batch``).

``send()`` costs a few microseconds of Python per record: the partitioner, the
accumulator and a future each. A loader that already has its records in hand
can skip that: it appends them to a builder, which encodes them at once into
the bytes of one record batch, and ``send_batch`` hands the whole batch to the
producer with one future. From there the batch is like any other: sequenced
when the sender drains it, retried with the same bytes, ordered after the
records ``send()`` put in the same partition before it, part of the open
transaction. librdkafka's ``rd_kafka_produce_batch`` exists for the same reason.

    batch = producer.create_batch()
    for v in values:
        if batch.append(value=v) is None:  # full: send it and start another
            await producer.send_batch(batch, "topic", partition=p)
            batch = producer.create_batch()
            batch.append(value=v)
    fut = await producer.send_batch(batch, "topic", partition=p)
    meta = await fut  # RecordMetadata of the batch's first record (its base offset)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ..protocol import BrokerError, ErrorCode
from ._batch import UNKEYED_OVERHEAD, ProducerBatch

__all__ = ["BatchBuilder"]

# AsyncProducer.encode_record: (key, value, headers) -> key bytes, value bytes, header bytes, record size
Serialize = Callable[
    [Any, Any, Sequence[tuple[str, bytes | None]] | None], tuple[bytes | None, bytes | None, bytes, int]
]


class BatchBuilder:
    """Records for one ``send_batch``: at most ``batch_size`` bytes, any one record however large.

    Get one from ``AsyncProducer.create_batch()``: its serializers and record
    size limit apply. Not thread-safe; append from one thread, then send it once.
    """

    __slots__ = ("_batch", "_batch_size", "_max_record_bytes", "_plain_values", "_sent", "_serialize")

    def __init__(self, batch_size: int, serialize: Serialize, *, max_record_bytes: int, plain_values: bool) -> None:
        self._batch = ProducerBatch("", -1, 0.0)
        self._batch_size = batch_size
        self._serialize = serialize
        self._max_record_bytes = max_record_bytes
        self._plain_values = plain_values  # no value serializer: a bytes value is taken as it is
        self._sent = False

    def append(
        self,
        *,
        value: Any = None,
        key: Any = None,
        timestamp: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
    ) -> int | None:
        """Add one record; its offset within the batch, or None when it does not fit (the batch is full).

        Errors are ``send()``'s for the record itself (``RECORD_TOO_LARGE``, a
        value that is not bytes without a serializer); ``INVALID_REQUEST``
        after the batch was sent. The producer's state is checked by ``send_batch``.
        """
        if self._sent:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "append() to a batch already sent")
        b = self._batch
        if key is None and headers is None and type(value) is bytes and self._plain_values:
            # A loader's usual record, in few steps: the same checks and bytes as the general path below.
            nbytes = len(value) + UNKEYED_OVERHEAD
            if nbytes <= self._max_record_bytes:
                if b.record_count and b.size + nbytes > self._batch_size:
                    return None
                b.encode_value(time.time_ns() // 1_000_000 if timestamp is None else timestamp, value)
                return b.record_count - 1
        kb, vb, hb, nbytes = self._serialize(key, value, headers)
        if nbytes > self._max_record_bytes:
            raise BrokerError(ErrorCode.RECORD_TOO_LARGE, f"record of {nbytes} bytes exceeds the request size limit")
        if not b.has_room(nbytes, self._batch_size):
            return None
        b.encode(time.time_ns() // 1_000_000 if timestamp is None else timestamp, kb, vb, hb)
        return b.record_count - 1

    def record_count(self) -> int:
        return self._batch.record_count

    def size(self) -> int:
        """Bytes of the record batch so far (header included): what counts against ``batch_size``."""
        return self._batch.size

    def take(self) -> ProducerBatch:
        """The encoded batch, once (``send_batch`` calls it); the builder accepts nothing after."""
        if self._sent:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "this batch was already sent")
        if self._batch.record_count == 0:
            raise BrokerError(ErrorCode.INVALID_REQUEST, "an empty batch cannot be sent")
        self._sent = True
        return self._batch
