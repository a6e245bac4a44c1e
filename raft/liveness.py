"""Node liveness: one authenticated heartbeat per pair of nodes, whatever the number of groups they share.

Quiescent groups (``raft.quiescence``) stop their per-group heartbeats; what keeps their
followers from campaigning is this: each pair of nodes keeps one connection on the Raft port
(preamble group id ``LIVENESS_CHANNEL``, which no group can have: ``/`` is not allowed in
topic names), dialed by the member with the greater address as PySyncObj's groups are, and
both ends send ``ALIVE`` every heartbeat interval over it.

Security: the connection is a ``raft.connection.FrameConnection`` like every group's: AES-GCM
frames under session keys bound to the cluster key and both ends' fresh nonces, so a recorded
heartbeat replayed later (to either end) fails authentication, and a sequence number per
frame rejects a frame replayed within the session. The dialer's first message names it; it
must be a voter of some group of this node.

*Incarnation*: 8 random bytes per process start, sent in the hello. A peer whose incarnation
changed restarted: its replicas may have lost what they had not written, so every group
shared with it wakes (``on_restart``). A peer not heard for ``lapse_s`` lapsed (``on_lapse``,
once per lapse): the groups it is part of wake and run Raft's own heartbeats and election
timers again.

Threading: ``tick``, ``adopt`` and every connection callback run on the owning ticker shard's
thread. ``heard`` and ``incarnation_of`` read single dict entries and may be called from any
thread.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj.tcp_connection import CONNECTION_STATE

from raft.connection import FrameConnection

logger = logging.getLogger(__name__)

LIVENESS_CHANNEL = "txb/node-liveness"
HELLO = "hello"
ALIVE = "alive"
PEER_REFRESH_S = 1.0


def should_dial(self_address: str, peer: str) -> bool:
    """The member with the greater address dials (PySyncObj's rule for its groups)."""
    return self_address > peer


@dataclass(slots=True)
class _Link:
    """This node's connection to one peer node and what it last heard from it."""

    conn: FrameConnection | None = None
    next_dial: float = 0.0
    next_send: float = 0.0
    introduced: bool = False  # our hello went out on ``conn``


class NodeLiveness:
    """Heartbeats per pair of nodes (see module doc). A ``raft.ticker.Tickable`` of its shard.

    ``peers()`` names the nodes to keep links with (any thread may be asked; called on the
    shard every ``PEER_REFRESH_S``). ``poller`` is the shard's poller seen through a proxy that
    ticks this object on socket events (``raft.ticker.ProxyPoller``).
    """

    def __init__(
        self,
        self_address: str,
        key: bytes,
        poller: Any,
        *,
        heartbeat_s: float,
        lapse_s: float,
        connection_timeout_s: float,
        retry_s: float,
        peers: Callable[[], set[str]],
        on_lapse: Callable[[str], None],
        on_restart: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group_id = LIVENESS_CHANNEL
        self.self_address = self_address
        self.incarnation = os.urandom(8).hex()
        self._key = key
        self._poller = poller
        self._heartbeat_s = heartbeat_s
        self.lapse_s = lapse_s
        self._timeout_s = connection_timeout_s
        self._retry_s = retry_s
        self._peers_fn = peers
        self._on_lapse = on_lapse
        self._on_restart = on_restart
        self._clock = clock
        self._peers: set[str] = set()
        self._next_peer_refresh = 0.0
        self._links: dict[str, _Link] = {}
        self._heard: dict[str, float] = {}
        self._incarnations: dict[str, str] = {}
        self._lapsed: set[str] = set()
        self._unidentified: set[FrameConnection] = set()
        self._closed = False
        self._last_tick: float | None = None
        self.heartbeats_sent = 0
        self.heartbeats_received = 0

    # --- any thread ------------------------------------------------------------------------

    def heard(self, address: str) -> float | None:
        """When (``time.monotonic``) this node last heard ``address``'s node; None: never."""
        return self._heard.get(address)

    def incarnation_of(self, address: str) -> str | None:
        return self._incarnations.get(address)

    def peers(self) -> frozenset[str]:
        return frozenset(self._peers)

    # --- shard thread ------------------------------------------------------------------------

    def tick(self) -> None:
        if self._closed:
            return
        now = self._clock()
        previous, self._last_tick = self._last_tick, now
        # A late tick (this node's ticker stalled) judges nothing: the peers' heartbeats are
        # still unread in the sockets, and a lapse now would wake groups of healthy peers.
        on_time = previous is not None and now - previous < self.lapse_s / 2
        if now >= self._next_peer_refresh:
            self._next_peer_refresh = now + PEER_REFRESH_S
            self._refresh_peers()
        for peer in self._peers:
            link = self._links.get(peer)
            if link is None:
                link = self._links[peer] = _Link()
            self._maintain(peer, link, now)
        for peer in self._peers if on_time else ():
            heard = self._heard.get(peer)
            if heard is not None and now - heard >= self.lapse_s and peer not in self._lapsed:
                self._lapsed.add(peer)
                logger.info("node liveness: %s not heard for %.2fs", peer, now - heard)
                self._notify(self._on_lapse, peer)
        for conn in list(self._unidentified):
            conn.check_deadline()
            if conn.state == CONNECTION_STATE.DISCONNECTED:
                self._unidentified.discard(conn)

    def _refresh_peers(self) -> None:
        peers = set(self._peers_fn()) - {self.self_address}
        for gone in self._peers - peers:
            link = self._links.pop(gone, None)
            if link is not None and link.conn is not None:
                link.conn.disconnect()
        self._peers = peers

    def _maintain(self, peer: str, link: _Link, now: float) -> None:
        conn = link.conn
        if conn is not None:
            conn.check_deadline()
        connected = conn is not None and conn.state == CONNECTION_STATE.CONNECTED
        if not connected and should_dial(self.self_address, peer) and now >= link.next_dial:
            if conn is None or conn.state == CONNECTION_STATE.DISCONNECTED:
                link.next_dial = now + self._retry_s
                self._dial(peer, link)
            return
        if connected and conn is not None and link.introduced and now >= link.next_send:
            link.next_send = now + self._heartbeat_s
            conn.send((ALIVE,))
            self.heartbeats_sent += 1

    def _dial(self, peer: str, link: _Link) -> None:
        host, _, port = peer.rpartition(":")
        conn = self._connection()
        link.conn = conn
        link.introduced = False
        conn.setOnConnectedCallback(lambda: self._introduce(peer, conn))
        conn.setOnMessageReceivedCallback(lambda message: self._on_message(peer, conn, message))
        conn.connect(host.strip("[]"), int(port))

    def _connection(self, sock: socket.socket | None = None, peer_nonce: bytes | None = None) -> FrameConnection:
        return FrameConnection(
            self._poller,
            key=self._key,
            group_id=LIVENESS_CHANNEL,
            socket=sock,
            peer_nonce=peer_nonce,
            timeout=self._timeout_s,
        )

    def _introduce(self, peer: str, conn: FrameConnection) -> None:
        link = self._links.get(peer)
        if link is None or link.conn is not conn:
            conn.disconnect()
            return
        conn.send((HELLO, self.self_address, self.incarnation))
        link.introduced = True
        link.next_send = 0.0

    def adopt(self, sock: socket.socket, peer_nonce: bytes) -> None:
        """Take over an accepted socket whose preamble named ``LIVENESS_CHANNEL``."""
        if self._closed:
            sock.close()
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = self._connection(sock, peer_nonce)
        self._unidentified.add(conn)
        conn.setOnMessageReceivedCallback(lambda message: self._on_first_message(conn, message))

    def _on_first_message(self, conn: FrameConnection, message: Any) -> None:
        self._unidentified.discard(conn)
        peer = _hello_address(message)
        if peer is None or peer not in self._peers or should_dial(self.self_address, peer):
            logger.warning("node liveness: refusing a dialer that introduced itself as %r", message)
            conn.disconnect()
            return
        link = self._links.get(peer)
        if link is None:
            link = self._links[peer] = _Link()
        if link.conn is not None and link.conn is not conn:
            link.conn.disconnect()  # the peer redialed: its old connection is dead
        link.conn = conn
        conn.setOnMessageReceivedCallback(lambda m: self._on_message(peer, conn, m))
        self._on_message(peer, conn, message)
        conn.send((HELLO, self.self_address, self.incarnation))
        link.introduced = True
        link.next_send = 0.0

    def _on_message(self, peer: str, conn: FrameConnection, message: Any) -> None:
        link = self._links.get(peer)
        if link is None or link.conn is not conn:
            return
        if not isinstance(message, tuple) or not message:
            return
        if message[0] == HELLO:
            if _hello_address(message) != peer:
                logger.warning("node liveness: %s introduced itself as %r", peer, message)
                conn.disconnect()
                return
            incarnation = str(message[2])
            before = self._incarnations.get(peer)
            self._incarnations[peer] = incarnation
            if before is not None and before != incarnation:
                logger.info("node liveness: %s restarted", peer)
                self._notify(self._on_restart, peer)
        elif message[0] != ALIVE:
            return
        self._heard[peer] = self._clock()
        self.heartbeats_received += 1
        self._lapsed.discard(peer)

    def _notify(self, fn: Callable[[str], None], peer: str) -> None:
        try:
            fn(peer)
        except Exception:
            logger.exception("node liveness: callback for %s failed", peer)

    def close(self) -> None:
        self._closed = True
        for link in self._links.values():
            if link.conn is not None:
                link.conn.disconnect()
        for conn in self._unidentified:
            conn.disconnect()
        self._links.clear()
        self._unidentified.clear()


def _hello_address(message: Any) -> str | None:
    if isinstance(message, tuple) and len(message) == 3 and message[0] == HELLO and isinstance(message[1], str):
        return message[1]
    return None
