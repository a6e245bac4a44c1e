"""Many groups, one listening port: the per-group transport and the node listener.

Wire protocol of one connection: see ``raft.connection`` (raw preamble with
the group id and the dialer's nonce, the acceptor's nonce, then AES-GCM
frames under session keys bound to the cluster secret, both nonces and the
group id). On top of it PySyncObj's own (unencrypted-mode) handshake: the
dialer's first message is its Raft address, which must name a voter (or a
learner the leader replicates to) of the group.

``Listener`` (one per node, own thread) accepts, reads the preamble with a
bounded length and a short deadline, and hands the socket and nonce to the
owning group's ticker shard; garbage, unknown groups and slow peers are
closed. ``SharedPortTransport`` (one per group) is a ``TCPTransport``
without a server socket whose connections are ``FrameConnection``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import pickle
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from raft import pysyncobj_patches as patches
from raft.connection import (
    MAX_GROUP_ID_BYTES,
    PICKLE_PROTOCOL,
    PREAMBLE_HEADER,
    PREAMBLE_MAGIC,
    PREAMBLE_VERSION,
    FrameConnection,
)
from raft.frame_crypto import NONCE_BYTES
from raft.thread_names import name_os_thread

logger = logging.getLogger(__name__)

PREAMBLE_DEADLINE_S = 5.0
ACCEPT_PAUSE_S = 0.1  # after accept() ran out of descriptors or memory
DEADLINE_CHECK_PERIOD_S = 0.5


class SharedPortTransport(TCPTransport):  # type: ignore[misc]  # PySyncObj is untyped
    """``TCPTransport`` whose server socket is the node's shared ``Listener``.

    Construct through ``functools.partial(SharedPortTransport, group_id=..,
    key=.., on_rejected=..)`` passed as SyncObj's ``transportClass``; ``key``
    is ``raft.frame_crypto.cluster_key(secret)``. The SyncObj must have no
    PySyncObj password: this transport authenticates every frame itself.
    """

    def __init__(
        self,
        syncObj: Any,
        selfNode: Any,
        otherNodes: Any,
        *,
        group_id: str,
        key: bytes,
        on_rejected: Callable[[str], None] | None = None,
    ) -> None:
        if len(key) != 32:
            raise ValueError("SharedPortTransport needs the 32-byte cluster key (Raft traffic must be authenticated)")
        if syncObj.encryptor is not None:
            raise ValueError("SharedPortTransport authenticates frames itself: do not set a PySyncObj password")
        # Set before super().__init__, which calls addNode().
        self._key = key
        self._next_deadline_check = 0.0
        self._last_pickled: tuple[dict[str, Any], bytes] | None = None
        self._group_id = group_id
        self._on_rejected = on_rejected
        super().__init__(syncObj, selfNode, otherNodes)

    # No per-group server: the node's Listener owns the port.
    def _createServer(self) -> None:
        self._server = None

    def _maybeBind(self) -> None:
        if not self.ready:
            self._ready = True
            self._bindOverEvent.set()

    def _new_connection(self, sock: socket.socket | None = None, peer_nonce: bytes | None = None) -> FrameConnection:
        conf = self._syncObj.conf
        return FrameConnection(
            self._syncObj._poller,
            key=self._key,
            group_id=self._group_id,
            socket=sock,
            peer_nonce=peer_nonce,
            timeout=conf.connectionTimeout,
            sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize,
            keepalive=conf.tcp_keepalive,
            on_rejected=self._on_rejected,
        )

    def _onTick(self) -> None:
        # Handshake deadlines and silent peers: a connection without socket
        # events would never check them itself.
        now = time.monotonic()
        if now >= self._next_deadline_check:
            self._next_deadline_check = now + DEADLINE_CHECK_PERIOD_S
            for conn in [*self._connections.values(), *self._unknownConnections]:
                conn.check_deadline()
        super()._onTick()

    def addNode(self, node: Any) -> None:
        # Mirrors TCPTransport.addNode with our connection class. A node that has a connection already
        # (a learner becoming a voter: ``raft.membership_log``) keeps it.
        self._nodes.add(node)
        self._nodeAddrToNode[node.address] = node
        if node not in self._connections and self._shouldConnect(node):
            conn = self._new_connection()
            conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
            conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
            self._connections[node] = conn

    def send(self, node: Any, message: Any) -> bool:
        # As TCPTransport.send, but an AppendEntries with entries is pickled
        # once for all followers: PySyncObj builds one equal message per
        # follower (same entry objects), and pickling copies every payload.
        conn = self._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return False
        if isinstance(message, dict) and message.get("entries"):
            cached = self._last_pickled
            if cached is not None and _same_append_entries(cached[0], message):
                data = cached[1]
            else:
                data = pickle.dumps(message, PICKLE_PROTOCOL)
                self._last_pickled = (message, data)
            conn.send_pickled(data)
        else:
            conn.send(message)
        return bool(conn.state == CONNECTION_STATE.CONNECTED)

    def note_peers_alive(self, heard: Callable[[str], float | None]) -> None:
        """Count each peer's node heartbeat (``heard(address)``, ``time.monotonic``) as traffic of its connection."""
        now = time.monotonic()
        for node, conn in self._connections.items():
            at = heard(str(node.id))
            if at is not None:
                conn.note_peer_heard(now - at)

    def adopt_incoming(self, sock: socket.socket, peer_nonce: bytes) -> None:
        """Take over an accepted socket whose preamble named this group (ticker thread)."""
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._onNewIncomingConnection(self._new_connection(sock, peer_nonce))

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        # The first (authenticated) message must name a voter of this group.
        # PySyncObj would also accept 'readonly' and admin utility commands;
        # neither is part of our protocol.
        if not (isinstance(message, str) and message in self._nodeAddrToNode):
            if self._on_rejected is not None:
                self._on_rejected(f"unknown peer identity {message!r:.80}")
            conn.disconnect()
            self._unknownConnections.discard(conn)
            return
        super()._onIncomingMessageReceived(conn, message)

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        # PySyncObj bug (reference 4.4 item 3): a successful ACK sets the
        # follower's nextIndex back to acked+1 although later entries are
        # already in flight, so everything in flight is re-sent (and the
        # follower truncates and re-appends). Keep nextIndex monotonic on
        # plain successful ACKs; a 'reset' ACK still moves it backwards.
        if (
            isinstance(message, dict)
            and message.get("type") == "next_node_idx"
            and message.get("success")
            and not message.get("reset")
        ):
            next_index = patches.raft_next_index(self._syncObj)
            before = next_index.get(node)
            super()._onMessageReceived(node, message)
            after = next_index.get(node)
            if before is not None and after is not None and after < before:
                next_index[node] = before
            return
        super()._onMessageReceived(node, message)


def _same_append_entries(a: dict[str, Any], b: dict[str, Any]) -> bool:
    # Cheap fields first: equal payloads of different entries would cost a full memcmp each.
    return (
        a.get("prevLogIdx") == b.get("prevLogIdx")
        and a.get("commit_index") == b.get("commit_index")
        and len(a["entries"]) == len(b["entries"])
        and a == b
    )


class Listener:
    """The node's one Raft port: accept, read the preamble, dispatch.

    ``dispatch(group_id, dialer_nonce, sock)`` is called on the listener thread and must
    return quickly: True if it took ownership of ``sock``, False to close it.
    """

    def __init__(
        self,
        host: str,
        port: int,
        dispatch: Callable[[str, bytes, socket.socket], bool],
        on_rejected: Callable[[str], None],
    ) -> None:
        self._dispatch = dispatch
        self._on_rejected = on_rejected
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._sel = selectors.DefaultSelector()
        self._sel.register(sock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._pending: dict[socket.socket, tuple[bytearray, float]] = {}
        self._accept_paused_until: float | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"raft-listener-{port}", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5.0)
        for s in list(self._pending):
            s.close()
        self._pending.clear()
        self._sel.close()
        self._sock.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        name_os_thread()
        while not self._stopping:
            timeout = 1.0
            now = time.monotonic()
            if self._pending:
                timeout = max(0.0, min(timeout, self._oldest_deadline() - now))
            if self._accept_paused_until is not None:
                if now >= self._accept_paused_until:
                    self._accept_paused_until = None
                    self._sel.register(self._sock, selectors.EVENT_READ, None)
                else:
                    timeout = min(timeout, self._accept_paused_until - now)
            try:
                events = self._sel.select(timeout)
            except OSError:
                if self._stopping:
                    return
                raise
            for key, _ in events:
                if key.data == "wake":
                    return
                if key.fileobj is self._sock:
                    self._accept()
                else:
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    self._read_preamble(sock)
            now = time.monotonic()
            while self._pending and self._oldest_deadline() < now:
                self._drop(next(iter(self._pending)), "preamble deadline exceeded")

    def _oldest_deadline(self) -> float:
        # Every deadline is its accept time plus the same delay, and a socket enters ``_pending`` once: the
        # dict's insertion order is deadline order, so the first entry is the soonest (no scan of thousands
        # of sockets on each event while a node connects its groups).
        return next(iter(self._pending.values()))[1]

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except BlockingIOError:
                return
            except OSError as e:
                logger.warning("raft listener accept failed: %s", e)
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors or memory: the connection stays in the backlog and the socket stays
                    # readable; stop watching it for a moment rather than spin on accept().
                    self._sel.unregister(self._sock)
                    self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
                return
            sock.setblocking(False)
            self._pending[sock] = (bytearray(), time.monotonic() + PREAMBLE_DEADLINE_S)
            self._sel.register(sock, selectors.EVENT_READ, "pending")

    def _read_preamble(self, sock: socket.socket) -> None:
        buf, _ = self._pending[sock]
        # Read exactly the preamble: the bytes after it belong to the group's connection.
        need = PREAMBLE_HEADER.size - len(buf)
        if need <= 0:
            magic, version, length = PREAMBLE_HEADER.unpack_from(buf)
            need = PREAMBLE_HEADER.size + length + NONCE_BYTES - len(buf)
        try:
            chunk = sock.recv(need)
        except BlockingIOError:
            return
        except OSError as e:
            self._drop(sock, f"read error {e}")
            return
        if not chunk:
            self._drop(sock, "closed before preamble")
            return
        buf += chunk
        if len(buf) < PREAMBLE_HEADER.size:
            return
        magic, version, length = PREAMBLE_HEADER.unpack_from(buf)
        if magic != PREAMBLE_MAGIC or version != PREAMBLE_VERSION:
            self._drop(sock, "bad preamble magic/version")
            return
        if not 0 < length <= MAX_GROUP_ID_BYTES:
            self._drop(sock, "bad preamble group id length")
            return
        id_end = PREAMBLE_HEADER.size + length
        if len(buf) < id_end + NONCE_BYTES:
            return
        try:
            group_id = bytes(buf[PREAMBLE_HEADER.size : id_end]).decode("utf-8")
        except UnicodeDecodeError:
            self._drop(sock, "group id is not UTF-8")
            return
        nonce = bytes(buf[id_end : id_end + NONCE_BYTES])
        self._sel.unregister(sock)
        del self._pending[sock]
        try:
            taken = self._dispatch(group_id, nonce, sock)
        except Exception:
            logger.exception("raft listener dispatch failed for group %r", group_id)
            taken = False
        if not taken:
            self._on_rejected(f"unknown group {group_id!r:.80}")
            sock.close()

    def _drop(self, sock: socket.socket, why: str) -> None:
        logger.info("raft listener closing connection: %s", why)
        self._on_rejected(why)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)
        self._pending.pop(sock, None)
        sock.close()
