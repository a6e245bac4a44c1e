"""Apply throughput of ``PartitionLog`` versus raw rocksdict puts of the same bytes.

``python -m bench.storage_apply [--payload-bytes N] [--count N]`` prints both rates
in MB/s. ``txbroker bench produce`` imports ``raw_put_rate`` and ``apply_rate``.

The batches are built (and their CRCs computed) before timing starts; the
apply timing covers decoding the command, the header CRC check, the producer
state rules, building the WriteBatch and writing it (no RocksDB WAL, as the node writes; the raw puts use
RocksDB's default write options).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile
import time

from clients.protocol import Record, encode_batch
from storage.commands import encode_append
from storage.partition_log import PartitionLog
from storage.store import NodeStore

__all__ = ["apply_rate", "raw_put_rate"]

_RECORD_BYTES = 1024


def _batch(payload_bytes: int, producer_id: int, seq: int) -> bytes:
    n = max(1, payload_bytes // _RECORD_BYTES)
    value = os.urandom(max(1, payload_bytes // n - 26))  # 26 bytes of record framing
    return encode_batch(
        [Record(value=value, timestamp=1_700_000_000_000)] * n,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=seq,
    )


def raw_put_rate(path: pathlib.Path | str, payload_bytes: int, count: int) -> float:
    """MB/s of ``count`` rocksdict puts of a ``payload_bytes`` value (distinct keys)."""
    store = NodeStore(pathlib.Path(path))
    try:
        value = _batch(payload_bytes, 1, 0)
        keys = [b"R" + i.to_bytes(8, "big") for i in range(count)]
        db = store.db
        start = time.perf_counter()
        for key in keys:
            db.put(key, value)
        elapsed = time.perf_counter() - start
    finally:
        store.close()
    return len(value) * count / elapsed / 1e6


def apply_rate(path: pathlib.Path | str, payload_bytes: int, count: int) -> float:
    """MB/s (batch bytes) of ``count`` ``PartitionLog.apply`` calls of idempotent batches."""
    store = NodeStore(pathlib.Path(path))
    try:
        log = PartitionLog(store, b"B\x00\x00\x00\x01\x00\x00\x00\x00", "bench-0")
        commands = []
        seq = 0
        for _ in range(count):
            batch = _batch(payload_bytes, 42, seq)
            seq += max(1, payload_bytes // _RECORD_BYTES)
            commands.append(encode_append(batch, 1_700_000_000_000))
        total = sum(len(c) - 9 for c in commands)
        start = time.perf_counter()
        for index, command in enumerate(commands, start=1):
            log.apply(index, command)
        elapsed = time.perf_counter() - start
        if log.last_applied != count:
            raise RuntimeError("bench: not every command applied")
    finally:
        store.close()
    return total / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--payload-bytes", type=int, default=64 * 1024)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    raw_rates, apply_rates = [], []
    # Alternate the two for a few rounds and report medians: a shared machine is noisy.
    for _round in range(args.rounds):
        with tempfile.TemporaryDirectory() as raw_dir, tempfile.TemporaryDirectory() as apply_dir:
            raw_rates.append(raw_put_rate(raw_dir, args.payload_bytes, args.count))
            apply_rates.append(apply_rate(apply_dir, args.payload_bytes, args.count))
    raw, applied = statistics.median(raw_rates), statistics.median(apply_rates)
    print(f"payload {args.payload_bytes} B x {args.count}, median of {args.rounds} rounds")
    print(f"raw rocksdict put:  {raw:8.1f} MB/s  {[round(r) for r in raw_rates]}")
    print(f"PartitionLog.apply: {applied:8.1f} MB/s  {[round(r) for r in apply_rates]}  ({applied / raw:.0%} of raw)")


if __name__ == "__main__":
    main()
