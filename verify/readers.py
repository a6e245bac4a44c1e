"""The workload's readers: read_committed consumers over every partition for the whole run, and the final drain.

A reader assigns itself every partition (no group) from offset 0 and records each poll with the
records it returned, in order. A consumer that keeps failing is closed and a new one resumes after
the last record read (an ``assign`` line with the positions, so the checker knows it was a seek).
The final drain waits until no transaction is open on any partition, reads every partition from the
start up to its end offset (the last stable offset, which is then the high watermark) from the
leaders, and records a ``drain`` line per partition saying how far it got.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from clients.admin import Admin
from clients.consumer import Consumer
from clients.records import ConsumerRecord
from clients.security import SecurityOptions

from .history import HistoryWriter

__all__ = ["Reader", "drain", "wait_stable"]

log = logging.getLogger("verify.readers")

TPS = list[tuple[str, int]]

#: Consecutive failed polls after which a reader replaces its consumer.
_FAILED_POLLS = 3


def _value(r: ConsumerRecord) -> str:
    v = r.value
    if v is None:
        return ""
    return v.decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else str(v)


def _error(exc: BaseException) -> str:
    code = getattr(exc, "error_code", None)
    return f"{code.name}: {getattr(exc, 'message', exc)}" if code is not None else f"{type(exc).__name__}: {exc}"


def _close(consumer: Consumer | None) -> None:
    if consumer is not None:
        with contextlib.suppress(Exception):
            consumer.close(autocommit=False)


def _consumer(bootstrap: Sequence[str], request_timeout_ms: int, security: SecurityOptions) -> Consumer:
    return Consumer(
        list(bootstrap), isolation_level="read_committed", auto_offset_reset="earliest",
        request_timeout_ms=request_timeout_ms, fetch_max_wait_ms=200, max_poll_records=1000, **security,
    )  # fmt: skip


class Reader(threading.Thread):
    """Consumer ``n``: polls every partition until ``stop``; every poll is a history line."""

    def __init__(
        self, n: int, bootstrap: Sequence[str], tps: TPS, history: HistoryWriter, stop: threading.Event,
        request_timeout_ms: int = 5_000, security: SecurityOptions | None = None,
    ) -> None:  # fmt: skip
        super().__init__(name=f"verify-c{n}", daemon=True)
        self.process = f"c{n}"
        self.bootstrap = list(bootstrap)
        self.tps = list(tps)
        self.h = history
        self.stop_event = stop
        self.request_timeout_ms = request_timeout_ms
        self.security = security or SecurityOptions()
        self.positions = {tp: 0 for tp in self.tps}
        self.records = 0

    def _open(self) -> Consumer | None:
        invoke = self.h.now()
        consumer = None
        try:
            consumer = _consumer(self.bootstrap, self.request_timeout_ms, self.security)
            consumer.assign(self.tps)
            for tp in self.tps:
                consumer.seek(tp, self.positions[tp])
        except Exception as exc:
            log.info("%s: new consumer: %s", self.process, _error(exc))
            _close(consumer)
            return None
        self.h.assign(self.process, invoke, [(t, p, self.positions[(t, p)]) for t, p in self.tps])
        return consumer

    def run(self) -> None:
        consumer: Consumer | None = None
        failed = 0
        try:
            while not self.stop_event.is_set():
                if consumer is None:
                    consumer = self._open()
                    if consumer is None:
                        self.stop_event.wait(0.5)
                        continue
                invoke = self.h.now()
                try:
                    records = consumer.poll(timeout_ms=300)
                except Exception as exc:
                    self.h.poll(self.process, invoke, "fail", [], error=_error(exc))
                    failed += 1
                    if failed >= _FAILED_POLLS:
                        _close(consumer)
                        consumer = None
                        failed = 0
                    self.stop_event.wait(0.2)
                    continue
                failed = 0
                self._record(invoke, records)
        finally:
            _close(consumer)

    def _record(self, invoke: float, records: list[ConsumerRecord]) -> None:
        rows = [(r.topic, r.partition, r.offset, _value(r)) for r in records]
        if rows:  # an empty poll says nothing; leaving it out keeps histories small
            self.h.poll(self.process, invoke, "ok", rows)
        for r in records:
            self.positions[(r.topic, r.partition)] = r.offset + 1
        self.records += len(rows)


def wait_stable(
    bootstrap: Sequence[str], topics: Sequence[str], deadline: float, security: SecurityOptions | None = None
) -> bool:
    """Wait until every partition's last stable offset has reached its high watermark (no open transaction)."""
    admin = Admin(list(bootstrap), request_timeout_ms=5_000, **(security or SecurityOptions()))
    while True:
        try:
            meta: dict[str, Any] = admin.metadata(list(topics))
            parts = [p for t in meta.get("topics", []) if t.get("name") in topics for p in t.get("partitions", [])]
            if parts and all(p.get("last_stable_offset") == p.get("high_watermark") for p in parts):
                return True
        except Exception as exc:
            log.info("metadata: %s", _error(exc))
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def drain(
    bootstrap: Sequence[str], tps: TPS, history: HistoryWriter, deadline: float, security: SecurityOptions | None = None
) -> dict[tuple[str, int], bool]:
    """Read every partition from 0 to its end offset; records the polls and one ``drain`` line per partition."""
    process = "drain"
    done: dict[tuple[str, int], bool] = dict.fromkeys(tps, False)
    ends: dict[tuple[str, int], int] = {}
    consumer: Consumer | None = None
    positions = dict.fromkeys(tps, 0)
    while time.monotonic() < deadline and not all(done.values()):
        if consumer is None:
            invoke = history.now()
            try:
                consumer = _consumer(bootstrap, 5_000, security or SecurityOptions())
                if not ends:
                    ends = dict(consumer.end_offsets(tps))
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, positions[tp])
            except Exception as exc:
                log.info("drain: consumer: %s", _error(exc))
                _close(consumer)
                consumer = None
                time.sleep(0.5)
                continue
            history.assign(process, invoke, [(t, p, positions[(t, p)]) for t, p in tps])
        invoke = history.now()
        try:
            records = consumer.poll(timeout_ms=300)
            rows = [(r.topic, r.partition, r.offset, _value(r)) for r in records]
            if rows:
                history.poll(process, invoke, "ok", rows)
            for r in records:
                positions[(r.topic, r.partition)] = r.offset + 1
            for tp in tps:
                if not done[tp] and consumer.position(tp) >= ends[tp]:
                    done[tp] = True
        except Exception as exc:
            history.poll(process, invoke, "fail", [], error=_error(exc))
            _close(consumer)
            consumer = None
    _close(consumer)
    for (t, p), ok in done.items():
        history.drain(t, p, ends.get((t, p), 0), ok, process=process)
    return done
