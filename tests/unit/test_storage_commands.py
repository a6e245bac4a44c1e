"""Command encodings and the NodeStore helpers."""

from __future__ import annotations

import pathlib

import pytest

from clients.protocol import BrokerError, ErrorCode
from storage.commands import (
    AppendCommand,
    DeleteRecordsCommand,
    NoopCommand,
    RetentionCommand,
    decode_command,
    encode_append,
    encode_delete_records,
    encode_retention,
)
from storage.store import NodeStore, prefix_upper_bound


def test_commands_round_trip() -> None:
    cmd = decode_command(encode_append(b"batch-bytes", 1234))
    assert isinstance(cmd, AppendCommand)
    assert (cmd.log_append_time, bytes(cmd.batch)) == (1234, b"batch-bytes")
    assert decode_command(encode_retention(1, 2, 3, 4)) == RetentionCommand(1, 2, 3, 4)
    assert decode_command(encode_delete_records(-1)) == DeleteRecordsCommand(-1)
    assert decode_command(b"\x00") == NoopCommand()


@pytest.mark.parametrize("command", [b"", b"\x09", b"\x02" + bytes(31), b"\x02" + bytes(33), b"\x03" + bytes(7)])
def test_malformed_commands_are_invalid_request(command: bytes) -> None:
    with pytest.raises(BrokerError) as info:
        decode_command(command)
    assert info.value.error_code is ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize(
    ("prefix", "upper"),
    [(b"a", b"b"), (b"a\xff", b"b"), (b"\x00\xff\xff", b"\x01"), (b"\xff", None)],
)
def test_prefix_upper_bound(prefix: bytes, upper: bytes | None) -> None:
    assert prefix_upper_bound(prefix) == upper


def test_iter_and_delete_prefix(tmp_path: pathlib.Path) -> None:
    store = NodeStore(tmp_path / "db")
    try:
        for key in (b"a", b"ab1", b"ab2", b"ac", b"b", b"\xff\x01", b"\xff\x02"):
            store.db.put(key, key)
        assert [k for k, _ in store.iter_prefix(b"ab")] == [b"ab1", b"ab2"]
        assert [k for k, _ in store.iter_range(b"ab", b"ac", backwards=True)] == [b"ab2", b"ab1"]
        assert [k for k, _ in store.iter_range(b"ab", b"b", floor=b"ab15")] == [b"ab1", b"ab2", b"ac"]
        assert [k for k, _ in store.iter_range(b"ab", b"b", floor=b"aa")] == [b"ab1", b"ab2", b"ac"]
        store.delete_prefix(b"ab")
        store.delete_prefix(b"\xff")
        assert [k for k, _ in store.iter_prefix(b"")] == [b"a", b"ac", b"b"]
        with pytest.raises(ValueError, match="whole database"):
            store.delete_prefix(b"")
    finally:
        store.close()
        store.close()  # idempotent
