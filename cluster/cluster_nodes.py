"""The cluster's nodes as this node knows them: its config's list, then the controller's registry.

A node starts knowing the nodes its config file lists (the founders, or for a
node written by ``txbroker cluster add-node``, the nodes registered then).
Once its controller replica has applied the registry (``ControllerView.nodes``),
that registry is the truth: a node added later is learned from it, with no
config file edited anywhere, and a registered node's address in the registry
wins over a config entry. ``update`` runs on the loop after every metadata
change; readers get consistent snapshots (the map is replaced, never mutated).

Implements ``cluster.seams.NodeDirectory``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .config import NodeAddress, NodeConfig
from .controller_view import NODE_ACTIVE, NODE_DECOMMISSIONED, ControllerView


class ClusterNodes:
    def __init__(self, config: NodeConfig) -> None:
        self._config = config
        self._scheme = config.self_address.scheme
        self._nodes: Mapping[int, NodeAddress] = {n.id: n for n in config.nodes}
        self._by_raft: Mapping[str, NodeAddress] = {n.raft_address: n for n in config.nodes}
        self._states: Mapping[int, str] = {n.id: NODE_ACTIVE for n in config.nodes}
        self._founders: tuple[int, ...] = config.founder_ids
        self._listeners: list[Callable[[], None]] = []

    @property
    def node_id(self) -> int:
        return self._config.node_id

    @property
    def founders(self) -> tuple[int, ...]:
        """The nodes of ``cluster init``: the default placement of internal partitions is over them."""
        return self._founders

    def node_ids(self) -> list[int]:
        """Every known node that is not decommissioned, this one included."""
        return sorted(i for i in self._nodes if self._states.get(i) != NODE_DECOMMISSIONED)

    def all_ids(self) -> list[int]:
        return sorted(self._nodes)

    def node(self, node_id: int) -> NodeAddress | None:
        return self._nodes.get(node_id)

    def node_by_raft_address(self, address: str) -> NodeAddress | None:
        return self._by_raft.get(address)

    def node_url(self, node_id: int | None) -> str | None:
        if node_id is None:
            return None
        n = self._nodes.get(node_id)
        return n.url if n else None

    def state(self, node_id: int) -> str | None:
        return self._states.get(node_id)

    def on_change(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs (loop thread) after the set of nodes or an address changes."""
        self._listeners.append(listener)

    def update(self, view: ControllerView) -> None:
        """Adopt the registry of ``view`` (loop thread); config-only nodes stay until registered."""
        if not view.nodes:
            return
        nodes = dict(self._nodes)
        states = dict(self._states)
        for rec in view.nodes.values():
            # The registry records the scheme each node was added with; this cluster's scheme is what its
            # own config says (every node of a cluster serves TLS, or none does).
            addr = NodeAddress(rec.node_id, rec.host, rec.http_port, rec.raft_port, self._scheme, rec.kafka_port)
            nodes[rec.node_id] = addr
            states[rec.node_id] = rec.state
        if view.founders:
            self._founders = view.founders
        changed = nodes != self._nodes or states != self._states
        self._nodes = nodes
        self._by_raft = {n.raft_address: n for n in nodes.values()}
        self._states = states
        if changed:
            for listener in self._listeners:
                listener()
