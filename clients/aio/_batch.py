"""One producer batch: records for one partition, encoded as they arrive, sent as one record batch.

Terms (Kafka's ``ProducerBatch``):

* A batch is **open** while it accepts records; it is **sealed** when full,
  when its linger time has passed, or on flush. Only sealed batches are sent.
* A batch is **sequenced** when the sender first drains it: it then gets the
  producer id, epoch and base sequence and its wire bytes are fixed. Every
  retry resends exactly those bytes, so the broker's duplicate check (same
  epoch, same sequence range) recognises a retry of a batch that already
  landed and answers with the original offsets.
* A batch is **reported** once its records' futures are completed (acknowledged
  or failed). An expired batch is reported (failed) while its request may still
  be in flight; its ``state`` still says IN_FLIGHT until the request returns.
* ``maybe_written``: some attempt ended without a definite answer (network
  error, timeout, leader change), so the broker may hold the batch. Such a
  batch is never re-sequenced under a new epoch: that could write it twice.

The record layout is the one in ``clients.protocol`` (checked by a unit test
against ``protocol.encode_batch``); records are encoded once, in ``append``,
and the header and CRC are written once, in ``seal_wire``.

Not thread-safe: the owning event loop mutates batches.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import crc32c

from ..protocol import ATTR_TRANSACTIONAL, BATCH_HEADER, BATCH_MAGIC, BrokerError, ErrorCode
from ..records import RecordMetadata

__all__ = [
    "NO_HEADERS",
    "UNKEYED_OVERHEAD",
    "BatchState",
    "DeliveryTimeoutError",
    "ProducerBatch",
    "RecordSink",
    "encode_headers",
    "record_size",
]

_REC_HEAD = struct.Struct(">qi")  # timestamp, key_len
_REC_NULL_KEY = struct.Struct(">qii")  # timestamp, key_len (-1), value_len
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
NO_HEADERS = b"\x00\x00"  # header_count 0
_NULL_LEN = _I32.pack(-1)
CRC_START = 5  # magic u8 + crc u32 are not covered by the CRC
BATCH_OVERHEAD = BATCH_HEADER.size
UNKEYED_OVERHEAD = 18  # record_size(None, value, NO_HEADERS) - len(value): ts, key_len, value_len, header_count


class RecordSink(Protocol):
    """Where one record's outcome goes: an ``asyncio.Future`` or a ``concurrent.futures.Future``."""

    def done(self) -> bool: ...
    def set_result(self, result: RecordMetadata, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...
    def exception(self) -> BaseException | None: ...


class DeliveryTimeoutError(BrokerError):
    """A batch was not acknowledged within ``delivery_timeout_ms`` (or before ``close(timeout)`` gave up).

    ``error_code`` is ``REQUEST_TIMED_OUT``. ``maybe_written`` says whether a
    request carrying the batch may still have reached the broker: then the
    records may be in the log (once, never twice) -- Kafka's
    ``TimeoutException`` has the same meaning.
    """

    def __init__(self, message: str, *, maybe_written: bool) -> None:
        super().__init__(ErrorCode.REQUEST_TIMED_OUT, message, maybe_written=maybe_written)
        self.maybe_written = maybe_written


class BatchState(enum.Enum):
    QUEUED = "queued"  # sealed or open, no sequence yet
    IN_FLIGHT = "in_flight"  # sequenced, a request carrying it is outstanding
    RETRY_WAIT = "retry_wait"  # sequenced, waiting for its backoff or its predecessors
    RESEQUENCE = "resequence"  # never written; goes back to QUEUED after the epoch bump
    DONE = "done"  # acknowledged or failed, no request outstanding


VALID_PREVIOUS: dict[BatchState, frozenset[BatchState]] = {
    BatchState.QUEUED: frozenset({BatchState.RESEQUENCE}),
    BatchState.IN_FLIGHT: frozenset({BatchState.QUEUED, BatchState.RETRY_WAIT}),
    BatchState.RETRY_WAIT: frozenset({BatchState.IN_FLIGHT}),
    BatchState.RESEQUENCE: frozenset({BatchState.IN_FLIGHT, BatchState.RETRY_WAIT}),
    BatchState.DONE: frozenset({BatchState.QUEUED, BatchState.IN_FLIGHT, BatchState.RETRY_WAIT, BatchState.RESEQUENCE}),
}


def encode_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> bytes:
    """``header_count i16 | (hkey_len i16 | hkey | hval_len i32 | hval)*`` (the protocol's record tail)."""
    if not headers:
        return NO_HEADERS
    out = [_I16.pack(len(headers))]
    for hk, hv in headers:
        if not isinstance(hk, str):
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"header keys must be str, got {type(hk).__name__}")
        kb = hk.encode("utf-8")
        out.append(_I16.pack(len(kb)))
        out.append(kb)
        if hv is None:
            out.append(_NULL_LEN)
        else:
            out.append(_I32.pack(len(hv)))
            out.append(hv)
    return b"".join(out)


def record_size(key: bytes | None, value: bytes | None, headers: bytes) -> int:
    """Encoded size of one record in a batch (what counts against batch_size and buffer_memory)."""
    return 16 + (len(key) if key is not None else 0) + (len(value) if value is not None else 0) + len(headers)


class ProducerBatch:
    """Records for one (topic, partition); see the module docstring for its life cycle."""

    __slots__ = (
        "_parts",
        "attempts",
        "base_sequence",
        "behind_gap",
        "created",
        "expired",
        "failure",
        "first_ts",
        "held",
        "last_error",
        "max_ts",
        "maybe_written",
        "partition",
        "producer_epoch",
        "producer_id",
        "record_count",
        "reported",
        "retry_at",
        "sealed",
        "sent_with_live_predecessors",
        "size",
        "state",
        "thunks",
        "token_taken",
        "topic",
        "txn_token",
        "wait_for_predecessors",
        "wire",
    )

    def __init__(self, topic: str, partition: int, created: float) -> None:
        self.topic = topic
        self.partition = partition
        self.created = created
        self._parts: list[bytes] = []
        self.thunks: list[tuple[RecordSink, int, int, int, int]] = []  # sink, ts, key/value/header sizes
        self.size = BATCH_OVERHEAD
        self.record_count = 0
        self.first_ts = 0
        self.max_ts = 0
        self.sealed = False
        self.held = False  # the next transaction's, appended during a pipelined commit: not sent until it ends
        self.state = BatchState.QUEUED
        self.wire: bytes | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1
        self.attempts = 0
        self.txn_token: bytes | None = None  # carried marker (docs/carried-markers.md): on the first batch only
        self.token_taken = False  # whether the transaction's token for this partition was looked for yet
        self.retry_at = 0.0
        self.maybe_written = False
        self.sent_with_live_predecessors = False
        self.wait_for_predecessors = False
        self.behind_gap = False  # an earlier batch of this epoch is certainly unwritten
        self.expired = False
        self.reported = False
        self.last_error: BrokerError | None = None  # of the latest attempt
        self.failure: BrokerError | None = None  # what the futures were failed with

    def __repr__(self) -> str:
        return (
            f"ProducerBatch({self.topic}-{self.partition} seq={self.base_sequence} n={self.record_count} "
            f"{self.state.name} attempts={self.attempts})"
        )

    # ---- building ------------------------------------------------------------------------

    def has_room(self, nbytes: int, batch_size: int) -> bool:
        """Whether a record of ``nbytes`` fits; an empty batch takes any one record (Kafka does too)."""
        return self.record_count == 0 or self.size + nbytes <= batch_size

    def append(
        self,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: bytes,
        sink: RecordSink,
    ) -> None:
        ks, vs = self.encode(timestamp, key, value, headers)
        self.thunks.append((sink, timestamp, ks, vs, len(headers) - 2))

    def encode(self, timestamp: int, key: bytes | None, value: bytes | None, headers: bytes) -> tuple[int, int]:
        """Add one record's bytes (no outcome sink: ``append``, or a whole-batch sink); its key and value sizes."""
        vs = -1 if value is None else len(value)
        if key is None:
            ks = -1
            self._parts += (_REC_NULL_KEY.pack(timestamp, -1, vs), value or b"", headers)
            self.size += 16 + (vs if vs > 0 else 0) + len(headers)
        else:
            ks = len(key)
            self._parts += (_REC_HEAD.pack(timestamp, ks), key, _I32.pack(vs), value or b"", headers)
            self.size += 16 + ks + (vs if vs > 0 else 0) + len(headers)
        if self.record_count == 0:
            self.first_ts = self.max_ts = timestamp
        elif timestamp > self.max_ts:
            self.max_ts = timestamp
        self.record_count += 1
        return ks, vs

    def encode_value(self, timestamp: int, value: bytes) -> None:
        """``encode`` of a bytes value with no key and no headers, in fewer steps (``BatchBuilder``'s hot path)."""
        self._parts += (_REC_NULL_KEY.pack(timestamp, -1, len(value)), value, NO_HEADERS)
        self.size += UNKEYED_OVERHEAD + len(value)
        if self.record_count == 0:
            self.first_ts = self.max_ts = timestamp
        elif timestamp > self.max_ts:
            self.max_ts = timestamp
        self.record_count += 1

    def append_unkeyed(self, timestamp: int, value: bytes | None, headers: bytes, sink: RecordSink) -> None:
        """``append`` with ``key=None`` in fewer steps (the sticky partitioner's hot path); same bytes."""
        if value is None:
            self._parts += (_REC_NULL_KEY.pack(timestamp, -1, -1), headers)
            self.size += 16 + len(headers)
            self.thunks.append((sink, timestamp, -1, -1, len(headers) - 2))
        else:
            vs = len(value)
            self._parts += (_REC_NULL_KEY.pack(timestamp, -1, vs), value, headers)
            self.size += 16 + vs + len(headers)
            self.thunks.append((sink, timestamp, -1, vs, len(headers) - 2))
        if timestamp > self.max_ts:
            self.max_ts = timestamp
        self.record_count += 1

    def assign(self, topic: str, partition: int, created: float, sink: RecordSink) -> None:
        """Aim a batch built apart (``BatchBuilder``) at ``topic``/``partition``; ``sink`` gets the outcome.

        On success ``sink`` gets the ``RecordMetadata`` of the batch's first record
        (its base offset; sizes -1, as aiokafka's ``send_batch`` answers).
        """
        self.topic, self.partition, self.created = topic, partition, created
        self.thunks = [(sink, self.first_ts, -1, -1, -1)]

    def seal_wire(self, producer_id: int, producer_epoch: int, base_sequence: int, transactional: bool) -> None:
        """Fix the batch's identity and bytes; every later attempt sends exactly these bytes.

        The record parts are dropped once joined; a re-sequenced batch restamps
        the header of its existing bytes instead.
        """
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        if self.wire is None:
            buf = bytearray(BATCH_OVERHEAD)
            buf += b"".join(self._parts)
            self._parts = []
        else:
            buf = bytearray(self.wire)
        BATCH_HEADER.pack_into(
            buf,
            0,
            BATCH_MAGIC,
            0,
            ATTR_TRANSACTIONAL if transactional else 0,
            producer_id,
            producer_epoch,
            base_sequence,
            self.record_count,
            self.first_ts,
            self.max_ts,
        )
        struct.pack_into(">I", buf, 1, crc32c.crc32c(memoryview(buf)[CRC_START:]))
        self.wire = bytes(buf)

    def unsequence(self) -> None:
        """Forget the identity of a batch that was never written, before it is sent under a new epoch."""
        self.producer_id = self.producer_epoch = self.base_sequence = -1
        self.sent_with_live_predecessors = self.wait_for_predecessors = self.behind_gap = False

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.record_count - 1) % 2**31

    # ---- life cycle ----------------------------------------------------------------------

    def transition_to(self, state: BatchState) -> None:
        if self.state not in VALID_PREVIOUS[state]:
            raise BrokerError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"{self!r}: illegal batch transition {self.state.name} -> {state.name}",
            )
        self.state = state

    def complete(self, base_offset: int, log_append_time: int) -> None:
        """Report success: every record's future gets its RecordMetadata."""
        if self.reported:
            return
        self.reported = True
        topic, partition = self.topic, self.partition
        offset, step = base_offset, (1 if base_offset >= 0 else 0)
        new = tuple.__new__  # RecordMetadata(...) without the named tuple's Python-level __new__: one per record
        for sink, ts, ks, vs, hs in self.thunks:
            if not sink.done():
                sink.set_result(new(RecordMetadata, (topic, partition, offset, ts, log_append_time, ks, vs, hs)))
            offset += step
        self._release()

    def fail(self, exc: BrokerError) -> None:
        """Report failure: every record's future gets ``exc``.

        The failure is marked as seen (``exception()``): fire-and-forget sends
        are normal for a producer, and the producer logs each failed batch once
        instead of asyncio logging every unawaited record future.
        """
        if self.reported:
            return
        self.reported = True
        self.failure = exc
        for sink, *_ in self.thunks:
            if not sink.done():
                sink.set_exception(exc)
                sink.exception()
        self._release()

    def _release(self) -> None:
        self._parts = []
        self.thunks = []


def add_callback(
    sink: Any, callback: Callable[[RecordMetadata | None, BaseException | None], None], on_error: Callable[..., None]
) -> None:
    """Run Java-style ``callback(metadata, exception)`` when ``sink`` completes; its errors go to ``on_error``."""

    def done(fut: Any) -> None:
        if fut.cancelled():
            return
        try:
            exc = fut.exception()
            callback(None if exc is not None else fut.result(), exc)
        except Exception:
            on_error("producer callback raised", exc_info=True)

    sink.add_done_callback(done)
