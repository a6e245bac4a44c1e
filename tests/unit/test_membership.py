"""The controller's membership rules: registering nodes, planning and recording moves, decommission (pure)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clients.protocol import BrokerError, ErrorCode
from cluster.controller_view import ControllerView, NodeRecord, Reassignment
from cluster.membership import (
    apply_membership,
    cancel_reassignment_command,
    complete_reassignment_command,
    decommission_command,
    holds_anything,
    hosted_groups,
    plan_decommission,
    plan_reassignment,
    reassign_command,
    register_node_command,
    seed_nodes_command,
    set_node_state_command,
    topic_placement_nodes,
)
from cluster.topics import PartitionAssignment, TopicMetadata, group_id_for


def node(i: int, state: str = "active") -> NodeRecord:
    return NodeRecord(i, "127.0.0.1", 9000 + i, 9100 + i, "http", state)


def topic(name: str, topic_id: int, *placements: tuple[int, ...]) -> TopicMetadata:
    parts = tuple(PartitionAssignment(p, r) for p, r in enumerate(placements))
    return TopicMetadata(name, topic_id, parts, {}, 0)


def view(n: int = 4, **topics: TopicMetadata) -> ControllerView:
    return ControllerView(topics=dict(topics), nodes={i: node(i) for i in range(1, n + 1)}, founders=(1, 2, 3))


def run(v: ControllerView, command: bytes) -> tuple[object, ControllerView]:
    return apply_membership(v, json.loads(command))


INTERNAL = {"__transaction_state-0": (1, 2, 3), "__consumer_offsets-0": (2, 3, 1)}


def test_seed_records_the_founders_once() -> None:
    empty = ControllerView()
    _, v = run(empty, seed_nodes_command([node(1), node(2), node(3)]))
    assert sorted(v.nodes) == [1, 2, 3] and v.founders == (1, 2, 3)
    _, again = run(v, seed_nodes_command([node(7)]))
    assert again is v


def test_register_refuses_a_known_id_and_a_taken_port() -> None:
    v = view(3)
    err, same = run(v, register_node_command(node(2)))
    assert isinstance(err, BrokerError) and err.error_code is ErrorCode.DUPLICATE_BROKER_REGISTRATION and same is v
    clash = NodeRecord(9, "127.0.0.1", 9001, 9999)
    err, same = run(v, register_node_command(clash))
    assert isinstance(err, BrokerError) and err.error_code is ErrorCode.INVALID_REQUEST and same is v
    rec, grown = run(v, register_node_command(node(4)))
    assert rec == node(4) and sorted(grown.nodes) == [1, 2, 3, 4]
    assert topic_placement_nodes(grown, [1, 2, 3]) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("replicas", "code"),
    [
        ([9], ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # unknown node
        ([2, 2, 3], ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # duplicate ids
        ([], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ("2,3", ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ([2, True], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ([4], ErrorCode.INVALID_REPLICATION_FACTOR),  # fewer than min_insync_replicas (2)
    ],
)
def test_a_bad_move_is_refused(replicas: object, code: ErrorCode) -> None:
    v = view(4, t=topic("t", 1, (1, 2, 3)))
    with pytest.raises(BrokerError) as err:
        plan_reassignment(v, "t", 0, replicas, 2, 0)
    assert err.value.error_code is code


def test_unknown_topic_partition_and_decommissioning_nodes_are_refused() -> None:
    v = view(4, t=topic("t", 1, (1, 2, 3)))
    for t, p in (("nope", 0), ("t", 1)):
        with pytest.raises(BrokerError) as err:
            plan_reassignment(v, t, p, [1, 2], 2, 0)
        assert err.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    leaving = replace(v, nodes={**v.nodes, 4: node(4, "decommissioning")})
    with pytest.raises(BrokerError) as err:
        plan_reassignment(leaving, "t", 0, [2, 3, 4], 2, 0)
    assert err.value.error_code is ErrorCode.INVALID_REPLICA_ASSIGNMENT


def test_a_move_runs_on_both_sets_until_complete_then_the_target_is_the_placement() -> None:
    v = view(4, t=topic("t", 1, (1, 2, 3)))
    move = plan_reassignment(v, "t", 0, [2, 3, 4], 2, 123)
    gid = group_id_for(1, 0)
    assert (move.adding, move.removing) == ((4,), (1,))
    _, moving = run(v, reassign_command([move]))
    assert hosted_groups(moving, 4) == {gid} and hosted_groups(moving, 1) == {gid}
    with pytest.raises(BrokerError) as err:
        plan_reassignment(moving, "t", 0, [1, 2, 3], 2, 0)
    assert err.value.error_code is ErrorCode.REASSIGNMENT_IN_PROGRESS
    err2, same = run(moving, reassign_command([move]))
    assert isinstance(err2, BrokerError) and err2.error_code is ErrorCode.REASSIGNMENT_IN_PROGRESS and same is moving
    # voters that are not the target do not complete the move
    stale, same = run(moving, complete_reassignment_command(gid, [1, 2, 3, 4]))
    assert isinstance(stale, BrokerError) and same is moving
    _, done = run(moving, complete_reassignment_command(gid, [4, 3, 2]))
    assert done.reassignments == {} and done.topics["t"].partitions[0].replicas == (2, 3, 4)
    assert hosted_groups(done, 1) == set()
    again, same = run(done, complete_reassignment_command(gid, [2, 3, 4]))
    assert again is None and same is done


def test_a_reorder_only_changes_the_preferred_leader_at_once() -> None:
    v = view(3, t=topic("t", 1, (1, 2, 3)))
    move = plan_reassignment(v, "t", 0, [3, 1, 2], 2, 0)
    _, after = run(v, reassign_command([move]))
    assert after.reassignments == {} and after.topics["t"].partitions[0].replicas == (3, 1, 2)


def test_cancel_turns_the_move_back_and_needs_a_move() -> None:
    v = view(4, t=topic("t", 1, (1, 2, 3)))
    gid = group_id_for(1, 0)
    err, same = run(v, cancel_reassignment_command(gid))
    assert isinstance(err, BrokerError) and err.error_code is ErrorCode.NO_REASSIGNMENT_IN_PROGRESS and same is v
    _, moving = run(v, reassign_command([plan_reassignment(v, "t", 0, [2, 3, 4], 2, 0)]))
    back, cancelled = run(moving, cancel_reassignment_command(gid))
    assert isinstance(back, Reassignment) and back.cancelled and back.target == (1, 2, 3)
    assert set(back.involved) == {1, 2, 3, 4}  # every node of the move keeps its replica until it ends
    _, done = run(cancelled, complete_reassignment_command(gid, [1, 2, 3]))
    assert done.topics["t"].partitions[0].replicas == (1, 2, 3) and done.reassignments == {}


def test_decommission_spreads_the_replicas_over_the_least_loaded_nodes() -> None:
    v = view(5, a=topic("a", 1, (1, 2, 3), (2, 3, 4), (3, 4, 1)), b=topic("b", 2, (1, 5)))
    moves = plan_decommission(v, 1, INTERNAL, 0)
    targets = {m.group_id: m.target for m in moves}
    assert all(1 not in t for t in targets.values())
    assert len(moves) == 5  # a-0, a-2, b-0 and both internal partitions
    # node 5 held the least, so it takes the first replica; the place in the order is kept
    assert targets[group_id_for(1, 0)] == (5, 2, 3)
    _, leaving = run(v, decommission_command(1, moves))
    assert leaving.nodes[1].state == "decommissioning"
    assert holds_anything(leaving, 1, INTERNAL)
    # once every move completed, nothing is left on the node
    done = leaving
    for m in moves:
        _, done = run(done, complete_reassignment_command(m.group_id, m.target))
    internal = {g: done.internal_replicas.get(g, r) for g, r in INTERNAL.items()}
    assert not holds_anything(done, 1, internal)
    _, gone = run(done, set_node_state_command(1, "decommissioned"))
    assert gone.nodes[1].state == "decommissioned" and 1 not in gone.active_node_ids()


def test_decommission_is_refused_when_the_rest_cannot_hold_the_replicas() -> None:
    v = view(3, t=topic("t", 1, (1, 2, 3)))
    with pytest.raises(BrokerError) as err:
        plan_decommission(v, 3, INTERNAL, 0)
    assert err.value.error_code is ErrorCode.INVALID_REPLICATION_FACTOR
    lone = ControllerView(nodes={1: node(1), 2: node(2, "decommissioned")})
    with pytest.raises(BrokerError) as err:
        plan_decommission(lone, 1, {}, 0)
    assert err.value.error_code is ErrorCode.INVALID_REPLICATION_FACTOR
    with pytest.raises(BrokerError) as err:
        plan_decommission(v, 9, INTERNAL, 0)
    assert err.value.error_code is ErrorCode.BROKER_ID_NOT_REGISTERED


def test_the_view_reads_back_what_it_wrote_and_an_older_one_without_nodes() -> None:
    v = view(4, t=topic("t", 1, (1, 2, 3)))
    _, moving = run(v, reassign_command([plan_reassignment(v, "t", 0, [2, 3, 4], 2, 5)]))
    moving = replace(moving, internal_replicas={"__consumer_offsets-1": (4, 2, 3)})
    assert ControllerView.from_json(json.loads(json.dumps(moving.to_json()))) == moving
    old = {"topics": [], "next_topic_id": 3, "next_producer_id": 2000, "placement_cursor": 1}
    assert ControllerView.from_json(old) == ControllerView(next_topic_id=3, next_producer_id=2000, placement_cursor=1)
