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

from collections.abc import Callable
from typing import Any, BinaryIO, Protocol, runtime_checkable

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


@runtime_checkable
class DurableStateMachine(StateMachine, Protocol):
    """A machine whose whole state already lives in a durable store (RocksDB) at ``last_applied``.

    Log compaction then needs no copy of the state: the group writes a *light*
    snapshot (Raft metadata and the state index only) after ``make_durable``,
    and builds a full snapshot only when a follower needs one installed, from
    ``consistent_snapshot`` on a background thread. A partition with gigabytes
    of records would otherwise be copied in full, on the ticker thread, at every
    compaction.
    """

    def make_durable(self) -> None:
        """Make every applied entry survive a machine crash (e.g. flush the store's memtables).

        Called on the node's compaction thread, never on the ticker, and never
        concurrently with itself; ``apply`` may run meanwhile.
        """
        ...

    def consistent_snapshot(self) -> tuple[int, Callable[[BinaryIO], None]]:
        """``(state index, body writer)`` of one point-in-time view of the state.

        Called on the ticker thread; the writer runs on another thread while
        ``apply`` goes on, so it must read only that view. Its output is what
        ``read_snapshot`` accepts, restored at the returned index.
        """
        ...
