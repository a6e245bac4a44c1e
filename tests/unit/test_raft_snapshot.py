"""The snapshot container (raft/snapshot.py): round trip, reopen, corruption."""

from __future__ import annotations

import io
import pathlib
from typing import BinaryIO

import pytest

from raft.errors import SnapshotCorruptError
from raft.snapshot import SnapshotReader, write_snapshot

RAFT_DATA = ((b"\x01cmd", 41, 3), (b"\x01prev", 40, 3), {"127.0.0.1:1", "127.0.0.1:2"})


def _body(payload: bytes):  # type: ignore[no-untyped-def]
    def write(out: BinaryIO) -> None:
        out.write(payload)

    return write


@pytest.fixture
def snap(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "raft.dump"
    write_snapshot(str(path), RAFT_DATA, 57, _body(b"state-bytes" * 1000))
    return path


def test_round_trip_restores_raft_data_index_and_body(snap: pathlib.Path) -> None:
    reader = SnapshotReader(str(snap))
    assert reader.raft_data == RAFT_DATA
    assert reader.state_index == 57
    with reader.open_body() as body:
        assert body.read() == b"state-bytes" * 1000


def test_body_reader_stops_at_body_end_with_small_reads(snap: pathlib.Path) -> None:
    reader = SnapshotReader(str(snap))
    chunks = []
    with reader.open_body() as body:
        while chunk := body.read(7):
            chunks.append(chunk)
    assert b"".join(chunks) == b"state-bytes" * 1000


def test_empty_body_round_trips(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "d"
    write_snapshot(str(path), RAFT_DATA, 0, _body(b""))
    reader = SnapshotReader(str(path))
    with reader.open_body() as body:
        assert body.read() == b""


@pytest.mark.parametrize("offset", [0, 9, 30, 200, 5000, -40, -1])
def test_flipped_byte_anywhere_is_rejected(snap: pathlib.Path, offset: int) -> None:
    data = bytearray(snap.read_bytes())
    data[offset] ^= 0x40
    snap.write_bytes(bytes(data))
    with pytest.raises(SnapshotCorruptError):
        SnapshotReader(str(snap))


@pytest.mark.parametrize("keep", [0, 10, 100, -1, -33])
def test_truncated_file_is_rejected(snap: pathlib.Path, keep: int) -> None:
    data = snap.read_bytes()
    snap.write_bytes(data[:keep])
    with pytest.raises(SnapshotCorruptError):
        SnapshotReader(str(snap))


def test_appended_garbage_is_rejected(snap: pathlib.Path) -> None:
    with open(snap, "ab") as f:
        f.write(b"junk")
    with pytest.raises(SnapshotCorruptError):
        SnapshotReader(str(snap))


def test_body_writer_may_seek_and_write_in_pieces(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "d"

    def write(out: BinaryIO) -> None:
        for i in range(100):
            out.write(bytes([i]) * 1000)

    write_snapshot(str(path), RAFT_DATA, 5, write)
    with SnapshotReader(str(path)).open_body() as body:
        got = io.BytesIO(body.read()).getvalue()
    assert got == b"".join(bytes([i]) * 1000 for i in range(100))


def test_light_container_has_no_body_and_says_so(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "raft.dump"
    write_snapshot(str(path), RAFT_DATA, 90, None)
    reader = SnapshotReader(str(path))
    assert reader.light
    assert (reader.raft_data, reader.state_index) == (RAFT_DATA, 90)
    with reader.open_body() as body:
        assert body.read() == b""
    full = tmp_path / "full"
    write_snapshot(str(full), RAFT_DATA, 90, _body(b"x"))
    assert not SnapshotReader(str(full)).light


def test_light_container_claiming_a_body_is_rejected(tmp_path: pathlib.Path) -> None:
    import hashlib
    import struct

    # A well-formed container (valid checksum) whose header says light but which carries body bytes.
    path = tmp_path / "raft.dump"
    write_snapshot(str(path), RAFT_DATA, 90, _body(b"state"))
    data = bytearray(path.read_bytes()[:-32])
    struct.pack_into("<H", data, 8, 2)  # version 2 = light
    path.write_bytes(bytes(data) + hashlib.sha256(data).digest())
    with pytest.raises(SnapshotCorruptError, match="light snapshot with a body"):
        SnapshotReader(str(path))
