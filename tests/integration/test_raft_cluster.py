"""3 RaftNodes in one process, many groups over one port each (raft/).

Covers: election in every group, submit from asyncio, NOT_LEADER with the
leader's address, failover and catch-up, snapshot install to a lagging
follower, full restart without double-apply, poison commands, transport
authentication and listener hygiene.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import pickle
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from raft import NotLeaderError, RaftApplyError, RaftSettings, snapshot, transport
from raft import pysyncobj_patches as patches
from raft.connection import ACCEPT_MESSAGE, PREAMBLE_HEADER, Phase, encode_preamble
from raft.frame_crypto import NONCE_BYTES, FrameCipher, cluster_key, new_nonce
from raft.links import LINK_CHANNEL
from tests.raft_support.cluster import PASSWORD, Cluster, eventually, run
from tests.raft_support.wire import read_until_closed, recv_exactly

pytestmark = pytest.mark.integration

GROUPS = [f"t{i}" for i in range(20)]


def test_every_group_elects_a_leader_and_submit_returns_apply_result(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, GROUPS)
        try:
            c.start_all()
            leaders = await c.wait_leaders()
            assert set(leaders) == set(GROUPS)
            # Only one node per group reports ready leadership.
            results = await asyncio.gather(*(c.submit(g, b"add:k:5") for g in GROUPS))
            assert results == [5] * len(GROUPS)
            assert await c.submit("t0", b"add:k:2") == 7
            for g in GROUPS[1:]:
                await c.wait_value(g, "k", 5)
            await c.wait_value("t0", "k", 7)
            status = c.group(leaders["t0"], "t0").status()
            assert status.state == "leader"
            assert status.has_quorum
            assert len(status.match_index) == 2
            # Every node saw an is_leader event for each group it leads.
            ready_events = {(e.group_id, e.leader) for e in c.events if e.is_leader}
            for g, i in leaders.items():
                assert (g, c.addrs[i]) in ready_events
        finally:
            c.close()

    run(scenario)


def test_on_applied_runs_for_a_command_whose_caller_stopped_waiting(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, ["solo"])
        try:
            c.start_all()
            leader = (await c.wait_leaders())["solo"]
            group = c.group(leader, "solo")
            applied: list[Any] = []
            waiting = asyncio.ensure_future(group.submit(b"add:k:3", 5, on_applied=applied.append))
            await asyncio.sleep(0)  # proposed: the caller gives up before the commit comes back
            waiting.cancel()
            await eventually(lambda: applied == [3], 5, "on_applied after the caller was cancelled")
            assert waiting.cancelled()
            assert await group.submit(b"add:k:1", 5, on_applied=applied.append) == 4
            assert applied == [3, 4]
        finally:
            c.close()

    run(scenario)


def test_follower_refuses_with_leader_address(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, ["solo"])
        try:
            c.start_all()
            leader = (await c.wait_leaders())["solo"]
            follower = (leader + 1) % 3
            await eventually(lambda: c.group(follower, "solo").leader() == c.addrs[leader], 5, "leader known")
            with pytest.raises(NotLeaderError) as info:
                await c.group(follower, "solo").submit(b"add:k:1", 2)
            assert info.value.leader == c.addrs[leader]
        finally:
            c.close()

    run(scenario)


def test_apply_exception_is_returned_and_group_keeps_working(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, ["p"])
        try:
            c.start_all()
            await c.wait_leaders()
            with pytest.raises(RaftApplyError):
                await c.submit("p", b"boom")
            assert await c.submit("p", b"add:k:1") == 1
            await c.wait_value("p", "k", 1)
        finally:
            c.close()

    run(scenario)


def test_leader_stop_fails_over_within_3s_and_restart_catches_up(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        groups = GROUPS[:5]
        c = Cluster(tmp_path, groups)
        try:
            c.start_all()
            await c.wait_leaders()
            for _ in range(30):
                await c.submit("t0", b"add:k:1")
            old = c.leader_index("t0")
            assert old is not None
            c.stop_node(old)
            took = await eventually(lambda: c.leader_index("t0") is not None, 3.0, "new leader")
            assert took < 3.0
            new = c.leader_index("t0")
            assert new is not None and new != old
            assert c.sms[(new, "t0")].value("k") == 30  # every committed entry survived
            assert await c.submit("t0", b"add:k:1") == 31
            c.start_node(old)
            await c.wait_value("t0", "k", 31)
            await c.wait_leaders()
        finally:
            c.close()

    run(scenario)


@pytest.mark.parametrize("durable", [False, True], ids=["full-snapshots", "store-backed"])
def test_lagging_follower_catches_up_via_snapshot(tmp_path: pathlib.Path, durable: bool) -> None:
    async def scenario() -> None:
        settings = RaftSettings(password=PASSWORD, log_compaction_min_entries=20, log_compaction_split=False)
        c = Cluster(tmp_path, ["s"], settings=settings, durable=durable)
        try:
            c.start_all()
            leader = (await c.wait_leaders())["s"]
            lagging = (leader + 1) % 3
            c.stop_node(lagging)
            for _ in range(200):
                await c.submit("s", b"add:k:1")
            so = c.group(leader, "s")._so
            await eventually(lambda: len(patches.raft_log(so)) < 100, 10, "leader compacted its log")
            c.start_node(lagging)
            await c.wait_value("s", "k", 200, timeout=20)
            assert c.sms[(lagging, "s")].restored_from_snapshot >= 1
            dump = c.group(leader, "s").data_dir + "/raft.dump"
            if durable:
                # Compaction wrote a light snapshot (no state copied) after making the store durable,
                # and the follower got a full one built from the store on demand.
                assert snapshot.SnapshotReader(dump).light
                assert c.sms[(leader, "s")].made_durable >= 1  # type: ignore[attr-defined]
                assert snapshot.SnapshotReader(dump + ".full").state_index >= 200
            else:
                assert not snapshot.SnapshotReader(dump).light
            assert await c.submit("s", b"add:k:1") == 201
            await c.wait_value("s", "k", 201)
        finally:
            c.close()

    run(scenario)


def _exists(path: str) -> bool:
    return os.path.exists(path)


def test_store_backed_compaction_never_stalls_the_ticker(tmp_path: pathlib.Path) -> None:
    # A store-backed group's compaction fsyncs the store and its dump (0.1-0.9 s under load, measured). It runs
    # on the node's compaction thread: while every replica's make_durable is held, the group keeps committing,
    # and the log is compacted only once the store is durable.
    gate = threading.Event()
    entered = threading.Event()

    async def scenario() -> None:
        settings = RaftSettings(password=PASSWORD, log_compaction_min_entries=20, log_compaction_split=False)
        c = Cluster(tmp_path, ["s"], settings=settings, durable=True)
        try:
            c.start_all()
            leader = (await c.wait_leaders())["s"]
            for i in range(3):
                sm = c.sms[(i, "s")]

                def held(sm: Any = sm) -> None:
                    entered.set()
                    gate.wait(30)
                    type(sm).make_durable(sm)

                sm.make_durable = held  # type: ignore[attr-defined]
            so = c.group(leader, "s")._so
            dump = c.group(leader, "s").data_dir + "/raft.dump"
            for _ in range(30):
                await c.submit("s", b"add:k:1")
            await eventually(entered.is_set, 10, "a compaction started")
            # With the fsync held, the group still commits: on the ticker this submit would wait for the gate.
            for _ in range(30):
                await asyncio.wait_for(c.submit("s", b"add:k:1"), 5)
            assert len(patches.raft_log(so)) > 60, "the log was compacted before the store was durable"
            assert not _exists(dump), "the dump was renamed into place before it was written"
            gate.set()
            await eventually(lambda: len(patches.raft_log(so)) < 30, 10, "the leader compacted its log")
            reader = snapshot.SnapshotReader(dump)
            assert reader.light and reader.state_index >= 20
            assert c.sms[(leader, "s")].made_durable >= 1  # type: ignore[attr-defined]
            assert not _exists(dump + ".tmp")
            await c.wait_value("s", "k", 60)
        finally:
            gate.set()
            c.close()

    run(scenario)


@pytest.mark.parametrize("durable", [False, True], ids=["full-snapshots", "store-backed"])
def test_full_restart_keeps_entries_and_replay_never_double_applies(tmp_path: pathlib.Path, durable: bool) -> None:
    async def scenario() -> None:
        settings = RaftSettings(password=PASSWORD, log_compaction_min_entries=50, log_compaction_split=False)
        groups = GROUPS[:4]
        c = Cluster(tmp_path, groups, settings=settings, durable=durable)
        try:
            c.start_all()
            await c.wait_leaders()
            for g in groups:
                for _ in range(80):  # crosses a compaction in each group
                    await c.submit(g, b"add:k:1")
            for g in groups:
                await c.wait_value(g, "k", 80)
            c.close()
            c.start_all()
            await c.wait_leaders()
            for g in groups:
                await c.wait_value(g, "k", 80)
                for i in range(3):
                    sm = c.sms[(i, g)]
                    # After restart the journal is replayed; the machine skipped
                    # what it had applied, and only new barriers were applied.
                    assert sm.apply_calls <= 3, (g, i, sm.apply_calls)
            replayed = sum(c.sms[(i, g)].skipped for i in range(3) for g in groups)
            assert replayed > 0
            assert await c.submit("t0", b"add:k:1") == 81
        finally:
            c.close()

    run(scenario)


def test_transfer_leadership_moves_the_leader(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, ["x"])
        try:
            c.start_all()
            leader = (await c.wait_leaders())["x"]
            await c.submit("x", b"add:k:1")
            target = (leader + 1) % 3
            await c.wait_value("x", "k", 1)
            c.group(leader, "x").transfer_leadership(c.addrs[target])
            await eventually(lambda: c.leader_index("x") == target, 5, "leadership moved")
        finally:
            c.close()

    run(scenario)


def test_wrong_password_peer_is_rejected_and_cannot_affect_group(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, ["a"])
        try:
            c.start_all()
            await c.wait_leaders()
            assert await c.submit("a", b"add:k:1") == 1
            # Replace node 2 by an impostor with the same address but the wrong password.
            c.stop_node(2)
            impostor = dataclasses.replace(c.settings, password="wrong-password")
            c.start_node(2, settings=impostor)
            # (node 2 may have been the leader: nodes 0 and 1 then elect a new one)
            await eventually(lambda: c.leader_index("a") in (0, 1), 10, "a leader among the honest nodes")
            assert await c.submit("a", b"add:k:1") == 2
            before = sum(n.rejected_connections for n in c.nodes[:2] if n is not None)
            await eventually(
                lambda: (
                    sum(n.rejected_connections for n in c.nodes[:2] if n is not None) > before
                    or (c.nodes[2] is not None and c.nodes[2].rejected_connections > 0)
                ),
                10,
                "impostor connection rejected",
            )
            await asyncio.sleep(0.5)
            # learned nothing new: it may or may not have applied write 1 before it stopped, never write 2
            assert c.sms[(2, "a")].value("k") in (0, 1)
            assert not c.group(2, "a").status().connected
            assert await c.submit("a", b"add:k:1") == 3
            # A raw client with the wrong key: closed, nothing unpickled.
            host, port = c.addrs[0].split(":")
            with socket.create_connection((host, int(port)), timeout=5) as s:
                nonce = new_nonce()
                s.sendall(encode_preamble(LINK_CHANNEL, nonce))
                acceptor_nonce = recv_exactly(s, NONCE_BYTES)
                wrong = FrameCipher(cluster_key("nope"), LINK_CHANNEL, nonce, acceptor_nonce, dialer=True)
                s.sendall(wrong.seal(pickle.dumps(c.addrs[2])))
                assert read_until_closed(s, 5)
        finally:
            c.close()

    run(scenario)


def test_garbage_and_unknown_group_are_closed_listener_survives(tmp_path: pathlib.Path) -> None:
    async def scenario() -> None:
        c = Cluster(tmp_path, ["a"])
        try:
            c.start_all()
            await c.wait_leaders()
            host, port = c.addrs[0].split(":")
            node0 = c.nodes[0]
            assert node0 is not None
            probes = [
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                encode_preamble("no-such-group", b"\x00" * 16),
                b"TXRB\x01\xff\xff" + b"x" * 100,  # group id length over the limit
                b"TXRB\x07\x01\x00a",  # unknown version
            ]
            for probe in probes:
                before = node0.rejected_connections
                with socket.create_connection((host, int(port)), timeout=5) as s:
                    s.sendall(probe)
                    assert read_until_closed(s, 5), probe
                await eventually(lambda b=before: node0.rejected_connections > b, 5, "counted")
            # Half a preamble then hang up.
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(b"TX")
            for _ in range(5):
                assert await c.submit("a", b"add:k:1") is not None
            t0 = time.monotonic()
            await c.wait_value("a", "k", 5)
            assert time.monotonic() - t0 < 10
        finally:
            c.close()

    run(scenario)


def test_connections_silent_before_their_preamble_are_closed_at_their_deadline(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "PREAMBLE_DEADLINE_S", 1.0)

    async def scenario() -> None:
        c = Cluster(tmp_path, ["a"])
        try:
            c.start_all()
            await c.wait_leaders()
            host, port = c.addrs[0].split(":")
            node0 = c.nodes[0]
            assert node0 is not None
            before = node0.rejected_connections
            socks = []
            try:
                for _ in range(3):
                    s = socket.create_connection((host, int(port)), timeout=5)
                    s.sendall(b"TX")  # part of a preamble, then silence
                    socks.append(s)
                for s in socks:
                    assert read_until_closed(s, 5.0)  # the deadline is 1 s
            finally:
                for s in socks:
                    s.close()
            await eventually(lambda: node0.rejected_connections >= before + 3, 5, "counted")
            assert await c.submit("a", b"add:k:1") is not None
        finally:
            c.close()

    run(scenario)


class _FakeAcceptor:
    """A listening socket the test drives by hand, and one dialing FrameConnection."""

    def __init__(self, handshake_timeout: float = 5.0) -> None:
        from pysyncobj.poller import PollPoller

        from raft.connection import FrameConnection

        self.server = socket.create_server(("127.0.0.1", 0))
        self.poller = PollPoller()
        self.connected: list[bool] = []
        self.disconnected: list[bool] = []
        self.rejected: list[str] = []
        self.conn = FrameConnection(
            self.poller,
            key=cluster_key(PASSWORD),
            group_id="g",
            onConnected=lambda: self.connected.append(True),
            onDisconnected=lambda: self.disconnected.append(True),
            handshake_timeout=handshake_timeout,
            on_rejected=self.rejected.append,
        )
        assert self.conn.connect("127.0.0.1", self.server.getsockname()[1])
        self.peer, _ = self.server.accept()
        self.peer.settimeout(5)

    def pump(self, until: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "condition not reached"
            self.poller.poll(0.02)
            self.conn.check_deadline()

    def answer_preamble(self, secret: str) -> FrameCipher:
        """Read the dialer's preamble, send our nonce; the acceptor-side cipher for ``secret``."""
        self.pump(lambda: self.conn.phase is Phase.AWAIT_NONCE)
        header = recv_exactly(self.peer, PREAMBLE_HEADER.size)
        length = PREAMBLE_HEADER.unpack(header)[2]
        dialer_nonce = recv_exactly(self.peer, length + NONCE_BYTES)[length:]
        nonce = new_nonce()
        self.peer.sendall(nonce)
        return FrameCipher(cluster_key(secret), "g", dialer_nonce, nonce, dialer=False)

    def close(self) -> None:
        self.conn.disconnect()
        self.peer.close()
        self.server.close()


def test_dialer_connects_only_after_the_accept_frame_verifies() -> None:
    f = _FakeAcceptor()
    try:
        cipher = f.answer_preamble(PASSWORD)
        f.pump(lambda: f.conn.phase is Phase.AWAIT_ACCEPT)
        assert not f.connected
        f.peer.sendall(cipher.seal(ACCEPT_MESSAGE))
        f.pump(lambda: bool(f.connected))
        f.conn.send("hello")
        body = recv_exactly(f.peer, 4 + len(pickle.dumps("hello", 4)) + 16)[4:]
        assert pickle.loads(cipher.open(body)) == "hello"
    finally:
        f.close()


def test_dialer_rejects_an_acceptor_without_the_secret() -> None:
    f = _FakeAcceptor()
    try:
        impostor = f.answer_preamble("not-the-secret")
        f.peer.sendall(impostor.seal(ACCEPT_MESSAGE))
        f.pump(lambda: bool(f.disconnected))
        assert not f.connected
        assert "authentication" in f.rejected[0]
        assert read_until_closed(f.peer, 5)
    finally:
        f.close()


def test_dialer_gives_up_on_a_silent_acceptor() -> None:
    f = _FakeAcceptor(handshake_timeout=0.3)
    try:
        f.pump(lambda: bool(f.disconnected))
        assert not f.connected
        assert "handshake" in f.rejected[0]
    finally:
        f.close()


def test_a_new_groups_preferred_replica_campaigns_without_waiting_out_an_election_timeout(
    tmp_path: pathlib.Path,
) -> None:
    # Election timeouts of 6-7 s: a group that waited for one would have no leader for 6 s.
    settings = RaftSettings(
        password=PASSWORD,
        election_timeout_min_s=6.0,
        election_timeout_max_s=7.0,
        check_quorum_s=3.0,
        leader_fallback_s=3.0,
    )

    async def scenario() -> None:
        c = Cluster(tmp_path, ["a", "b", "c"], settings=settings)
        try:
            t0 = time.monotonic()
            c.start_all()
            leaders = await c.wait_leaders(timeout=20)
            took = time.monotonic() - t0
            assert took < 4.0, f"leaders after {took:.1f} s"
            assert set(leaders.values()) == {0}  # the head of every group's replica list
            node = c.nodes[0]
            assert node is not None
            for gid in c.group_ids:
                group = node.group(gid)
                assert group is not None and group.term() == 1  # one election, no split vote
        finally:
            c.close()

    run(scenario)
