"""raft/connection.py: framing over partial reads, frame limits, preamble, auth."""

from __future__ import annotations

import errno
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pysyncobj.encryptor import getEncryptor
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE

from raft.connection import (
    MAX_FRAME_BYTES,
    PREAMBLE_HEADER,
    FrameBuffer,
    FrameConnection,
    encode_preamble,
    frame,
)


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=50),
)
def test_frames_survive_arbitrary_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    buf = FrameBuffer()
    got: list[bytes] = []
    pos, i = 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        buf.feed(stream[pos : pos + step])
        pos += step
        i += 1
        while (f := buf.next_frame()) is not None:
            got.append(f)
    assert got == payloads
    assert len(buf) == 0


def test_buffer_compacts_after_large_consumption() -> None:
    buf = FrameBuffer()
    big = b"x" * (3 << 20)
    buf.feed(frame(big) + frame(b"tail")[:3])
    assert buf.next_frame() == big
    assert buf.next_frame() is None
    buf.feed(frame(b"tail")[3:])
    assert buf.next_frame() == b"tail"


def test_oversize_frame_announcement_is_rejected_before_buffering() -> None:
    buf = FrameBuffer(max_frame=1000)
    buf.feed((1001).to_bytes(4, "little"))
    with pytest.raises(ValueError, match="exceeds"):
        buf.next_frame()
    assert MAX_FRAME_BYTES == 64 << 20


def test_preamble_encoding() -> None:
    raw = encode_preamble("topic-3")
    magic, version, length = PREAMBLE_HEADER.unpack_from(raw)
    assert (magic, version, length) == (b"TXRB", 1, 7)
    assert raw[PREAMBLE_HEADER.size :] == b"topic-3"
    with pytest.raises(ValueError, match="group id"):
        encode_preamble("")


class FakePoller:
    def __init__(self) -> None:
        self.subs: dict[int, Any] = {}

    def subscribe(self, fd: int, cb: Any, mask: int) -> None:
        self.subs[fd] = cb

    def unsubscribe(self, fd: int) -> None:
        self.subs.pop(fd, None)


class FakeSocket:
    """Scripted recv chunks; records sends."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.sent = bytearray()
        self.closed = False

    def fileno(self) -> int:
        return 42

    def recv(self, n: int) -> bytes:
        if not self.chunks:
            raise BlockingIOError(errno.EAGAIN, "again")
        c = self.chunks.pop(0)
        if len(c) > n:
            self.chunks.insert(0, c[n:])
            c = c[:n]
        return c

    def send(self, data: Any) -> int:
        n = min(len(data), 5)  # partial writes
        self.sent += bytes(data[:n])
        return n

    def setsockopt(self, *args: Any) -> None:
        pass

    def getsockopt(self, *args: Any) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


def _conn(chunks: list[bytes], password: str | None = None) -> tuple[FrameConnection, list[Any]]:
    received: list[Any] = []
    sock = FakeSocket(chunks)
    conn = FrameConnection(FakePoller(), socket=sock, recvBufferSize=16)  # type: ignore[arg-type]
    if password:
        conn.encryptor = getEncryptor(password)
    conn.setOnMessageReceivedCallback(received.append)
    return conn, received


def _wire(msg: Any, password: str) -> bytes:
    token: bytes = getEncryptor(password).encrypt_at_time(pickle.dumps(msg, 4), 100)
    return frame(token)


def test_connection_delivers_messages_split_across_reads() -> None:
    stream = _wire({"a": 1}, "pw") + _wire(b"x" * 100, "pw")
    chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    conn, received = _conn(chunks, "pw")
    for _ in range(len(chunks)):
        conn._on_event(42, POLL_EVENT_TYPE.READ)
    assert received == [{"a": 1}, b"x" * 100]
    assert conn.state == CONNECTION_STATE.CONNECTED


def test_connection_with_wrong_password_is_closed_without_delivery() -> None:
    conn, received = _conn([_wire("127.0.0.1:1", "other")], "pw")
    conn._on_event(42, POLL_EVENT_TYPE.READ)
    assert received == []
    assert conn.state == CONNECTION_STATE.DISCONNECTED


def test_oversize_frame_closes_connection() -> None:
    conn, received = _conn([(MAX_FRAME_BYTES + 1).to_bytes(4, "little") + b"zz"], "pw")
    conn._on_event(42, POLL_EVENT_TYPE.READ)
    assert received == []
    assert conn.state == CONNECTION_STATE.DISCONNECTED


def test_send_survives_partial_writes_in_order() -> None:
    conn, _ = _conn([])
    sock = conn._sock
    for i in range(3):
        conn.send(i)
    while conn.getSendBufferSize():
        conn._on_event(42, POLL_EVENT_TYPE.WRITE)
    buf = FrameBuffer()
    buf.feed(bytes(sock.sent))
    frames = [pickle.loads(f) for f in iter(buf.next_frame, None)]
    assert frames == [0, 1, 2]
