"""Raft traffic of this process: frames and bytes sent and received on Raft connections.

Every Raft group's connections run on one ticker (shard) thread, so each thread
counts in its own cell and nothing is locked on the hot path; a reader sums the
cells. A sum read while a thread counts may miss that thread's latest frame, as
any scrape of a live counter does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

_FRAMES_SENT, _BYTES_SENT, _FRAMES_RECEIVED, _BYTES_RECEIVED = range(4)


@dataclass(frozen=True, slots=True)
class Traffic:
    frames_sent: int = 0
    bytes_sent: int = 0
    frames_received: int = 0
    bytes_received: int = 0


class _Cells(threading.local):
    cell: list[int] | None = None


_local = _Cells()
_cells: list[list[int]] = []
_cells_lock = threading.Lock()


def _cell() -> list[int]:
    cell = _local.cell
    if cell is None:
        cell = _local.cell = [0, 0, 0, 0]
        with _cells_lock:
            _cells.append(cell)
    return cell


def count_sent(nbytes: int) -> None:
    cell = _cell()
    cell[_FRAMES_SENT] += 1
    cell[_BYTES_SENT] += nbytes


def count_received(nbytes: int) -> None:
    cell = _cell()
    cell[_FRAMES_RECEIVED] += 1
    cell[_BYTES_RECEIVED] += nbytes


def totals() -> Traffic:
    """The sums over every thread that ever counted (a finished thread's cell stays counted)."""
    with _cells_lock:
        cells = list(_cells)
    sums = [sum(c[i] for c in cells) for i in range(4)]
    return Traffic(*sums)
