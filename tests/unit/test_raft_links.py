"""raft/link_frames.py, raft/links.py and raft/transport.py's LinkTransport: the node links' pure parts.

Batches of many groups' messages, the split at the size bound, the membership check on
delivery, coalescing into one frame per pass, back-pressure, and a forged or replayed frame
on an accepted link (a scripted fake socket; real node processes are in
tests/integration/test_raft_links.py).
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pysyncobj.node import TCPNode as Node
from pysyncobj.poller import POLL_EVENT_TYPE

from raft import link_frames
from raft.frame_crypto import NONCE_BYTES, FrameCipher, cluster_key, new_nonce
from raft.links import ALIVE, HELLO, LINK_CHANNEL, NodeLinks, channel_for, shard_of_channel
from raft.transport import HERE, LinkTransport, essential
from tests.raft_support.fake_socket import FakeSocket

SECRET = "unit-test-secret"
SELF = "127.0.0.1:7001"
PEER = "127.0.0.1:7002"  # greater: it dials us
STRANGER = "127.0.0.1:7009"


# --- frames ------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.text(min_size=1, max_size=20), st.binary(max_size=300)), max_size=40))
def test_many_groups_messages_round_trip_in_order(items: list[tuple[str, bytes]]) -> None:
    packed = [(g.encode(), p) for g, p in items]
    frames = list(link_frames.batches(packed, max_bytes=1000))
    got = [item for f in frames for item in link_frames.unpack(f)]
    assert got == items
    assert len(frames) <= max(1, len(items))


def test_batches_split_at_the_size_bound_and_a_big_message_travels_alone() -> None:
    small = [(b"g%d" % i, b"x" * 90) for i in range(30)]
    big = (b"big", b"y" * 5000)
    items = [*small[:10], big, *small[10:]]
    frames = list(link_frames.batches(items, max_bytes=1000))
    sizes = [len(f) for f in frames]
    assert all(s <= 1000 for s in sizes if s < 5000)
    assert [f for f in frames if len(f) > 1000] == [link_frames.pack([big])]
    assert [i for f in frames for i in link_frames.unpack(f)] == [(c.decode(), p) for c, p in items]
    # One frame for what fits under the bound.
    assert len(list(link_frames.batches(small[:10], max_bytes=1000))) == 1


@pytest.mark.parametrize(
    "plain",
    [
        b"\x01",  # truncated header
        link_frames.ITEM_HEADER.pack(3, 10) + b"abc" + b"short",  # truncated payload
        link_frames.ITEM_HEADER.pack(2000, 0) + b"x" * 2000,  # channel over the limit
        link_frames.ITEM_HEADER.pack(2, 0) + b"\xff\xfe",  # not UTF-8
    ],
)
def test_malformed_batches_are_refused(plain: bytes) -> None:
    with pytest.raises(link_frames.MalformedBatch):
        link_frames.unpack(plain)


def test_link_channels_are_no_group_ids_and_name_their_shard() -> None:
    assert channel_for(0) == LINK_CHANNEL and shard_of_channel(LINK_CHANNEL) == 0
    assert shard_of_channel(channel_for(3)) == 3
    for other in ("topic-0", LINK_CHANNEL + "/x", LINK_CHANNEL + "/123456", "txb/node-liveness"):
        assert shard_of_channel(other) is None


def test_only_what_pysyncobj_sends_again_is_non_essential() -> None:
    assert not essential({"type": "append_entries", "entries": [], "term": 1})
    assert essential({"type": "append_entries", "transmission": "process", "data": b""})
    assert essential({"type": "append_entries", "serialized": b"", "term": 1})
    assert essential({"type": "request_vote", "term": 2})
    assert essential("anything else")


# --- fakes ---------------------------------------------------------------------------------


class FakePoller:
    def subscribe(self, fd: int, cb: Any, mask: int) -> None:
        pass

    def unsubscribe(self, fd: int) -> None:
        pass


class FakeSyncObj:
    encryptor = None

    def __init__(self) -> None:
        self.received: list[tuple[str, Any]] = []
        self.connected: list[str] = []
        self.disconnected: list[str] = []

    def addOnTickCallback(self, fn: Any) -> None:
        pass


def make_links(peers: set[str] | None = None, send_buffer_bytes: int = 1 << 20) -> tuple[NodeLinks, list[str]]:
    rejected: list[str] = []
    links = NodeLinks(
        SELF,
        cluster_key(SECRET),
        FakePoller(),
        heartbeat_s=0.1,
        lapse_s=0.6,
        silence_s=5.0,
        retry_s=1.0,
        peers=lambda: set(peers or {PEER}),
        on_rejected=rejected.append,
        send_buffer_bytes=send_buffer_bytes,
    )
    links.tick()
    return links, rejected


def make_group(links: NodeLinks, group_id: str, members: list[str]) -> tuple[LinkTransport, FakeSyncObj]:
    so = FakeSyncObj()
    t = LinkTransport(so, Node(SELF), [Node(m) for m in members], group_id=group_id, links=links)
    t.setOnMessageReceivedCallback(lambda node, msg: so.received.append((node.address, msg)))
    t.setOnNodeConnectedCallback(lambda node: so.connected.append(node.address))
    t.setOnNodeDisconnectedCallback(lambda node: so.disconnected.append(node.address))
    t._onTick()
    return t, so


class Dialer:
    """The test plays the peer that dials ``links`` (over a fake socket)."""

    def __init__(self, links: NodeLinks, secret: str = SECRET) -> None:
        self.sock = FakeSocket()
        self.nonce = new_nonce()
        self.links = links
        links.adopt(self.sock, self.nonce)  # type: ignore[arg-type]
        (self.conn,) = links._unidentified
        self.pump_writes()
        acceptor_nonce = bytes(self.sock.sent[:NONCE_BYTES])
        self.cipher = FrameCipher(cluster_key(secret), LINK_CHANNEL, self.nonce, acceptor_nonce, dialer=True)
        self.read = NONCE_BYTES
        assert self.next_plain() is not None  # the accept frame

    def pump_writes(self) -> None:
        while self.conn.getSendBufferSize():
            self.conn._on_event(42, POLL_EVENT_TYPE.WRITE)

    def next_plain(self) -> bytes | None:
        """The next frame the links sent us, opened."""
        data = self.sock.sent
        if len(data) - self.read < 4:
            return None
        n = int.from_bytes(data[self.read : self.read + 4], "little")
        body = bytes(data[self.read + 4 : self.read + 4 + n])
        self.read += 4 + n
        return self.cipher.open(body)

    def frames(self) -> list[list[tuple[str, bytes]]]:
        out = []
        while (plain := self.next_plain()) is not None:
            out.append(link_frames.unpack(plain))
        return out

    def seal(self, items: list[tuple[bytes, Any]]) -> bytes:
        return bytes(self.cipher.seal(link_frames.pack([(c, pickle.dumps(m, 4)) for c, m in items])))

    def feed(self, raw: bytes) -> None:
        self.sock.chunks.append(raw)
        self.conn._on_event(42, POLL_EVENT_TYPE.READ)

    def hello(self, address: str = PEER) -> None:
        self.feed(self.seal([(b"", (HELLO, address, "incarnation-1"))]))

    def here(self, groups: list[str], ack: bool = False) -> None:
        """The peer's replicas of ``groups`` say they exist."""
        self.feed(self.seal([(g.encode(), {"type": HERE, "ack": ack}) for g in groups]))


# --- links ---------------------------------------------------------------------------------


def test_a_group_connects_once_the_link_is_up_and_the_peers_replica_answered() -> None:
    links, _ = make_links()
    groups = [make_group(links, f"g{i}", [PEER]) for i in range(5)]
    _, other_so = make_group(links, "other", [STRANGER])
    d = Dialer(links)
    d.hello()
    assert links.is_up(PEER)
    links.flush()
    hello, heres = d.frames()
    assert pickle.loads(hello[0][1])[:2] == (HELLO, SELF)
    # Every group of the peer says "here" on the link, in one frame.
    assert [(c, pickle.loads(p)) for c, p in heres] == [(f"g{i}", {"type": HERE, "ack": False}) for i in range(5)]
    assert not any(so.connected for _, so in groups)  # the peer's replicas may not exist yet
    d.here(["g0", "g1"], ack=True)
    d.here(["g2"])
    assert [so.connected for _, so in groups] == [[PEER], [PEER], [PEER], [], []]
    links.flush()
    (answers,) = d.frames()
    assert [(c, pickle.loads(p)) for c, p in answers] == [("g2", {"type": HERE, "ack": True})]
    assert not other_so.connected
    # A group created while the link is up says "here" at its first tick.
    _, late_so = make_group(links, "late", [PEER])
    links.flush()
    (late_here,) = d.frames()
    assert [c for c, _ in late_here] == ["late"]
    d.feed(d.seal([(b"late", {"type": "request_vote", "term": 1})]))  # any message: the replica exists
    assert late_so.connected == [PEER] and late_so.received == [(PEER, {"type": "request_vote", "term": 1})]


def test_one_frame_per_pass_carries_every_groups_messages() -> None:
    links, _ = make_links()
    groups = [make_group(links, f"g{i}", [PEER]) for i in range(50)]
    d = Dialer(links)
    d.hello()
    d.here([f"g{i}" for i in range(50)], ack=True)
    links.flush()
    d.frames()
    frames_before, messages_before = links.stats.frames_sent, links.stats.messages_sent
    for t, _ in groups:
        assert t.send(Node(PEER), {"type": "append_entries", "term": 1, "entries": []})
    assert d.frames() == []  # nothing leaves before the end of the pass
    links.flush()
    (frame,) = d.frames()
    assert [c for c, _ in frame] == [f"g{i}" for i in range(50)]
    assert links.stats.frames_sent == frames_before + 1
    assert links.stats.messages_sent == messages_before + 50


def test_messages_reach_only_groups_the_sender_is_a_member_of() -> None:
    links, _ = make_links()
    _member, member_so = make_group(links, "mine", [PEER])
    _foreign, foreign_so = make_group(links, "foreign", [STRANGER])
    d = Dialer(links)
    d.hello()
    garbage = b"\x80\x04 not a pickle: must never be unpickled"
    d.feed(
        bytes(
            d.cipher.seal(
                link_frames.pack(
                    [
                        (b"mine", pickle.dumps({"type": "x"}, 4)),
                        (b"foreign", garbage),
                        (b"no-such-group", garbage),
                    ]
                )
            )
        )
    )
    assert member_so.received == [(PEER, {"type": "x"})]
    assert foreign_so.received == []
    assert links.stats.dropped_not_member == 1 and links.stats.dropped_unknown_group == 1
    assert links.is_up(PEER)


def test_a_full_link_drops_heartbeats_but_keeps_chunked_transfers() -> None:
    links, _ = make_links(send_buffer_bytes=1000)
    t, _ = make_group(links, "g", [PEER])
    d = Dialer(links)
    d.hello()
    d.here(["g"], ack=True)
    links.flush()
    d.frames()
    heartbeat = {"type": "append_entries", "term": 1, "entries": []}
    assert t.send(Node(PEER), {"type": "append_entries", "transmission": "start", "data": b"z" * 2000})
    assert not t.send(Node(PEER), heartbeat)
    assert links.stats.dropped_backpressure == 1
    assert t.send(Node(PEER), {"type": "append_entries", "transmission": "process", "data": b"z" * 10})
    links.flush()
    assert t.send(Node(PEER), heartbeat)  # sent: room again


def test_a_dialer_that_is_no_expected_peer_is_refused() -> None:
    links, rejected = make_links()
    _, so = make_group(links, "g", [PEER])
    d = Dialer(links)
    d.hello(STRANGER)
    assert d.sock.closed and rejected and not so.connected


@pytest.mark.parametrize("attack", ["replay", "forge"])
def test_a_replayed_or_forged_frame_closes_the_link_and_changes_nothing(attack: str) -> None:
    links, rejected = make_links()
    _, so = make_group(links, "g", [PEER])
    d = Dialer(links)
    d.hello()
    frame = d.seal([(b"g", {"type": "append_entries", "term": 5})])
    d.feed(frame)
    assert so.received == [(PEER, {"type": "append_entries", "term": 5})]
    if attack == "replay":
        d.feed(frame)
    else:
        forged = bytearray(d.seal([(b"g", {"type": "append_entries", "term": 6})]))
        forged[-20] ^= 1
        d.feed(bytes(forged))
    assert so.received == [(PEER, {"type": "append_entries", "term": 5})]
    assert d.sock.closed and rejected
    assert not links.is_up(PEER)
    assert so.disconnected == [PEER]


def test_alive_counts_as_hearing_the_peer() -> None:
    links, _ = make_links()
    d = Dialer(links)
    d.hello()
    first = links.heard(PEER)
    assert first is not None
    d.feed(d.seal([(b"", (ALIVE,))]))
    heard = links.heard(PEER)
    assert heard is not None and heard >= first and links.heartbeats_received == 1


def test_a_pulse_sends_a_heartbeat_to_a_peer_not_written_to_for_an_interval_and_whatever_is_queued() -> None:
    now = [100.0]
    links = NodeLinks(
        SELF, cluster_key(SECRET), FakePoller(), heartbeat_s=0.1, lapse_s=0.6, silence_s=5.0, retry_s=1.0,
        peers=lambda: {PEER}, clock=lambda: now[0],
    )  # fmt: skip
    links.tick()
    (t, _) = make_group(links, "g", [PEER])
    d = Dialer(links)
    d.hello()
    d.here(["g"], ack=True)
    links.flush()
    d.frames()
    sent = links.heartbeats_sent
    links.pulse()  # written to a moment ago: no heartbeat, nothing queued
    assert d.frames() == [] and links.heartbeats_sent == sent
    assert t.send(Node(PEER), {"type": "append_entries", "term": 1, "entries": []})
    links.pulse()  # what a group queued goes out at once, mid-pass
    ((channel, _),) = d.frames()[0]
    assert channel == "g" and links.heartbeats_sent == sent
    now[0] += 0.15
    links.pulse()  # an interval without a write: a heartbeat
    ((channel, payload),) = d.frames()[0]
    assert channel == "" and pickle.loads(payload) == (ALIVE,) and links.heartbeats_sent == sent + 1
