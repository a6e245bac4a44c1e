"""The snapshot container: PySyncObj's ``fullDumpFile`` for a group.

Layout (all integers little-endian)::

    magic    8  b"TXRBSNAP"
    version  2  u16 = 1 (full) or 2 (light: empty body, see below)
    index    8  u64  StateMachine.last_applied when written ("state index")
    raft_len 4  u32
    raft     raft_len  pickle(protocol 4) of PySyncObj's raftData tuple
                       (lastAppliedEntry, prevEntry, cluster nodes)
    body     ...       StateMachine.write_snapshot output
    body_len 8  u64
    sha256   32 over every byte before it

The state index may exceed raftData's index (the machine persists its own
last_applied and may be ahead of PySyncObj after a journal replay); the
reader restores the machine at the *state* index so later entries at or
below it are skipped, never applied twice.

A *light* container (version 2) has an empty body: the machine's state is
already durable in the node's own store at ``index`` or later
(``DurableStateMachine``). It serves log compaction and restarts of this
node only; a follower is always sent a full container.

The raftData pickle is only ever read from a local file or from a snapshot
streamed over an authenticated (AES-GCM) connection, and only after the
SHA-256 trailer verified. The file is fsynced before PySyncObj renames it
(the full snapshot built for a follower is not: it is rebuilt after a crash,
never reused).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import struct
from collections.abc import Callable
from typing import IO, Any, BinaryIO, cast

from raft.errors import SnapshotCorruptError

MAGIC = b"TXRBSNAP"
VERSION = 1
LIGHT_VERSION = 2
_HEADER = struct.Struct("<8sHQI")
_BODY_LEN = struct.Struct("<Q")
_DIGEST_LEN = 32
_TRAILER_LEN = _BODY_LEN.size + _DIGEST_LEN
_CHUNK = 1 << 20


def write_snapshot(
    path: str,
    raft_data: Any,
    state_index: int,
    write_body: Callable[[BinaryIO], None] | None,
    *,
    sync: bool = True,
    on_write: Callable[[int, int], None] | None = None,
) -> None:
    """Write a complete container to ``path`` (not renamed; PySyncObj renames it).

    ``write_body`` None writes a light container (no body). The digest is
    computed as the bytes go out (one pass over the body). ``sync`` False
    skips the fsync: for a file that is rebuilt rather than trusted after a
    crash (the full snapshot built for a follower). ``on_write(fd, bytes written so far)`` runs after every
    write (pacing, writeback).
    """
    raft_blob = pickle.dumps(raft_data, protocol=4)
    with open(path, "wb") as f:
        out = _HashingWriter(f, on_write)
        version = VERSION if write_body is not None else LIGHT_VERSION
        out.write(_HEADER.pack(MAGIC, version, state_index, len(raft_blob)))
        out.write(raft_blob)
        body_start = out.written
        if write_body is not None:
            write_body(cast(BinaryIO, out))
        out.write(_BODY_LEN.pack(out.written - body_start))
        f.write(out.digest())
        f.flush()
        if sync:
            os.fsync(f.fileno())


class _HashingWriter:
    """The file a container's bytes go to, hashing them on the way (``write`` is all a body writer calls)."""

    def __init__(self, f: IO[bytes], on_write: Callable[[int, int], None] | None = None) -> None:
        self._f = f
        self._hash = hashlib.sha256()
        self._on_write = on_write
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._hash.update(data)
        n = self._f.write(data)
        self.written += len(data)
        if self._on_write is not None:
            self._on_write(self._f.fileno(), self.written)
        return n

    def digest(self) -> bytes:
        return self._hash.digest()


def _hash_prefix(f: IO[bytes], length: int) -> bytes:
    h = hashlib.sha256()
    remaining = length
    while remaining > 0:
        chunk = f.read(min(_CHUNK, remaining))
        if not chunk:
            raise SnapshotCorruptError("snapshot shorter than its trailer claims")
        h.update(chunk)
        remaining -= len(chunk)
    return h.digest()


class SnapshotReader:
    """A verified container; ``open_body()`` streams the StateMachine body."""

    def __init__(self, path: str) -> None:
        self.path = path
        size = os.path.getsize(path)
        min_size = _HEADER.size + _TRAILER_LEN
        if size < min_size:
            raise SnapshotCorruptError(f"{path}: {size} bytes is shorter than a snapshot")
        with open(path, "rb") as f:
            digest = _hash_prefix(f, size - _DIGEST_LEN)
            stored = f.read(_DIGEST_LEN)
            if digest != stored:
                raise SnapshotCorruptError(f"{path}: SHA-256 mismatch (torn or corrupted snapshot)")
            f.seek(size - _TRAILER_LEN)
            (body_len,) = _BODY_LEN.unpack(f.read(_BODY_LEN.size))
            f.seek(0)
            magic, version, index, raft_len = _HEADER.unpack(f.read(_HEADER.size))
            if magic != MAGIC:
                raise SnapshotCorruptError(f"{path}: bad magic {magic!r}")
            if version not in (VERSION, LIGHT_VERSION):
                raise SnapshotCorruptError(f"{path}: unsupported version {version}")
            if version == LIGHT_VERSION and body_len:
                raise SnapshotCorruptError(f"{path}: a light snapshot with a body")
            if _HEADER.size + raft_len + body_len + _TRAILER_LEN != size:
                raise SnapshotCorruptError(f"{path}: section lengths do not add up")
            try:
                self.raft_data: Any = pickle.loads(f.read(raft_len))
            except Exception as e:
                raise SnapshotCorruptError(f"{path}: raft metadata unreadable: {e}") from e
        self.state_index: int = index
        self.light = version == LIGHT_VERSION
        self._body_start = _HEADER.size + raft_len
        self._body_len = body_len

    def open_body(self) -> BinaryIO:
        """A buffered reader positioned on the body, reading exactly its bytes."""
        raw = _Window(open(self.path, "rb"), self._body_start, self._body_len)  # noqa: SIM115
        return cast(BinaryIO, io.BufferedReader(raw, _CHUNK))


class _Window(io.RawIOBase):
    """Read-only view of ``[start, start+length)`` of a file."""

    def __init__(self, f: io.BufferedReader, start: int, length: int) -> None:
        self._f = f
        self._remaining = length
        f.seek(start)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._remaining <= 0:
            return 0
        view = memoryview(b).cast("B")
        n = min(len(view), self._remaining)
        got = self._f.readinto(view[:n])
        if not got:
            return 0
        assert isinstance(got, int)
        self._remaining -= got
        return got

    def close(self) -> None:
        self._f.close()
        super().close()
