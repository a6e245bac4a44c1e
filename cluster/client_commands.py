"""``txbroker produce`` and ``txbroker consume``: the Python clients behind a console interface.

``produce`` sends one record per stdin line through the idempotent
``Producer`` (so a retried request never writes a line twice) and exits
non-zero if any record was not acknowledged. ``consume`` assigns itself the
topic's partitions (or one of them) and prints records as raw bytes, one per
line, like Kafka's console tools.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import Future
from typing import Any, BinaryIO, TextIO

from clients.protocol import BrokerError, ErrorCode

from .client_config import client_options

PROGRESS_EVERY_S = 2.0
PROGRESS_MIN_RECORDS = 10_000
DEFAULT_IDLE_MS = 2000


class ProduceTally:
    """Outcome counts of the records sent, updated from the producer's I/O thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked = 0
        self.failed = 0
        self.first_error: BaseException | None = None

    def on_done(self, fut: Future[Any]) -> None:
        exc = fut.exception()
        with self.lock:
            if exc is None:
                self.acked += 1
            else:
                self.failed += 1
                self.first_error = self.first_error or exc

    def reject(self, exc: BaseException) -> None:
        with self.lock:
            self.failed += 1
            self.first_error = self.first_error or exc


def _progress(err: TextIO, text: str, *, final: bool = False) -> None:
    if err.isatty():
        err.write("\r" + text + ("\n" if final else ""))
    else:
        err.write(text + "\n")
    err.flush()


def _check_partition(topic: str, partition: int | None, count: int) -> None:
    if partition is not None and not 0 <= partition < count:
        raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")


def produce(args: argparse.Namespace, stdin: BinaryIO, err: TextIO) -> int:
    from clients.admin import Admin
    from clients.producer import Producer

    # Fail fast on a missing topic: the producer would wait max_block_ms for it to appear.
    _check_partition(
        args.topic,
        args.partition,
        len(Admin(args.bootstrap, **client_options(args)).describe_topic(args.topic)["partitions"]),
    )
    tally = ProduceTally()
    sent = 0
    started = last_report = time.monotonic()
    producer = Producer(bootstrap=args.bootstrap, **client_options(args))
    try:
        for lineno, raw in enumerate(stdin, 1):
            line = raw[:-1] if raw.endswith(b"\n") else raw
            key: bytes | None = None
            if args.keyed:
                key, tab, line = line.partition(b"\t")
                if not tab:
                    msg = f"line {lineno} has no key<TAB>value separator"
                    tally.reject(BrokerError(ErrorCode.INVALID_REQUEST, msg))
                    continue
            # send() blocks while the producer's buffer_memory is used up, which bounds memory on huge inputs
            fut = producer.send(args.topic, value=line, key=key, partition=args.partition)
            fut.add_done_callback(tally.on_done)
            sent += 1
            now = time.monotonic()
            if sent >= PROGRESS_MIN_RECORDS and now - last_report >= PROGRESS_EVERY_S:
                last_report = now
                _progress(err, f"{sent} records sent, {tally.acked} acknowledged, {tally.failed} failed")
        producer.flush()
    finally:
        producer.close()
    elapsed = max(time.monotonic() - started, 1e-9)
    rate = tally.acked / elapsed
    summary = f"produced {tally.acked} records to {args.topic} in {elapsed:.1f}s ({rate:.0f} records/s)"
    _progress(err, summary, final=True)
    if tally.failed:
        err.write(f"error: {tally.failed} records failed; first error: {tally.first_error}\n")
        return 1
    return 0


def _idle_timeout_ms(args: argparse.Namespace) -> float | None:
    """How long without a record before ``consume`` exits: --timeout-ms, else forever with --max/--follow."""
    if args.timeout_ms is not None:
        return float(args.timeout_ms)
    if args.follow or args.max is not None:
        return None
    return DEFAULT_IDLE_MS


def consume(args: argparse.Namespace, out: BinaryIO, err: TextIO) -> int:
    from clients.consumer import Consumer

    if args.max is not None and args.max < 1:
        raise BrokerError(ErrorCode.INVALID_REQUEST, "--max must be positive")
    idle_ms = _idle_timeout_ms(args)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    printed = 0
    consumer = Consumer(
        args.bootstrap,
        isolation_level=args.isolation,
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        read_replica=args.read_replica,
        **client_options(args),
    )
    try:
        partitions = sorted(consumer.partitions_for_topic(args.topic))
        _check_partition(args.topic, args.partition, len(partitions))
        if args.partition is not None:
            partitions = [args.partition]
        consumer.assign([(args.topic, p) for p in partitions])
        last_record = time.monotonic()
        while args.max is None or printed < args.max:
            now = time.monotonic()
            waits = [500.0]
            if idle_ms is not None:
                waits.append(idle_ms - (now - last_record) * 1000)
            if deadline is not None:
                waits.append((deadline - now) * 1000)
            wait = min(waits)
            if wait <= 0:
                break
            limit = None if args.max is None else args.max - printed
            records = consumer.poll(timeout_ms=wait, max_records=limit)
            for r in records:
                if args.print_key:
                    out.write((r.key or b"") + b"\t")
                out.write((r.value or b"") + b"\n")
            out.flush()
            if records:
                printed += len(records)
                last_record = time.monotonic()
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
        err.write(f"consumed {printed} records from {args.topic}\n")
    return 0
