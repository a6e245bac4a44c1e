"""CPU cost of Kafka record batches as a stored format (``storage.kafka_batch``), in µs per record.

``python -m bench.kafka_batches [--records 100] [--record-bytes 1024] [--rounds 7] [--json]``

One batch of ``records`` records of ``record-bytes`` each (hex text: zstd
halves it), built by kafka-python's builder as a Kafka producer would, then
timed, each operation repeated for ``rounds`` rounds of about 0.2 s (the
median round is reported):

* ``parse_verify_*``: what the partition leader does with an incoming batch
  (``parse_kafka_batch(verify=True)``: CRC-32C, header, decompression and every
  record decoded), uncompressed and zstd;
* ``parse_header``: what apply and every read do (``verify=False``);
* ``kafka_to_txbroker_*``: an HTTP binary fetch of a Kafka producer's batch;
* ``txbroker_to_kafka``: a Kafka Fetch of a batch written through HTTP,
  built anew, and ``txbroker_to_kafka_cached`` once the conversion cache
  holds it;
* ``kafka_to_kafka``: a Kafka Fetch of a Kafka producer's batch (``baseOffset``
  patched, nothing decoded);
* ``txbroker_parse_verify``: the same records as a txbroker batch, through
  ``parse_batch(verify=True)``, and ``txbroker_encode`` (``encode_batch`` of
  decoded records), for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder

from clients.protocol import BatchFormat, StoredBatch, encode_batch, parse_batch
from storage.kafka_batch import (
    ConversionCache,
    kafka_records,
    kafka_to_txbroker,
    parse_kafka_batch,
    stored_to_kafka,
    txbroker_to_kafka,
)

__all__ = ["measure"]

_ZSTD = 4
_TS = 1_700_000_000_000


def _kafka_batch(records: int, record_bytes: int, codec: int) -> bytes:
    builder: Any = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=1, producer_epoch=0,
        base_sequence=0, batch_size=2**30,
    )  # fmt: skip
    for i in range(records):
        value = os.urandom(record_bytes // 2).hex().encode()
        builder.append(i, _TS + i, f"key-{i}".encode(), value, [])
    return bytes(builder.build())


def _per_record_us(op: Callable[[], object], records: int, rounds: int) -> float:
    """Median over ``rounds`` rounds of ~0.2 s each of ``op``'s time, per record, in µs."""
    start = time.perf_counter()
    op()
    once = max(time.perf_counter() - start, 1e-6)
    n = max(1, int(0.2 / once))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            op()
        samples.append((time.perf_counter() - start) / n / records * 1e6)
    return statistics.median(samples)


def _copy(batch: StoredBatch) -> StoredBatch:
    return StoredBatch(batch.base_offset, batch.log_append_time, bytes(bytearray(batch.data)), batch.header,
                       batch.format)  # fmt: skip


def measure(records: int = 100, record_bytes: int = 1024, rounds: int = 7) -> dict[str, Any]:
    plain = _kafka_batch(records, record_bytes, 0)
    zstd = _kafka_batch(records, record_bytes, _ZSTD)
    txb = kafka_to_txbroker(plain)
    stored_kafka = StoredBatch(1000, _TS, zstd, parse_kafka_batch(zstd), BatchFormat.KAFKA)
    stored_txb = StoredBatch(1000, _TS, txb, parse_batch(txb), BatchFormat.TXBROKER)
    decoded = kafka_records(plain)
    cache = ConversionCache(64 << 20)
    cache.get(stored_txb, txbroker_to_kafka)
    ops: dict[str, Callable[[], object]] = {
        "parse_verify_uncompressed": lambda: parse_kafka_batch(plain),
        "parse_verify_zstd": lambda: parse_kafka_batch(zstd),
        "parse_header": lambda: parse_kafka_batch(zstd, verify=False),
        "kafka_records_zstd": lambda: kafka_records(zstd),
        "kafka_to_txbroker_uncompressed": lambda: kafka_to_txbroker(plain),
        "kafka_to_txbroker_zstd": lambda: kafka_to_txbroker(zstd),
        "txbroker_to_kafka": lambda: txbroker_to_kafka(stored_txb),
        # A read brings new bytes objects from RocksDB each time: the copy is part of the cost.
        "txbroker_to_kafka_cached": lambda: cache.get(_copy(stored_txb), txbroker_to_kafka),
        "kafka_to_kafka": lambda: stored_to_kafka(stored_kafka),
        "txbroker_parse_verify": lambda: parse_batch(txb),
        "txbroker_encode": lambda: encode_batch(decoded),
    }
    return {
        "records_per_batch": records,
        "record_bytes": record_bytes,
        "batch_bytes": {"uncompressed": len(plain), "zstd": len(zstd), "txbroker": len(txb)},
        "us_per_record": {name: round(_per_record_us(op, records, rounds), 3) for name, op in ops.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100)
    ap.add_argument("--record-bytes", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = measure(args.records, args.record_bytes, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.records} records of {args.record_bytes} B per batch; sizes {result['batch_bytes']}")
    for name, us in result["us_per_record"].items():
        print(f"  {name:32s} {us:8.2f} µs/record")


if __name__ == "__main__":
    main()
