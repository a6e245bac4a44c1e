"""One TCP connection between two nodes for one group: preamble + frames.

Replaces ``pysyncobj.tcp_connection.TcpConnection`` (same interface, used by
``TCPTransport``):

* The dialing side first writes a raw *preamble* naming the group, so that
  all groups of a node share one listening port (see ``raft.transport``).
* Buffers are ``bytearray`` with a read/write offset: PySyncObj's
  ``bytes +=`` and re-slicing is quadratic in the backlog.
* No zlib (payloads are compact binary batches, and every node runs this code).
* Frames: ``<u32 length><Fernet token>``; the token wraps
  ``pickle(protocol 4)`` of the message. Frames longer than ``MAX_FRAME_BYTES``
  close the connection before anything is buffered or decrypted.

Nothing received is unpickled before Fernet authenticates it (the transport
refuses to run without a password), so an attacker without the password can
at most make us close the connection.

Thread-safety: not thread-safe. Every method runs in the owning group's
ticker thread (the poller callbacks included).
"""

from __future__ import annotations

import base64
import errno
import logging
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any

from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, _getAddrType, set_keepalive

logger = logging.getLogger(__name__)

PREAMBLE_MAGIC = b"TXRB"
PREAMBLE_VERSION = 1
PREAMBLE_HEADER = struct.Struct("<4sBH")  # magic, version, group id length
MAX_GROUP_ID_BYTES = 1024
MAX_FRAME_BYTES = 64 << 20
_LEN = struct.Struct("<I")
_COMPACT_AT = 1 << 20
_WOULD_BLOCK = (errno.EAGAIN, errno.EWOULDBLOCK)
PICKLE_PROTOCOL = 4


def encode_preamble(group_id: str) -> bytes:
    raw = group_id.encode("utf-8")
    if not raw or len(raw) > MAX_GROUP_ID_BYTES:
        raise ValueError(f"group id must be 1..{MAX_GROUP_ID_BYTES} bytes of UTF-8")
    return PREAMBLE_HEADER.pack(PREAMBLE_MAGIC, PREAMBLE_VERSION, len(raw)) + raw


class FrameBuffer:
    """Incoming byte stream -> complete frames, with an amortised O(n) buffer."""

    __slots__ = ("_buf", "_pos", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.max_frame = max_frame

    def feed(self, data: bytes) -> None:
        self._buf += data

    def __len__(self) -> int:
        return len(self._buf) - self._pos

    def next_frame(self) -> bytes | None:
        """The next complete frame payload, or None if incomplete.

        Raises ValueError if the announced length exceeds ``max_frame``.
        """
        buf, pos = self._buf, self._pos
        if len(buf) - pos < _LEN.size:
            return None
        (length,) = _LEN.unpack_from(buf, pos)
        if length > self.max_frame:
            raise ValueError(f"frame of {length} bytes exceeds limit {self.max_frame}")
        end = pos + _LEN.size + length
        if len(buf) < end:
            return None
        frame = bytes(buf[pos + _LEN.size : end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
            if end >= _COMPACT_AT and end * 2 >= len(buf):
                del buf[:end]
                self._pos = 0
        return frame

    def clear(self) -> None:
        self._buf = bytearray()
        self._pos = 0


def frame(payload: bytes) -> bytes:
    return _LEN.pack(len(payload)) + payload


class FrameConnection:
    """Drop-in replacement for PySyncObj's ``TcpConnection`` (see module doc)."""

    def __init__(
        self,
        poller: Any,
        onMessageReceived: Callable[[Any], None] | None = None,
        onConnected: Callable[[], None] | None = None,
        onDisconnected: Callable[[], None] | None = None,
        socket: socket.socket | None = None,
        timeout: float = 10.0,
        sendBufferSize: int = 2**16,
        recvBufferSize: int = 2**16,
        keepalive: tuple[int, int, int] | None = None,
        preamble: bytes | None = None,
        on_rejected: Callable[[str], None] | None = None,
    ) -> None:
        self.sendRandKey: bytes | None = None
        self.recvRandKey: bytes | None = None
        self.recvLastTimestamp = 0
        self.encryptor: Any = None
        self._poller = poller
        self._timeout = timeout
        self._keepalive = keepalive
        self._send_buffer_size = sendBufferSize
        self._recv_buffer_size = recvBufferSize
        self._preamble = preamble
        self._on_rejected = on_rejected
        self._on_message = onMessageReceived
        self._on_connected = onConnected
        self._on_disconnected = onDisconnected
        self._rbuf = FrameBuffer()
        self._wbuf = bytearray()
        self._wpos = 0
        self._last_read = monotonic_time()
        self._sock: Any = socket
        self._fileno: int | None = None
        self._state = CONNECTION_STATE.DISCONNECTED
        if socket is not None:
            self._fileno = socket.fileno()
            self._state = CONNECTION_STATE.CONNECTED
            self._set_keepalive()
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
        return int(self._state)

    def fileno(self) -> int | None:
        return self._fileno

    def getSendBufferSize(self) -> int:
        return len(self._wbuf) - self._wpos

    def connect(self, host: str | None, port: int) -> bool:
        if host is None:
            return False
        self._state = CONNECTION_STATE.DISCONNECTED
        self._fileno = None
        sock = socket.socket(_getAddrType(host), socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer_size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer_size)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self._sock = sock
        self._set_keepalive()
        self._rbuf.clear()
        self._wbuf = bytearray(self._preamble or b"")
        self._wpos = 0
        self._last_read = monotonic_time()
        try:
            sock.connect((host, port))
        except OSError as e:
            if e.errno not in (errno.EINPROGRESS, *_WOULD_BLOCK):
                sock.close()
                self._sock = None
                return False
        self._fileno = sock.fileno()
        self._state = CONNECTION_STATE.CONNECTING
        self._subscribe(POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)
        return True

    def send(self, message: Any) -> None:
        if self._state == CONNECTION_STATE.DISCONNECTED:
            return
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = pickle.dumps(message, PICKLE_PROTOCOL)
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(monotonic_time()))
        self._wbuf += _LEN.pack(len(data))
        self._wbuf += data
        self._try_send()

    def disconnect(self) -> None:
        need_callback = self._on_disconnected is not None and self._state != CONNECTION_STATE.DISCONNECTED
        self.sendRandKey = None
        self.recvRandKey = None
        self.recvLastTimestamp = 0
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        self._wbuf = bytearray()
        self._wpos = 0
        self._rbuf.clear()
        self._state = CONNECTION_STATE.DISCONNECTED
        if need_callback and self._on_disconnected is not None:
            self._on_disconnected()

    # --- internals ---------------------------------------------------------

    def _set_keepalive(self) -> None:
        if self._sock is not None and self._keepalive is not None:
            set_keepalive(self._sock, *self._keepalive)

    def _subscribe(self, mask: int) -> None:
        self._poller.subscribe(self._fileno, self._on_event, mask)

    def _on_event(self, descr: int, event: int) -> None:
        if descr != self._fileno:
            return  # stale event: the descriptor now belongs to someone else
        if event & POLL_EVENT_TYPE.ERROR:
            self.disconnect()
            return
        if self._timed_out():
            return
        if self._state == CONNECTION_STATE.CONNECTING:
            if self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            try:
                self._sock.getpeername()
            except OSError:
                return  # not connected yet (stale event for a reused descriptor)
            # The preamble must precede every PySyncObj frame on the wire.
            self._try_send()
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return
            if self._on_connected is not None:
                self._on_connected()
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return
            self._state = CONNECTION_STATE.CONNECTED
            self._last_read = monotonic_time()
            return
        if event & POLL_EVENT_TYPE.WRITE:
            self._try_send()
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return
            mask = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
            if self.getSendBufferSize() > 0:
                mask |= POLL_EVENT_TYPE.WRITE
            self._subscribe(mask)
        if event & POLL_EVENT_TYPE.READ:
            self._read_available()
            while self._state != CONNECTION_STATE.DISCONNECTED:
                message = self._parse_one()
                if message is None:
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
            if sent <= 0:
                return
            self._wpos += sent
        self._wbuf.clear()
        self._wpos = 0

    def _read_available(self) -> None:
        while self._sock is not None:
            try:
                incoming = self._sock.recv(self._recv_buffer_size)
            except OSError as e:
                if e.errno not in _WOULD_BLOCK:
                    self.disconnect()
                break
            if not incoming:
                self.disconnect()
                return
            self._rbuf.feed(incoming)
            if len(incoming) < self._recv_buffer_size:
                break
        self._last_read = monotonic_time()

    def _parse_one(self) -> Any:
        try:
            data = self._rbuf.next_frame()
        except ValueError as e:
            self._reject(str(e))
            return None
        if data is None:
            return None
        try:
            if self.encryptor:
                # decrypt() authenticates the whole token (timestamp included); reading the
                # timestamp from the token's first 9 bytes afterwards avoids Fernet's
                # extract_timestamp, which base64-decodes and HMAC-checks the frame a second time.
                plain = self.encryptor.decrypt(data)
                timestamp = _fernet_timestamp(data)
                if timestamp < self.recvLastTimestamp:
                    raise ValueError("replayed or reordered frame")
                self.recvLastTimestamp = timestamp
                data = plain
            message = pickle.loads(data)
            if self.recvRandKey:
                if not (isinstance(message, tuple) and len(message) == 2):
                    raise ValueError(f"frame without session key: {message!r:.100}")
                rand_key, message = message
                if rand_key != self.recvRandKey:
                    raise ValueError("wrong session key")
        except Exception as e:  # any failure to authenticate or decode closes the connection
            self._reject(f"{type(e).__name__}: {e}")
            return None
        return message

    def _reject(self, why: str) -> None:
        logger.warning(
            "raft connection rejected (fd %s, %s): %s",
            self._fileno,
            "outgoing" if self._preamble else "incoming",
            why,
        )
        if self._on_rejected is not None:
            self._on_rejected(why)
        self.disconnect()


def _fernet_timestamp(token: bytes) -> int:
    """The timestamp of a Fernet token: bytes 1..9 of its base64url decoding (first 12 chars)."""
    return int.from_bytes(base64.urlsafe_b64decode(bytes(token[:12]))[1:9], "big")
