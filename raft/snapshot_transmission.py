"""Streaming a store-backed group's full snapshot to a follower (PySyncObj's ``Serializer`` transmission, patched).

A store-backed group's dump file is a light snapshot; the leader streams the full
one ``raft.full_snapshot`` builds on demand instead (``set_transmission_source``),
at most ``max_bytes_per_s`` to a follower, and closes the files PySyncObj leaves
open. While the snapshot has nothing to send (not built yet, ahead of its pace,
or the leader compacting), the leader sends the follower one message per round of
AppendEntries (``_hold_snapshot_round``). ``pysyncobj_patches.apply`` installs
``get_transmission_data`` and ``cancel_transmission``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import pysyncobj.serializer as _psc_serializer

__all__ = [
    "ORIGINAL_GET_TRANSMISSION_DATA",
    "cancel_transmission",
    "close_serializer_files",
    "get_transmission_data",
    "set_transmission_source",
]

logger = logging.getLogger(__name__)

ORIGINAL_GET_TRANSMISSION_DATA = _psc_serializer.Serializer.getTransmissionData


def _hold(serializer: Any, node: Any) -> None:
    hold = getattr(serializer, "txbroker_hold", None)
    if hold is not None:
        hold(node)


def get_transmission_data(self: Any, transmission_id: Any) -> Any:
    # PySyncObj forgets (never closes) the snapshot file it streams to a
    # follower once the transfer ends.
    transmissions = self._Serializer__transmissions
    before = transmissions.get(transmission_id)
    source = getattr(self, "txbroker_transmission_source", None)
    if before is None and source is not None and self._Serializer__pid == 0:
        # A store-backed group streams a full snapshot built on demand, not its light dump file.
        path = source()
        if path is None:
            _hold(self, transmission_id)
            return None  # still being built: PySyncObj asks again at the next heartbeat
        try:
            before = transmissions[transmission_id] = {"file": open(path, "rb"), "transmitted": 0}  # noqa: SIM115
        except OSError:
            logger.exception("cannot open snapshot %s for transmission", path)
            _hold(self, transmission_id)
            return None
        before["txb_started"] = time.monotonic()
    rate = getattr(self, "txbroker_transmission_rate", 0)
    started = before.get("txb_started") if before is not None and rate > 0 else None
    if before is not None and started is not None and before["transmitted"] > rate * (time.monotonic() - started):
        result = None  # ahead of the pace: nothing this round (a later heartbeat goes on)
    else:
        result = ORIGINAL_GET_TRANSMISSION_DATA(self, transmission_id)
    if result is None:
        _hold(self, transmission_id)
    if before is not None and transmission_id not in transmissions:
        _close_quietly(before.get("file"))
    return result


def cancel_transmission(self: Any, transmission_id: Any) -> None:
    transmission = self._Serializer__transmissions.pop(transmission_id, None)
    if transmission is not None:
        _close_quietly(transmission.get("file"))


def _close_quietly(f: Any) -> None:
    if f is not None:
        with contextlib.suppress(OSError):
            f.close()


def set_transmission_source(so: Any, source: Callable[[], str | None], max_bytes_per_s: int = 0) -> None:
    """Stream ``source()``'s file (None: not ready) to followers instead of the dump file, at most
    ``max_bytes_per_s`` to each (0: as fast as the leader's heartbeats send it)."""
    serializer = so._SyncObj__serializer
    serializer.txbroker_transmission_source = source
    serializer.txbroker_transmission_rate = max_bytes_per_s
    serializer.txbroker_hold = lambda node: _hold_snapshot_round(so, node)


def _hold_snapshot_round(so: Any, node: Any) -> None:
    """End this round of ``node``'s AppendEntries: its snapshot has nothing to send now (not built yet, ahead of
    its pace, or the leader compacting).

    PySyncObj's leader loops over a follower that needs a snapshot while ``nextIndex <= its last index``,
    sending one snapshot message after another until ``appendEntriesPeriod`` has passed: with nothing to send,
    the ticker would spin through every heartbeat sending "nothing yet" messages as fast as it can, starving
    every group of the ticker (and the follower answers each). So the follower's next index steps past the
    leader's log for the rest of the round (the loop ends there), and
    ``CoalescedAppendEntries._flush_append_entries`` puts it back after the round.
    """
    held = getattr(so, "_txb_snapshot_held", None)
    if held is None or node in held:
        return  # not within a round of ``_flush_append_entries``, or held already
    next_index = so._SyncObj__raftNextIndex
    if node not in next_index:
        return
    held[node] = next_index[node]
    next_index[node] = so._SyncObj__getCurrentLogIndex() + 1


def close_serializer_files(so: Any) -> None:
    """Close snapshot files PySyncObj keeps open (outgoing and incoming transfers)."""
    serializer = so._SyncObj__serializer
    for transmission in serializer._Serializer__transmissions.values():
        _close_quietly(transmission.get("file"))
    serializer._Serializer__transmissions.clear()
    _close_quietly(serializer._Serializer__incomingTransmissionFile)
    serializer._Serializer__incomingTransmissionFile = None
