"""The controller state machine and topic placement (pure, real RocksDB in tmp_path)."""

from __future__ import annotations

import io

import pytest

from clients.protocol import BrokerError, ErrorCode
from cluster.controller import (
    PRODUCER_ID_BLOCK_SIZE,
    ControllerCorruptionError,
    ControllerStateMachine,
    allocate_producer_ids_command,
    create_topic_command,
    delete_topic_command,
)
from cluster.topics import assign_replicas, validate_topic_config, validate_topic_name
from raft.state_machine import NOOP_COMMAND


def create(sm, index, name="t", partitions=3, rf=3):
    return sm.apply(index, create_topic_command(name, assign_replicas([1, 2, 3], partitions, rf, 0), {}, 1000))


def test_create_delete_and_producer_id_blocks(store):
    sm = ControllerStateMachine(store)
    meta = create(sm, 1)
    assert meta.topic_id == 1 and len(meta.partitions) == 3
    dup = create(sm, 2)
    assert isinstance(dup, BrokerError) and dup.error_code is ErrorCode.TOPIC_ALREADY_EXISTS
    b1 = sm.apply(3, allocate_producer_ids_command(1))
    b2 = sm.apply(4, allocate_producer_ids_command(2))
    assert (b1.first, b2.first) == (0, PRODUCER_ID_BLOCK_SIZE)
    assert sm.apply(5, delete_topic_command("t")).name == "t"
    assert "t" not in sm.view.topics
    # a re-created topic gets a new id, so old data can never be mistaken for it
    assert create(sm, 6).topic_id == 2


def test_replayed_entries_change_nothing(store):
    sm = ControllerStateMachine(store)
    sm.apply(1, allocate_producer_ids_command(1))
    assert sm.apply(1, allocate_producer_ids_command(1)) is None
    assert sm.view.next_producer_id == PRODUCER_ID_BLOCK_SIZE
    assert sm.apply(2, NOOP_COMMAND) is None and sm.last_applied == 2


def test_reopen_restores_state_and_index(store, open_store):
    sm = ControllerStateMachine(store)
    create(sm, 1)
    sm.apply(2, allocate_producer_ids_command(1))
    store.close()
    sm2 = ControllerStateMachine(open_store())
    assert sm2.last_applied == 2 and "t" in sm2.view.topics and sm2.view.next_producer_id == PRODUCER_ID_BLOCK_SIZE


def test_corrupted_state_is_detected(store):
    s = store
    sm = ControllerStateMachine(s)
    create(sm, 1)
    raw = bytearray(s.db.get(b"C/state"))
    raw[-3] ^= 0xFF
    s.db.put(b"C/state", bytes(raw))
    with pytest.raises(ControllerCorruptionError):
        ControllerStateMachine(s)
    s.db.put(b"C/state", bytes(raw[:4]))
    with pytest.raises(ControllerCorruptionError):
        ControllerStateMachine(s)


def test_bad_command_is_an_error_value_not_an_exception(store):
    sm = ControllerStateMachine(store)
    assert isinstance(sm.apply(1, b"{not json"), BrokerError)
    assert isinstance(sm.apply(2, b'{"op": "nope"}'), BrokerError)
    assert sm.last_applied == 2


def test_snapshot_round_trip(store, open_store):
    sm = ControllerStateMachine(store)
    create(sm, 7)
    buf = io.BytesIO()
    sm.write_snapshot(buf)
    sm2 = ControllerStateMachine(open_store("db2"))
    sm2.read_snapshot(io.BytesIO(buf.getvalue()), 7)
    assert sm2.view == sm.view and sm2.last_applied == 7


def test_placement_spreads_preferred_leaders_and_replicas():
    a = assign_replicas([3, 1, 2], 6, 3, cursor=0)
    assert [p.replicas[0] for p in a] == [1, 2, 3, 1, 2, 3]
    assert all(len(set(p.replicas)) == 3 for p in a)
    assert assign_replicas([1, 2, 3], 1, 1, cursor=1)[0].replicas == (2,)
    with pytest.raises(BrokerError) as exc:
        assign_replicas([1, 2, 3], 1, 4, cursor=0)
    assert exc.value.error_code is ErrorCode.INVALID_REPLICATION_FACTOR


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x" * 250, "é", "__internal", "a b", None, 5])
def test_hostile_topic_names_are_rejected(name):
    with pytest.raises(BrokerError) as exc:
        validate_topic_name(name)
    assert exc.value.error_code is ErrorCode.INVALID_TOPIC


@pytest.mark.parametrize(
    "config",
    [
        {"retention.ms": "abc"},
        {"retention.ms": True},
        {"nope": 1},
        {"cleanup.policy": "compact"},
        {"max.message.bytes": 10},
        {"retention.bytes": 2**70},
        [],
    ],
)
def test_bad_topic_configs_are_rejected(config):
    with pytest.raises(BrokerError) as exc:
        validate_topic_config(config)
    assert exc.value.error_code is ErrorCode.INVALID_CONFIG


def test_topic_config_accepts_kafka_keys():
    assert validate_topic_config({"retention.ms": "1000", "retention.bytes": -1}) == {
        "retention.ms": 1000,
        "retention.bytes": -1,
    }
