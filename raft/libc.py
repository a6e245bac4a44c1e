"""The C library, for the few calls the standard library lacks (``prctl``, ``sync_file_range``); None if absent."""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["LIBC"]


def _load() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


LIBC = _load()
