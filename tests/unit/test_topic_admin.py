"""Growing a topic and changing its config: the checks and the controller's transitions (pure; RocksDB in tmp_path)."""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable

import pytest

from clients.aio import _metadata
from clients.aio._metadata import MetadataCache
from clients.protocol import BrokerError, ErrorCode
from cluster.controller import ControllerStateMachine, create_topic_command, delete_topic_command
from cluster.topic_admin import (
    add_partitions_command,
    alter_topic_config_command,
    config_changes,
    config_json,
    effective_config,
    new_partitions,
    validate_partition_count,
)
from cluster.topic_commands import _key_value, parse_replica_assignment
from cluster.topics import TOPIC_CONFIG_DEFAULTS, PartitionAssignment, TopicMetadata, assign_replicas
from storage.store import NodeStore


def topic(partitions: int = 2, rf: int = 3, cursor: int = 0, nodes: tuple[int, ...] = (1, 2, 3)) -> TopicMetadata:
    return TopicMetadata("t", 7, assign_replicas(list(nodes), partitions, rf, cursor), {"retention.ms": 1000}, 1)


def code_of(exc_info: pytest.ExceptionInfo[BrokerError]) -> ErrorCode:
    return exc_info.value.error_code


# ---- the partition count -----------------------------------------------------------------------------


@pytest.mark.parametrize("count", [2, 1, 0, -1], ids=["equal", "fewer", "zero", "negative"])
def test_a_count_not_above_the_current_one_is_refused(count: int) -> None:
    with pytest.raises(BrokerError) as ei:
        validate_partition_count(count, 2, 100)
    assert code_of(ei) is ErrorCode.INVALID_PARTITIONS
    assert "only increase" in ei.value.message


@pytest.mark.parametrize("count", [5.0, "5", True, None, [5]], ids=["float", "string", "bool", "null", "list"])
def test_a_count_that_is_not_an_integer_is_refused(count: object) -> None:
    with pytest.raises(BrokerError) as ei:
        validate_partition_count(count, 2, 100)
    assert code_of(ei) is ErrorCode.INVALID_PARTITIONS


def test_a_count_above_the_limit_is_refused_and_the_limit_itself_is_taken() -> None:
    with pytest.raises(BrokerError) as ei:
        validate_partition_count(101, 2, 100)
    assert code_of(ei) is ErrorCode.INVALID_PARTITIONS
    assert validate_partition_count(100, 2, 100) == 100
    assert validate_partition_count(3, 2, 100) == 3


# ---- placement ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cursor", range(4))
@pytest.mark.parametrize(("nodes", "rf"), [((1, 2, 3), 3), ((1, 2, 3), 1), ((1, 2, 3, 4, 5), 2), ((4, 9), 2)])
def test_new_partitions_continue_the_round_robin_of_creation(cursor: int, nodes: tuple[int, ...], rf: int) -> None:
    meta = topic(2, rf, cursor, nodes)
    added = new_partitions(meta, 7, list(nodes))
    # exactly what creating the topic with 7 partitions would have placed
    assert meta.partitions + added == assign_replicas(list(nodes), 7, rf, cursor)
    assert [a.partition for a in added] == [2, 3, 4, 5, 6]


def test_new_partitions_keep_the_replication_factor_and_spread_leaders() -> None:
    added = new_partitions(topic(2, 2), 8, [1, 2, 3])
    assert all(len(a.replicas) == 2 and len(set(a.replicas)) == 2 for a in added)
    leaders = [a.replicas[0] for a in topic(2, 2).partitions + added]
    assert sorted(leaders.count(n) for n in (1, 2, 3)) == [2, 3, 3]


def test_a_replication_factor_above_the_nodes_left_is_refused() -> None:
    with pytest.raises(BrokerError) as ei:
        new_partitions(topic(2, 3), 3, [1, 2])
    assert code_of(ei) is ErrorCode.INVALID_REPLICATION_FACTOR


def test_explicit_assignments_place_the_new_partitions() -> None:
    added = new_partitions(topic(2, 3), 4, [1, 2, 3], [[3, 1, 2], [2, 3, 1]])
    assert added == (PartitionAssignment(2, (3, 1, 2)), PartitionAssignment(3, (2, 3, 1)))


@pytest.mark.parametrize(
    "assignments",
    [
        [[1, 2, 3]],  # one partition short
        [[1, 2, 3], [1, 2, 3], [1, 2, 3]],  # one too many
        [[1, 2], [1, 2, 3]],  # fewer replicas than the replication factor
        [[1, 2, 3, 3], [1, 2, 3]],  # more
        [[1, 1, 2], [1, 2, 3]],  # a node twice
        [[1, 2, 4], [1, 2, 3]],  # an unknown node
        [[1, 2, "3"], [1, 2, 3]],  # not an id
        [[1, 2, True], [1, 2, 3]],  # a bool is no id
        [[1, 2, 3], 4],  # not a list
        {"2": [1, 2, 3]},  # not a list of lists
        "1:2:3,2:3:1",
    ],
)
def test_bad_assignments_are_refused(assignments: object) -> None:
    with pytest.raises(BrokerError) as ei:
        new_partitions(topic(2, 3), 4, [1, 2, 3], assignments)
    assert code_of(ei) is ErrorCode.INVALID_REPLICA_ASSIGNMENT


# ---- config changes ----------------------------------------------------------------------------------


def test_a_config_change_is_validated_like_creation_and_null_deletes() -> None:
    sets, deletes = config_changes({"retention.ms": "3600000", "max.message.bytes": 2048, "retention.bytes": None})
    assert sets == {"retention.ms": 3_600_000, "max.message.bytes": 2048}
    assert deletes == ("retention.bytes",)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"no.such.key": 1}, ErrorCode.INVALID_CONFIG),
        ({"no.such.key": None}, ErrorCode.INVALID_CONFIG),
        ({"retention.ms": "soon"}, ErrorCode.INVALID_CONFIG),
        ({"retention.ms": 1.5}, ErrorCode.INVALID_CONFIG),
        ({"retention.ms": True}, ErrorCode.INVALID_CONFIG),
        ({"retention.ms": -2}, ErrorCode.INVALID_CONFIG),
        ({"max.message.bytes": 1023}, ErrorCode.INVALID_CONFIG),
        ({"cleanup.policy": "compact"}, ErrorCode.INVALID_CONFIG),
        ({"retention.ms": 1000, "bogus": 1}, ErrorCode.INVALID_CONFIG),
        ([["retention.ms", 1]], ErrorCode.INVALID_CONFIG),
        ({}, ErrorCode.INVALID_REQUEST),
    ],
)
def test_a_bad_config_change_is_refused(body: object, code: ErrorCode) -> None:
    with pytest.raises(BrokerError) as ei:
        config_changes(body)
    assert code_of(ei) is code


def test_the_effective_config_names_every_key_with_overrides_over_defaults() -> None:
    assert effective_config({}) == TOPIC_CONFIG_DEFAULTS
    eff = effective_config({"retention.ms": 5})
    assert eff["retention.ms"] == 5 and eff["max.message.bytes"] == TOPIC_CONFIG_DEFAULTS["max.message.bytes"]
    assert config_json(topic()) == {"topic": "t", "config": {**TOPIC_CONFIG_DEFAULTS, "retention.ms": 1000},
                                    "overrides": {"retention.ms": 1000}}  # fmt: skip


# ---- the controller's transitions --------------------------------------------------------------------


def created(store: NodeStore) -> tuple[ControllerStateMachine, TopicMetadata]:
    sm = ControllerStateMachine(store)
    meta = sm.apply(1, create_topic_command("t", assign_replicas([1, 2, 3], 2, 3, 0), {"retention.ms": 1000}, 5))
    assert isinstance(meta, TopicMetadata)
    return sm, meta


def test_add_partitions_appends_to_the_topic(store: NodeStore) -> None:
    sm, meta = created(store)
    added = new_partitions(meta, 5, [1, 2, 3])
    grown = sm.apply(2, add_partitions_command(meta, added))
    assert isinstance(grown, TopicMetadata) and len(grown.partitions) == 5
    assert sm.view.topics["t"] == grown and grown.topic_id == meta.topic_id and grown.config == meta.config
    assert grown.partitions[:2] == meta.partitions


def test_a_command_checked_on_an_older_view_changes_nothing(store: NodeStore) -> None:
    sm, meta = created(store)
    cmd = add_partitions_command(meta, new_partitions(meta, 3, [1, 2, 3]))
    assert len(sm.apply(2, cmd).partitions) == 3
    before = sm.view
    again = sm.apply(3, cmd)  # the same growth proposed twice: the second one meets 3 partitions
    assert isinstance(again, BrokerError) and again.error_code is ErrorCode.INVALID_PARTITIONS
    assert sm.view is before and sm.last_applied == 3


def test_a_command_for_a_deleted_or_recreated_topic_changes_nothing(store: NodeStore) -> None:
    sm, meta = created(store)
    sm.apply(2, delete_topic_command("t"))
    sm.apply(3, create_topic_command("t", assign_replicas([1, 2, 3], 2, 3, 0), {}, 6))
    before = sm.view
    for i, cmd in enumerate(
        (add_partitions_command(meta, new_partitions(meta, 3, [1, 2, 3])),
         alter_topic_config_command(meta, {"retention.ms": 5}, ())), start=4):  # fmt: skip
        res = sm.apply(i, cmd)
        assert isinstance(res, BrokerError) and res.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert sm.view is before


def test_bad_replicas_in_a_command_change_nothing(store: NodeStore) -> None:
    sm, meta = created(store)
    before = sm.view
    for i, reps in enumerate([(1, 2), (1, 1, 2)], start=2):
        res = sm.apply(i, add_partitions_command(meta, [PartitionAssignment(2, reps)]))
        assert isinstance(res, BrokerError) and res.error_code is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert sm.view is before


def test_alter_config_sets_and_deletes_overrides_and_survives_a_reopen(
    store: NodeStore, open_store: Callable[[], NodeStore]
) -> None:
    sm, meta = created(store)
    res = sm.apply(2, alter_topic_config_command(meta, {"max.message.bytes": 2048}, ("retention.ms",)))
    assert isinstance(res, TopicMetadata) and res.config == {"max.message.bytes": 2048}
    assert sm.view.topics["t"].config_int("retention.ms") == TOPIC_CONFIG_DEFAULTS["retention.ms"]
    res = sm.apply(3, alter_topic_config_command(meta, {"retention.ms": 60_000}, ()))
    assert res.config == {"max.message.bytes": 2048, "retention.ms": 60_000}  # changes compose
    grown = sm.apply(4, add_partitions_command(meta, new_partitions(meta, 3, [1, 2, 3])))
    assert grown.config == res.config
    buf = io.BytesIO()
    sm.write_snapshot(buf)
    store.close()
    sm2 = ControllerStateMachine(open_store())
    assert sm2.view.topics["t"] == grown and sm2.last_applied == 4
    sm2.read_snapshot(io.BytesIO(buf.getvalue()), 4)
    assert sm2.view.topics["t"] == grown


def test_an_invalid_value_in_an_alter_command_changes_nothing(store: NodeStore) -> None:
    sm, meta = created(store)
    before = sm.view
    res = sm.apply(2, alter_topic_config_command(meta, {"max.message.bytes": 10}, ()))
    assert isinstance(res, BrokerError) and res.error_code is ErrorCode.INVALID_CONFIG
    assert sm.view is before


# ---- clients: a refresh shows the new partitions ---------------------------------------------------------


def test_a_full_refresh_shows_new_partitions_and_the_cache_goes_stale_after_max_age(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(_metadata.time, "monotonic", lambda: now[0])

    def body(n: int) -> dict[str, object]:
        parts = [{"partition": p, "leader": 1, "leader_url": "http://n1"} for p in range(n)]
        return {"nodes": [{"id": 1, "url": "http://n1"}], "topics": [{"name": "t", "partitions": parts}]}

    cache = MetadataCache(None, "http://n1", metadata_max_age_ms=1000)  # type: ignore[arg-type]
    cache._apply(body(2), partial=False)
    assert cache.cached_partition_count("t") == 2 and not cache.stale()
    now[0] += 1.5
    assert cache.stale()  # the producer's sender refreshes now
    cache._apply(body(5), partial=False)
    assert cache.cached_partition_count("t") == 5 and not cache.stale()
    assert cache.cached("t", 4) is not None


# ---- the CLI's arguments -----------------------------------------------------------------------------------


def test_the_cli_parses_kafka_style_assignments_and_key_values() -> None:
    assert parse_replica_assignment("1:2:3,2:3:1") == [[1, 2, 3], [2, 3, 1]]
    with pytest.raises(BrokerError) as ei:
        parse_replica_assignment("1:2:x")
    assert code_of(ei) is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert _key_value("retention.ms = 1000") == ("retention.ms", "1000")
    for bad in ("retention.ms", "=5"):
        with pytest.raises(argparse.ArgumentTypeError):
            _key_value(bad)
