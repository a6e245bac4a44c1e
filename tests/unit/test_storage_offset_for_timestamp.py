"""ListOffsets by timestamp on a partition log: the first offset whose record timestamp is >= the target."""

from __future__ import annotations

import pytest

from clients.protocol import ControlType, Record, encode_batch
from storage.commands import encode_append, encode_delete_records, encode_txn_marker
from storage.partition_log import PartitionLog
from storage.store import NodeStore

PREFIX = b"P\x00\x00\x00\x07\x00\x00\x00\x00"


def append(log: PartitionLog, timestamps: list[int], *, pid: int = -1, epoch: int = -1, seq: int = -1,
           transactional: bool = False) -> None:  # fmt: skip
    batch = encode_batch([Record(value=b"v", timestamp=t) for t in timestamps], producer_id=pid,
                         producer_epoch=epoch, base_sequence=seq, transactional=transactional)  # fmt: skip
    log.apply(log.last_applied + 1, encode_append(batch, 99))


@pytest.fixture
def log(store: NodeStore) -> PartitionLog:
    """Offsets 0-2 at 100, 200, 300; 3-5 at 400, 350, 600 (not ordered inside the batch); 6 at 700."""
    plog = PartitionLog(store, PREFIX, "t-0")
    append(plog, [100, 200, 300])
    append(plog, [400, 350, 600])
    append(plog, [700])
    return plog


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (0, 0),  # older than everything: the log start
        (100, 0),  # equal counts
        (101, 1),
        (300, 2),
        (301, 3),  # the next batch's first record (400) is the first >= 301
        (360, 3),
        (500, 5),  # inside a batch, past an older record
        (700, 6),
        (701, None),  # nothing that new
    ],
)
def test_first_offset_at_or_after_the_timestamp(log: PartitionLog, target: int, expected: int | None) -> None:
    assert log.offset_for_timestamp(target) == expected


def test_the_answer_is_never_below_the_log_start(log: PartitionLog) -> None:
    log.apply(log.last_applied + 1, encode_delete_records(4))  # inside the second batch
    assert log.log_start_offset == 4
    assert log.offset_for_timestamp(0) == 4
    assert log.offset_for_timestamp(340) == 4  # offset 3 (400) is below the log start; 4 holds 350
    assert log.offset_for_timestamp(360) == 5


def test_control_batches_are_skipped(store: NodeStore) -> None:
    plog = PartitionLog(store, PREFIX, "t-0")
    append(plog, [100, 200], pid=7, epoch=0, seq=0, transactional=True)
    plog.apply(plog.last_applied + 1, encode_txn_marker(7, 1, 0, ControlType.COMMIT, 5000))  # TV2: epoch + 1
    append(plog, [300])
    assert plog.high_watermark == 4
    assert plog.offset_for_timestamp(250) == 3  # the marker (offset 2) has no records of the partition
    assert plog.offset_for_timestamp(301) is None


def test_an_empty_log_has_no_offset(store: NodeStore) -> None:
    assert PartitionLog(store, PREFIX, "t-0").offset_for_timestamp(0) is None
