"""State machines for the raft tests.

``CounterStateMachine`` keeps named counters in RocksDB and persists
``last_applied`` in the same WriteBatch as every change (DESIGN rule 3), so a
journal replay after restart skips what it already applied. Commands:
``b"add:<key>:<n>"`` -> returns the new value; ``b"boom"`` raises (poison
test); ``NOOP_COMMAND`` records the index only.

``MemoryStateMachine`` only counts bytes (benchmarks).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

from rocksdict import Options, Rdict, WriteBatch

from raft.state_machine import NOOP_COMMAND

_APPLIED = b"\x00applied"
_LEN = struct.Struct("<I")


class CounterStateMachine:
    def __init__(self, path: str) -> None:
        self.path = path
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self._opts = opts
        self._db = Rdict(path, opts)
        raw = self._db.get(_APPLIED)
        self._last_applied = 0 if raw is None else int(raw.decode())
        self.apply_calls = 0  # entries actually applied (not skipped) by this instance
        self.skipped = 0  # entries skipped because index <= last_applied
        self.restored_from_snapshot = 0
        self._lock = threading.Lock()

    @property
    def last_applied(self) -> int:
        return self._last_applied

    def value(self, key: str) -> int:
        raw = self._db.get(b"k:" + key.encode())
        return 0 if raw is None else int(raw.decode())

    def values(self) -> dict[str, int]:
        return {k[2:].decode(): int(v.decode()) for k, v in self._db.items() if k.startswith(b"k:")}

    def apply(self, index: int, command: bytes) -> Any:
        if index <= self._last_applied:
            self.skipped += 1
            return None
        if command == b"boom":
            raise RuntimeError("poison command")
        wb = WriteBatch(raw_mode=True)
        result: Any = None
        if command[:1] != NOOP_COMMAND:
            _, key, n = command.decode().split(":")
            result = self.value(key) + int(n)
            wb.put(b"k:" + key.encode(), str(result).encode())
        wb.put(_APPLIED, str(index).encode())
        self._db.write(wb)
        self._last_applied = index
        self.apply_calls += 1
        return result

    def write_snapshot(self, out: BinaryIO) -> None:
        for k, v in self._db.items():
            out.write(_LEN.pack(len(k)) + k + _LEN.pack(len(v)) + v)

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        wb = WriteBatch(raw_mode=True)
        for k in list(self._db.keys()):
            wb.delete(k)
        while True:
            head = inp.read(_LEN.size)
            if not head:
                break
            k = inp.read(_LEN.unpack(head)[0])
            v = inp.read(_LEN.unpack(inp.read(_LEN.size))[0])
            wb.put(k, v)
        wb.put(_APPLIED, str(last_applied).encode())
        self._db.write(wb)
        self._last_applied = last_applied
        self.restored_from_snapshot += 1

    def close(self) -> None:
        self._db.close()


class DurableCounterStateMachine(CounterStateMachine):
    """The same counters, declared store-backed (``DurableStateMachine``): light snapshots at compaction."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.made_durable = 0

    def make_durable(self) -> None:
        self._db.flush_wal(True)
        self.made_durable += 1

    def consistent_snapshot(self) -> tuple[int, Callable[[BinaryIO], None]]:
        it = self._db.iter()  # RocksDB pins what an iterator sees when it is created
        it.seek_to_first()
        pairs: list[tuple[bytes, bytes]] = []
        applied = 0
        while it.valid():
            k, v = it.key(), it.value()
            if k == _APPLIED:
                applied = int(v.decode())
            pairs.append((k, v))
            it.next()

        def write(out: BinaryIO) -> None:
            for k, v in pairs:
                out.write(_LEN.pack(len(k)) + k + _LEN.pack(len(v)) + v)

        return applied, write


class MemoryStateMachine:
    """Counts applied bytes; state is the count (benchmarks and framing tests)."""

    def __init__(self) -> None:
        self._last_applied = 0
        self.bytes_applied = 0
        self.entries = 0

    @property
    def last_applied(self) -> int:
        return self._last_applied

    def apply(self, index: int, command: bytes) -> Any:
        if index <= self._last_applied:
            return None
        self._last_applied = index
        if command[:1] != NOOP_COMMAND:
            self.bytes_applied += len(command)
            self.entries += 1
        return index

    def write_snapshot(self, out: BinaryIO) -> None:
        out.write(struct.pack("<QQ", self.bytes_applied, self.entries))

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        self.bytes_applied, self.entries = struct.unpack("<QQ", inp.read(16))
        self._last_applied = last_applied
