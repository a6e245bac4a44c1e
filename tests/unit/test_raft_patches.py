"""raft/pysyncobj_patches.py: the PySyncObj internals we patch or read still exist."""

from __future__ import annotations

import logging
import pathlib
import subprocess
import sys
import textwrap
from time import monotonic
from typing import Any

import pysyncobj.pickle as psc_pickle
import pysyncobj.serializer as psc_serializer
import pysyncobj.syncobj as psc_syncobj
import pytest
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.transport import Transport

from raft import pysyncobj_patches as patches
from raft import snapshot_transmission


class _NullTransport(Transport):  # type: ignore[misc]
    def send(self, node: object, message: object) -> bool:
        return False


def test_audit_passes_on_the_pinned_version() -> None:
    patches.audit()


def test_apply_is_idempotent_and_sets_protocol_4() -> None:
    patches.apply()
    patches.apply()
    assert psc_pickle.__dict__["__protocol"] == 4
    assert psc_syncobj.createPoller is patches._create_poller


def test_instance_private_attributes_exist() -> None:
    patches.apply()
    conf = SyncObjConf(autoTick=False, appendEntriesUseBatch=False)
    so = SyncObj("127.0.0.1:1", ["127.0.0.1:2"], conf, transport=_NullTransport(None, None, []))
    try:
        assert isinstance(patches.raft_next_index(so), dict)
        assert isinstance(patches.raft_match_index(so), dict)
        assert patches.raft_state(so) == 0
        assert isinstance(patches.connected_nodes(so), set)
        assert len(patches.raft_log(so)) == 1
        assert patches.transport_of(so) is not None
        assert "_SyncObj__pipeNotifier" in so.__dict__
    finally:
        so.destroy()
        patches.close_pipe_notifier(so)


def test_poller_override_is_thread_local_and_scoped() -> None:
    patches.apply()
    sentinel = object()
    with patches.constructing_with_poller(sentinel):
        assert psc_syncobj.createPoller("auto") is sentinel
    assert psc_syncobj.createPoller("auto") is not sentinel


def test_truncation_critical_is_demoted_and_counted(caplog: object) -> None:
    patches.apply()
    before = patches.TRUNCATION_WARNINGS.value
    records: list[logging.LogRecord] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log = logging.getLogger(psc_syncobj.__name__)
    handler = Grab()
    log.addHandler(handler)
    try:
        log.critical("truncating already-applied log entries from index %d", 5)
        log.critical("something else")
    finally:
        log.removeHandler(handler)
    assert patches.TRUNCATION_WARNINGS.value == before + 1
    assert [r.levelname for r in records] == ["WARNING", "CRITICAL"]


class _RecordingTransport(_NullTransport):
    def __init__(self) -> None:
        super().__init__(None, None, [])
        self.sent: list[tuple[object, object]] = []

    def send(self, node: object, message: object) -> bool:
        self.sent.append((node, message))
        return True


class _Coalescing(patches.CoalescedAppendEntries, SyncObj):  # type: ignore[misc]
    def __init__(
        self,
        transport: _RecordingTransport,
        commit_notify_delay: float = 0.0,
        lazy: bool = False,
        delay_idle: bool = False,
    ) -> None:
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,
            commandsWaitLeader=False,
            appendEntriesPeriod=10.0,
            raftMinTimeout=40.0,
            raftMaxTimeout=50.0,
            leaderFallbackTimeout=60.0,
            connectionTimeout=60.0,
        )
        self.commit_notify_delay = commit_notify_delay
        self.lazy_commit_notify = lazy
        self.delay_idle_commit_notify = delay_idle
        self.wakes: list[float] = []
        super().__init__("127.0.0.1:1", ["127.0.0.1:2"], conf, transport=transport)

    def _wake_at(self, when: float) -> None:
        self.wakes.append(when)

    @replicated  # type: ignore[untyped-decorator]
    def put(self, value: bytes) -> bytes:
        return value

    def lead(self) -> Any:
        """Make this node the leader with its follower connected (PySyncObj internals, test only)."""
        self._SyncObj__raftState = 2
        self._SyncObj__raftLeader = self._SyncObj__selfNode
        follower = next(iter(self._SyncObj__otherNodes))
        self._SyncObj__connectedNodes.add(follower)
        self._SyncObj__raftNextIndex[follower] = self._SyncObj__getCurrentLogIndex() + 1
        self._SyncObj__raftMatchIndex[follower] = 0
        self._SyncObj__lastResponseTime[follower] = monotonic()
        self._SyncObj__newAppendEntriesTime = monotonic() + 10.0
        return follower


def _append_entries(transport: _RecordingTransport) -> list[dict[str, Any]]:
    return [m for _, m in transport.sent if isinstance(m, dict) and m.get("type") == "append_entries"]


def _acked_by(so: _Coalescing, transport: _RecordingTransport, follower: Any) -> tuple[int, int]:
    """The follower acknowledges the leader's whole log: (that index, AppendEntries sent so far)."""
    index: int = so._SyncObj__getCurrentLogIndex()
    so._SyncObj__raftMatchIndex[follower] = index
    return index, len(_append_entries(transport))


def test_queued_commands_go_out_in_one_append_entries_per_drain() -> None:
    patches.apply()
    transport = _RecordingTransport()
    so = _Coalescing(transport)
    try:
        so.lead()
        for i in range(5):
            so._applyCommand(b"cmd%d" % i, None)
        so._checkCommandsToApply()
        appends = _append_entries(transport)
        assert len(appends) == 1
        assert [e[0] for e in appends[0]["entries"]] == [b"cmd%d" % i for i in range(5)]
        # A lone command is still sent within the same drain.
        so._applyCommand(b"alone", None)
        so._checkCommandsToApply()
        appends = _append_entries(transport)
        assert len(appends) == 2
        assert [e[0] for e in appends[1]["entries"]] == [b"alone"]
    finally:
        so.destroy()
        patches.close_pipe_notifier(so)


@pytest.mark.parametrize("delay", [0.0, 5.0])
def test_commit_notification_is_deferred_only_while_more_entries_are_in_flight(delay: float) -> None:
    patches.apply()
    transport = _RecordingTransport()
    so = _Coalescing(transport, commit_notify_delay=delay)
    try:
        follower = so.lead()
        results: list[Any] = []
        so.put(b"first", callback=lambda res, err: results.append(res))
        so.put(b"second", callback=lambda res, err: results.append(res))
        so.doTick(0.0)  # appends and replicates both entries
        second = so._SyncObj__getCurrentLogIndex()
        first = second - 1
        assert [e[1] for e in _append_entries(transport)[-1]["entries"]] == [first, second]

        def notified(index: int, since: int) -> bool:
            return any(m["commit_index"] == index for m in _append_entries(transport)[since:])

        # The follower acknowledged the first entry only: it commits while the second is in flight.
        so._SyncObj__raftMatchIndex[follower] = first
        sent = len(_append_entries(transport))
        so.doTick(0.0)
        assert results == [b"first"]
        if delay == 0.0:
            assert notified(first, sent) and not so.wakes  # PySyncObj's behaviour: at once
            return
        assert not notified(first, sent)  # the second entry's commit will announce it
        assert len(so.wakes) == 1 and so.wakes[0] <= monotonic() + delay
        # The second entry commits: nothing else in flight, so followers hear at once.
        so._SyncObj__raftMatchIndex[follower] = second
        sent = len(_append_entries(transport))
        so.doTick(0.0)
        assert results == [b"first", b"second"]
        assert notified(second, sent)
    finally:
        so.destroy()
        patches.close_pipe_notifier(so)


@pytest.mark.parametrize("delay", [0.0, 5.0])
def test_a_lazy_group_announces_a_lone_commit_with_the_next_heartbeat(delay: float) -> None:
    # lazy_commit_notify (coordinator groups): a write with nothing after it costs no AppendEntries round of
    # its own to tell followers the commit index; the heartbeat due next carries it
    patches.apply()
    transport = _RecordingTransport()
    so = _Coalescing(transport, commit_notify_delay=delay, lazy=True)
    try:
        follower = so.lead()
        results: list[Any] = []
        so.put(b"lone", callback=lambda res, err: results.append(res))
        so.doTick(0.0)
        index, sent = _acked_by(so, transport, follower)
        so.doTick(0.0)
        assert results == [b"lone"], "the leader's commit and apply are not delayed"
        assert len(_append_entries(transport)) == sent, "a round only to announce the commit"
        so._SyncObj__newAppendEntriesTime = monotonic() - 1  # the heartbeat is due
        so.doTick(0.0)
        assert [m["commit_index"] for m in _append_entries(transport)[sent:]] == [index]
    finally:
        so.destroy()
        patches.close_pipe_notifier(so)


def test_a_trickle_group_announces_a_lone_commit_with_the_next_write_or_after_the_delay() -> None:
    # delay_idle_commit_notify (partitions): below full load each write committed alone, and announcing it at
    # once cost every write a second AppendEntries round; the next write's AppendEntries carries it instead
    patches.apply()
    transport = _RecordingTransport()
    so = _Coalescing(transport, commit_notify_delay=5.0, delay_idle=True)
    try:
        follower = so.lead()
        results: list[Any] = []
        so.put(b"one", callback=lambda res, err: results.append(res))
        so.doTick(0.0)
        first, sent = _acked_by(so, transport, follower)
        so.doTick(0.0)
        assert results == [b"one"], "the leader's commit and apply are not delayed"
        assert len(_append_entries(transport)) == sent, "no round only to announce the commit"
        assert len(so.wakes) == 1 and so.wakes[0] <= monotonic() + 5.0, "a tick is asked for at the delay"
        # The next write comes first: its AppendEntries carries the commit index.
        so.put(b"two", callback=lambda res, err: results.append(res))
        so.doTick(0.0)
        appends = _append_entries(transport)[sent:]
        assert [(m["commit_index"], len(m["entries"])) for m in appends] == [(first, 1)]
        # Nothing follows the second: after the delay, a round announces it.
        second, sent = _acked_by(so, transport, follower)
        so.doTick(0.0)
        assert results == [b"one", b"two"] and len(_append_entries(transport)) == sent
        assert so._SyncObj__newAppendEntriesTime <= monotonic() + 5.0, "the announcement is due within the delay"
        so._SyncObj__newAppendEntriesTime = monotonic() - 1  # the delay has passed
        so.doTick(0.0)
        assert [m["commit_index"] for m in _append_entries(transport)[sent:]] == [second]
    finally:
        so.destroy()
        patches.close_pipe_notifier(so)


def test_commit_index_is_stored_at_most_once_per_period_and_on_demand(tmp_path: Any) -> None:
    import types

    from pysyncobj.journal import FileJournal, MetaStorer

    patches.apply()
    path = str(tmp_path / "raft.journal")
    journal = FileJournal(path)
    try:

        def stored() -> Any:
            return MetaStorer(path + ".meta").getMeta().get("raftCommitIndex")

        journal.setRaftCommitIndex(5)
        journal.onOneSecondTimer()
        assert stored() == 5
        journal.setRaftCommitIndex(6)  # within the period: kept in memory only
        journal.onOneSecondTimer()
        assert stored() == 5
        assert journal.getRaftCommitIndex() == 6
        so = types.SimpleNamespace(_SyncObj__raftLog=journal)
        patches.store_commit_index(so)
        assert stored() == 6
    finally:
        journal._destroy()


def test_journal_entries_written_with_pwritev_reopen_byte_identical(tmp_path: Any) -> None:
    import struct

    from pysyncobj.journal import FIRST_RECORD_OFFSET, FileJournal

    patches.apply()
    path = str(tmp_path / "raft.journal")
    entries = [(b"\x01" + bytes([i]) * (i * 5000), i + 1, 3) for i in range(40)]  # grows the file many times
    journal = FileJournal(path)
    for entry in entries:
        journal.add(*entry)
    journal.deleteEntriesFrom(38)  # truncation walks back over the trailers we wrote
    journal._destroy()
    reopened = FileJournal(path)
    try:
        assert [tuple(e) for e in reopened] == entries[:38]
    finally:
        reopened._destroy()
    with open(path, "rb") as f:
        raw = f.read()
    expected = b"".join(
        struct.pack("<I", 16 + len(c)) + struct.pack("<QQ", i, t) + c + struct.pack("<I", 16 + len(c))
        for c, i, t in entries[:38]
    )
    assert raw[FIRST_RECORD_OFFSET : FIRST_RECORD_OFFSET + len(expected)] == expected


def test_a_journal_write_the_disk_refuses_ends_the_process(tmp_path: Any) -> None:
    # A follower would acknowledge an entry that is only in memory, and a leader count it towards a majority:
    # after a restart a committed entry could be gone. RLIMIT_FSIZE makes the real pwritev fail with EFBIG.
    script = textwrap.dedent(
        f"""
        import resource, signal
        from pysyncobj.journal import FileJournal
        from raft import pysyncobj_patches as patches
        patches.apply()
        journal = FileJournal({str(tmp_path / "raft.journal")!r})
        journal.add(b"fits", 1, 1)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        journal.add(b"x" * (2 << 20), 2, 1)
        print("the add returned", flush=True)
        """
    )
    repo = pathlib.Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=60)
    assert "the add returned" not in res.stdout
    assert res.returncode == patches.EXIT_JOURNAL_ERROR == 74, res.stderr
    assert "write failed" in res.stderr


@pytest.mark.parametrize(("rate", "chunks_at_once"), [(0, 3), (1, 1)])
def test_a_paced_snapshot_transfer_sends_no_more_than_its_rate(tmp_path: Any, rate: int, chunks_at_once: int) -> None:
    patches.apply()
    full = tmp_path / "raft.dump.full"
    full.write_bytes(b"x" * 3000)
    serializer = psc_serializer.Serializer(str(tmp_path / "raft.dump"), 1000, False, None, None, None)

    class _So:
        _SyncObj__serializer = serializer

    so = _So()
    snapshot_transmission.set_transmission_source(so, lambda: str(full), rate)
    got = []
    try:
        while (data := serializer.getTransmissionData("follower")) is not None and not data[2]:
            got.append(data[0])
        # 1 byte/s: after the first chunk the transfer is ahead of its pace, and the leader's round of chunks ends
        assert [len(c) for c in got] == [1000] * chunks_at_once
        if rate:
            assert serializer.getTransmissionData("follower") is None, "still ahead of the pace"
    finally:
        snapshot_transmission.close_serializer_files(so)


@pytest.mark.parametrize("ready", [False, True])
def test_a_snapshot_with_nothing_to_send_costs_one_message_per_round(tmp_path: Any, ready: bool) -> None:
    # A follower behind the leader's log start gets a snapshot; while it is being built (or ahead of its pace),
    # the leader's round of AppendEntries sends one "nothing yet" message to it, not one after another for the
    # whole heartbeat period (10 s here).
    patches.apply()
    transport = _RecordingTransport()
    so = _Coalescing(transport)
    full = tmp_path / "raft.dump.full"
    full.write_bytes(b"x" * 3000)
    try:
        follower = so.lead()
        for i in range(3):
            so._applyCommand(b"cmd%d" % i, None)
        so._checkCommandsToApply()
        start = so._SyncObj__raftLog[0][1]
        so._SyncObj__raftNextIndex[follower] = start  # at the log start: a snapshot is due
        so._SyncObj__serializer._Serializer__fileName = str(tmp_path / "raft.dump")  # a file-backed group's
        snapshot_transmission.set_transmission_source(so, lambda: str(full) if ready else None)
        transport.sent.clear()
        began = monotonic()
        so._flush_append_entries()
        snapshots = [m for m in _append_entries(transport) if "serialized" in m]
        assert monotonic() - began < 5.0
        if ready:  # a built one streams in this round, to its end
            assert [m["serialized"] is not None for m in snapshots] == [True] * len(snapshots) and snapshots
            assert snapshots[-1]["serialized"][2], "the last chunk"
        else:
            assert [m["serialized"] for m in snapshots] == [None]
            assert so._SyncObj__raftNextIndex[follower] == start, "its next index back after the round"
    finally:
        snapshot_transmission.close_serializer_files(so)
        so.destroy()
        patches.close_pipe_notifier(so)


def test_the_journal_meta_is_overwritten_in_place_and_reads_back_after_a_shorter_one(tmp_path: pathlib.Path) -> None:
    from pysyncobj.journal import MetaStorer

    patches.apply()
    path = tmp_path / "g.meta"
    storer = MetaStorer(str(path))
    storer.storeMeta({"currentTerm": 123456789, "votedForNodeId": "127.0.0.1:65535", "raftCommitIndex": 10**9})
    inode = path.stat().st_ino
    storer.storeMeta({"currentTerm": 2, "votedForNodeId": None, "raftCommitIndex": 1})
    assert path.stat().st_ino == inode  # the same file: no new file renamed over it
    assert not (tmp_path / "g.meta.tmp").exists()
    assert MetaStorer(str(path)).getMeta() == {"currentTerm": 2, "votedForNodeId": None, "raftCommitIndex": 1}
    big = {"currentTerm": 3, "votedForNodeId": "x" * 1000}  # over one sector: a new file renamed over it
    storer.storeMeta(big)
    assert MetaStorer(str(path)).getMeta() == big
    path.write_bytes(b"\x00garbage")
    with pytest.raises(RuntimeError, match="unreadable"):
        MetaStorer(str(path)).getMeta()
