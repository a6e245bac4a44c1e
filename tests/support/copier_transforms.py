"""Transforms for ``txbroker copy --transform python:tests.support.copier_transforms:NAME`` in tests.

``throttled`` caps a copier at about 2,000 records/s: on loopback it would
otherwise copy 20,000 records in about a second, before a fault test could
bounce anything. It blocks the copier's event loop 10 ms per 20 records, far
below its heartbeat interval.
"""

from __future__ import annotations

import time

_count = 0


def throttled(value: bytes | None) -> bytes | None:
    global _count
    _count += 1
    if _count % 20 == 0:
        time.sleep(0.01)
    return value
