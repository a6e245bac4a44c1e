"""``FullSnapshotBuilder``: the full snapshot a leader builds for a follower, and its file's lifetime."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from raft import snapshot
from raft.full_snapshot import FullSnapshotBuilder, Pacer

GROUP = "t1p0"


class FakeStore:
    """A ``DurableStateMachine`` whose state is ``body`` at ``index``."""

    def __init__(self, index: int, body: bytes) -> None:
        self.index, self.body = index, body
        self.last_applied = index

    def consistent_snapshot(self) -> tuple[int, Callable[[BinaryIO], None]]:
        index, body = self.index, self.body

        def write(out: BinaryIO) -> None:
            out.write(body[: len(body) // 2])
            out.write(memoryview(body)[len(body) // 2 :])

        return index, write

    # the rest of the protocol, unused by the builder
    def apply(self, index: int, command: bytes) -> object:
        raise AssertionError("not applied here")

    def write_snapshot(self, out: BinaryIO) -> None:
        raise AssertionError("a store-backed machine is copied through consistent_snapshot")

    def read_snapshot(self, inp: BinaryIO, last_applied: int) -> None:
        raise AssertionError("not restored here")

    def make_durable(self) -> None:
        pass


def light_dump(path: Path, index: int) -> None:
    """A compaction's light container at ``path`` (replaced: a new file, as PySyncObj renames one in)."""
    tmp = str(path) + ".new"
    snapshot.write_snapshot(tmp, ("raft", index), index, None)
    os.replace(tmp, path)


def finish_build() -> None:
    for t in threading.enumerate():
        if t.name == f"snapshot-{GROUP}":
            t.join(10)
            assert not t.is_alive()


def test_a_full_snapshot_is_built_off_the_ticker_and_then_handed_out(tmp_path: Path) -> None:
    dump = tmp_path / "raft.dump"
    light_dump(dump, 40)
    sm = FakeStore(45, b"state " * 1000)
    b = FullSnapshotBuilder(GROUP, str(dump), sm)  # type: ignore[arg-type]  # a fake store
    assert b.path_for_transmission() is None, "not built yet: PySyncObj asks again"
    finish_build()
    path = b.path_for_transmission()
    assert path == b.full_path and b.builds == 1
    reader = snapshot.SnapshotReader(path)  # the digest written on the way out verifies
    assert not reader.light and reader.state_index == 45 and reader.raft_data == ("raft", 40)
    with reader.open_body() as body:
        assert body.read() == sm.body
    assert b.path_for_transmission() == path and b.builds == 1, "handed out again, not rebuilt"


def test_a_stale_full_file_is_removed_when_the_next_is_built_and_at_close(tmp_path: Path) -> None:
    dump = tmp_path / "raft.dump"
    light_dump(dump, 40)
    sm = FakeStore(45, b"a" * 4096)
    b = FullSnapshotBuilder(GROUP, str(dump), sm)  # type: ignore[arg-type]
    b.path_for_transmission()
    finish_build()
    assert b.path_for_transmission() == b.full_path
    light_dump(dump, 80)  # a compaction: the full file no longer starts where the leader's log does
    sm.index, sm.body = 90, b"b" * 4096
    release = threading.Event()
    write_new = sm.consistent_snapshot

    def held() -> tuple[int, Callable[[BinaryIO], None]]:
        index, write = write_new()
        return index, lambda out: (release.wait(10), write(out))[1]

    sm.consistent_snapshot = held  # type: ignore[method-assign]
    assert b.path_for_transmission() is None
    assert not os.path.exists(b.full_path), "the stale copy is gone while the next one is built"
    release.set()
    finish_build()
    assert b.path_for_transmission() == b.full_path
    assert snapshot.SnapshotReader(b.full_path).state_index == 90
    b.close()
    assert not os.path.exists(b.full_path)
    assert b.path_for_transmission() is None, "a closed builder hands out nothing"


def test_a_previous_process_full_file_is_removed_at_start(tmp_path: Path) -> None:
    dump = tmp_path / "raft.dump"
    light_dump(dump, 40)
    for leftover in ("raft.dump.full", "raft.dump.full.tmp"):
        (tmp_path / leftover).write_bytes(b"from before the restart")
    FullSnapshotBuilder(GROUP, str(dump), FakeStore(45, b"x"))  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raft.dump"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_paced_copy_sleeps_each_mib_it_is_ahead_of_its_rate(tmp_path: Path) -> None:
    clock = FakeClock()
    pacer = Pacer(2 << 20, clock=clock, sleep=clock.sleep)  # 2 MiB/s
    with open(tmp_path / "copy", "wb") as f:
        fd = f.fileno()
        pacer(fd, 1000)  # under a MiB: nothing
        assert clock.sleeps == []
        pacer(fd, 1 << 20)  # 1 MiB at once: due at 0.5 s
        assert clock.sleeps == [0.5]
        clock.now += 2.0  # a slow stretch: behind the pace, no sleep
        pacer(fd, 2 << 20)
        pacer(fd, 3 << 20)
        assert clock.sleeps == [0.5]
        pacer(fd, 8 << 20)  # due at 4 s after the start; 2.5 s have passed
        assert clock.sleeps == [0.5, 1.5] and pacer.slept == 2.0


def test_an_unpaced_copy_never_sleeps(tmp_path: Path) -> None:
    clock = FakeClock()
    pacer = Pacer(0, clock=clock, sleep=clock.sleep)
    with open(tmp_path / "copy", "wb") as f:
        for mib in range(1, 5):
            pacer(f.fileno(), mib << 20)
    assert clock.sleeps == [] and pacer.slept == 0.0


def test_a_paced_build_takes_its_time_and_still_verifies(tmp_path: Path) -> None:
    dump = tmp_path / "raft.dump"
    light_dump(dump, 40)
    sm = FakeStore(45, os.urandom(3 << 20))
    b = FullSnapshotBuilder(GROUP, str(dump), sm, max_bytes_per_s=12 << 20)  # type: ignore[arg-type]  # a fake
    started = time.monotonic()
    assert b.path_for_transmission() is None
    finish_build()
    assert time.monotonic() - started >= 0.25, "3 MiB at 12 MiB/s"
    path = b.path_for_transmission()
    assert path is not None
    with snapshot.SnapshotReader(path).open_body() as body:
        assert body.read() == sm.body
