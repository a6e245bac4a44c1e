"""What the HTTP layer adapts: the node's services, built by the composition root (``cluster.node``)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import NodeConfig
from ..controller_service import ControllerService
from ..group_service import GroupService
from ..metrics import NodeMetrics
from ..operations import ClusterOperations
from ..partitions import PartitionService
from ..reassignment import ReassignmentDriver
from ..routed_produce import RoutedProducer
from ..seams import MarkerWriter, NodeDirectory, PeerClient, ProducerIdSource
from ..txn import TransactionCoordinator

__all__ = ["Readiness", "Services"]


class Readiness(Protocol):
    @property
    def draining(self) -> bool: ...

    def is_ready(self) -> bool: ...

    def missing_groups(self) -> list[dict[str, Any]]:
        """The internal groups replicated here without a ready leader (what ``/readyz?verbose`` lists)."""
        ...

    async def refresh_readiness(self, timeout: float) -> None:
        """Poll now the peers that lead a group replicated here but have not reported it ready, so that
        ``missing_groups`` does not wait for the next periodic poll (at most ``timeout`` seconds)."""
        ...

    def internal_state_json(self, epoch: str | None, since: int | None) -> dict[str, Any]:
        """This node's view of its Raft groups, for ``/v1/internal/state`` (peers read it): what changed
        after version ``since`` of ``epoch``, or all of it (``cluster.state_versions``)."""
        ...


@dataclass(frozen=True)
class Services:
    """What the HTTP layer adapts: the node's services, built by ``cluster.node``."""

    config: NodeConfig
    metrics: NodeMetrics
    node: Readiness
    controller: ControllerService
    partitions: PartitionService
    routed: RoutedProducer
    txn: TransactionCoordinator
    groups: GroupService
    producer_ids: ProducerIdSource
    markers: MarkerWriter
    peers: PeerClient
    nodes: NodeDirectory
    operations: ClusterOperations
    reassignments: ReassignmentDriver
    #: the context of this node's HTTPS calls to other nodes (None: the nodes speak plain HTTP)
    client_ssl: ssl.SSLContext | None = None
