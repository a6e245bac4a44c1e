"""read_committed filtering (kafka_txn.md §7.4, seed 000) against hand cases and a model."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from clients.protocol import (
    ControlType,
    Record,
    StoredBatch,
    encode_batch,
    encode_control_batch,
    parse_batch,
)
from clients.txn_filter import visible_batches, visible_records


class LogBuilder:
    """Builds a partition's batches with offsets, as the broker would store them."""

    def __init__(self) -> None:
        self.batches: list[StoredBatch] = []
        self.next_offset = 0

    def _add(self, data: bytes) -> StoredBatch:
        batch = StoredBatch(self.next_offset, 0, data, parse_batch(data))
        self.batches.append(batch)
        self.next_offset = batch.last_offset + 1
        return batch

    def data(self, pid: int = -1, *, txn: bool = False, records: int = 1, tag: str = "") -> StoredBatch:
        values = [Record(value=f"{tag}{self.next_offset + i}".encode()) for i in range(records)]
        if pid < 0:
            return self._add(encode_batch(values))
        return self._add(encode_batch(values, producer_id=pid, producer_epoch=0, base_sequence=0, transactional=txn))

    def marker(self, pid: int, ctype: ControlType) -> StoredBatch:
        return self._add(
            encode_control_batch(ctype, producer_id=pid, producer_epoch=1, coordinator_epoch=0, timestamp=0)
        )


def offsets(batches: list[StoredBatch]) -> list[int]:
    return [b.base_offset for b in batches]


# -- hand cases ------------------------------------------------------------------------


def test_interleaved_abort_hides_only_the_aborted_producer() -> None:
    # kafka_txn.md §14 item 17: A writes x1, B writes y1, y2, A writes x2, B aborts,
    # A commits -> only x1 and x2 remain, at their original offsets.
    log = LogBuilder()
    x1 = log.data(1, txn=True)
    log.data(2, txn=True)
    log.data(2, txn=True)
    x2 = log.data(1, txn=True)
    log.marker(2, ControlType.ABORT)
    log.marker(1, ControlType.COMMIT)
    assert offsets(list(visible_batches(log.batches, [(2, 1)]))) == [x1.base_offset, x2.base_offset] == [0, 3]


def test_control_batches_are_never_returned() -> None:
    log = LogBuilder()
    log.data(1, txn=True)
    log.marker(1, ControlType.COMMIT)
    plain = log.data()
    assert offsets(list(visible_batches(log.batches, []))) == [0, plain.base_offset]


def test_non_transactional_batches_are_always_delivered() -> None:
    # §7.4: plain and idempotent (non-transactional) batches inside an aborted range stay visible.
    log = LogBuilder()
    log.data(1, txn=True)
    plain = log.data()
    idem = log.data(7)
    log.marker(1, ControlType.ABORT)
    assert offsets(list(visible_batches(log.batches, [(1, 0)]))) == [plain.base_offset, idem.base_offset]


def test_abort_marker_ends_the_aborted_range_so_a_later_committed_txn_is_visible() -> None:
    log = LogBuilder()
    log.data(1, txn=True)
    log.marker(1, ControlType.ABORT)
    later = log.data(1, txn=True)
    log.marker(1, ControlType.COMMIT)
    assert offsets(list(visible_batches(log.batches, [(1, 0)]))) == [later.base_offset]


def test_two_aborted_txns_of_one_producer_around_a_committed_one() -> None:
    log = LogBuilder()
    log.data(1, txn=True)  # 0: aborted
    log.marker(1, ControlType.ABORT)  # 1
    kept = log.data(1, txn=True)  # 2: committed
    log.marker(1, ControlType.COMMIT)  # 3
    log.data(1, txn=True)  # 4: aborted
    log.marker(1, ControlType.ABORT)  # 5
    assert offsets(list(visible_batches(log.batches, [(1, 4), (1, 0)]))) == [kept.base_offset]


def test_fetch_starting_inside_an_aborted_txn() -> None:
    # The aborted txn began before the fetched range: its first offset is below every batch.
    log = LogBuilder()
    log.data(1, txn=True)
    log.data(1, txn=True)
    log.marker(1, ControlType.ABORT)
    tail = log.data()
    fetched = log.batches[1:]
    assert offsets(list(visible_batches(fetched, [(1, 0)]))) == [tail.base_offset]


def test_records_before_the_fetch_offset_are_dropped() -> None:
    log = LogBuilder()
    log.data(records=3)
    log.data(records=2)
    got = [off for off, _r in visible_records(log.batches, [], from_offset=1)]
    assert got == [1, 2, 3, 4]


def test_visible_records_carry_their_own_offsets() -> None:
    log = LogBuilder()
    log.data(1, txn=True, records=2, tag="a")
    log.data(2, txn=True, records=2, tag="b")
    log.marker(1, ControlType.ABORT)
    log.marker(2, ControlType.COMMIT)
    assert [(off, r.value) for off, r in visible_records(log.batches, [(1, 0)])] == [(2, b"b2"), (3, b"b3")]


# -- model check -----------------------------------------------------------------------


@dataclass
class Scenario:
    """A partition log with the broker's aborted index and what read_committed must show."""

    log: LogBuilder = field(default_factory=LogBuilder)
    aborted: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, first, marker offset)
    lso: int = 0
    txn_of: dict[int, int] = field(default_factory=dict)  # batch base offset -> txn id
    committed: set[int] = field(default_factory=set)

    def expected(self, from_offset: int) -> list[int]:
        out: list[int] = []
        for b in self.log.batches:
            if b.base_offset >= self.lso or b.header.is_control:
                continue
            txn = self.txn_of.get(b.base_offset)
            if txn is None or txn in self.committed:
                out.extend(o for o in range(b.base_offset, b.last_offset + 1) if o >= from_offset)
        return out

    def aborted_for(self, fetch_offset: int, upper: int) -> list[tuple[int, int]]:
        """Kafka's collectAbortedTxns over the index (kafka_txn.md §7.3)."""
        return [(pid, first) for pid, first, last in self.aborted if last >= fetch_offset and first < upper]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("txn"), st.integers(1, 3), st.integers(1, 3)),
        st.tuples(st.just("plain"), st.integers(-1, -1), st.integers(1, 3)),
        st.tuples(st.just("idempotent"), st.integers(10, 11), st.integers(1, 3)),
        st.tuples(st.sampled_from(["commit", "abort"]), st.integers(1, 3), st.just(0)),
    ),
    max_size=40,
)


def build(ops: list[tuple[str, int, int]]) -> Scenario:
    sc = Scenario()
    open_txn: dict[int, tuple[int, int]] = {}  # pid -> (txn id, first offset)
    for n, (kind, pid, records) in enumerate(ops):
        if kind == "txn":
            txn_id, first = open_txn.setdefault(pid, (n, sc.log.next_offset))
            sc.txn_of[sc.log.data(pid, txn=True, records=records).base_offset] = txn_id
        elif kind in ("plain", "idempotent"):
            sc.log.data(pid, records=records)
        elif pid in open_txn:  # a marker only lands where the producer has an open txn
            txn_id, first = open_txn.pop(pid)
            marker = sc.log.marker(pid, ControlType.COMMIT if kind == "commit" else ControlType.ABORT)
            if kind == "commit":
                sc.committed.add(txn_id)
            else:
                sc.aborted.append((pid, first, marker.base_offset))
    sc.lso = min((first for _t, first in open_txn.values()), default=sc.log.next_offset)
    return sc


@settings(max_examples=300, deadline=None)
@given(ops=OPS, cuts=st.lists(st.integers(0, 60), max_size=5), start_shift=st.integers(0, 2))
def test_filter_matches_the_model_over_any_split_into_fetches(
    ops: list[tuple[str, int, int]], cuts: list[int], start_shift: int
) -> None:
    sc = build(ops)
    stable = [b for b in sc.log.batches if b.base_offset < sc.lso]
    # A consumer starts at some offset inside the first batch and fetches the stable
    # log in chunks of whole batches, as the broker answers them.
    fetch_offset = (
        stable[0].base_offset + min(start_shift, stable[0].last_offset - stable[0].base_offset) if stable else 0
    )
    bounds = sorted({0, len(stable), *(c for c in cuts if c < len(stable))})
    got: list[int] = []
    position = fetch_offset
    for lo, hi in itertools.pairwise(bounds):
        chunk = stable[lo:hi]
        upper = chunk[-1].last_offset + 1
        aborted = sc.aborted_for(position, upper)
        got.extend(off for off, _r in visible_records(chunk, aborted, from_offset=position))
        position = upper
    assert got == sc.expected(fetch_offset)
