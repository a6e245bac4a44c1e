"""Pure parts of the consumer's group client and of the copier: parsing, tables, argument checks (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from clients.aio._group import (
    VALID_PREVIOUS,
    ConsumerCoordinator,
    GroupConfig,
    HeartbeatAction,
    MemberState,
    heartbeat_action,
    parse_join_answer,
    parse_offsets,
)
from clients.aio._metadata import MetadataCache
from clients.aio._session import HttpSession
from clients.aio.consumer import AsyncConsumer, normalize_offsets
from clients.protocol import BrokerError, ErrorCode
from clients.records import ConsumerGroupMetadata, OffsetAndMetadata
from cluster.copier import CopierConfig, load_transform

URL = "http://127.0.0.1:1"


def coordinator() -> ConsumerCoordinator:
    session = HttpSession()
    return ConsumerCoordinator(session, MetadataCache(session, URL), GroupConfig("g"), wake=lambda: None)


def test_member_state_table_allows_exactly_the_protocol_steps() -> None:
    assert set(VALID_PREVIOUS) == set(MemberState)
    c = coordinator()
    assert c.state is MemberState.UNJOINED
    with pytest.raises(RuntimeError, match="Unjoined -> Stable"):
        c._transition(MemberState.STABLE)  # a generation comes only from a completed join
    c._transition(MemberState.REBALANCING)
    c._transition(MemberState.STABLE)
    with pytest.raises(RuntimeError, match="Stable -> Stable"):
        c._transition(MemberState.STABLE)
    c._transition(MemberState.UNJOINED)


def test_group_metadata_is_only_a_member_identity_while_stable() -> None:
    c = coordinator()
    assert c.group_metadata() == ConsumerGroupMetadata("g", -1, "")
    c.generation = parse_join_answer({"generation_id": 4, "member_id": "m-1", "assignment": []})
    c.state = MemberState.STABLE
    assert c.group_metadata() == ConsumerGroupMetadata("g", 4, "m-1")
    c.state = MemberState.REBALANCING
    assert c.group_metadata().generation_id == -1


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (ErrorCode.NONE, HeartbeatAction.CONTINUE),
        (ErrorCode.REBALANCE_IN_PROGRESS, HeartbeatAction.REJOIN),
        (ErrorCode.ILLEGAL_GENERATION, HeartbeatAction.LOST),
        (ErrorCode.UNKNOWN_MEMBER_ID, HeartbeatAction.RESET),
        (ErrorCode.NOT_COORDINATOR, HeartbeatAction.RETRY),
        (ErrorCode.NETWORK_EXCEPTION, HeartbeatAction.RETRY),
    ],
)
def test_heartbeat_answers_map_to_member_actions(code: ErrorCode, action: HeartbeatAction) -> None:
    assert heartbeat_action(code) is action


def test_request_rejoin_remembers_lost_and_forgets_the_member_id_on_reset() -> None:
    woken = []
    session = HttpSession()
    c = ConsumerCoordinator(session, MetadataCache(session, URL), GroupConfig("g"), wake=lambda: woken.append(1))
    c.member_id = "m-1"
    c.request_rejoin("rebalancing")
    assert (c.rejoin_needed, c.partitions_lost, c.member_id) == (True, False, "m-1")
    c.request_rejoin("expelled", lost=True, reset_member=True)
    assert (c.partitions_lost, c.member_id) == (True, "")
    assert len(woken) == 2


def test_join_answer_parsing() -> None:
    gen = parse_join_answer(
        {
            "generation_id": 3, "member_id": "m", "leader_id": "m", "protocol": "range",
            "assignment": [{"topic": "t", "partition": 1}, {"topic": "t", "partition": 0}], "members": ["m", "n"],
        }
    )  # fmt: skip
    assert gen.assignment == (("t", 0), ("t", 1))
    assert (gen.generation_id, gen.member_id, gen.members) == (3, "m", ("m", "n"))
    for bad in (None, [], {"generation_id": 1}, {"generation_id": "1", "member_id": "m"},
                {"generation_id": 1, "member_id": "m", "assignment": [{"topic": "t"}]}):  # fmt: skip
        with pytest.raises(BrokerError) as err:
            parse_join_answer(bad)
        assert err.value.error_code is ErrorCode.UNKNOWN_SERVER_ERROR


def test_offset_fetch_parsing_keeps_only_wanted_partitions_with_an_offset() -> None:
    body = {
        "offsets": [
            {"topic": "t", "partition": 0, "offset": 7, "metadata": "m"},
            {"topic": "t", "partition": 1, "offset": -1},
            {"topic": "u", "partition": 0, "offset": 9},
        ]
    }
    got = parse_offsets(body, [("t", 0), ("t", 1), ("t", 2)])
    assert got == {("t", 0): OffsetAndMetadata(7, "m"), ("t", 1): None, ("t", 2): None}
    with pytest.raises(BrokerError):
        parse_offsets({"nope": 1}, [("t", 0)])


def test_commit_offsets_accept_kafka_python_shapes_and_refuse_bad_ones() -> None:
    got = normalize_offsets({("t", 0): 5, ("t", 1): OffsetAndMetadata(6, "x"), ("t", 2): (7, "y", -1)})
    assert got == {
        ("t", 0): OffsetAndMetadata(5),
        ("t", 1): OffsetAndMetadata(6, "x"),
        ("t", 2): OffsetAndMetadata(7, "y"),
    }
    for bad in ({("t", 0): -1}, {("t", 0): "5"}, {("t", 0): True}, {"t": 1}):
        with pytest.raises(BrokerError) as err:
            normalize_offsets(bad)
        assert err.value.error_code is ErrorCode.INVALID_REQUEST


def test_group_config_rules() -> None:
    with pytest.raises(BrokerError, match="heartbeat_interval_ms"):
        GroupConfig("g", session_timeout_ms=1000, heartbeat_interval_ms=1000).validate()
    with pytest.raises(BrokerError, match="partition_assignment_strategy"):
        GroupConfig("g", protocol="sticky").validate()
    with pytest.raises(BrokerError, match="group_id"):
        GroupConfig("").validate()


def test_consumer_group_modes_and_auto_commit_default() -> None:
    async def scenario() -> None:
        plain = AsyncConsumer(URL)
        grouped = AsyncConsumer(URL, group_id="g")
        manual = AsyncConsumer(URL, group_id="g", enable_auto_commit=False)
        try:
            assert not plain.enable_auto_commit  # nowhere to commit without a group
            assert grouped.enable_auto_commit  # kafka-python's default with a group
            assert not manual.enable_auto_commit
            for call in (lambda: plain.subscribe(["t"]), plain.group_metadata, lambda: grouped.subscribe([])):
                with pytest.raises(BrokerError) as err:
                    call()
                assert err.value.error_code is ErrorCode.INVALID_REQUEST
            grouped.assign([("t", 0)])
            with pytest.raises(BrokerError, match="unsubscribe"):
                grouped.subscribe(["t"])
            manual.subscribe("t")
            assert manual.subscription() == {"t"}
            with pytest.raises(BrokerError, match="unsubscribe"):
                manual.assign([("t", 0)])
            with pytest.raises(BrokerError) as err:
                await manual.commit({("t", 0): 1})  # not a member of a generation yet
            assert err.value.error_code is ErrorCode.REBALANCE_IN_PROGRESS
        finally:
            for c in (plain, grouped, manual):
                await c.close(autocommit=False)

    asyncio.run(scenario())


def test_copier_transforms_and_config_checks() -> None:
    assert load_transform("identity")(b"a") == b"a"
    assert load_transform("upper")(b"ab1") == b"AB1"
    assert load_transform("upper")(None) is None
    assert load_transform("python:base64:b64encode")(b"x") == b"eA=="
    assert load_transform("python:os.path:basename")("a/b") == b"b"  # type: ignore[arg-type]  # str results are encoded
    for bad in ("lower", "python:nomodule", "python::f"):
        with pytest.raises(ValueError, match="transform"):
            load_transform(bad)
    with pytest.raises(TypeError):
        load_transform("python:builtins:len")(b"abc")
    with pytest.raises(ValueError, match="different"):
        CopierConfig(URL, "t", "t", "g", "tid").validate()
    with pytest.raises(ValueError, match="commit-every"):
        CopierConfig(URL, "a", "b", "g", "tid", commit_every=-1).validate()
