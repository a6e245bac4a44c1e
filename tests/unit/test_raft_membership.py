"""Pure rules of a group's configuration (raft.membership) and the PySyncObj internals they rely on."""

from __future__ import annotations

import pickle

import pytest
from pysyncobj.node import TCPNode

from raft import pysyncobj_patches as patches
from raft.membership import (
    ADD,
    REMOVE,
    Change,
    Plan,
    RemovesLeader,
    RequestError,
    lag,
    parse_change,
    plan_change,
    replay,
    requested,
    rewind,
)
from raft.membership_log import snapshot_voters

A, B, C, D, E = (f"10.0.0.{i}:9000" for i in range(1, 6))


def _entry(op: str, address: str) -> bytes:
    # PySyncObj's addNodeToCluster / removeNodeFromCluster command.
    return bytes([2]) + pickle.dumps([op, address, TCPNode(address)])


def test_parse_change_reads_membership_entries_only() -> None:
    assert parse_change(_entry("add", D)) == Change(ADD, D)
    assert parse_change(_entry("rem", A)) == Change(REMOVE, A)
    assert parse_change(b"\x00" + pickle.dumps((0, (b"x",)))) is None  # a replicated command
    assert parse_change(b"\x01") is None  # a no-op
    assert parse_change(b"") is None
    assert parse_change(bytes([2]) + pickle.dumps(["ver", A])) is None


def test_replay_applies_changes_in_log_order() -> None:
    base = frozenset({A, B, C})
    assert replay(base, []) == base
    assert replay(base, [Change(ADD, D), Change(REMOVE, A)]) == {B, C, D}
    # The last change naming a node decides, whatever the base believed.
    assert replay({A, B, C}, [Change(ADD, E), Change(REMOVE, E)]) == {A, B, C}
    assert replay({B, C, D}, [Change(ADD, D), Change(REMOVE, A)]) == {B, C, D}


def test_rewind_gives_the_configuration_before_a_suffix() -> None:
    changes = [Change(ADD, D), Change(REMOVE, A), Change(ADD, E), Change(REMOVE, E)]
    before = frozenset({A, B, C})
    after = replay(before, changes)
    assert after == {B, C, D}
    assert rewind(after, changes) == before
    for cut in range(len(changes) + 1):
        assert rewind(after, changes[cut:]) == replay(before, changes[:cut])


def test_snapshot_voters_accepts_nodes_and_addresses() -> None:
    last, prev = (b"\x01", 10, 2), (b"\x01", 9, 2)
    assert snapshot_voters((last, prev, {TCPNode(A), TCPNode(B)})) == {A, B}
    assert snapshot_voters((last, prev, [A, C])) == {A, C}


def test_requested_takes_exactly_one_address() -> None:
    assert issubclass(RequestError, ValueError)
    assert requested(D, None) == Change(ADD, D)
    assert requested(None, A) == Change(REMOVE, A)
    with pytest.raises(RequestError):
        requested(None, None)
    with pytest.raises(RequestError):
        requested(D, A)
    for bad in ("nohost", ":9000", "h:", "h:99999", "h:x"):
        with pytest.raises(RequestError, match="host:port"):
            requested(bad, None)


def test_plan_change() -> None:
    voters = frozenset({A, B, C})
    assert plan_change(voters, A, Change(ADD, D)) is Plan.PROPOSE
    assert plan_change(voters, A, Change(REMOVE, B)) is Plan.PROPOSE
    assert plan_change(voters, A, Change(ADD, B)) is Plan.NOTHING
    assert plan_change(voters, A, Change(REMOVE, D)) is Plan.NOTHING
    with pytest.raises(RemovesLeader):
        plan_change(voters, A, Change(REMOVE, A))


def test_lag() -> None:
    assert lag(100, 100) == 0
    assert lag(100, 40) == 60
    assert lag(100, 0) == 100
    assert lag(100, None) is None
    assert lag(100, 120) == 0  # a match index read ahead of the last index (racing reads)


def test_audit_covers_the_membership_internals() -> None:
    patches.audit()  # raises when a call path raft.membership_log overrides moved
