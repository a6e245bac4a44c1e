"""raft/connection.py and raft/frame_crypto.py: framing, handshake, authentication.

No sockets: the acceptor side runs over a scripted fake socket, the dialer
side of the handshake is covered with real sockets in
tests/integration/test_raft_cluster.py.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE

from raft.connection import (
    ACCEPT_MESSAGE,
    HANDSHAKE_MAX_FRAME,
    MAX_FRAME_BYTES,
    PREAMBLE_HEADER,
    FrameBuffer,
    FrameConnection,
    Phase,
    encode_preamble,
    frame,
)
from raft.frame_crypto import NONCE_BYTES, FrameAuthError, FrameCipher, cluster_key, new_nonce
from tests.raft_support.fake_socket import FakeSocket

SECRET = "unit-test-secret"
GROUP = "topic-3"


# --- FrameBuffer ----------------------------------------------------------------


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
            got.append(bytes(f))
            f.release()
    assert got == payloads
    assert len(buf) == 0


def test_buffer_reuses_space_after_large_consumption() -> None:
    buf = FrameBuffer()
    big = b"x" * (3 << 20)
    buf.feed(frame(big) + frame(b"tail")[:3])
    with buf.next_frame() as f:  # type: ignore[union-attr]
        assert f == big
    assert buf.next_frame() is None
    size = len(buf._buf)
    for _ in range(100):  # the space the big frame used is reused, not appended to
        buf.feed(frame(b"tail")[3:] + frame(b"tail")[:3])
        assert buf.next_frame() == b"tail"
    assert len(buf._buf) == size


def test_idle_buffer_shrinks_after_a_huge_frame() -> None:
    buf = FrameBuffer()
    buf.feed(frame(b"y" * (8 << 20)))
    with buf.next_frame() as f:  # type: ignore[union-attr]
        assert len(f) == 8 << 20
    assert len(buf._buf) <= 1 << 20


def test_raw_prefix_then_frames() -> None:
    buf = FrameBuffer()
    buf.feed(b"0123")
    assert buf.take(5) is None
    buf.feed(b"4" + frame(b"f"))
    assert buf.take(5) == b"01234"
    assert buf.next_frame() == b"f"


def test_oversize_frame_announcement_is_rejected_before_buffering() -> None:
    buf = FrameBuffer(max_frame=1000)
    buf.feed((1001).to_bytes(4, "little"))
    with pytest.raises(ValueError, match="exceeds"):
        buf.next_frame()
    assert MAX_FRAME_BYTES == 64 << 20


def test_preamble_encoding() -> None:
    nonce = bytes(range(NONCE_BYTES))
    raw = encode_preamble(GROUP, nonce)
    magic, version, length = PREAMBLE_HEADER.unpack_from(raw)
    assert (magic, version, length) == (b"TXRB", 2, 7)
    assert raw[PREAMBLE_HEADER.size :] == b"topic-3" + nonce
    with pytest.raises(ValueError, match="group id"):
        encode_preamble("", nonce)
    with pytest.raises(ValueError, match="nonce"):
        encode_preamble(GROUP, b"short")


# --- FrameCipher -------------------------------------------------------------------


def _pair(
    secret_d: str = SECRET, secret_a: str = SECRET, group_d: str = GROUP, group_a: str = GROUP
) -> tuple[FrameCipher, FrameCipher]:
    nd, na = new_nonce(), new_nonce()
    return (
        FrameCipher(cluster_key(secret_d), group_d, nd, na, dialer=True),
        FrameCipher(cluster_key(secret_a), group_a, nd, na, dialer=False),
    )


def _body(sealed: bytes) -> bytes:
    return sealed[4:]


def test_frames_round_trip_both_directions_in_order() -> None:
    dialer, acceptor = _pair()
    for i in range(5):
        assert acceptor.open(_body(dialer.seal(b"d%d" % i))) == b"d%d" % i
        assert dialer.open(_body(acceptor.seal(b"a%d" % i))) == b"a%d" % i


def test_large_frame_round_trips_and_wire_carries_no_plaintext() -> None:
    dialer, acceptor = _pair()
    payload = bytes(range(256)) * (32 << 10)  # 8 MiB
    sealed = dialer.seal(payload)
    assert len(sealed) == 4 + len(payload) + 16
    assert bytes(range(256)) not in sealed
    assert acceptor.open(memoryview(sealed)[4:]) == payload


@pytest.mark.parametrize("where", [0, 1, 100, -17, -1])
def test_tampered_frame_is_rejected(where: int) -> None:
    dialer, acceptor = _pair()
    body = bytearray(_body(dialer.seal(b"x" * 200)))
    body[where] ^= 0x01
    with pytest.raises(FrameAuthError):
        acceptor.open(bytes(body))


def test_truncated_or_extended_frame_is_rejected() -> None:
    dialer, acceptor = _pair()
    body = _body(dialer.seal(b"x" * 200))
    with pytest.raises(FrameAuthError):
        acceptor.open(body[:-1])
    with pytest.raises(FrameAuthError):
        acceptor.open(body + b"\x00")
    with pytest.raises(FrameAuthError):
        acceptor.open(b"short")


def test_replayed_and_reordered_frames_are_rejected() -> None:
    dialer, acceptor = _pair()
    first, second = _body(dialer.seal(b"one")), _body(dialer.seal(b"two"))
    with pytest.raises(FrameAuthError):
        acceptor.open(second)  # reordered (or first dropped)
    assert acceptor.open(first) == b"one"
    with pytest.raises(FrameAuthError):
        acceptor.open(first)  # replayed within the session
    assert acceptor.open(second) == b"two"


def test_recorded_session_does_not_verify_in_a_new_session() -> None:
    old_dialer, _ = _pair()
    recorded = _body(old_dialer.seal(b"append_entries"))
    _, new_acceptor = _pair()  # fresh nonces on both sides
    with pytest.raises(FrameAuthError):
        new_acceptor.open(recorded)


def test_reflected_frame_is_rejected() -> None:
    dialer, _ = _pair()
    with pytest.raises(FrameAuthError):
        dialer.open(_body(dialer.seal(b"mine")))  # each direction has its own key


def test_wrong_secret_or_group_id_is_rejected() -> None:
    dialer, acceptor = _pair(secret_d="other-secret")
    with pytest.raises(FrameAuthError):
        acceptor.open(_body(dialer.seal(b"x")))
    dialer, acceptor = _pair(group_d="topic-4")  # rewritten preamble group id
    with pytest.raises(FrameAuthError):
        acceptor.open(_body(dialer.seal(b"x")))


def test_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="secret"):
        cluster_key("")


# --- FrameConnection (acceptor side, fake socket) ----------------------------------


class FakePoller:
    def __init__(self) -> None:
        self.subs: dict[int, int] = {}

    def subscribe(self, fd: int, cb: Any, mask: int) -> None:
        self.subs[fd] = mask

    def unsubscribe(self, fd: int) -> None:
        self.subs.pop(fd, None)


class Acceptor:
    """An accepted FrameConnection plus the test's dialer-side cipher."""

    def __init__(self, dialer_secret: str = SECRET, max_send: int = 5) -> None:
        self.sock = FakeSocket(max_send=max_send)
        self.poller = FakePoller()
        self.received: list[Any] = []
        self.rejected: list[str] = []
        self.dialer_nonce = new_nonce()
        self.conn = FrameConnection(
            self.poller,
            key=cluster_key(SECRET),
            group_id=GROUP,
            socket=self.sock,  # type: ignore[arg-type]
            peer_nonce=self.dialer_nonce,
            recvBufferSize=16,
            on_rejected=self.rejected.append,
        )
        self.conn.setOnMessageReceivedCallback(self.received.append)
        self.flush()
        acceptor_nonce = bytes(self.sock.sent[:NONCE_BYTES])
        self.dialer = FrameCipher(cluster_key(dialer_secret), GROUP, self.dialer_nonce, acceptor_nonce, dialer=True)
        self.accept_frame = bytes(self.sock.sent[NONCE_BYTES:])

    def flush(self) -> None:
        while self.conn.getSendBufferSize():
            self.conn._on_event(42, POLL_EVENT_TYPE.WRITE)

    def deliver(self, stream: bytes, step: int = 7) -> None:
        self.sock.chunks += [stream[i : i + step] for i in range(0, len(stream), step)]
        while self.sock.chunks and self.conn.state != CONNECTION_STATE.DISCONNECTED:
            self.conn._on_event(42, POLL_EVENT_TYPE.READ)

    def sealed(self, msg: Any) -> bytes:
        return self.dialer.seal(pickle.dumps(msg, 4))


def test_acceptor_sends_nonce_and_a_verifiable_accept_frame() -> None:
    a = Acceptor()
    assert a.conn.phase is Phase.AWAIT_HELLO
    assert a.dialer.open(a.accept_frame[4:]) == ACCEPT_MESSAGE


def test_acceptor_delivers_verified_messages_split_across_reads() -> None:
    a = Acceptor()
    a.deliver(a.sealed("127.0.0.1:1") + a.sealed({"a": 1}) + a.sealed(b"x" * 100))
    assert a.received == ["127.0.0.1:1", {"a": 1}, b"x" * 100]
    assert a.conn.phase is Phase.ESTABLISHED
    assert a.conn.state == CONNECTION_STATE.CONNECTED


def test_large_message_after_handshake_is_delivered() -> None:
    a = Acceptor()
    big = {"entries": [(b"y" * (1 << 20), 7, 1)]}
    a.deliver(a.sealed("127.0.0.1:1") + a.sealed(big), step=65536)
    assert a.received == ["127.0.0.1:1", big]


def test_wrong_secret_closes_without_delivery() -> None:
    a = Acceptor(dialer_secret="wrong")
    a.deliver(a.sealed("127.0.0.1:1"))
    assert a.received == []
    assert a.conn.state == CONNECTION_STATE.DISCONNECTED
    assert a.sock.closed and a.rejected


def test_tampered_frame_closes_and_nothing_after_it_is_delivered() -> None:
    a = Acceptor()
    good = a.sealed("127.0.0.1:1")
    bad = bytearray(a.sealed({"type": "append_entries"}))
    bad[-20] ^= 0x80
    a.deliver(good + bytes(bad) + a.sealed("after"))
    assert a.received == ["127.0.0.1:1"]
    assert a.conn.state == CONNECTION_STATE.DISCONNECTED


def test_replayed_frame_closes_the_connection() -> None:
    a = Acceptor()
    hello = a.sealed("127.0.0.1:1")
    a.deliver(hello + hello)
    assert a.received == ["127.0.0.1:1"]
    assert a.conn.state == CONNECTION_STATE.DISCONNECTED


def test_unencrypted_pickle_is_never_unpickled() -> None:
    a = Acceptor()
    a.deliver(frame(pickle.dumps("127.0.0.1:1")))
    assert a.received == []
    assert a.conn.state == CONNECTION_STATE.DISCONNECTED


def test_large_frame_before_authentication_is_refused_unbuffered() -> None:
    a = Acceptor()
    a.deliver((HANDSHAKE_MAX_FRAME + 1).to_bytes(4, "little") + b"zz")
    assert a.conn.state == CONNECTION_STATE.DISCONNECTED
    assert "exceeds" in a.rejected[0]


def test_oversize_frame_after_authentication_closes_connection() -> None:
    a = Acceptor()
    a.deliver(a.sealed("127.0.0.1:1") + (MAX_FRAME_BYTES + 1).to_bytes(4, "little") + b"zz")
    assert a.received == ["127.0.0.1:1"]
    assert a.conn.state == CONNECTION_STATE.DISCONNECTED


def test_handshake_deadline_closes_a_silent_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    import raft.connection as connection

    a = Acceptor()
    now = connection.monotonic_time()
    monkeypatch.setattr(connection, "monotonic_time", lambda: now + connection.HANDSHAKE_TIMEOUT_S + 1)
    a.conn.check_deadline()
    assert a.conn.state == CONNECTION_STATE.DISCONNECTED
    assert "handshake" in a.rejected[0]


def test_send_survives_partial_writes_in_order() -> None:
    a = Acceptor()
    for i in range(3):
        a.conn.send(i)
    a.flush()
    buf = FrameBuffer()
    buf.feed(bytes(a.sock.sent[NONCE_BYTES:]))
    frames = [bytes(f) for f in iter(buf.next_frame, None)]
    assert a.dialer.open(frames[0]) == ACCEPT_MESSAGE
    assert [pickle.loads(a.dialer.open(f)) for f in frames[1:]] == [0, 1, 2]


def test_unsent_tail_waits_for_writability() -> None:
    a = Acceptor(max_send=1 << 30)
    a.sock.max_send = 10
    a.conn.send(b"z" * 1000)  # nothing queued: written directly, the rest buffered
    assert a.conn.getSendBufferSize() > 0
    assert a.poller.subs[42] & POLL_EVENT_TYPE.WRITE
    a.sock.max_send = 1 << 30
    a.flush()
    assert not a.poller.subs[42] & POLL_EVENT_TYPE.WRITE
    buf = FrameBuffer()
    buf.feed(bytes(a.sock.sent[NONCE_BYTES:]))
    accept, message = [bytes(f) for f in iter(buf.next_frame, None)]
    assert a.dialer.open(accept) == ACCEPT_MESSAGE
    assert pickle.loads(a.dialer.open(message)) == b"z" * 1000


def test_frames_are_identical_without_encrypt_into(monkeypatch: pytest.MonkeyPatch) -> None:
    import raft.frame_crypto as frame_crypto

    nd, na = new_nonce(), new_nonce()
    key = cluster_key(SECRET)
    fast = FrameCipher(key, GROUP, nd, na, dialer=True).seal(b"payload" * 100)
    monkeypatch.setattr(frame_crypto, "_HAS_ENCRYPT_INTO", False)
    slow = FrameCipher(key, GROUP, nd, na, dialer=True).seal(b"payload" * 100)
    assert fast == slow


class _Named:
    """Any class: a message naming one is refused, whatever the class does when built."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("ran code from a Raft message",))


def test_raft_messages_unpickle_as_plain_data_and_a_message_naming_a_class_is_refused() -> None:
    import pickle

    from raft.connection import PICKLE_PROTOCOL, loads_data

    message = {"type": "append_entries", "term": 3, "entries": [(b"cmd", 7, 3)], "x": None, "f": 1.5, "s": {1}}
    assert loads_data(pickle.dumps(message, PICKLE_PROTOCOL)) == message
    for hostile in (_Named(), print, {"type": "append_entries", "entries": [_Named()]}, ValueError("x")):
        with pytest.raises(pickle.UnpicklingError, match="names no class"):
            loads_data(pickle.dumps(hostile, PICKLE_PROTOCOL))
