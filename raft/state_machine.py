"""The seam between Raft and what it replicates.

A ``StateMachine`` is driven by exactly one Raft group. Every method is called
from that group's ticker thread, never concurrently with another method of the
same instance. Readers on other threads (the asyncio loop) may read the state
the machine publishes (RocksDB, immutable snapshots of in-memory values) but
must not call these methods.

Rules (DESIGN.md "Rules that make this correct"):

* ``apply`` is deterministic: it never reads the clock or randomness (time
  comes inside the command) and does no network I/O.
* ``apply`` never raises. A replicated method that raises wedges the whole
  PySyncObj group on every replica, so errors are *returned* as values.
* ``apply`` is idempotent across restarts: the machine persists the Raft index
  of the last entry it applied in the same RocksDB WriteBatch as the state
  change, and returns ``None`` without changing anything for an entry whose
  index is at or below it (journal replay after a restart).
* A command whose first byte is ``NOOP_COMMAND[0]`` (0x00) is a barrier: the
  machine records the index and changes nothing else.
"""

from __future__ import annotations

from typing import Any, BinaryIO, Protocol

NOOP_COMMAND = b"\x00"


class StateMachine(Protocol):
    @property
    def last_applied(self) -> int:
        """Raft index of the last entry applied (0 when none), as persisted."""
        ...

    def apply(self, index: int, command: bytes) -> Any:
        """Apply the committed entry at Raft ``index``; return the result for the proposer."""
        ...

    def write_snapshot(self, out: BinaryIO) -> None:
        """Write the whole state (as of ``last_applied``) to ``out``."""
        ...

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        """Replace the whole state with what ``write_snapshot`` wrote; set ``last_applied``."""
        ...
