"""``clients._fetch_decode``: which records of a fetch a consumer delivers and where it fetches next."""

from __future__ import annotations

import pytest

from clients._fetch_decode import decode_fetch
from clients.protocol import (
    BrokerError,
    ControlType,
    ErrorCode,
    FetchBatches,
    Record,
    StoredBatch,
    encode_batch,
    encode_control_batch,
    parse_batch,
)


class Log:
    def __init__(self) -> None:
        self.batches: list[StoredBatch] = []
        self.next = 0

    def add(self, data: bytes) -> Log:
        b = StoredBatch(self.next, 0, data, parse_batch(data))
        self.batches.append(b)
        self.next = b.last_offset + 1
        return self

    def data(self, n: int, pid: int = -1, txn: bool = False) -> Log:
        recs = [Record(value=f"v{self.next + i}".encode(), key=b"k", timestamp=7) for i in range(n)]
        if pid < 0:
            return self.add(encode_batch(recs))
        return self.add(encode_batch(recs, producer_id=pid, producer_epoch=0, base_sequence=0, transactional=txn))

    def marker(self, pid: int, ctype: ControlType) -> Log:
        marker = encode_control_batch(ctype, producer_id=pid, producer_epoch=0, coordinator_epoch=0, timestamp=0)
        return self.add(marker)

    def fetch(self, *, lso: int | None = None, aborted: tuple[tuple[int, int], ...] = ()) -> FetchBatches:
        return FetchBatches(self.next, self.next if lso is None else lso, 0, tuple(self.batches), aborted)


def offsets(f: FetchBatches, fetch_offset: int, isolation: str = "read_uncommitted") -> tuple[list[int], int]:
    d = decode_fetch("t", 0, fetch_offset, f, isolation)
    return [r.offset for r in d.records], d.next_offset


def test_records_below_the_fetch_offset_in_the_first_batch_are_dropped():
    f = Log().data(5).data(5).fetch()
    assert offsets(f, 3) == ([3, 4, 5, 6, 7, 8, 9], 10)
    assert offsets(f, 7) == ([7, 8, 9], 10)


def test_record_fields_are_carried_over():
    d = decode_fetch("t", 2, 0, Log().data(2).fetch(), "read_uncommitted")
    assert [(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp) for r in d.records] == [
        ("t", 2, 0, b"k", b"v0", 7),
        ("t", 2, 1, b"k", b"v1", 7),
    ]
    assert d.size_bytes == sum(len(b.data) for b in Log().data(2).batches)


def test_control_batches_are_skipped_but_the_next_offset_moves_past_them():
    f = Log().data(2, pid=1, txn=True).marker(1, ControlType.COMMIT).fetch()
    assert offsets(f, 0) == ([0, 1], 3)
    only_marker = FetchBatches(3, 3, 0, (f.batches[1],), ())
    assert offsets(only_marker, 2) == ([], 3)


def test_an_empty_fetch_stays_at_the_fetch_offset():
    assert offsets(Log().fetch(), 0) == ([], 0)


def test_read_committed_stops_at_the_last_stable_offset():
    f = Log().data(3).data(3, pid=4, txn=True).fetch(lso=3)
    assert offsets(f, 0, "read_committed") == ([0, 1, 2], 3)
    assert offsets(f, 0, "read_uncommitted") == ([0, 1, 2, 3, 4, 5], 6)


def test_read_committed_drops_aborted_transactions_read_uncommitted_keeps_them():
    f = Log().data(2, pid=9, txn=True).marker(9, ControlType.ABORT).data(1).fetch(aborted=((9, 0),))
    assert offsets(f, 0, "read_committed") == ([3], 4)
    assert offsets(f, 0, "read_uncommitted") == ([0, 1, 3], 4)


def test_a_failing_deserializer_keeps_the_records_before_it_and_stops_at_its_offset():
    def value(b: bytes | None) -> str:
        if b == b"v3":
            raise ValueError("bad")
        return (b or b"").decode()

    d = decode_fetch("t", 0, 1, Log().data(5).fetch(), "read_uncommitted", value_deserializer=value)
    assert [r.value for r in d.records] == ["v1", "v2"]
    assert d.next_offset == 3
    assert isinstance(d.error, BrokerError)
    assert d.error.error_code is ErrorCode.CORRUPT_MESSAGE
    assert d.error.extra["offset"] == 3


@pytest.mark.parametrize("fetch_offset", [0, 4, 9])
def test_key_and_value_deserializers_apply_to_every_delivered_record(fetch_offset):
    d = decode_fetch(
        "t", 0, fetch_offset, Log().data(10).fetch(), "read_uncommitted",
        key_deserializer=lambda b: (b or b"").upper(), value_deserializer=len,
    )  # fmt: skip
    assert [(r.key, r.value) for r in d.records] == [(b"K", len(f"v{i}")) for i in range(fetch_offset, 10)]
