"""The narrow seams between a node's services (STYLE.md "One composition root, narrow seams").

``cluster/node.py`` builds every collaborator and hands each service only the
few of these protocols it uses, never the whole node: a service can then be
tested with a four-line fake, and no import runs from a service back to the
node or to the HTTP layer.

* ``Clock``: wall-clock milliseconds, stamped into replicated commands (apply
  never reads the clock itself; DESIGN.md rule 1).
* ``NodeDirectory``: this node's id and the URLs of the cluster's nodes.
* ``PeerClient``: a signed node-to-node call to another node's internal
  endpoint (``/v1/internal/*``).
* ``TopicDirectory``: the controller's topics, and who leads a partition.
* ``MarkerWriter``: a COMMIT/ABORT marker (or a revoking marker) applied on a
  partition's leader, here or on another node.
* ``PartitionVerifier``: KIP-890's check that a partition is in a producer's
  transaction, adding it if needed.
* ``TransactionPartitions``: AddPartitionsToTxn on the transaction coordinator.
* ``ProducerIdSource``: the next producer id of this node's block.
* ``PeerPartitions``: a group's state as the peers last reported it (their
  ``/v1/internal/state``), such as the leader's high watermark.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from clients.protocol import ControlType
from storage.commands import RevokeResult, TxnMarkerResult

if TYPE_CHECKING:
    from coordinator.metadata import TopicPartition
    from coordinator.results import AddPartitionsResult

    from .config import NodeAddress
    from .topics import TopicMetadata

__all__ = [
    "Clock",
    "MarkerWriter",
    "NodeDirectory",
    "PartitionVerifier",
    "PeerClient",
    "PeerPartitions",
    "ProducerIdSource",
    "SystemClock",
    "TopicDirectory",
    "TransactionPartitions",
]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (what Kafka stamps into its log and coordinator records)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return int(time.time() * 1000)


class NodeDirectory(Protocol):
    @property
    def node_id(self) -> int: ...

    @property
    def founders(self) -> tuple[int, ...]:
        """The nodes of ``cluster init`` (the default placement of internal partitions)."""
        ...

    def node_ids(self) -> list[int]:
        """Every known node's id that is not decommissioned, this one included."""
        ...

    def node_url(self, node_id: int | None) -> str | None: ...

    def node(self, node_id: int) -> NodeAddress | None: ...

    def node_by_raft_address(self, address: str) -> NodeAddress | None: ...


class PeerClient(Protocol):
    async def call(self, node_id: int, path: str, body: dict[str, Any], *, relay: bool = True) -> Any:
        """POST ``body`` to ``path`` (an internal endpoint) on ``node_id``, signed; its JSON answer.

        An error answer is raised as ``BrokerError`` with the remote error code; an unreachable node as
        ``NETWORK_EXCEPTION``; an unknown node as ``COORDINATOR_NOT_AVAILABLE``. ``relay``: through
        another node when ``node_id`` is out of this node's reach (connectivity need not be transitive).
        """
        ...


class PeerPartitions(Protocol):
    def remote_partition(self, group_id: str) -> dict[str, Any] | None:
        """A group's state as a live peer last reported it (its leader's own report first); None if unknown."""
        ...


class TopicDirectory(Protocol):
    def topic(self, name: str) -> TopicMetadata:
        """The topic's metadata; ``UNKNOWN_TOPIC_OR_PARTITION`` if the controller has no such topic."""
        ...

    def partition_leader(self, meta: TopicMetadata, partition: int) -> int | None:
        """The node leading the partition as far as this node knows, or None."""
        ...

    def high_watermark(self, meta: TopicMetadata, partition: int) -> int:
        """The partition's high watermark as far as this node knows (-1 when unknown)."""
        ...

    def partition_counts(self) -> dict[str, int]:
        """Each topic's partition count."""
        ...


class MarkerWriter(Protocol):
    async def write_txn_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        control: ControlType,
        classic: bool = False,
    ) -> TxnMarkerResult:
        """A COMMIT/ABORT marker on the partition's leader; ``classic``: of a classic-protocol transaction."""
        ...

    async def revoke_txn_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int,
        control: ControlType,
    ) -> RevokeResult: ...  # fmt: skip


class PartitionVerifier(Protocol):
    async def verify_partition(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int,
        state: object = None, add: bool = True,
    ) -> None:  # fmt: skip
        """Raise unless the partition is in the producer's ongoing transaction (adding it if needed).

        ``state``: the partition's state of the producer (a cached answer counts only for the same object).
        ``add`` False: verify only, INVALID_TXN_STATE when the partition is not in the transaction.
        """
        ...


class TransactionPartitions(PartitionVerifier, Protocol):
    async def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Iterable[TopicPartition]
    ) -> AddPartitionsResult: ...


class ProducerIdSource(Protocol):
    async def next_producer_id(self) -> int: ...
