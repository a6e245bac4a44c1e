"""Give the calling thread its Python name at the OS level, so ``top -H``, ``/proc/<pid>/task/*/comm`` and
``txbroker bench`` can tell a node's threads apart (CPython 3.11 leaves them all named after the process)."""

from __future__ import annotations

import ctypes
import sys
import threading

from .libc import LIBC

__all__ = ["name_os_thread"]

_PR_SET_NAME = 15  # linux/prctl.h
_libc = LIBC if sys.platform.startswith("linux") else None


def name_os_thread(name: str | None = None) -> None:
    """Set the calling thread's OS name (at most 15 bytes are kept) to ``name`` or its Python name.

    Best effort: on other systems, or if the call fails, nothing happens.
    """
    if _libc is None:
        return
    raw = (name or threading.current_thread().name).encode("ascii", "replace")[:15]
    _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)
