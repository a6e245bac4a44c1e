"""Users and ACLs in the controller's replicated state: pure transitions, then the state machine with real
RocksDB (its own key written only on change, reopen, snapshots with and without the security part)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import pytest

from clients.protocol import BrokerError, ErrorCode
from cluster.controller import ControllerCorruptionError, ControllerStateMachine, create_topic_command
from cluster.security.acl import AclBinding, AclFilter
from cluster.security.scram import MIN_ITERATIONS, ScramCredential, make_credential
from cluster.security_state import (
    SecurityChange,
    SecurityView,
    apply_security,
    bootstrap_command,
    create_acls_command,
    delete_acls_command,
    delete_user_command,
    upsert_user_command,
)
from cluster.topics import assign_replicas
from storage.store import NodeStore

SECURITY_KEY = b"C/security"


def cred(password: str = "pw", mechanism: str = "SCRAM-SHA-256") -> ScramCredential:
    return make_credential(password, mechanism, MIN_ITERATIONS)


def acl(principal: str = "User:alice", name: str = "orders", op: str = "READ", **over: str) -> AclBinding:
    doc = {"principal": principal, "resource_type": "TOPIC", "resource_name": name, "operation": op,
           "permission": "ALLOW", **over}  # fmt: skip
    return AclBinding.from_json(doc)


def run(view: SecurityView, command: bytes) -> tuple[object, SecurityView]:
    return apply_security(view, json.loads(command))


# ---- pure transitions --------------------------------------------------------------------------------------


def test_users_are_created_replaced_and_deleted() -> None:
    a1, a2 = cred("one"), cred("two", "SCRAM-SHA-512")
    result, v1 = run(SecurityView(), upsert_user_command("alice", [a1]))
    assert result == {"name": "alice", "created": True} and v1.users == {"alice": {"SCRAM-SHA-256": a1}}
    result, v2 = run(v1, upsert_user_command("alice", [a2]))
    assert result == {"name": "alice", "created": False}
    assert v2.users == {"alice": {"SCRAM-SHA-512": a2}}  # the command's credentials replace the user's
    assert v2.users_json() == [{"name": "alice", "mechanisms": ["SCRAM-SHA-512"]}]
    assert v1.users == {"alice": {"SCRAM-SHA-256": a1}}  # views are never mutated
    result, v3 = run(v2, delete_user_command("alice"))
    assert result == "alice" and v3.users == {}
    missing, v4 = run(v3, delete_user_command("alice"))
    assert isinstance(missing, BrokerError) and missing.error_code is ErrorCode.RESOURCE_NOT_FOUND and v4 is v3


def test_acls_are_added_once_and_deleted_by_filters() -> None:
    a, b, c = acl(), acl("User:bob"), acl(name="pay", pattern_type="PREFIXED")
    result, v1 = run(SecurityView(), create_acls_command([a, b]))
    assert result == [a, b] and set(v1.acls) == {a, b}
    result, v2 = run(v1, create_acls_command([a]))
    assert v2 is v1  # an ACL already there changes nothing
    _, v3 = run(v2, create_acls_command([c]))
    deleted, v4 = run(v3, delete_acls_command([AclFilter(principal="User:bob"), AclFilter(resource_name="pay")]))
    assert set(deleted) == {b, c} and v4.acls == (a,)  # type: ignore[arg-type]
    nothing, v5 = run(v4, delete_acls_command([AclFilter(principal="User:carol")]))
    assert nothing == [] and v5 is v4


def test_bootstrap_records_once_and_keeps_existing_users() -> None:
    mine, config_admin = cred("operator-set"), cred("from-config")
    _, v1 = run(SecurityView(), upsert_user_command("admin", [mine]))
    users = {"admin": {"SCRAM-SHA-256": config_admin}, "metrics": {"SCRAM-SHA-256": cred("m")}}
    done, v2 = run(
        v1, bootstrap_command(users, [acl("User:metrics", "kafka-cluster", "DESCRIBE", resource_type="CLUSTER")])
    )
    assert done is True and v2.bootstrapped
    assert v2.users["admin"] == {"SCRAM-SHA-256": mine} and "metrics" in v2.users and len(v2.acls) == 1
    _, v3 = run(v2, delete_user_command("metrics"))
    again, v4 = run(v3, bootstrap_command(users, []))
    assert again is False and v4 is v3 and "metrics" not in v4.users  # never re-added after deletion


@pytest.mark.parametrize(
    "command",
    [
        {"op": "upsert_user", "name": "x", "credentials": []},
        {"op": "upsert_user", "name": "x", "credentials": [{"mechanism": "SCRAM-SHA-256"}]},
        {"op": "create_acls", "acls": [{"principal": "nobody"}]},
        {"op": "delete_acls", "filters": [{"operation": "JUMP"}]},
        {"op": "delete_acls"},
        {"op": "explode"},
    ],
)
def test_bad_commands_are_errors_and_change_nothing(command: dict[str, object]) -> None:
    view = SecurityView(acls=(acl(),))
    result, after = apply_security(view, command)
    assert isinstance(result, BrokerError) and after is view


def test_json_round_trip() -> None:
    _, v = run(SecurityView(), upsert_user_command("alice", [cred(), cred("x", "SCRAM-SHA-512")]))
    _, v = run(v, create_acls_command([acl(), acl("User:*", "*", "WRITE", permission="DENY")]))
    assert SecurityView.from_json(json.loads(json.dumps(v.to_json()))) == v


# ---- the controller state machine, real RocksDB -------------------------------------------------------------


def topic(sm: ControllerStateMachine, index: int, name: str = "t") -> object:
    return sm.apply(index, create_topic_command(name, assign_replicas([1, 2, 3], 1, 3, 0), {}, 1000))


def test_security_commands_answer_their_index(store: NodeStore) -> None:
    sm = ControllerStateMachine(store)
    seen: list[int] = []
    sm.on_security_change = seen.append
    change = sm.apply(1, upsert_user_command("alice", [cred()]))
    assert change == SecurityChange(1, {"name": "alice", "created": True})
    topic(sm, 2)
    unchanged = sm.apply(3, create_acls_command([acl()]))
    again = sm.apply(4, create_acls_command([acl()]))
    assert isinstance(unchanged, SecurityChange) and isinstance(again, SecurityChange) and again.index == 4
    error = sm.apply(5, delete_user_command("nobody"))
    assert isinstance(error, BrokerError) and error.error_code is ErrorCode.RESOURCE_NOT_FOUND
    assert seen == [1, 3]  # told only of changes
    assert sm.last_applied == 5 and "t" in sm.view.topics


def test_the_security_key_is_written_only_when_it_changes(store: NodeStore) -> None:
    sm = ControllerStateMachine(store)
    topic(sm, 1)
    assert store.db.get(SECURITY_KEY) is None  # no users or ACLs yet: nothing written
    sm.apply(2, upsert_user_command("alice", [cred()]))
    assert store.db.get(SECURITY_KEY) is not None
    store.db.delete(SECURITY_KEY)  # a write of the key from here on would bring it back
    topic(sm, 3, "u")
    sm.apply(4, create_acls_command([]))
    sm.apply(5, delete_user_command("nobody"))
    assert store.db.get(SECURITY_KEY) is None
    sm.apply(6, delete_user_command("alice"))
    assert store.db.get(SECURITY_KEY) is not None


def test_reopen_restores_users_and_acls(store: NodeStore, open_store: Callable[..., NodeStore]) -> None:
    sm = ControllerStateMachine(store)
    alice = cred()
    sm.apply(1, upsert_user_command("alice", [alice]))
    sm.apply(2, create_acls_command([acl()]))
    topic(sm, 3)
    store.close()
    sm2 = ControllerStateMachine(open_store())
    assert sm2.last_applied == 3 and sm2.security == sm.security
    assert sm2.security.users["alice"]["SCRAM-SHA-256"] == alice and sm2.security.acls == (acl(),)


def test_state_without_the_security_key_loads_as_empty(store: NodeStore, open_store: Callable[..., NodeStore]) -> None:
    sm = ControllerStateMachine(store)
    topic(sm, 1)
    store.close()
    sm2 = ControllerStateMachine(open_store())
    assert sm2.security == SecurityView() and "t" in sm2.view.topics


def test_corrupted_security_state_is_detected(store: NodeStore) -> None:
    sm = ControllerStateMachine(store)
    sm.apply(1, upsert_user_command("alice", [cred()]))
    raw = bytearray(store.db.get(SECURITY_KEY))
    raw[-2] ^= 0xFF
    store.db.put(SECURITY_KEY, bytes(raw))
    with pytest.raises(ControllerCorruptionError):
        ControllerStateMachine(store)


def test_snapshots_carry_users_and_acls(store: NodeStore, open_store: Callable[..., NodeStore]) -> None:
    sm = ControllerStateMachine(store)
    topic(sm, 1)
    sm.apply(2, upsert_user_command("alice", [cred()]))
    sm.apply(3, create_acls_command([acl(), acl(name="p", pattern_type="PREFIXED")]))
    sm.apply(4, bootstrap_command({}, []))
    buf = io.BytesIO()
    sm.write_snapshot(buf)
    other = open_store("db2")
    sm2 = ControllerStateMachine(other)
    seen: list[int] = []
    sm2.on_security_change = seen.append
    sm2.read_snapshot(io.BytesIO(buf.getvalue()), 4)
    assert sm2.view == sm.view and sm2.security == sm.security and sm2.security.bootstrapped
    assert sm2.last_applied == 4 and seen == [4]
    other.close()
    assert ControllerStateMachine(open_store("db2")).security == sm.security  # and persisted


def test_a_snapshot_without_a_security_part_clears_it(store: NodeStore, open_store: Callable[..., NodeStore]) -> None:
    sm = ControllerStateMachine(store)
    topic(sm, 1)
    old_format = io.BytesIO(ControllerStateMachine._encode(sm.view, 1))
    sm2 = ControllerStateMachine(open_store("db2"))
    sm2.apply(1, upsert_user_command("stale", [cred()]))
    sm2.read_snapshot(old_format, 5)
    assert sm2.security == SecurityView() and sm2.view == sm.view and sm2.last_applied == 5


def test_a_corrupted_snapshot_is_detected(store: NodeStore, open_store: Callable[..., NodeStore]) -> None:
    sm = ControllerStateMachine(store)
    sm.apply(1, upsert_user_command("alice", [cred()]))
    buf = io.BytesIO()
    sm.write_snapshot(buf)
    raw = bytearray(buf.getvalue())
    raw[-5] ^= 0xFF
    with pytest.raises(ControllerCorruptionError):
        ControllerStateMachine(open_store("db2")).read_snapshot(io.BytesIO(bytes(raw)), 1)
