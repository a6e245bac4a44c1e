"""storage.store: writes skip RocksDB's WAL (the Raft journal is the WAL); ``make_durable`` is what persists them.

Each scenario writes in a child process that then dies without closing the database (``os._exit``), as a
SIGKILLed node would, and the test reopens the store.
"""

from __future__ import annotations

import errno
import os
import pathlib
import random
import subprocess
import sys
import textwrap

import pytest

from storage.store import NodeStore, supports_direct_io

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


def test_a_write_the_disk_refuses_ends_the_process(tmp_path: pathlib.Path) -> None:
    # A committed entry this replica cannot apply must not be skipped while the other replicas apply it (they
    # would diverge). RLIMIT_FSIZE makes RocksDB's real flush fail with EFBIG ("IO error: ... File too large");
    # RocksDB then refuses every write, and the store exits with status 74 instead of returning an error.
    script = textwrap.dedent(
        f"""
        import os, pathlib, resource, signal
        from storage.store import NodeStore
        store = NodeStore(pathlib.Path({str(tmp_path)!r}))
        store.put(b"before", b"1")
        store.make_durable()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))
        for i in range(50):
            store.put(b"big%d" % i, os.urandom(16384))
        try:
            store.make_durable()
        except Exception as exc:
            print("flush failed:", exc, flush=True)
        store.put(b"after", b"2")
        print("the write returned", flush=True)
        os._exit(0)
        """
    )
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "flush failed: IO error" in res.stdout
    assert "the write returned" not in res.stdout
    assert res.returncode == 74, res.stderr
    assert "write failed" in res.stderr and "exiting with status 74" in res.stderr
    assert _read(tmp_path, b"before", b"after") == [b"1", None]


def test_a_write_with_a_bad_argument_raises_and_the_process_lives(tmp_path: pathlib.Path) -> None:
    # Not the disk's fault: every replica would meet it alike, so it stays an exception (the group turns it
    # into an error result).
    store = NodeStore(tmp_path)
    try:
        with pytest.raises(TypeError):
            store.write(b"not a batch")  # type: ignore[arg-type]
        store.put(b"k", b"v")
        assert store.db.get(b"k") == b"v"
    finally:
        store.close()


def _logged_direct_io(path: pathlib.Path) -> str:
    """What RocksDB's LOG says of the option (the store's own flag could disagree with what RocksDB got)."""
    for line in (path / "LOG").read_text().splitlines():
        if "Options.use_direct_io_for_flush_and_compaction:" in line:
            return line.rsplit(":", 1)[1].strip()
    raise AssertionError("option not in RocksDB's LOG")


def test_flushes_bypass_the_page_cache_where_the_filesystem_allows(tmp_path: pathlib.Path) -> None:
    supported = supports_direct_io(tmp_path)
    assert not (tmp_path / ".direct-io-probe").exists()
    store = NodeStore(tmp_path)
    try:
        assert store.direct_io is supported
        assert _logged_direct_io(tmp_path) == ("1" if supported else "0")
    finally:
        store.close()
    # Blobs flushed with O_DIRECT (unaligned sizes included) read back whole after a crash.
    values = {f"k{i}".encode(): random.Random(i).randbytes(4096 * i + 1234) for i in range(1, 9)}
    _crash_after(
        tmp_path,
        """
        import random
        batch = store.new_batch()
        for i in range(1, 9):
            batch.put(f"k{i}".encode(), random.Random(i).randbytes(4096 * i + 1234))
        store.write(batch)
        store.make_durable()
        """,
    )
    assert _read(tmp_path, *values) == list(values.values())


def test_direct_io_is_off_where_the_filesystem_refuses_it_or_when_asked(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def refuse_o_direct(path: str, flags: int, *args: int) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")  # what tmpfs before Linux 6.6 answers
        return real_open(path, flags, *args)

    with monkeypatch.context() as m:
        m.setattr(os, "open", refuse_o_direct)
        assert supports_direct_io(tmp_path) is False
        store = NodeStore(tmp_path / "refused")
    try:
        assert store.direct_io is False
        assert _logged_direct_io(tmp_path / "refused") == "0"
    finally:
        store.close()
    store = NodeStore(tmp_path / "off", direct_io=False)
    try:
        assert (store.direct_io, _logged_direct_io(tmp_path / "off")) == (False, "0")
    finally:
        store.close()
