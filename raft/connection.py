"""One authenticated TCP connection between two nodes: a node link's (``raft.links``).

The interface of ``pysyncobj.tcp_connection.TcpConnection``; ``group_id`` names the
connection's *channel* (a node link's channel). Wire protocol (dialer = the member
with the greater address, as in PySyncObj):

1. dialer -> acceptor, raw: preamble ``b"TXRB" | u8 version | u16 len |
   channel | 16-byte dialer nonce``. The node's listener reads it and hands
   the socket to the links of the channel (``raft.transport``).
2. acceptor -> dialer, raw: its 16-byte nonce, then an encrypted *accept*
   frame. Both sides now hold the session keys (``raft.frame_crypto``: they
   bind the cluster secret, both nonces and the channel).
3. Frames both ways: ``<u32 length><AES-GCM(plaintext)>``; the plaintext is
   decoded by ``decode`` (a node link's: a batch of its groups' messages,
   ``raft.link_frames``, whose first is the sender's hello).

Authentication: the dialer reports itself connected (``onConnected``) only
after the accept frame verified, the acceptor accepts messages only after
they verified; a frame that fails verification closes the connection.
Nothing is unpickled before it verified, and then only as plain data (``loads_data``: no class
is ever looked up, so a message cannot name code to run even with the cluster key). Until a connection has verified one
frame, frames are limited to ``HANDSHAKE_MAX_FRAME`` bytes and the handshake
to ``handshake_timeout`` seconds (``check_deadline``), so an unauthenticated
peer can neither make us buffer much nor hold a connection slot for long.

Buffers are ``bytearray`` with a read/write offset (PySyncObj's ``bytes +=``
and re-slicing is quadratic in the backlog); a frame is written straight to
the socket when nothing is queued before it. No zlib.

``decode`` turns a verified frame's plaintext into the message delivered (default: ``loads_data``;
a node link takes the bytes and unpacks its batch itself: ``raft.links``).

Thread-safety: not thread-safe. Every method runs in the owning group's
ticker thread (the poller callbacks included).
"""

from __future__ import annotations

import enum
import errno
import io
import logging
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any

from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, _getAddrType, set_keepalive

from raft import traffic
from raft.frame_crypto import NONCE_BYTES, FrameAuthError, FrameCipher, new_nonce

logger = logging.getLogger(__name__)

PREAMBLE_MAGIC = b"TXRB"
PREAMBLE_VERSION = 2
PREAMBLE_HEADER = struct.Struct("<4sBH")  # magic, version, group id length (then the id, then the nonce)
MAX_GROUP_ID_BYTES = 1024
MAX_FRAME_BYTES = 64 << 20
HANDSHAKE_MAX_FRAME = 4096
HANDSHAKE_TIMEOUT_S = 5.0
ACCEPT_MESSAGE = b"TXRB accept v2"
_LEN = struct.Struct("<I")
_COMPACT_AT = 1 << 20
_MIN_FREE = 64 << 10
_SHRINK_ABOVE = 4 << 20
_WOULD_BLOCK = (errno.EAGAIN, errno.EWOULDBLOCK)
PICKLE_PROTOCOL = 4


class _DataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a Raft message names no class ({module[:40]}.{name[:40]} refused)")


def loads_data(payload: bytes) -> Any:
    """A Raft message: pickled plain data only (dicts, lists, tuples, strings, bytes, numbers, None).

    Every global (a class, a function) is refused with ``pickle.UnpicklingError``: PySyncObj's
    messages and txbroker's own are plain data, and their commands travel as bytes inside.
    """
    return _DataUnpickler(io.BytesIO(payload)).load()


def encode_preamble(group_id: str, nonce: bytes) -> bytes:
    raw = group_id.encode("utf-8")
    if not raw or len(raw) > MAX_GROUP_ID_BYTES:
        raise ValueError(f"group id must be 1..{MAX_GROUP_ID_BYTES} bytes of UTF-8")
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"preamble nonce must be {NONCE_BYTES} bytes")
    return PREAMBLE_HEADER.pack(PREAMBLE_MAGIC, PREAMBLE_VERSION, len(raw)) + raw + nonce


class FrameBuffer:
    """Incoming byte stream -> raw prefix bytes and complete frames.

    One ``bytearray`` received into in place (``recv_into``): a frame is
    handed out as a ``memoryview`` of it, so the bytes are copied once by the
    kernel and once by decryption, nowhere else. A view returned by
    ``next_frame`` must be released before the next ``writable``/``feed``
    (the buffer may move or grow then). Consumed space is reused by moving
    the unread tail to the front; an idle buffer above ``_SHRINK_ABOVE``
    bytes is shrunk back.
    """

    __slots__ = ("_buf", "_end", "_start", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray(_MIN_FREE)
        self._start = 0
        self._end = 0
        self.max_frame = max_frame

    def __len__(self) -> int:
        return self._end - self._start

    def writable(self, min_free: int = _MIN_FREE) -> memoryview:
        """A view of the free space (at least ``min_free`` bytes) to receive into; then ``advance``."""
        buf, start, end = self._buf, self._start, self._end
        if len(buf) - end < min_free:
            if start:
                buf[: end - start] = buf[start:end]
                end -= start
                start = 0
            if len(buf) - end < min_free:
                buf.extend(bytes(max(min_free - (len(buf) - end), len(buf))))
            self._start, self._end = start, end
        return memoryview(buf)[end:]

    def advance(self, n: int) -> None:
        self._end += n

    def feed(self, data: bytes) -> None:
        with self.writable(len(data)) as view:
            view[: len(data)] = data
        self.advance(len(data))

    def take(self, n: int) -> bytes | None:
        """The next ``n`` raw bytes, or None if fewer are buffered."""
        if len(self) < n:
            return None
        start = self._start
        data = bytes(self._buf[start : start + n])
        self._consumed(start + n)
        return data

    def next_frame(self) -> memoryview | None:
        """A view of the next complete frame body (without its length header), or None if incomplete.

        Raises ValueError if the announced length exceeds ``max_frame``.
        """
        buf, pos = self._buf, self._start
        if self._end - pos < _LEN.size:
            return None
        (length,) = _LEN.unpack_from(buf, pos)
        if length > self.max_frame:
            raise ValueError(f"frame of {length} bytes exceeds limit {self.max_frame}")
        end = pos + _LEN.size + length
        if self._end < end:
            return None
        self._consumed(end)
        return memoryview(buf)[pos + _LEN.size : end]

    def _consumed(self, upto: int) -> None:
        if upto == self._end:  # empty: start over at the front (the data stays valid until the next write)
            self._start = self._end = 0
            if len(self._buf) > _SHRINK_ABOVE:
                self._buf = bytearray(_MIN_FREE)
        else:
            self._start = upto

    def clear(self) -> None:
        self._buf = bytearray(_MIN_FREE)
        self._start = self._end = 0


def frame(payload: bytes) -> bytes:
    """An unencrypted frame (tests and probes only: peers reject it)."""
    return _LEN.pack(len(payload)) + payload


class Phase(enum.Enum):
    """Handshake progress of one connection (see module doc)."""

    CLOSED = 0
    TCP_CONNECTING = 1  # dialer: TCP connect in progress, preamble queued
    AWAIT_NONCE = 2  # dialer: preamble sent, waiting for the acceptor's nonce
    AWAIT_ACCEPT = 3  # dialer: keys derived, waiting for the accept frame
    AWAIT_HELLO = 4  # acceptor: keys derived, nonce + accept frame queued, nothing verified yet
    ESTABLISHED = 5  # at least one frame from the peer verified


VALID_PREVIOUS: dict[Phase, frozenset[Phase]] = {
    Phase.CLOSED: frozenset(Phase),
    Phase.TCP_CONNECTING: frozenset({Phase.CLOSED}),
    Phase.AWAIT_NONCE: frozenset({Phase.TCP_CONNECTING}),
    Phase.AWAIT_ACCEPT: frozenset({Phase.AWAIT_NONCE}),
    Phase.AWAIT_HELLO: frozenset({Phase.CLOSED}),
    Phase.ESTABLISHED: frozenset({Phase.AWAIT_ACCEPT, Phase.AWAIT_HELLO}),
}

_PYSYNCOBJ_STATE = {
    Phase.CLOSED: CONNECTION_STATE.DISCONNECTED,
    Phase.TCP_CONNECTING: CONNECTION_STATE.CONNECTING,
    Phase.AWAIT_NONCE: CONNECTION_STATE.CONNECTING,
    Phase.AWAIT_ACCEPT: CONNECTION_STATE.CONNECTING,
    Phase.AWAIT_HELLO: CONNECTION_STATE.CONNECTED,
    Phase.ESTABLISHED: CONNECTION_STATE.CONNECTED,
}


class FrameConnection:
    """Drop-in replacement for PySyncObj's ``TcpConnection`` (see module doc).

    Dialer: built without ``socket``, with ``group_id``; ``connect()`` starts
    a fresh handshake each time. Acceptor: built with the accepted ``socket``
    and the ``peer_nonce`` its preamble carried.
    """

    def __init__(
        self,
        poller: Any,
        *,
        key: bytes,
        group_id: str,
        onMessageReceived: Callable[[Any], None] | None = None,
        onConnected: Callable[[], None] | None = None,
        onDisconnected: Callable[[], None] | None = None,
        socket: socket.socket | None = None,
        peer_nonce: bytes | None = None,
        timeout: float = 10.0,
        handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
        sendBufferSize: int = 2**16,
        recvBufferSize: int = 2**16,
        keepalive: tuple[int, int, int] | None = None,
        on_rejected: Callable[[str], None] | None = None,
        decode: Callable[[bytes], Any] = loads_data,
    ) -> None:
        self._poller = poller
        self._decode = decode
        self._key = key
        self._group_id = group_id
        self._timeout = timeout
        self._handshake_timeout = handshake_timeout
        self._keepalive = keepalive
        self._send_buffer_size = sendBufferSize
        self._recv_buffer_size = recvBufferSize
        self._on_rejected = on_rejected
        self._on_message = onMessageReceived
        self._on_connected = onConnected
        self._on_disconnected = onDisconnected
        self._dialer = socket is None
        self._nonce = b""
        self._cipher: FrameCipher | None = None
        self._rbuf = FrameBuffer(HANDSHAKE_MAX_FRAME)
        self._wbuf = bytearray()
        self._wpos = 0
        self._last_read = self._handshake_started = monotonic_time()
        self._sock: Any = socket
        self._fileno: int | None = None
        self._write_watched = False
        self._phase = Phase.CLOSED
        if socket is not None:
            if peer_nonce is None:
                raise ValueError("an accepted connection needs the dialer's preamble nonce")
            self._fileno = socket.fileno()
            self._set_keepalive()
            self._nonce = new_nonce()
            self._cipher = FrameCipher(key, group_id, peer_nonce, self._nonce, dialer=False)
            self._wbuf += self._nonce
            self._wbuf += self._cipher.seal(ACCEPT_MESSAGE)
            self._transition(Phase.AWAIT_HELLO)
            self._subscribe(POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)

    # --- PySyncObj TcpConnection interface ---------------------------------

    def setOnConnectedCallback(self, cb: Callable[[], None] | None) -> None:
        self._on_connected = cb

    def setOnMessageReceivedCallback(self, cb: Callable[[Any], None] | None) -> None:
        self._on_message = cb

    def setOnDisconnectedCallback(self, cb: Callable[[], None] | None) -> None:
        self._on_disconnected = cb

    @property
    def state(self) -> int:
        return int(_PYSYNCOBJ_STATE[self._phase])

    @property
    def phase(self) -> Phase:
        return self._phase

    def fileno(self) -> int | None:
        return self._fileno

    def getSendBufferSize(self) -> int:
        return len(self._wbuf) - self._wpos

    def connect(self, host: str | None, port: int) -> bool:
        if host is None or not self._dialer:
            return False
        if self._phase is not Phase.CLOSED:
            self.disconnect()
        self._fileno = None
        self._cipher = None
        sock = socket.socket(_getAddrType(host), socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer_size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer_size)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self._sock = sock
        self._set_keepalive()
        self._rbuf = FrameBuffer(HANDSHAKE_MAX_FRAME)
        self._nonce = new_nonce()
        self._wbuf = bytearray(encode_preamble(self._group_id, self._nonce))
        self._wpos = 0
        self._last_read = self._handshake_started = monotonic_time()
        try:
            sock.connect((host, port))
        except OSError as e:
            if e.errno not in (errno.EINPROGRESS, *_WOULD_BLOCK):
                sock.close()
                self._sock = None
                return False
        self._fileno = sock.fileno()
        self._transition(Phase.TCP_CONNECTING)
        self._subscribe(POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)
        return True

    def send(self, message: Any) -> None:
        self.send_pickled(pickle.dumps(message, PICKLE_PROTOCOL))

    def send_pickled(self, plaintext: bytes) -> None:
        """Send a message already pickled (the transport pickles once for all followers)."""
        if self._phase is Phase.CLOSED or self._cipher is None:
            return
        data = self._cipher.seal(plaintext)
        traffic.count_sent(len(data))
        if self._wpos == len(self._wbuf) and self._sock is not None and not self._timed_out():
            # Nothing queued: write straight from the frame; if the socket takes only part of it,
            # the frame itself (a fresh bytearray) becomes the write buffer.
            try:
                sent = self._sock.send(data)
            except OSError as e:
                if e.errno not in _WOULD_BLOCK:
                    self.disconnect()
                    return
                sent = 0
            if sent < len(data):
                self._wbuf, self._wpos = data, sent
                self._watch_writable(True)
            return
        self._wbuf += data
        self._try_send()

    def disconnect(self) -> None:
        need_callback = self._on_disconnected is not None and self._phase is not Phase.CLOSED
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        self._wbuf = bytearray()
        self._wpos = 0
        self._rbuf.clear()
        self._cipher = None
        self._transition(Phase.CLOSED)
        if need_callback and self._on_disconnected is not None:
            self._on_disconnected()

    def check_deadline(self) -> None:
        """Close the connection if its handshake or its peer's silence lasted too long.

        Called periodically by the transport: a connection with no socket
        events would otherwise never notice either.
        """
        if self._phase is Phase.CLOSED:
            return
        handshaking = self._phase is not Phase.ESTABLISHED
        if handshaking and monotonic_time() - self._handshake_started > self._handshake_timeout:
            self._reject(f"handshake not completed within {self._handshake_timeout}s")
            return
        self._timed_out()

    # --- internals ---------------------------------------------------------

    def _transition(self, to: Phase) -> None:
        if self._phase not in VALID_PREVIOUS[to]:
            raise RuntimeError(f"raft connection: invalid transition {self._phase.name} -> {to.name}")
        self._phase = to

    def _set_keepalive(self) -> None:
        if self._sock is not None and self._keepalive is not None:
            set_keepalive(self._sock, *self._keepalive)

    def _subscribe(self, mask: int) -> None:
        self._write_watched = bool(mask & POLL_EVENT_TYPE.WRITE)
        self._poller.subscribe(self._fileno, self._on_event, mask)

    def _watch_writable(self, on: bool) -> None:
        if self._fileno is not None and on != self._write_watched:
            self._subscribe(POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR | (POLL_EVENT_TYPE.WRITE if on else 0))

    def _on_event(self, descr: int, event: int) -> None:
        if descr != self._fileno:
            return  # stale event: the descriptor now belongs to someone else
        if event & POLL_EVENT_TYPE.ERROR:
            self.disconnect()
            return
        if self._timed_out():
            return
        if self._phase is Phase.TCP_CONNECTING:
            if self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            try:
                self._sock.getpeername()
            except OSError:
                return  # not connected yet (stale event for a reused descriptor)
            self._transition(Phase.AWAIT_NONCE)
            self._last_read = monotonic_time()
        if event & POLL_EVENT_TYPE.WRITE:
            self._try_send()
            if self._phase is Phase.CLOSED:
                return
        if event & POLL_EVENT_TYPE.READ:
            self._read_available()
            while self._phase is not Phase.CLOSED:
                message = self._parse_one()
                if message is _NOTHING:
                    break
                if self._on_message is not None:
                    self._on_message(message)

    def _timed_out(self) -> bool:
        # Checked on send too (PySyncObj semantics): a peer that stopped
        # talking is dropped even while we keep writing to it.
        if monotonic_time() - self._last_read > self._timeout:
            self.disconnect()
            return True
        return False

    def _try_send(self) -> None:
        if self._timed_out() or self._sock is None:
            return
        while self._wpos < len(self._wbuf):
            try:
                with memoryview(self._wbuf) as view, view[self._wpos :] as tail:
                    sent = self._sock.send(tail)
            except OSError as e:
                if e.errno not in _WOULD_BLOCK:
                    self.disconnect()
                    return
                break
            if sent <= 0:
                break
            self._wpos += sent
        if self._wpos == len(self._wbuf):
            self._wbuf.clear()
            self._wpos = 0
        elif self._wpos >= _COMPACT_AT:
            del self._wbuf[: self._wpos]
            self._wpos = 0
        self._watch_writable(self._wpos < len(self._wbuf))

    def _read_available(self) -> None:
        rbuf = self._rbuf
        while self._sock is not None:
            with rbuf.writable() as view:
                want = min(len(view), self._recv_buffer_size)
                try:
                    got = self._sock.recv_into(view, want)
                except OSError as e:
                    if e.errno not in _WOULD_BLOCK:
                        self.disconnect()
                    break
            if not got:
                self.disconnect()
                return
            rbuf.advance(got)
            if got < want:
                break
        self._last_read = monotonic_time()

    def _parse_one(self) -> Any:
        """The next verified message, or ``_NOTHING`` (incomplete, or the connection was closed)."""
        if self._phase is Phase.AWAIT_NONCE:
            peer_nonce = self._rbuf.take(NONCE_BYTES)
            if peer_nonce is None:
                return _NOTHING
            self._cipher = FrameCipher(self._key, self._group_id, self._nonce, peer_nonce, dialer=True)
            self._transition(Phase.AWAIT_ACCEPT)
        try:
            body = self._rbuf.next_frame()
        except ValueError as e:
            self._reject(str(e))
            return _NOTHING
        if body is None:
            return _NOTHING
        try:
            with body:
                if self._cipher is None:
                    return _NOTHING
                plain = self._cipher.open(body)
        except FrameAuthError as e:
            self._reject(str(e))
            return _NOTHING
        traffic.count_received(len(plain))
        if self._phase is Phase.AWAIT_ACCEPT:
            if plain != ACCEPT_MESSAGE:
                self._reject("unexpected handshake frame")
                return _NOTHING
            self._established()
            if self._on_connected is not None:
                self._on_connected()
            return self._parse_one() if self.state == CONNECTION_STATE.CONNECTED else _NOTHING
        if self._phase is Phase.AWAIT_HELLO:
            self._established()
        try:
            return self._decode(plain)
        except Exception as e:  # a verified peer sent something undecodable: drop the connection
            self._reject(f"undecodable frame: {type(e).__name__}: {e}")
            return _NOTHING

    def _established(self) -> None:
        self._transition(Phase.ESTABLISHED)
        self._rbuf.max_frame = MAX_FRAME_BYTES

    def _reject(self, why: str) -> None:
        logger.warning(
            "raft connection rejected (fd %s, %s, group %r): %s",
            self._fileno,
            "outgoing" if self._dialer else "incoming",
            self._group_id,
            why,
        )
        if self._on_rejected is not None:
            self._on_rejected(why)
        self.disconnect()


_NOTHING: Any = object()
