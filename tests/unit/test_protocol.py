"""Record-batch encoding, binary produce/fetch framing and the partitioner (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients.partitioner import murmur2, partition_for_key
from clients.protocol import (
    BrokerError,
    ControlType,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    Record,
    control_type_of,
    decode_fetch_batches,
    decode_produce_request,
    decode_records,
    encode_batch,
    encode_control_batch,
    encode_fetch_batches,
    encode_produce_request,
    parse_batch,
)

records_st = st.lists(
    st.builds(
        Record,
        value=st.none() | st.binary(max_size=64),
        key=st.none() | st.binary(max_size=16),
        headers=st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3).map(tuple),
        timestamp=st.integers(min_value=-1, max_value=2**62),
    ),
    min_size=1,
    max_size=20,
)


@given(records_st, st.integers(-1, 2**40), st.integers(0, 32767), st.integers(0, 2**31 - 1))
def test_batch_round_trips(records, pid, epoch, seq):
    data = encode_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    h = parse_batch(data)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == (pid, epoch, seq, len(records))
    assert list(decode_records(data)) == records


@given(records_st, st.data())
def test_any_flipped_byte_is_detected(records, data):
    raw = bytearray(encode_batch(records))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(BrokerError) as exc:
        parse_batch(bytes(raw))
    assert exc.value.error_code is ErrorCode.CORRUPT_MESSAGE


def test_truncated_batch_and_record_count_lies_are_rejected():
    good = encode_batch([Record(b"a"), Record(b"b")])
    for cut in (10, len(good) - 1):
        with pytest.raises(BrokerError):
            parse_batch(good[:cut])


def test_last_sequence_wraps_at_int32_max():
    h = parse_batch(
        encode_batch([Record(b"a"), Record(b"b")], producer_id=1, producer_epoch=0, base_sequence=2**31 - 1)
    )
    assert h.last_sequence == 0


def test_control_batch_carries_marker_type():
    data = encode_control_batch(ControlType.ABORT, producer_id=5, producer_epoch=1, coordinator_epoch=3, timestamp=9)
    h = parse_batch(data)
    assert h.is_control and h.is_transactional
    assert control_type_of(data) is ControlType.ABORT


def test_produce_request_round_trip_and_garbage():
    req = ProduceRequest(
        (ProducePartition("t", 0, encode_batch([Record(b"x")])), ProducePartition("u", 3, b"abc")),
        acks=0,
        timeout_ms=5,
        transactional_id="tx",
    )
    assert decode_produce_request(encode_produce_request(req)) == req
    for junk in (b"", b"TXP1", b"nope" * 10, encode_produce_request(req)[:-1], encode_produce_request(req) + b"x"):
        with pytest.raises(BrokerError) as exc:
            decode_produce_request(junk)
        assert exc.value.error_code is ErrorCode.INVALID_REQUEST


def test_fetch_batches_round_trip():
    b = encode_batch([Record(b"x"), Record(b"y")])
    raw = encode_fetch_batches(10, 8, 0, [(3, 77, b)], [(5, 1)])
    out = decode_fetch_batches(raw)
    assert (out.high_watermark, out.last_stable_offset, out.log_start_offset) == (10, 8, 0)
    assert out.batches[0].base_offset == 3 and out.batches[0].last_offset == 4
    assert out.aborted_transactions == ((5, 1),)


def test_murmur2_matches_kafka_utils_test_vectors():
    # Kafka's UtilsTest.testMurmur2
    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for key, expected in cases.items():
        assert murmur2(key) == expected
    assert all(0 <= partition_for_key(k, 7) < 7 for k in cases)


def test_error_codes_have_unique_numbers_and_http_statuses():
    seen = {}
    for e in ErrorCode:
        assert 200 <= e.http_status < 600
        assert seen.setdefault(e.code, e) is e
    assert ErrorCode.INVALID_TOPIC_EXCEPTION is ErrorCode.INVALID_TOPIC
