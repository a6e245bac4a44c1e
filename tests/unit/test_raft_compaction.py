"""raft.compaction: a group's dump is renamed into place only when it is written, durable, and still current."""

from __future__ import annotations

import pathlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from pysyncobj.config import SERIALIZER_STATE

from raft import snapshot
from raft.compaction import Compaction


def _light(tmp_path: pathlib.Path) -> tuple[Compaction, ThreadPoolExecutor, str]:
    pool = ThreadPoolExecutor(max_workers=1)
    return Compaction("g", pool), pool, str(tmp_path / "raft.dump")


def test_light_dump_is_made_durable_off_the_caller_and_renamed_by_check(tmp_path: pathlib.Path) -> None:
    compaction, pool, dump = _light(tmp_path)
    gate = threading.Event()
    threads: list[str] = []

    def make_durable() -> None:
        threads.append(threading.current_thread().name)
        gate.wait(10)

    try:
        assert compaction.check() == SERIALIZER_STATE.NOT_SERIALIZING
        compaction.start(dump, ("raft", 1), 42, make_durable, None)  # returns at once: the fsync is held
        assert compaction.check() == SERIALIZER_STATE.SERIALIZING
        assert not pathlib.Path(dump).exists()
        gate.set()
        pool.shutdown(wait=True)
        assert threads and threads[0] != threading.current_thread().name
        assert compaction.check() == SERIALIZER_STATE.SUCCESS
        reader = snapshot.SnapshotReader(dump)
        assert reader.light and reader.state_index == 42 and reader.raft_data == ("raft", 1)
        assert compaction.check() == SERIALIZER_STATE.NOT_SERIALIZING
        assert compaction.completed == 1
    finally:
        gate.set()
        pool.shutdown(wait=True)


def test_dump_of_a_state_replaced_meanwhile_is_dropped(tmp_path: pathlib.Path) -> None:
    compaction, pool, dump = _light(tmp_path)
    pathlib.Path(dump).write_bytes(b"installed from the leader")
    gate = threading.Event()

    def held() -> None:
        gate.wait(10)

    try:
        compaction.start(dump, ("raft", 1), 7, held, None)
        compaction.invalidate()  # a snapshot was installed while the fsync ran
        gate.set()
        pool.shutdown(wait=True)
        assert compaction.check() == SERIALIZER_STATE.FAILED
        assert pathlib.Path(dump).read_bytes() == b"installed from the leader"
        assert not pathlib.Path(dump + ".tmp").exists()
        assert compaction.completed == 0
    finally:
        gate.set()
        pool.shutdown(wait=True)


def test_failed_fsync_fails_the_compaction_and_keeps_the_old_dump(tmp_path: pathlib.Path) -> None:
    compaction, pool, dump = _light(tmp_path)
    pathlib.Path(dump).write_bytes(b"old")

    def broken() -> None:
        raise OSError("EIO")

    compaction.start(dump, ("raft", 1), 7, broken, None)
    pool.shutdown(wait=True)
    assert compaction.check() == SERIALIZER_STATE.FAILED
    assert pathlib.Path(dump).read_bytes() == b"old"


def test_in_memory_state_is_copied_synchronously(tmp_path: pathlib.Path) -> None:
    compaction, pool, dump = _light(tmp_path)
    state = [b"before"]

    def write_body(out: BinaryIO) -> None:
        out.write(state[0])

    try:
        compaction.start(dump, ("raft", 1), 3, None, write_body)
        state[0] = b"after"  # the next apply: the dump must already hold the state it was asked for
        assert compaction.check() == SERIALIZER_STATE.SUCCESS
        with snapshot.SnapshotReader(dump).open_body() as body:
            assert body.read() == b"before"
    finally:
        pool.shutdown(wait=True)


def test_a_stopped_node_fails_the_compaction_instead_of_raising(tmp_path: pathlib.Path) -> None:
    compaction, pool, dump = _light(tmp_path)
    pool.shutdown(wait=True)
    compaction.start(dump, ("raft", 1), 3, lambda: None, None)
    assert compaction.check() == SERIALIZER_STATE.FAILED
    assert not pathlib.Path(dump).exists()
