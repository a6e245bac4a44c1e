"""Who is in the cluster and where each Raft group lives: the controller's membership commands (pure).

Commands (JSON, proposed to the controller group) and their transitions on a
``ControllerView``; every function returns ``(result, next view)`` and never
raises for bad input (an error is a ``BrokerError`` result), so every replica
applies the same outcome.

* ``seed_nodes``: the first controller leader records the founders (the nodes
  of ``cluster init``); once only.
* ``register_node``: ``txbroker cluster add-node`` registers a new node.
* ``reassign``: start moves (``Reassignment``), one per Raft group; a group
  already moving is refused (``REASSIGNMENT_IN_PROGRESS``).
* ``cancel_reassignment``: the move turns back to where it came from.
* ``complete_reassignment``: the group's leader reports its voters equal the
  target; the placement becomes the target and the move ends.
* ``decommission``: the node becomes ``decommissioning`` and its moves start.
* ``set_node_state``: ``decommissioned`` once nothing is left on the node.

The planners (``plan_reassignment``, ``plan_decommission``) validate a
request against a view and build the moves; the service runs them on the
controller leader before proposing, and the transitions check again.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from clients.protocol import BrokerError, ErrorCode

from .controller_view import (
    NODE_ACTIVE,
    NODE_DECOMMISSIONED,
    NODE_DECOMMISSIONING,
    NODE_STATES,
    ControllerView,
    NodeRecord,
    Reassignment,
)
from .seams import NodeDirectory
from .topics import PartitionAssignment, TopicMetadata, group_id_for

MEMBERSHIP_OPS = frozenset(
    {
        "seed_nodes",
        "register_node",
        "reassign",
        "cancel_reassignment",
        "complete_reassignment",
        "decommission",
        "set_node_state",
    }
)

Result = tuple[Any, ControllerView]


# ---- commands ---------------------------------------------------------------------------------


def seed_nodes_command(nodes: Iterable[NodeRecord]) -> bytes:
    return json.dumps({"op": "seed_nodes", "nodes": [n.to_json() for n in nodes]}).encode()


def register_node_command(node: NodeRecord) -> bytes:
    return json.dumps({"op": "register_node", "node": node.to_json()}).encode()


def reassign_command(moves: Iterable[Reassignment]) -> bytes:
    return json.dumps({"op": "reassign", "moves": [m.to_json() for m in moves]}).encode()


def cancel_reassignment_command(group_id: str) -> bytes:
    return json.dumps({"op": "cancel_reassignment", "group_id": group_id}).encode()


def complete_reassignment_command(group_id: str, voters: Iterable[int]) -> bytes:
    return json.dumps({"op": "complete_reassignment", "group_id": group_id, "voters": sorted(voters)}).encode()


def decommission_command(node_id: int, moves: Iterable[Reassignment]) -> bytes:
    return json.dumps({"op": "decommission", "node_id": node_id, "moves": [m.to_json() for m in moves]}).encode()


def set_node_state_command(node_id: int, state: str) -> bytes:
    return json.dumps({"op": "set_node_state", "node_id": node_id, "state": state}).encode()


# ---- transitions --------------------------------------------------------------------------------


def apply_membership(view: ControllerView, cmd: Mapping[str, Any]) -> Result:
    op = cmd.get("op")
    if op == "seed_nodes":
        if view.nodes:
            return None, view
        nodes = {n.node_id: n for n in (NodeRecord.from_json(x) for x in cmd["nodes"])}
        return None, replace(view, nodes=nodes, founders=tuple(sorted(nodes)))
    if op == "register_node":
        return _register(view, NodeRecord.from_json(cmd["node"]))
    if op == "reassign":
        return _start_moves(view, [Reassignment.from_json(x) for x in cmd["moves"]])
    if op == "cancel_reassignment":
        return _cancel(view, str(cmd["group_id"]))
    if op == "complete_reassignment":
        return _complete(view, str(cmd["group_id"]), {int(n) for n in cmd["voters"]})
    if op == "decommission":
        return _decommission(view, int(cmd["node_id"]), [Reassignment.from_json(x) for x in cmd["moves"]])
    if op == "set_node_state":
        return _set_state(view, int(cmd["node_id"]), str(cmd["state"]))
    return BrokerError(ErrorCode.INVALID_REQUEST, f"unknown membership command {op!r}"), view


def _register(view: ControllerView, node: NodeRecord) -> Result:
    if node.node_id in view.nodes:
        return BrokerError(ErrorCode.DUPLICATE_BROKER_REGISTRATION, f"node {node.node_id} is registered"), view
    for other in view.nodes.values():
        if other.host == node.host and {other.http_port, other.raft_port} & {node.http_port, node.raft_port}:
            return (
                BrokerError(
                    ErrorCode.INVALID_REQUEST,
                    f"node {other.node_id} already uses a port of {node.host}:{node.http_port}/{node.raft_port}",
                ),
                view,
            )
    nodes = dict(view.nodes)
    nodes[node.node_id] = replace(node, state=NODE_ACTIVE)
    return nodes[node.node_id], replace(view, nodes=nodes)


def _start_moves(view: ControllerView, moves: Sequence[Reassignment]) -> Result:
    for m in moves:
        if m.group_id in view.reassignments:
            return BrokerError(ErrorCode.REASSIGNMENT_IN_PROGRESS, f"group {m.group_id} is already moving"), view
        unknown = [n for n in m.target if n not in view.nodes]
        if unknown:
            return BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"unknown nodes {unknown}"), view
    current = dict(view.reassignments)
    for m in moves:
        if set(m.target) != set(m.original):
            current[m.group_id] = m
    view = replace(view, reassignments=current)
    # A move to the same set (another order) changes only who is preferred: it completes at once.
    for m in moves:
        if set(m.target) == set(m.original):
            view = _set_placement(view, m, m.target)
    return list(moves), view


def _cancel(view: ControllerView, group_id: str) -> Result:
    move = view.reassignments.get(group_id)
    if move is None:
        return BrokerError(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, f"group {group_id} is not moving"), view
    if move.cancelled:
        return move, view
    back = replace(move, original=move.target, target=move.original, cancelled=True)
    moves = dict(view.reassignments)
    moves[group_id] = back
    return back, replace(view, reassignments=moves)


def _complete(view: ControllerView, group_id: str, voters: set[int]) -> Result:
    move = view.reassignments.get(group_id)
    if move is None:
        return None, view
    if voters != set(move.target):
        return BrokerError(ErrorCode.INVALID_REQUEST, f"{group_id}: voters {sorted(voters)} are not the target"), view
    moves = dict(view.reassignments)
    del moves[group_id]
    return move, _set_placement(replace(view, reassignments=moves), move, move.target)


def _set_placement(view: ControllerView, move: Reassignment, replicas: tuple[int, ...]) -> ControllerView:
    if move.topic is None:
        internal = dict(view.internal_replicas)
        internal[move.group_id] = replicas
        return replace(view, internal_replicas=internal)
    meta = view.topics.get(move.topic)
    if meta is None or group_id_for(meta.topic_id, move.partition) != move.group_id:
        return view  # the topic was deleted (or re-created) meanwhile: nothing to place
    parts = tuple(
        PartitionAssignment(a.partition, replicas) if a.partition == move.partition else a for a in meta.partitions
    )
    topics = dict(view.topics)
    topics[meta.name] = replace(meta, partitions=parts)
    return replace(view, topics=topics)


def _decommission(view: ControllerView, node_id: int, moves: Sequence[Reassignment]) -> Result:
    node = view.nodes.get(node_id)
    if node is None:
        return BrokerError(ErrorCode.BROKER_ID_NOT_REGISTERED, f"node {node_id} is not registered"), view
    if node.state != NODE_ACTIVE:
        return node, view
    result, view = _start_moves(view, moves)
    if isinstance(result, BrokerError):
        return result, view
    nodes = dict(view.nodes)
    nodes[node_id] = replace(node, state=NODE_DECOMMISSIONING)
    return nodes[node_id], replace(view, nodes=nodes)


def _set_state(view: ControllerView, node_id: int, state: str) -> Result:
    node = view.nodes.get(node_id)
    if node is None:
        return BrokerError(ErrorCode.BROKER_ID_NOT_REGISTERED, f"node {node_id} is not registered"), view
    if state not in NODE_STATES:
        return BrokerError(ErrorCode.INVALID_REQUEST, f"unknown node state {state!r}"), view
    nodes = dict(view.nodes)
    nodes[node_id] = replace(node, state=state)
    return nodes[node_id], replace(view, nodes=nodes)


# ---- placement and planners ------------------------------------------------------------------------


def hosted_groups(view: ControllerView, node_id: int) -> set[str]:
    """The data-partition groups ``node_id`` runs: its placement, plus every move it takes part in."""
    out = {
        group_id_for(meta.topic_id, a.partition)
        for meta in view.topics.values()
        for a in meta.partitions
        if node_id in a.replicas
    }
    out.update(m.group_id for m in view.reassignments.values() if m.topic is not None and node_id in m.involved)
    return out


def holds_anything(view: ControllerView, node_id: int, internal: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether ``node_id`` still holds a replica of a data or internal partition, or takes part in a move."""
    if hosted_groups(view, node_id):
        return True
    if any(node_id in replicas for replicas in internal.values()):
        return True
    return any(node_id in m.involved for m in view.reassignments.values())


def validate_replica_list(view: ControllerView, replicas: object) -> tuple[int, ...]:
    """A requested replica set: a non-empty list of distinct, registered, active node ids."""
    if not isinstance(replicas, list) or not replicas:
        raise BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "replicas must be a non-empty list of node ids")
    if any(isinstance(r, bool) or not isinstance(r, int) for r in replicas):
        raise BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "replicas must be node ids (integers)")
    dupes = sorted(n for n, c in Counter(replicas).items() if c > 1)
    if dupes:
        raise BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"duplicate node ids {dupes}")
    unknown = [r for r in replicas if r not in view.nodes]
    if unknown:
        raise BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"unknown nodes {unknown}")
    inactive = [r for r in replicas if view.nodes[r].state != NODE_ACTIVE]
    if inactive:
        raise BrokerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"nodes {inactive} are being decommissioned")
    return tuple(replicas)


def plan_reassignment(
    view: ControllerView, topic: str, partition: int, replicas: object, min_replicas: int, now_ms: int
) -> Reassignment:
    """Validate ``POST /v1/topics/{topic}/partitions/{p}/reassign`` and build its move."""
    meta = view.topics.get(topic)
    if meta is None:
        raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
    if not 0 <= partition < len(meta.partitions):
        raise BrokerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
    target = validate_replica_list(view, replicas)
    original = meta.partitions[partition].replicas
    floor = min(min_replicas, len(original))
    if len(target) < floor:
        raise BrokerError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"{topic}-{partition} needs at least {floor} replicas (min_insync_replicas), got {len(target)}",
        )
    gid = group_id_for(meta.topic_id, partition)
    if gid in view.reassignments:
        raise BrokerError(ErrorCode.REASSIGNMENT_IN_PROGRESS, f"{topic}-{partition} is already moving")
    return Reassignment(gid, topic, partition, original, target, now_ms)


def plan_decommission(
    view: ControllerView, node_id: int, internal: Mapping[str, tuple[int, ...]], now_ms: int
) -> list[Reassignment]:
    """The moves that take every replica off ``node_id``; refused when the rest cannot hold them.

    ``internal``: every internal partition's group id -> its current replica set. A replacement is
    the active node holding the fewest replicas (then the lowest id) not already in the set; it
    takes the leaving node's place in the order, so preference shifts as little as possible.
    """
    node = view.nodes.get(node_id)
    if node is None:
        raise BrokerError(ErrorCode.BROKER_ID_NOT_REGISTERED, f"node {node_id} is not registered")
    if node.state == NODE_DECOMMISSIONED:
        raise BrokerError(ErrorCode.INVALID_REQUEST, f"node {node_id} is decommissioned")
    if node.state == NODE_DECOMMISSIONING:
        raise BrokerError(ErrorCode.REASSIGNMENT_IN_PROGRESS, f"node {node_id} is being decommissioned")
    remaining = [n for n in view.active_node_ids() if n != node_id]
    if not remaining:
        raise BrokerError(ErrorCode.INVALID_REPLICATION_FACTOR, "the last active node cannot be decommissioned")
    busy = [m.group_id for m in view.reassignments.values() if node_id in m.involved]
    if busy:
        raise BrokerError(ErrorCode.REASSIGNMENT_IN_PROGRESS, f"node {node_id} takes part in moves {sorted(busy)}")
    load: Counter[int] = Counter({n: 0 for n in remaining})
    held: list[tuple[str, str | None, int, tuple[int, ...]]] = []
    for meta in sorted(view.topics.values(), key=lambda t: t.topic_id):
        for a in meta.partitions:
            load.update(r for r in a.replicas if r in load)
            if node_id in a.replicas:
                held.append((group_id_for(meta.topic_id, a.partition), meta.name, a.partition, a.replicas))
    for gid, replicas in sorted(internal.items()):
        load.update(r for r in replicas if r in load)
        if node_id in replicas:
            held.append((gid, None, _internal_partition(gid), replicas))
    moves = []
    for gid, topic, partition, replicas in held:
        if gid in view.reassignments:
            raise BrokerError(ErrorCode.REASSIGNMENT_IN_PROGRESS, f"group {gid} is already moving")
        candidates = [n for n in remaining if n not in replicas]
        if not candidates:
            what = f"{topic}-{partition}" if topic is not None else gid
            raise BrokerError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"the {len(remaining)} remaining active nodes cannot hold the {len(replicas)} replicas of {what}",
            )
        pick = min(candidates, key=lambda n: (load[n], n))
        load[pick] += 1
        target = tuple(pick if r == node_id else r for r in replicas)
        moves.append(Reassignment(gid, topic, partition, replicas, target, now_ms))
    return moves


def _internal_partition(group_id: str) -> int:
    _, _, p = group_id.rpartition("-")
    return int(p) if p.isdigit() else 0


def group_members(nodes: NodeDirectory, replicas: Sequence[int], what: str) -> list[str]:
    """The Raft addresses a local replica of a group starts with: its replicas', and this node's.

    A node joining by a move is not among the replicas yet: it starts with the current voters plus
    itself, and its log's configuration takes over from the first entry it receives.
    """
    members = []
    for r in replicas:
        addr = nodes.node(r)
        if addr is None:
            raise RuntimeError(f"{what}: replica node {r} is not known")
        members.append(addr.raft_address)
    me = nodes.node(nodes.node_id)
    if me is not None and me.raft_address not in members:
        members.append(me.raft_address)
    return members


def topic_placement_nodes(view: ControllerView, configured: Sequence[int]) -> list[int]:
    """The nodes new partitions go to: the active registered nodes (the configured ones before any is)."""
    return view.active_node_ids() if view.nodes else sorted(configured)


def describe_assignment(meta: TopicMetadata, view: ControllerView, partition: int) -> dict[str, list[int]]:
    """Kafka's adding/removing replicas of a partition while it moves (empty lists when it does not)."""
    move = view.reassignments.get(group_id_for(meta.topic_id, partition))
    if move is None:
        return {"adding_replicas": [], "removing_replicas": []}
    return {"adding_replicas": list(move.adding), "removing_replicas": list(move.removing)}
