"""storage.store: writes skip RocksDB's WAL (the Raft journal is the WAL); ``make_durable`` is what persists them.

Each scenario writes in a child process that then dies without closing the database (``os._exit``), as a
SIGKILLed node would, and the test reopens the store.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

from storage.store import NodeStore

REPO = pathlib.Path(__file__).resolve().parents[2]


def _crash_after(path: pathlib.Path, body: str) -> None:
    script = (
        textwrap.dedent(
            f"""
        import os, pathlib
        from storage.store import NodeStore
        store = NodeStore(pathlib.Path({str(path)!r}))
        """
        )
        + textwrap.dedent(body)
        + "\nos._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=60)


def _read(path: pathlib.Path, *keys: bytes) -> list[bytes | None]:
    store = NodeStore(path)
    try:
        return [store.db.get(k) for k in keys]
    finally:
        store.close()


def test_writes_since_the_last_make_durable_are_lost_with_the_process(tmp_path: pathlib.Path) -> None:
    _crash_after(
        tmp_path,
        """
        store.put(b"a", b"1")
        store.make_durable()
        batch = store.new_batch()
        batch.put(b"b", b"2")
        batch.put(b"c", os.urandom(8192))  # a blob-sized value
        store.write(batch)
        store.put(b"a", b"3")
        """,
    )
    # Back at the flush: a consistent prefix of the writes, which the groups' journals replay.
    assert _read(tmp_path, b"a", b"b", b"c") == [b"1", None, None]


def test_make_durable_persists_every_write_before_it(tmp_path: pathlib.Path) -> None:
    _crash_after(
        tmp_path,
        """
        batch = store.new_batch()
        batch.put(b"b", b"2")
        batch.put(b"c", b"x" * 8192)
        store.write(batch)
        store.put(b"a", b"3")
        store.make_durable()
        """,
    )
    assert _read(tmp_path, b"a", b"b", b"c") == [b"3", b"2", b"x" * 8192]


def test_a_range_delete_survives_the_process_without_a_flush(tmp_path: pathlib.Path) -> None:
    _crash_after(
        tmp_path,
        """
        store.put(b"P1k", b"old")
        store.put(b"P2k", b"other group")
        store.make_durable()
        store.delete_prefix(b"P1")  # a deleted partition: its keys must not come back
        """,
    )
    assert _read(tmp_path, b"P1k", b"P2k") == [None, b"other group"]


def test_sync_mode_keeps_the_write_ahead_log(tmp_path: pathlib.Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, pathlib
        from storage.store import NodeStore
        store = NodeStore(pathlib.Path({str(tmp_path)!r}), sync=True)
        store.put(b"a", b"1")
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=60)
    assert _read(tmp_path, b"a") == [b"1"]
