"""The workload's writers: transactional producers and idempotent producers, one thread each.

Every client error becomes an outcome in the history, never an exception out of the thread:
``fail`` when the write definitely did not happen, ``info`` when it may have. A producer that
can no longer be used (fenced, or a transaction end whose outcome stayed unknown) is closed and a
new one takes its place under the same transactional id, which fences the old one.

Values name their writer and sequence: ``t3-17-0`` is record 0 of transaction 17 of transactional
producer 3, ``i2-455`` the 455th record of idempotent producer 2.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clients.producer import Producer
from clients.protocol import BrokerError, ErrorCode
from clients.records import RecordMetadata

from .history import HistoryWriter

__all__ = ["IdempotentWriter", "TxnWriter", "WriterConfig", "send_outcome"]

log = logging.getLogger("verify.writers")

#: Produce errors that mean the broker never appended the record.
_NEVER_WRITTEN = frozenset(
    {
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.RECORD_TOO_LARGE,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    }
)


@dataclass(frozen=True)
class WriterConfig:
    bootstrap: Sequence[str]
    topics: Sequence[str]
    partitions: int
    run_id: str
    abort_ratio: float = 0.2
    max_txn_records: int = 4
    idempotent_rate: float = 50.0  # records per second per idempotent producer
    max_in_flight: int = 64  # unacknowledged records per idempotent producer
    request_timeout_ms: int = 5_000
    delivery_timeout_ms: int = 20_000
    transaction_timeout_ms: int = 15_000
    end_timeout_s: float = 20.0  # how long one commit/abort may keep retrying
    producer_options: dict[str, Any] = field(default_factory=dict)

    def transactional_id(self, n: int) -> str:
        return f"verify-{self.run_id}-t{n}"


def send_outcome(exc: BaseException) -> str:
    """``fail`` when the record was definitely not appended, else ``info``."""
    if isinstance(exc, BrokerError):
        if exc.error_code in _NEVER_WRITTEN:
            return "fail"
        if exc.error_code is ErrorCode.REQUEST_TIMED_OUT and exc.extra.get("maybe_written") is False:
            return "fail"
    return "info"


def _error(exc: BaseException) -> str:
    if isinstance(exc, BrokerError):
        return f"{exc.error_code.name}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def _close(producer: Producer | None) -> None:
    if producer is None:
        return
    try:
        producer.close(timeout=2.0)
    except Exception as exc:  # a closing producer's errors change nothing the history records
        log.debug("closing a producer: %s", exc)


def _offset(fut: concurrent.futures.Future[RecordMetadata] | None) -> int | None:
    if fut is None or not fut.done() or fut.cancelled() or fut.exception() is not None:
        return None
    return fut.result().offset


class _Writer(threading.Thread):
    """One writer process of the workload: its history name (``<prefix><n>``), config, seed and stop event."""

    prefix = ""

    def __init__(self, n: int, cfg: WriterConfig, history: HistoryWriter, stop: threading.Event, seed: int) -> None:
        super().__init__(name=f"verify-{self.prefix}{n}", daemon=True)
        self.n = n
        self.cfg = cfg
        self.h = history
        self.stop_event = stop
        self.rng = random.Random(seed)
        self.process = f"{self.prefix}{n}"


class TxnWriter(_Writer):
    """Transactional producer ``n``: transactions of 1..max_txn_records records over the topics, some aborted."""

    prefix = "t"

    def __init__(self, n: int, cfg: WriterConfig, history: HistoryWriter, stop: threading.Event, seed: int) -> None:
        super().__init__(n, cfg, history, stop, seed)
        self.transactions = 0

    def run(self) -> None:
        producer: Producer | None = None
        txn = 0
        try:
            while not self.stop_event.is_set():
                if producer is None:
                    producer = self._open()
                    if producer is None:
                        self.stop_event.wait(0.5)
                        continue
                txn += 1
                try:
                    producer = self._transaction(producer, txn)
                except Exception as exc:  # never let one transaction end the writer
                    log.warning("%s txn %d: %s", self.process, txn, _error(exc))
                    _close(producer)
                    producer = None
        finally:
            _close(producer)

    def _open(self) -> Producer | None:
        cfg = self.cfg
        producer = None
        try:
            producer = Producer(
                list(cfg.bootstrap), transactional_id=cfg.transactional_id(self.n),
                transaction_timeout_ms=cfg.transaction_timeout_ms, request_timeout_ms=cfg.request_timeout_ms,
                delivery_timeout_ms=cfg.delivery_timeout_ms, max_block_ms=int(cfg.end_timeout_s * 1000), linger_ms=2,
                **cfg.producer_options,
            )  # fmt: skip
            producer.init_transactions(timeout=cfg.end_timeout_s)
            return producer
        except Exception as exc:
            log.info("%s: init_transactions: %s", self.process, _error(exc))
            _close(producer)
            return None

    def _transaction(self, producer: Producer, txn: int) -> Producer | None:
        cfg = self.cfg
        commit = self.rng.random() >= cfg.abort_ratio
        count = self.rng.randint(1, cfg.max_txn_records)
        try:
            producer.begin_transaction()
        except Exception as exc:
            log.info("%s: begin_transaction: %s", self.process, _error(exc))
            _close(producer)
            return None  # nothing was sent: no operation to record
        invoke = self.h.now()
        records: list[tuple[str, int, str]] = []
        futs: list[concurrent.futures.Future[RecordMetadata]] = []
        send_error: str | None = None
        for i in range(count):
            topic = cfg.topics[self.rng.randrange(len(cfg.topics))]
            partition = self.rng.randrange(cfg.partitions)
            value = f"t{self.n}-{txn}-{i}"
            try:
                futs.append(producer.send(topic, value.encode(), partition=partition))
            except Exception as exc:  # not handed to the producer: not part of the transaction
                send_error = _error(exc)
                break
            records.append((topic, partition, value))
        if send_error is not None:
            outcome, error, producer_after = self._abort(producer, intended=False)
            error = send_error if error is None else f"{send_error}; {error}"
        elif commit:
            outcome, error, producer_after = self._commit(producer)
        else:
            outcome, error, producer_after = self._abort(producer, intended=True)
        rows = [(t, p, v, _offset(f)) for (t, p, v), f in zip(records, futs, strict=True)]
        self.h.txn(self.process, txn, commit, invoke, outcome, rows, error)
        if outcome == "ok" and commit:
            self.transactions += 1
        return producer_after

    def _abort(self, producer: Producer, *, intended: bool) -> tuple[str, str | None, Producer | None]:
        """End the transaction with an abort. Commit was never asked for, so a commit op that ends here failed."""
        try:
            producer.abort_transaction(timeout=self.cfg.end_timeout_s)
            return ("ok" if intended else "fail"), None, producer
        except Exception as exc:
            _close(producer)  # the next instance's init_transactions aborts what is left
            return ("info" if intended else "fail"), _error(exc), None

    def _commit(self, producer: Producer) -> tuple[str, str | None, Producer | None]:
        deadline = time.monotonic() + self.cfg.end_timeout_s
        attempts = 0
        while True:
            attempts += 1
            try:
                producer.commit_transaction(timeout=max(0.5, deadline - time.monotonic()))
                return "ok", None, producer
            except BrokerError as exc:
                if exc.error_code is ErrorCode.TRANSACTION_ABORTABLE and attempts == 1:
                    # The coordinator never took a commit decision (a record failed, or EndTxn was refused).
                    outcome, error, after = self._abort(producer, intended=False)
                    return outcome, _error(exc) + (f"; {error}" if error else ""), after
                if exc.retriable and time.monotonic() < deadline:
                    continue  # REQUEST_TIMED_OUT and friends: the same call resumes the same commit
                _close(producer)
                return "info", _error(exc), None
            except Exception as exc:
                _close(producer)
                return "info", _error(exc), None


class IdempotentWriter(_Writer):
    """Idempotent producer ``n``: single records at ``idempotent_rate`` per second to random partitions."""

    prefix = "i"

    def __init__(self, n: int, cfg: WriterConfig, history: HistoryWriter, stop: threading.Event, seed: int) -> None:
        super().__init__(n, cfg, history, stop, seed)
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[float, str, int, str]] = {}
        self._slots = threading.Semaphore(cfg.max_in_flight)
        self.acked = 0

    def _new_producer(self) -> Producer:
        cfg = self.cfg
        return Producer(
            list(cfg.bootstrap), enable_idempotence=True, request_timeout_ms=cfg.request_timeout_ms,
            delivery_timeout_ms=cfg.delivery_timeout_ms, max_block_ms=5_000, linger_ms=5, **cfg.producer_options,
        )  # fmt: skip

    def run(self) -> None:
        producer: Producer | None = None
        seq = 0
        interval = 1.0 / self.cfg.idempotent_rate if self.cfg.idempotent_rate > 0 else 0.0
        next_at = time.monotonic()
        try:
            while not self.stop_event.is_set():
                if producer is None:
                    try:
                        producer = self._new_producer()
                    except Exception as exc:
                        log.info("%s: new producer: %s", self.process, _error(exc))
                        self.stop_event.wait(0.5)
                        continue
                if not self._slots.acquire(timeout=0.2):
                    continue
                seq += 1
                if not self._send(producer, seq):
                    _close(producer)  # its records are all reported (close fails what it cannot deliver)
                    producer = None
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    self.stop_event.wait(delay)
                else:
                    next_at = time.monotonic()
        finally:
            if producer is not None:
                with contextlib.suppress(Exception):
                    producer.flush(timeout=self.cfg.delivery_timeout_ms / 1000)
                _close(producer)
            self._report_pending()

    def _send(self, producer: Producer, seq: int) -> bool:
        topic = self.cfg.topics[self.rng.randrange(len(self.cfg.topics))]
        partition = self.rng.randrange(self.cfg.partitions)
        value = f"i{self.n}-{seq}"
        invoke = self.h.now()
        with self._lock:
            self._pending[seq] = (invoke, topic, partition, value)
        try:
            fut = producer.send(topic, value.encode(), partition=partition)
        except Exception as exc:
            with self._lock:
                self._pending.pop(seq, None)
            self.h.send(self.process, seq, invoke, "fail", topic, partition, value, None, _error(exc))
            self._slots.release()
            return isinstance(exc, BrokerError) and exc.error_code is ErrorCode.REQUEST_TIMED_OUT  # buffer full
        fut.add_done_callback(functools.partial(self._done, seq))
        return True

    def _done(self, seq: int, fut: concurrent.futures.Future[RecordMetadata]) -> None:
        with self._lock:
            item = self._pending.pop(seq, None)
        if item is None:
            return
        invoke, topic, partition, value = item
        exc = fut.exception()
        if exc is None:
            md = fut.result()
            self.acked += 1
            self.h.send(self.process, seq, invoke, "ok", md.topic, md.partition, value, md.offset)
        else:
            self.h.send(self.process, seq, invoke, send_outcome(exc), topic, partition, value, None, _error(exc))
        self._slots.release()

    def _report_pending(self) -> None:
        """Records whose future never resolved (the producer was abandoned): unknown."""
        with self._lock:
            left, self._pending = self._pending, {}
        for seq, (invoke, topic, partition, value) in sorted(left.items()):
            self.h.send(self.process, seq, invoke, "info", topic, partition, value, None, "no answer before the end")
