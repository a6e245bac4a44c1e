"""The history of a verify run: one JSON object per line, written as operations complete (docs/verify.md).

Every line has a ``"type"``. Operations (``send``, ``txn-commit``, ``txn-abort``, ``poll``, ``assign``)
carry the client ``process`` that ran them, ``invoke`` and ``complete`` times (seconds of
``time.monotonic()`` since the run started) and an ``outcome``: ``ok``, ``fail`` (definitely not
applied) or ``info`` (unknown). Events (``fault``, ``run``, ``drain``, ``copier``, ``meta``) carry a
``time``. The checker (``verify.checker``) reads nothing else.

``HistoryWriter`` is thread-safe (client callbacks write from the clients' loop threads) and streams
to the file; ``read_history`` streams it back, so neither holds a whole history in memory.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = [
    "FORMAT_VERSION",
    "OUTCOMES",
    "HistoryError",
    "HistoryWriter",
    "Op",
    "read_history",
    "write_history",
]

FORMAT_VERSION = 1
OUTCOMES = ("ok", "fail", "info")
OP_TYPES = ("send", "txn-commit", "txn-abort", "poll", "assign")
EVENT_TYPES = ("meta", "run", "fault", "drain", "copier")

#: One history line, as parsed JSON.
Op = dict[str, Any]


class HistoryError(ValueError):
    """A history line that is not JSON or lacks what its type needs."""


class HistoryWriter:
    """Appends history lines to ``path``; ``now()`` is the run's clock (0 at construction)."""

    def __init__(self, path: Path, *, start: float | None = None) -> None:
        self.path = path
        self.start = time.monotonic() if start is None else start
        self._lock = threading.Lock()
        self._file: IO[str] | None = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.lines = 0

    def now(self) -> float:
        return round(time.monotonic() - self.start, 6)

    def at(self, monotonic: float) -> float:
        """A ``time.monotonic()`` reading on this run's clock."""
        return round(monotonic - self.start, 6)

    def write(self, op: Op) -> None:
        line = json.dumps(op, separators=(",", ":"), ensure_ascii=False) + "\n"
        with self._lock:
            if self._file is None:
                return  # a late client callback after the run ended: the history is closed
            self._file.write(line)
            self.lines += 1

    # ---- typed helpers (one per line type) ----------------------------------------------------

    def meta(self, **fields: Any) -> None:
        self.write({"type": "meta", "version": FORMAT_VERSION, "time": self.now(), **fields})

    def run(self, kind: str) -> None:
        self.write({"type": "run", "kind": kind, "time": self.now()})

    def fault(self, kind: str, fault: str, nodes: Sequence[int], time_: float | None = None) -> None:
        t = self.now() if time_ is None else time_
        self.write({"type": "fault", "kind": kind, "fault": fault, "nodes": list(nodes), "time": t})

    def leadership(self, fault: str, heal_time: float, groups: int, changed: Sequence[str]) -> None:
        """How many of ``groups`` Raft groups changed leader or term within a while after the heal at ``heal_time``."""
        self.write({"type": "leadership", "fault": fault, "time": heal_time, "groups": groups,
                    "changed": list(changed), "recorded": self.now()})  # fmt: skip

    def send(
        self,
        process: str,
        seq: int,
        invoke: float,
        outcome: str,
        topic: str,
        partition: int | None,
        value: str,
        offset: int | None,
        error: str | None = None,
    ) -> None:
        self.write(
            {"type": "send", "process": process, "seq": seq, "invoke": invoke, "complete": self.now(),
             "outcome": outcome, "topic": topic, "partition": partition, "value": value, "offset": offset,
             "error": error}
        )  # fmt: skip

    def txn(
        self,
        process: str,
        txn: int,
        commit: bool,
        invoke: float,
        outcome: str,
        records: Sequence[tuple[str, int | None, str, int | None]],
        error: str | None = None,
    ) -> None:
        self.write(
            {"type": "txn-commit" if commit else "txn-abort", "process": process, "txn": txn, "invoke": invoke,
             "complete": self.now(), "outcome": outcome, "records": [list(r) for r in records], "error": error}
        )  # fmt: skip

    def poll(
        self,
        process: str,
        invoke: float,
        outcome: str,
        records: Sequence[tuple[str, int, int, str]],
        isolation: str = "read_committed",
        error: str | None = None,
    ) -> None:
        self.write(
            {"type": "poll", "process": process, "invoke": invoke, "complete": self.now(), "outcome": outcome,
             "isolation": isolation, "records": [list(r) for r in records], "error": error}
        )  # fmt: skip

    def assign(self, process: str, invoke: float, positions: Sequence[tuple[str, int, int]]) -> None:
        self.write(
            {"type": "assign", "process": process, "invoke": invoke, "complete": self.now(), "outcome": "ok",
             "positions": [list(p) for p in positions]}
        )  # fmt: skip

    def drain(self, topic: str, partition: int, end_offset: int, complete: bool, process: str = "drain") -> None:
        self.write(
            {"type": "drain", "process": process, "topic": topic, "partition": partition, "end_offset": end_offset,
             "complete": complete, "time": self.now()}
        )  # fmt: skip

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _validate(op: Any, where: str) -> Op:
    if not isinstance(op, dict) or not isinstance(op.get("type"), str):
        raise HistoryError(f"{where}: not a history line (an object with a string 'type')")
    kind = op["type"]
    if kind in OP_TYPES:
        for field in ("process", "invoke", "complete", "outcome"):
            if field not in op:
                raise HistoryError(f"{where}: {kind} line without {field!r}")
        if op["outcome"] not in OUTCOMES:
            raise HistoryError(f"{where}: outcome {op['outcome']!r} is not one of {OUTCOMES}")
    elif kind in EVENT_TYPES and kind != "meta" and "time" not in op:
        raise HistoryError(f"{where}: {kind} line without 'time'")
    # Unknown types are kept (the checker skips them): newer writers may add events.
    return op


def read_history(path: Path | str) -> Iterator[Op]:
    """The lines of a history file, streamed; blank lines are skipped, a torn last line is ignored."""
    with open(path, encoding="utf-8") as f:
        pending: tuple[int, str] | None = None
        for no, raw in enumerate(f, 1):
            if pending is not None:
                raise HistoryError(f"{path}:{pending[0]}: not JSON: {pending[1][:80]!r}")
            line = raw.strip()
            if not line:
                continue
            try:
                op = json.loads(line)
            except json.JSONDecodeError:
                if not raw.endswith("\n"):
                    return  # the writer died mid-line: everything before it is the history
                pending = (no, line)
                continue
            yield _validate(op, f"{path}:{no}")
        if pending is not None:
            raise HistoryError(f"{path}:{pending[0]}: not JSON: {pending[1][:80]!r}")


def write_history(path: Path, ops: Iterable[Op]) -> int:
    """Write ``ops`` as a history file (tests and tools that build histories); returns the line count."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for op in ops:
            f.write(json.dumps(op, separators=(",", ":"), ensure_ascii=False) + "\n")
            n += 1
    return n
