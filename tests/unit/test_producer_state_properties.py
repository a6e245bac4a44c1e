"""Property test: PartitionLog's producer-state decisions equal a simple model's.

The model restates kafka_txn.md §3.1 rules 1-5 and 9 as plainly as possible;
hypothesis drives random appends (random pids, epochs, next/duplicate/random
sequences, counts that reach the 2**31-1 wrap), DeleteRecords, producer
expiration and reopen, and every answer (accept, duplicate with its offsets,
error code) must match.
"""

from __future__ import annotations

import pathlib
import struct
import tempfile
from dataclasses import dataclass, field

import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.protocol import BrokerError, ErrorCode, Record, encode_batch
from storage.commands import (
    AppendResult,
    encode_append,
    encode_delete_records,
    encode_retention,
)
from storage.partition_log import PartitionLog
from storage.store import NodeStore

WRAP = 2**31
PREFIX = b"P\x00\x00\x00\x09\x00\x00\x00\x01"


def make_batch(pid: int, epoch: int, seq: int, count: int) -> bytes:
    buf = bytearray(encode_batch([Record(value=b"x")], producer_id=pid, producer_epoch=epoch, base_sequence=seq))
    struct.pack_into(">i", buf, 20, count)
    struct.pack_into(">I", buf, 1, crc32c.crc32c(bytes(buf[5:])))
    return bytes(buf)


@dataclass
class ModelEntry:
    epoch: int
    batches: list[tuple[int, int, int, int, int]]  # first, last, base, last_offset, append time
    last_ts: int


@dataclass
class Model:
    hw: int = 0
    log_start: int = 0
    expired: int = 0
    producers: dict[int, ModelEntry] = field(default_factory=dict)

    def append(self, pid: int, epoch: int, seq: int, count: int, ts: int) -> object:
        if pid == -1:
            base = self.hw
            self.hw += count
            return ("ok", base, base + count - 1, ts, False)
        last = (seq + count - 1) % WRAP
        entry = self.producers.get(pid)
        if entry is not None and entry.epoch == epoch:
            for first_seq, last_seq, base, last_off, t in entry.batches:
                if (first_seq, last_seq) == (seq, last):
                    return ("ok", base, last_off, t, True)
        if entry is None:
            if seq != 0:
                lost = self.log_start > 0 or self.expired > 0
                return ErrorCode.UNKNOWN_PRODUCER_ID if lost else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        elif epoch < entry.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        elif epoch > entry.epoch:
            if seq != 0:
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        else:
            if seq != (entry.batches[-1][1] + 1) % WRAP:
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        base = self.hw
        self.hw += count
        meta = (seq, last, base, base + count - 1, ts)
        if entry is None or entry.epoch != epoch:
            self.producers[pid] = ModelEntry(epoch, [meta], ts)
        else:
            entry.batches = [*entry.batches, meta][-5:]
            entry.last_ts = ts
        return ("ok", base, base + count - 1, ts, False)

    def next_seq(self, pid: int, epoch: int) -> int:
        entry = self.producers.get(pid)
        if entry is None or entry.epoch != epoch:
            return 0
        return (entry.batches[-1][1] + 1) % WRAP


def observed(result: object) -> object:
    if isinstance(result, AppendResult):
        return ("ok", result.base_offset, result.last_offset, result.log_append_time, result.duplicate)
    assert isinstance(result, BrokerError), result
    return result.error_code


def assert_same_state(log: PartitionLog, model: Model) -> None:
    assert log.high_watermark == model.hw
    assert log.log_start_offset == model.log_start
    assert {e.producer_id for e in log.producer_entries()} == set(model.producers)
    for pid, m in model.producers.items():
        entry = log.producer_entry(pid)
        assert entry is not None
        assert entry.producer_epoch == m.epoch
        assert entry.last_timestamp == m.last_ts
        assert [
            (b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.log_append_time) for b in entry.batches
        ] == m.batches


PIDS = st.sampled_from([-1, 1, 2, 3])
# "fill": run the sequence up to 2**31-1 so that the next batch must wrap to 0.
COUNTS = st.sampled_from([1, 1, 2, 3, 2**30, "fill"])


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_producer_state_matches_model(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp)
        store = NodeStore(path)
        log = PartitionLog(store, PREFIX, "prop-0")
        model = Model()
        index = 0
        now = 0
        try:
            for _step in range(data.draw(st.integers(1, 40), label="steps")):
                index += 1
                now += 10
                op = data.draw(st.sampled_from(["append"] * 8 + ["delete", "expire", "reopen"]), label="op")
                if op == "append":
                    pid = data.draw(PIDS, label="pid")
                    entry = model.producers.get(pid)
                    epoch = data.draw(st.integers(0, 2), label="epoch")
                    how = data.draw(st.sampled_from(["next", "next", "dup", "any"]), label="seq")
                    drawn = data.draw(COUNTS, label="count")
                    count = 1
                    if pid == -1:
                        epoch, seq = -1, -1
                    elif how == "next":
                        seq = model.next_seq(pid, epoch)
                    elif how == "dup" and entry is not None:
                        first, last, *_ = data.draw(st.sampled_from(entry.batches), label="dup")
                        epoch = data.draw(st.sampled_from([entry.epoch, epoch]), label="dup epoch")
                        seq, count = first, (last - first) % WRAP + 1
                    else:
                        seq = data.draw(st.sampled_from([0, 1, 2, 5, WRAP - 1]), label="any")
                    if how != "dup" or entry is None:
                        count = min(WRAP - max(seq, 0), WRAP - 1) if drawn == "fill" else int(drawn)
                    result = log.apply(index, encode_append(make_batch(pid, epoch, seq, count), now))
                    assert observed(result) == model.append(pid, epoch, seq, count, now)
                elif op == "delete":
                    target = data.draw(st.integers(model.log_start, model.hw), label="before")
                    log.apply(index, encode_delete_records(target))
                    model.log_start = max(model.log_start, target)
                elif op == "expire":
                    expiration = data.draw(st.sampled_from([-1, 0, 15, 40]), label="expiration")
                    log.apply(index, encode_retention(now, -1, -1, expiration))
                    if expiration >= 0:
                        gone = [p for p, e in model.producers.items() if now - e.last_ts > expiration]
                        for p in gone:
                            del model.producers[p]
                        model.expired += len(gone)
                else:
                    store.close()
                    store = NodeStore(path)
                    log = PartitionLog(store, PREFIX, "prop-0")
                    assert log.last_applied == index - 1
                    log.apply(index, b"\x00")
                assert log.last_applied == index
                assert_same_state(log, model)
        finally:
            store.close()
