"""Many groups, one listening port, one link per pair of nodes: the group transport and the node listener.

``LinkTransport`` (one per group) is PySyncObj's transport of a group, a thin view of the
node links of its ticker shard (``raft.links``): ``send`` queues the pickled message on the
link to that node (sent with everything else of the pass in one frame), a peer is connected
while its link is up and its replica of the group is known to exist (it sent something, at
the least the ``HERE`` every replica sends when the link comes up or the group is created),
and connect/disconnect callbacks follow the link. Messages arrive
through ``deliver``, only from members (voters and learners) of the group.

``Listener`` (one per node, own thread) accepts, reads the preamble (``raft.connection``:
magic, version, channel, dialer nonce) with a bounded length and a short deadline, and hands
the socket and nonce to the link of the channel's ticker shard; garbage, unknown channels and
slow peers are closed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import pickle
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pysyncobj.transport import Transport

from raft import pysyncobj_patches as patches
from raft.connection import (
    MAX_GROUP_ID_BYTES,
    PICKLE_PROTOCOL,
    PREAMBLE_HEADER,
    PREAMBLE_MAGIC,
    PREAMBLE_VERSION,
    loads_data,
)
from raft.frame_crypto import NONCE_BYTES
from raft.links import NodeLinks
from raft.thread_names import name_os_thread

logger = logging.getLogger(__name__)

PREAMBLE_DEADLINE_S = 5.0
ACCEPT_PAUSE_S = 0.1  # after accept() ran out of descriptors or memory
# A group's first message to a peer's replica on a link that came up: "my replica exists" (answered once,
# ``ack``). A peer counts as connected for the group once its replica answered (or sent anything): a
# new group waits for its peers' replicas before it campaigns (``raft.campaigns``).
HERE = "txb_here"


def essential(message: Any) -> bool:
    """False for what PySyncObj sends again by itself when it is lost: heartbeats and plain AppendEntries.

    A part of a chunked transfer (a big entry, a snapshot) is essential: the follower
    reassembles the parts in order and a gap would corrupt the whole.
    """
    if not isinstance(message, dict) or message.get("type") != "append_entries":
        return True
    return "transmission" in message or "serialized" in message


class LinkTransport(Transport):  # type: ignore[misc]  # PySyncObj is untyped
    """A group's PySyncObj transport over its shard's node links (see module doc).

    Construct through ``functools.partial(LinkTransport, group_id=.., links=..)`` passed as
    SyncObj's ``transportClass``. The SyncObj must have no PySyncObj password: the links
    authenticate every frame.
    """

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any, *, group_id: str, links: NodeLinks) -> None:
        if syncObj.encryptor is not None:
            raise ValueError("LinkTransport: the node links authenticate frames; do not set a PySyncObj password")
        super().__init__(syncObj, selfNode, otherNodes)
        self._syncObj = syncObj
        self._selfNode = selfNode
        self._group_id = group_id
        self._channel = group_id.encode("utf-8")
        self._links = links
        self._nodes: set[Any] = set()
        self._nodeAddrToNode: dict[str, Any] = {}
        self._linked: set[Any] = set()  # link up, our HERE sent on it
        self._connected: set[Any] = set()  # ... and the peer's replica is known to exist
        self._last_pickled: tuple[dict[str, Any], bytes] | None = None
        self._destroyed = False
        syncObj.addOnTickCallback(self._onTick)
        for node in otherNodes:
            self.addNode(node)
        links.register(group_id, self)

    # --- PySyncObj Transport interface ---------------------------------------------------

    def addNode(self, node: Any) -> None:
        # A node added later (a learner, a new voter) is linked at the next tick if its link is up.
        if node in self._nodes:
            return
        self._nodes.add(node)
        self._nodeAddrToNode[node.address] = node
        self._links.want(node.address)

    def dropNode(self, node: Any) -> None:
        self._linked.discard(node)
        if node in self._connected:
            self._connected.discard(node)
            self._onNodeDisconnected(node)
        if node in self._nodes:
            self._nodes.discard(node)
            self._links.unwant(node.address)
        address = str(node.address)
        if self._nodeAddrToNode.get(address) is node:
            del self._nodeAddrToNode[address]

    def send(self, node: Any, message: Any) -> bool:
        if node not in self._connected:
            return False
        # An AppendEntries with entries is pickled once for all followers: PySyncObj builds one
        # equal message per follower (same entry objects), and pickling copies every payload.
        if isinstance(message, dict) and message.get("entries"):
            cached = self._last_pickled
            if cached is not None and _same_append_entries(cached[0], message):
                data = cached[1]
            else:
                data = pickle.dumps(message, PICKLE_PROTOCOL)
                self._last_pickled = (message, data)
        else:
            data = pickle.dumps(message, PICKLE_PROTOCOL)
        return self._links.queue(node.address, self._channel, data, essential(message))

    def destroy(self) -> None:
        self._destroyed = True
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        self._links.unregister(self._group_id, self)
        for node in self._nodes:
            self._links.unwant(node.address)
        self._nodes.clear()
        self._linked.clear()
        self._connected.clear()

    # --- the links' side (shard thread) ----------------------------------------------------

    def link_up(self, address: str) -> None:
        node = self._nodeAddrToNode.get(address)
        if node is not None and node not in self._linked and not self._destroyed:
            self._linked.add(node)
            self._send_here(node, ack=False)

    def link_down(self, address: str) -> None:
        node = self._nodeAddrToNode.get(address)
        if node is None:
            return
        self._linked.discard(node)
        if node in self._connected:
            self._connected.discard(node)
            self._onNodeDisconnected(node)

    def deliver(self, address: str, payload: bytes) -> bool:
        node = self._nodeAddrToNode.get(address)
        if node is None or self._destroyed:
            return False
        message = loads_data(payload)
        if node not in self._connected:
            self._present(node)
        if isinstance(message, dict) and message.get("type") == HERE:
            if not message.get("ack"):
                self._send_here(node, ack=True)
            return True
        self._onMessageReceived(node, message)
        return True

    def _send_here(self, node: Any, *, ack: bool) -> None:
        data = pickle.dumps({"type": HERE, "ack": ack}, PICKLE_PROTOCOL)
        self._links.queue(node.address, self._channel, data)

    def _present(self, node: Any) -> None:
        """The peer's replica exists (it sent us something): connected, if the link is up."""
        if node not in self._linked:
            self.link_up(node.address)
        if node in self._linked and node not in self._connected:
            self._connected.add(node)
            self._onNodeConnected(node)

    def _onTick(self) -> None:
        # Nodes whose link came up before this group existed (or before their addNode).
        if len(self._linked) == len(self._nodes):
            return
        for node in self._nodes:
            if node not in self._linked and self._links.is_up(node.address):
                self.link_up(node.address)

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

    ``dispatch(channel, dialer_nonce, sock)`` is called on the listener thread and must
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
            self._on_rejected(f"unknown channel {group_id!r:.80}")
            sock.close()

    def _drop(self, sock: socket.socket, why: str) -> None:
        logger.info("raft listener closing connection: %s", why)
        self._on_rejected(why)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)
        self._pending.pop(sock, None)
        sock.close()
