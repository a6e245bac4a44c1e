"""Node links: one authenticated connection per pair of nodes (and ticker shard) carrying every group's messages.

Each ticker shard of a node runs one ``NodeLinks`` (a ``raft.ticker.Tickable`` of the shard,
registered under ``channel_for(shard index)``); it keeps one link to every peer node its
groups (or the node's groups, ``peers()``) share. A link is a ``raft.connection.FrameConnection``
whose preamble names the shard's link channel, which no group can have (``/`` is not allowed
in topic names): AES-GCM frames under session keys bound to the cluster key, both ends' fresh
nonces and the channel, a sequence number per frame (a replayed, reordered or modified frame
fails and closes the link), nothing decoded before it verified, handshake frames and time
bounded. The member with the greater address dials, as PySyncObj's groups do.

Identity: each end's first message is a hello naming its Raft address and *incarnation*
(8 random bytes per process start); the acceptor takes a dialer only if it names a peer it
expects and that should dial it. A link is *up* once the peer's hello verified on it. Groups
see the link through their ``raft.transport.LinkTransport``: connected while the link is up,
a disconnect (and later a connect) whenever it goes down and comes back, so a peer's restart
shows as a reconnect. A message for a group is delivered only if the sending node is a member
(voter or learner) of the receiver's replica; a message for a group this node does not have
(yet) is dropped and counted (PySyncObj retransmits).

Coalescing: what the shard's groups send during one ticker pass is queued per link and goes
out at the end of the pass as one frame per link (``raft.link_frames``: split at
``MAX_BATCH_BYTES``). Back-pressure: a link whose unsent bytes exceed ``send_buffer_bytes``
refuses what PySyncObj sends again by itself (heartbeats, plain AppendEntries) instead of
buffering without bound; parts of a chunked transfer are never dropped.

Liveness: both ends send ``ALIVE`` on every link each heartbeat interval when nothing else
went out; whatever arrives on a link counts as hearing the peer (``heard``). The shard-0
instance (``judge=True``) is the node liveness of quiescent groups (``raft.quiescence``): a
peer not heard for ``lapse_s`` lapsed (``on_lapse``, once per lapse); a changed incarnation
means it restarted (``on_restart``). A link silent for ``silence_s`` (a half-open connection
after a network cut) is closed and re-dialed.

Thread-safety: shard thread only, except ``heard``, ``incarnation_of``, ``peers`` and
``stats`` (single reads, any thread).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pysyncobj.tcp_connection import CONNECTION_STATE

from raft import link_frames
from raft.connection import PICKLE_PROTOCOL, FrameConnection, loads_data

logger = logging.getLogger(__name__)

LINK_CHANNEL = "txb/node-link"
HELLO = "hello"
ALIVE = "alive"
PEER_REFRESH_S = 1.0
SEND_BUFFER_BYTES = 32 << 20
SOCKET_BUFFER_BYTES = 4 << 20


def channel_for(shard_index: int) -> str:
    """The preamble channel of the links of ticker shard ``shard_index``."""
    return LINK_CHANNEL if shard_index == 0 else f"{LINK_CHANNEL}/{shard_index}"


def shard_of_channel(channel: str) -> int | None:
    """The shard index a link channel names; None if ``channel`` is no link channel."""
    if channel == LINK_CHANNEL:
        return 0
    prefix = LINK_CHANNEL + "/"
    if channel.startswith(prefix) and channel[len(prefix) :].isdigit() and len(channel) - len(prefix) <= 4:
        return int(channel[len(prefix) :])
    return None


def should_dial(self_address: str, peer: str) -> bool:
    """The member with the greater address dials (PySyncObj's rule for its groups)."""
    return self_address > peer


class Endpoint(Protocol):
    """A group's side of the links (``raft.transport.LinkTransport``)."""

    def link_up(self, address: str) -> None: ...

    def link_down(self, address: str) -> None: ...

    def deliver(self, address: str, payload: bytes) -> bool:
        """Hand a message from ``address`` to the group; False (nothing unpickled) if it is no member."""
        ...


@dataclass(slots=True)
class LinkStats:
    """Counters of one ``NodeLinks`` (or their sum over a node's shards)."""

    frames_sent: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    dropped_unknown_group: int = 0
    dropped_not_member: int = 0
    dropped_backpressure: int = 0
    links_up: int = 0

    def add(self, other: LinkStats) -> LinkStats:
        return LinkStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})


@dataclass(slots=True)
class _Link:
    """This node's link to one peer node."""

    conn: FrameConnection | None = None
    next_dial: float = 0.0
    last_sent: float = float("-inf")
    up: bool = False  # the peer's hello verified on ``conn``
    outbox: list[link_frames.Item] = field(default_factory=list)
    outbox_bytes: int = 0


class NodeLinks:
    """The links of one ticker shard (see module doc). A ``raft.ticker.Tickable`` of its shard.

    ``peers()`` names nodes to keep links with beside those of the registered groups (any
    thread may be asked; called on the shard every ``PEER_REFRESH_S``). ``poller`` is the
    shard's poller seen through a proxy that ticks this object on socket events
    (``raft.ticker.ProxyPoller``). ``mark_dirty(group_id)`` has the shard tick a group that
    received a message. ``forward(group_id, address, payload)`` takes a message for a group
    this shard does not run (a peer with another shard count); False: no such group here.
    """

    def __init__(
        self,
        self_address: str,
        key: bytes,
        poller: Any,
        *,
        index: int = 0,
        heartbeat_s: float,
        lapse_s: float,
        silence_s: float,
        retry_s: float,
        peers: Callable[[], set[str]],
        on_lapse: Callable[[str], None] | None = None,
        on_restart: Callable[[str], None] | None = None,
        on_rejected: Callable[[str], None] | None = None,
        mark_dirty: Callable[[str], None] | None = None,
        forward: Callable[[str, str, bytes], bool] | None = None,
        judge: bool = True,
        send_buffer_bytes: int = SEND_BUFFER_BYTES,
        incarnation: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group_id = channel_for(index)
        self.self_address = self_address
        self.incarnation = incarnation or os.urandom(8).hex()
        self._key = key
        self._poller = poller
        self._heartbeat_s = heartbeat_s
        self.lapse_s = lapse_s
        self._silence_s = silence_s
        self._retry_s = retry_s
        self._peers_fn = peers
        self._on_lapse = on_lapse
        self._on_restart = on_restart
        self._on_rejected = on_rejected
        self._mark_dirty = mark_dirty
        self._forward = forward
        self._judge = judge
        self._send_buffer_bytes = send_buffer_bytes
        self._clock = clock
        self._peers: set[str] = set()
        self._next_peer_refresh = 0.0
        self._links: dict[str, _Link] = {}
        self._pending: list[_Link] = []  # links with a non-empty outbox
        self._endpoints: dict[str, Endpoint] = {}
        self._wanted: Counter[str] = Counter()  # peer address -> members of this shard's groups naming it
        self._heard: dict[str, float] = {}
        self._incarnations: dict[str, str] = {}
        self._lapsed: set[str] = set()
        self._unidentified: set[FrameConnection] = set()
        self._closed = False
        self._last_tick: float | None = None
        self.stats = LinkStats()
        self.heartbeats_sent = 0
        self.heartbeats_received = 0

    # --- any thread ------------------------------------------------------------------------

    def heard(self, address: str) -> float | None:
        """When (``clock``, ``time.monotonic``) this shard last heard ``address``'s node; None: never."""
        return self._heard.get(address)

    def incarnation_of(self, address: str) -> str | None:
        return self._incarnations.get(address)

    def peers(self) -> frozenset[str]:
        return frozenset(self._peers)

    def is_up(self, address: str) -> bool:
        link = self._links.get(address)
        return link is not None and link.up

    def current_stats(self) -> LinkStats:
        ups = sum(1 for link in list(self._links.values()) if link.up)
        return dataclasses.replace(self.stats, links_up=ups)

    # --- groups (shard thread) ---------------------------------------------------------------

    def register(self, group_id: str, endpoint: Endpoint) -> None:
        self._endpoints[group_id] = endpoint

    def unregister(self, group_id: str, endpoint: Endpoint) -> None:
        if self._endpoints.get(group_id) is endpoint:
            del self._endpoints[group_id]

    def want(self, address: str) -> None:
        """Keep a link to ``address`` (a member of a group of this shard) until as many ``unwant``."""
        self._wanted[address] += 1
        if address != self.self_address and address not in self._peers:
            self._peers.add(address)
            self._links.setdefault(address, _Link())
            if self._mark_dirty is not None:
                self._mark_dirty(self.group_id)  # dial at the next pass, not at the next refresh

    def wanted(self) -> frozenset[str]:
        """The addresses this shard's groups want links to (any thread: one copy of the counter's keys,
        which holds the GIL throughout)."""
        return frozenset(self._wanted)

    def unwant(self, address: str) -> None:
        count = self._wanted[address] - 1
        if count > 0:
            self._wanted[address] = count
        else:
            self._wanted.pop(address, None)

    def queue(self, address: str, channel: bytes, payload: bytes, essential: bool = True) -> bool:
        """Queue a message for ``address`` (sent at the end of the shard's pass); False if not sent."""
        link = self._links.get(address)
        if link is None or not link.up or link.conn is None:
            return False
        if not essential and link.outbox_bytes + link.conn.getSendBufferSize() > self._send_buffer_bytes:
            self.stats.dropped_backpressure += 1
            return False
        if not link.outbox:
            self._pending.append(link)
        link.outbox.append((channel, payload))
        link.outbox_bytes += link_frames.item_size(channel, payload)
        return True

    def pulse(self) -> None:
        """In the middle of a long ticker pass: a heartbeat to every peer not written to for a heartbeat interval,
        and everything queued (the peers judge this node's liveness by its heartbeats, whatever its passes take).
        Shard thread."""
        if self._closed:
            return
        now = self._clock()
        for peer in self._peers:
            link = self._links.get(peer)
            if link is not None and link.up and now - link.last_sent >= self._heartbeat_s:
                self._send_control(link, (ALIVE,))
                self.heartbeats_sent += 1
        self.flush()

    def flush(self) -> None:
        """Send every link's queued messages, one frame per link (split at the size bound). Shard thread."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        now = self._clock()
        stats = self.stats
        for link in pending:
            items, link.outbox, link.outbox_bytes = link.outbox, [], 0
            conn = link.conn
            if conn is None or not link.up:
                continue
            for plain in link_frames.batches(items):
                conn.send_pickled(plain)
                stats.frames_sent += 1
            stats.messages_sent += len(items)
            link.last_sent = now

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
        for peer in self._peers if on_time and self._judge else ():
            heard = self._heard.get(peer)
            if heard is not None and now - heard >= self.lapse_s and peer not in self._lapsed:
                self._lapsed.add(peer)
                logger.info("node liveness: %s not heard for %.2fs", peer, now - heard)
                self._notify(self._on_lapse, peer)
        for conn in list(self._unidentified):
            conn.check_deadline()
            if conn.state == CONNECTION_STATE.DISCONNECTED:
                self._unidentified.discard(conn)
        self.flush()

    def _refresh_peers(self) -> None:
        peers = set(self._peers_fn())
        peers.update(self._wanted)
        peers.discard(self.self_address)
        for gone in self._peers - peers:
            link = self._links.pop(gone, None)
            if link is not None:
                self._went_down(gone, link)
                if link.conn is not None:
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
        if link.up and now - link.last_sent >= self._heartbeat_s:
            self._send_control(link, (ALIVE,))
            self.heartbeats_sent += 1

    def _dial(self, peer: str, link: _Link) -> None:
        host, _, port = peer.rpartition(":")
        conn = self._connection()
        link.conn = conn
        conn.setOnConnectedCallback(lambda: self._introduce(peer, conn))
        conn.setOnMessageReceivedCallback(lambda data: self._on_frame(peer, conn, data))
        conn.setOnDisconnectedCallback(lambda: self._on_closed(peer, conn))
        conn.connect(host.strip("[]"), int(port))

    def _connection(self, sock: socket.socket | None = None, peer_nonce: bytes | None = None) -> FrameConnection:
        return FrameConnection(
            self._poller,
            key=self._key,
            group_id=self.group_id,
            socket=sock,
            peer_nonce=peer_nonce,
            timeout=self._silence_s,
            sendBufferSize=SOCKET_BUFFER_BYTES,
            recvBufferSize=SOCKET_BUFFER_BYTES,
            on_rejected=self._on_rejected,
            decode=bytes,
        )

    def _introduce(self, peer: str, conn: FrameConnection) -> None:
        link = self._links.get(peer)
        if link is None or link.conn is not conn:
            conn.disconnect()
            return
        self._send_now(conn, (HELLO, self.self_address, self.incarnation))

    def _send_now(self, conn: FrameConnection, message: tuple[Any, ...]) -> None:
        conn.send_pickled(link_frames.pack([(link_frames.CONTROL, pickle.dumps(message, PICKLE_PROTOCOL))]))
        self.stats.frames_sent += 1

    def _send_control(self, link: _Link, message: tuple[Any, ...]) -> None:
        if not link.outbox:
            self._pending.append(link)
        payload = pickle.dumps(message, PICKLE_PROTOCOL)
        link.outbox.append((link_frames.CONTROL, payload))
        link.outbox_bytes += link_frames.item_size(link_frames.CONTROL, payload)

    def adopt(self, sock: socket.socket, peer_nonce: bytes) -> None:
        """Take over an accepted socket whose preamble named this shard's link channel."""
        if self._closed:
            sock.close()
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = self._connection(sock, peer_nonce)
        self._unidentified.add(conn)
        conn.setOnMessageReceivedCallback(lambda data: self._on_first_frame(conn, data))

    def _on_first_frame(self, conn: FrameConnection, data: bytes) -> None:
        self._unidentified.discard(conn)
        items = self._unpack(conn, data)
        hello = _control(items[0][1]) if items and items[0][0] == "" else None
        peer = _hello_address(hello)
        if peer is None or peer not in self._peers or should_dial(self.self_address, peer):
            logger.warning("node link: refusing a dialer that introduced itself as %r", hello)
            if self._on_rejected is not None:
                self._on_rejected(f"node link: unexpected dialer {hello!r:.80}")
            conn.disconnect()
            return
        link = self._links.get(peer)
        if link is None:
            link = self._links[peer] = _Link()
        if link.conn is not None and link.conn is not conn:
            old = link.conn
            link.conn = None
            old.disconnect()  # the peer redialed: its old connection is dead
            self._went_down(peer, link)
        link.conn = conn
        conn.setOnMessageReceivedCallback(lambda d: self._on_frame(peer, conn, d))
        conn.setOnDisconnectedCallback(lambda: self._on_closed(peer, conn))
        self._send_now(conn, (HELLO, self.self_address, self.incarnation))
        self._on_items(peer, conn, link, items)

    def _on_frame(self, peer: str, conn: FrameConnection, data: bytes) -> None:
        link = self._links.get(peer)
        if link is None or link.conn is not conn:
            return
        items = self._unpack(conn, data)
        if items:
            self._on_items(peer, conn, link, items)

    def _unpack(self, conn: FrameConnection, data: bytes) -> list[tuple[str, bytes]]:
        try:
            return link_frames.unpack(data)
        except link_frames.MalformedBatch as e:
            logger.warning("node link: malformed frame (%s): closing", e)
            if self._on_rejected is not None:
                self._on_rejected(f"node link: {e}")
            conn.disconnect()
            return []

    def _on_items(self, peer: str, conn: FrameConnection, link: _Link, items: list[tuple[str, bytes]]) -> None:
        self._heard[peer] = self._clock()
        self._lapsed.discard(peer)
        for channel, payload in items:
            if link.conn is not conn:
                return  # closed while delivering (a bad message)
            if channel == "":
                self._on_control(peer, conn, link, payload)
            elif link.up:
                self._deliver(peer, conn, channel, payload)

    def _on_control(self, peer: str, conn: FrameConnection, link: _Link, payload: bytes) -> None:
        message = _control(payload)
        if message is None:
            return
        if message[0] == ALIVE:
            self.heartbeats_received += 1
            return
        if message[0] != HELLO:
            return
        if _hello_address(message) != peer:
            logger.warning("node link: %s introduced itself as %r", peer, message)
            conn.disconnect()
            return
        incarnation = str(message[2])
        before = self._incarnations.get(peer)
        self._incarnations[peer] = incarnation
        if before is not None and before != incarnation and self._judge:
            logger.info("node liveness: %s restarted", peer)
            self._notify(self._on_restart, peer)
        if not link.up:
            link.up = True
            link.last_sent = float("-inf")
            for endpoint in list(self._endpoints.values()):
                endpoint.link_up(peer)

    def _deliver(self, peer: str, conn: FrameConnection, group_id: str, payload: bytes) -> None:
        stats = self.stats
        endpoint = self._endpoints.get(group_id)
        if endpoint is None:
            if self._forward is None or not self._forward(group_id, peer, payload):
                stats.dropped_unknown_group += 1
            return
        try:
            delivered = endpoint.deliver(peer, payload)
        except Exception as e:  # a verified peer sent something undecodable: drop the link
            logger.warning("node link: message from %s for group %r failed (%s): closing", peer, group_id, e)
            conn.disconnect()
            return
        if not delivered:
            stats.dropped_not_member += 1
            return
        stats.messages_received += 1
        if self._mark_dirty is not None:
            self._mark_dirty(group_id)

    def _on_closed(self, peer: str, conn: FrameConnection) -> None:
        link = self._links.get(peer)
        if link is None or link.conn is not conn:
            return
        self._went_down(peer, link)

    def _went_down(self, peer: str, link: _Link) -> None:
        link.outbox, link.outbox_bytes = [], 0
        if not link.up:
            return
        link.up = False
        for endpoint in list(self._endpoints.values()):
            endpoint.link_down(peer)

    def _notify(self, fn: Callable[[str], None] | None, peer: str) -> None:
        if fn is None:
            return
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
        self._pending.clear()
        self._unidentified.clear()


def _control(payload: bytes) -> tuple[Any, ...] | None:
    try:
        message = loads_data(payload)
    except Exception:
        return None
    return message if isinstance(message, tuple) and message else None


def _hello_address(message: Any) -> str | None:
    if isinstance(message, tuple) and len(message) == 3 and message[0] == HELLO and isinstance(message[1], str):
        return message[1]
    return None
