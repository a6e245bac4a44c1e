"""The node directory: the config's nodes until the controller's registry is applied, then the registry."""

from __future__ import annotations

from pathlib import Path

from cluster.cluster_nodes import ClusterNodes
from cluster.config import make_cluster_configs
from cluster.controller_view import ControllerView, NodeRecord


def test_config_then_registry(tmp_path: Path) -> None:
    cfg = make_cluster_configs(3, tmp_path, http_ports=[1001, 1002, 1003], raft_ports=[2001, 2002, 2003])[0]
    nodes = ClusterNodes(cfg)
    assert nodes.founders == (1, 2, 3)  # a config from `cluster init` lists no founders: all its nodes are
    assert nodes.node_ids() == [1, 2, 3] and nodes.node(4) is None
    changes: list[int] = []
    nodes.on_change(lambda: changes.append(1))
    nodes.update(ControllerView())  # nothing registered yet: the config stays
    assert nodes.node_ids() == [1, 2, 3] and changes == []
    registry = {i: NodeRecord(i, "127.0.0.1", 1000 + i, 2000 + i) for i in (1, 2, 3)}
    registry[4] = NodeRecord(4, "10.0.0.4", 1004, 2004)
    registry[2] = NodeRecord(2, "127.0.0.1", 1002, 2002, state="decommissioned")
    nodes.update(ControllerView(nodes=registry, founders=(1, 2, 3)))
    assert changes == [1]
    assert nodes.node_ids() == [1, 3, 4] and nodes.all_ids() == [1, 2, 3, 4]
    four = nodes.node(4)
    assert four is not None and nodes.node_by_raft_address("10.0.0.4:2004") == four
    assert nodes.node_url(4) == "http://10.0.0.4:1004" and nodes.state(2) == "decommissioned"
