"""``BatchBuilder`` and ``send_batch``'s accumulator half: the bytes, the size bound, order and accounting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.aio._accumulator import Outcome
from clients.aio._batch import BATCH_OVERHEAD, NO_HEADERS, UNKEYED_OVERHEAD, BatchState, encode_headers, record_size
from clients.aio.batch_builder import BatchBuilder
from clients.protocol import BrokerError, ErrorCode, decode_records, encode_batch
from tests.unit.test_producer_accumulator import Sink, leader, make, put, records_st


def encode(key, value, headers):  # AsyncProducer.encode_record without serializers
    hb = encode_headers(headers) if headers else NO_HEADERS
    return key, value, hb, record_size(key, value, hb)


def builder(batch_size: int = 1 << 20, max_record_bytes: int = 1 << 20) -> BatchBuilder:
    return BatchBuilder(batch_size, encode, max_record_bytes=max_record_bytes, plain_values=True)


@given(records_st, st.integers(0, 2**40), st.integers(0, 2**31 - 1))
@settings(max_examples=200, deadline=None)
def test_built_batch_bytes_equal_protocol_encode_batch(records, pid, seq):
    """Both paths (bytes value without key or headers, and the general one) encode what the protocol does."""
    b = builder()
    for i, r in enumerate(records):
        at = b.append(value=r.value, key=r.key, headers=list(r.headers) or None, timestamp=r.timestamp)
        assert at == i
    pb = b.take()
    pb.seal_wire(pid, 0, seq, transactional=False)
    assert pb.wire == encode_batch(records, producer_id=pid, producer_epoch=0, base_sequence=seq)
    assert b.size() == len(pb.wire) == pb.size
    assert list(decode_records(pb.wire)) == list(records)


def test_batch_size_bounds_the_batch_but_one_record_always_fits():
    b = builder(batch_size=BATCH_OVERHEAD + 2 * record_size(None, b"x" * 100, NO_HEADERS))
    assert [b.append(value=b"x" * 100) for _ in range(3)] == [0, 1, None]
    assert b.record_count() == 2
    big = builder(batch_size=100)
    assert big.append(value=b"y" * 500) == 0, "an empty batch takes any record the request limit allows"
    assert big.append(value=b"z") is None


def test_bad_records_and_reuse_are_refused():
    b = builder(max_record_bytes=200)
    for bad in (dict(value=b"x" * 300), dict(value=b"x" * 300, key=b"k")):
        with pytest.raises(BrokerError) as e:
            b.append(**bad)
        assert e.value.error_code is ErrorCode.RECORD_TOO_LARGE
    assert b.record_count() == 0
    with pytest.raises(BrokerError) as e:
        b.take()
    assert e.value.error_code is ErrorCode.INVALID_REQUEST, "an empty batch was taken"
    b.append(value=b"ok")
    b.take()
    for call in (lambda: b.append(value=b"late"), b.take):
        with pytest.raises(BrokerError) as e:
            call()
        assert e.value.error_code is ErrorCode.INVALID_REQUEST, "a sent batch was reused"


def test_send_batch_queues_after_the_open_batch_and_answers_the_base_offset():
    _, acc = make(batch_size=10_000)
    first = put(acc, 0, b"before")  # an open batch of partition 0
    b = builder()
    for i in range(5):
        b.append(value=f"b{i}".encode(), timestamp=1000 + i)
    pb = b.take()
    whole = Sink()
    pb.assign("t", 0, 0.0, whole)
    acc.append_batch(pb)
    assert acc.buffered_bytes == record_size(None, b"before", NO_HEADERS) + pb.size - BATCH_OVERHEAD
    later = put(acc, 0, b"after")  # must not join the open batch that now sits before the caller's
    sent = [b2 for _, bs in acc.drain(1.0, leader) for b2 in bs]
    assert [x.record_count for x in sent] == [1, 5, 1], "send order across the three batches"
    assert [x.base_sequence for x in sent] == [0, 1, 6]
    base = 10
    for x in sent:
        acc.request_finished()
        assert acc.handle_response(x, base, -1, None, 1.0) is Outcome.ACKED
        base += x.record_count
    assert first.result.offset == 10 and later.result.offset == 16
    assert (whole.result.offset, whole.result.partition, whole.result.timestamp) == (11, 0, 1000)
    assert acc.buffered_bytes == 0 and all(x.state is BatchState.DONE for x in sent)


def test_unkeyed_overhead_is_what_record_size_counts():
    assert record_size(None, b"abc", NO_HEADERS) == UNKEYED_OVERHEAD + 3
