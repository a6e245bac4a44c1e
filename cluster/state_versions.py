"""What changed in this node's group states since a peer last asked: the deltas of ``/v1/internal/state``.

A node's peers poll its view of every Raft group it replicates once a second (``cluster.peers``). At
thousands of partitions, encoding and decoding every entry on every poll costs more than the groups
themselves while idle, and almost nothing changes between two polls. So each entry carries the
*version* at which it last changed; a peer names the version it holds and gets only what is newer,
plus the groups this node no longer replicates.

Versions count within one *epoch*: a random name the node picks when it starts. A poll naming another
epoch (the node restarted), a version this node never reached, or one older than the oldest removal
it still remembers gets the whole state (``full``), which replaces what the peer held.

Pure: the node records its current states (``record``) and answers polls (``since``) on its event loop.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: removals remembered for deltas; a peer that fell further behind gets the whole state
MAX_REMOVED = 16_384
EPOCH_MAX_LEN = 64

Entry = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class StateDelta:
    epoch: str
    version: int
    full: bool  # ``changed`` is the whole state: it replaces the peer's copy
    changed: dict[str, Entry]
    removed: list[str] = field(default_factory=list)


class StateVersions:
    def __init__(self, epoch: str | None = None, *, max_removed: int = MAX_REMOVED) -> None:
        self.epoch = epoch if epoch is not None else secrets.token_hex(8)
        self.version = 0
        self._max_removed = max_removed
        # group id -> (entry, the version it last changed at); re-inserted on change, so the dict is in
        # version order and the newest changes are at its end
        self._entries: dict[str, tuple[Entry, int]] = {}
        self._removed: dict[str, int] = {}  # group id -> version of its removal, in version order
        self._forgotten = 0  # removals at or below this version are no longer remembered

    def record(self, current: Mapping[str, Entry], touched: Iterable[str] | None = None) -> None:
        """Take the node's current states: what differs from the last record gets a new version.

        ``touched``: the only groups whose entries may differ from the last record (the caller read
        only these again, and no group came or went); None: any may.
        """
        entries = self._entries
        candidates = current if touched is None else [gid for gid in touched if gid in current]
        changed = [
            gid
            for gid in candidates
            if (old := entries.get(gid)) is None or (old[0] is not (entry := current[gid]) and old[0] != entry)
        ]
        new = sum(1 for gid in changed if gid not in entries)
        gone = [gid for gid in entries if gid not in current] if len(entries) + new != len(current) else []
        if not changed and not gone:
            return
        self.version += 1
        v = self.version
        for gid in changed:
            entries.pop(gid, None)
            entries[gid] = (current[gid], v)
            self._removed.pop(gid, None)
        for gid in gone:
            del entries[gid]
            self._removed[gid] = v
        while len(self._removed) > self._max_removed:
            gid = next(iter(self._removed))
            self._forgotten = max(self._forgotten, self._removed.pop(gid))

    def since(self, epoch: str | None, version: int | None) -> StateDelta:
        """What a peer holding ``version`` of ``epoch`` lacks (the whole state when it holds nothing usable)."""
        if epoch != self.epoch or version is None or version > self.version or version < self._forgotten:
            return StateDelta(self.epoch, self.version, True, {gid: e for gid, (e, _) in self._entries.items()})
        changed: dict[str, Entry] = {}
        for gid in reversed(self._entries):
            entry, v = self._entries[gid]
            if v <= version:
                break
            changed[gid] = entry
        removed: list[str] = []
        for gid in reversed(self._removed):
            if self._removed[gid] <= version:
                break
            removed.append(gid)
        return StateDelta(self.epoch, self.version, False, changed, removed)


def apply_delta(held: dict[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """A peer's copy of a node's states after that node's answer ``body`` (a full answer replaces it)."""
    changed = body.get("partitions")
    if not isinstance(changed, dict):
        changed = {}
    if body.get("full", True):
        return dict(changed)
    held.update(changed)
    removed = body.get("removed")
    for gid in removed if isinstance(removed, list) else ():
        held.pop(gid, None)
    return held
