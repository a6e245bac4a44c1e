"""Admin client: topics, cluster metadata, transactions, consumer groups, security
(kafka-python's ``KafkaAdminClient``, over HTTP).

Blocking and thread-free (stdlib HTTP, one connection per call), so it is
cheap to create for a single command. ``clients.aio.AsyncAdmin`` is the
asyncio twin; both send the requests defined in ``clients._admin_calls``
(consumer groups: ``clients._group_calls``).
Every failure raises ``BrokerError`` carrying the broker's ``ErrorCode``
(``TOPIC_ALREADY_EXISTS``, ``UNKNOWN_TOPIC_OR_PARTITION``,
``INVALID_REPLICATION_FACTOR``, ...).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TypeVar, Unpack

from . import _admin_calls as calls
from . import _cluster_calls as cluster_calls
from . import _group_calls as group_calls
from ._http import request_json
from .aio._metadata import parse_bootstrap
from .protocol import BrokerError
from .security import AclBinding, ClientSecurity, SecurityOptions

T = TypeVar("T")


class Admin:
    """``security`` takes ``clients.security.SecurityOptions`` (credentials, CA, client certificate)."""

    def __init__(
        self, bootstrap: str | Sequence[str], *, request_timeout_ms: int = 30000, **security: Unpack[SecurityOptions]
    ) -> None:
        self._urls = parse_bootstrap(bootstrap)
        self._timeout = request_timeout_ms / 1000
        self._security = ClientSecurity.from_options(self._urls, **security)

    def _run(self, call: calls.AdminCall[T]) -> T:
        last: BrokerError | None = None
        for url in self._urls:
            try:
                return call.parse(
                    request_json(
                        call.method, url + call.path, call.body, timeout=self._timeout, security=self._security
                    )
                )
            except BrokerError as exc:
                if not calls.should_try_next_node(exc):
                    raise
                last = exc
        assert last is not None
        raise last

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 3,
        config: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create a topic; returns its description. Leaders are elected right after: see ``wait_for_leaders``."""
        return self._run(calls.create_topic(name, partitions, replication_factor, config))

    def delete_topic(self, name: str) -> None:
        self._run(calls.delete_topic(name))

    def list_topics(self) -> list[dict[str, Any]]:
        """``[{"name", "partitions", "replication_factor"}]`` for every topic."""
        return self._run(calls.list_topics())

    def describe_topic(self, name: str) -> dict[str, Any]:
        return self._run(calls.describe_topic(name))

    def create_partitions(
        self, name: str, count: int, assignments: Sequence[Sequence[int]] | None = None
    ) -> dict[str, Any]:
        """Grow ``name`` to ``count`` partitions in total (only up: INVALID_PARTITIONS otherwise); returns its
        description. ``assignments``: the replicas of each new partition (default: round-robin). Leaders of the
        new partitions are elected right after: see ``wait_for_leaders``."""
        return self._run(calls.create_partitions(name, count, assignments))

    def alter_topic_config(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Set config overrides (``{"retention.ms": 3600000}``; a value of None deletes the override, back to the
        default); validated like creation (INVALID_CONFIG). Returns ``describe_topic_config``'s answer."""
        return self._run(calls.alter_topic_config(name, changes))

    def describe_topic_config(self, name: str) -> dict[str, Any]:
        """``{"topic", "config": every key's value (defaults included), "overrides": the keys set}``."""
        return self._run(calls.describe_topic_config(name))

    def describe_cluster(self) -> dict[str, Any]:
        return self._run(calls.describe_cluster())

    def metadata(self, topics: Sequence[str] | None = None) -> dict[str, Any]:
        return self._run(calls.metadata(topics))

    def wait_for_leaders(self, name: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Poll until every partition of ``name`` has a leader; returns the description."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                desc = self.describe_topic(name)
            except BrokerError as exc:
                if not calls.topic_may_be_propagating(exc):
                    raise
                desc = {}
            if calls.leaders_elected(desc):
                return desc
            if time.monotonic() >= deadline:
                raise calls.leaders_timeout_error(name, timeout_s)
            time.sleep(0.05)

    # ---- transactions ----------------------------------------------------------------------

    def list_transactions(self, states: Sequence[str] | None = None, prefix: str = "") -> list[dict[str, Any]]:
        return self._run(calls.list_transactions(states, prefix))

    def describe_transaction(self, transactional_id: str) -> dict[str, Any]:
        return self._run(calls.describe_transaction(transactional_id))

    def abort_transaction(self, transactional_id: str) -> dict[str, Any]:
        return self._run(calls.abort_transaction(transactional_id))

    def abort_transactions_with_prefix(self, prefix: str) -> list[str]:
        return self._run(calls.abort_transactions_with_prefix(prefix))

    def complete_prepared(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> dict[str, Any]:
        return self._run(calls.complete_prepared(transactional_id, producer_id, producer_epoch, commit))

    def commit_prepared_group(
        self, group_id: str, members: Sequence[tuple[str, int, int]], commit: bool = True
    ) -> dict[str, Any]:
        return self._run(calls.commit_prepared_group(group_id, members, commit))

    def describe_producers(self, topic: str, partition: int) -> list[dict[str, Any]]:
        return self._run(calls.describe_producers(topic, partition))

    # ---- consumer groups (kafka-consumer-groups.sh; API.md "Operating a cluster") ------------------

    def list_consumer_groups(self) -> list[dict[str, Any]]:
        """Every group of the cluster: ``[{"group_id", "state", "members", ...}]`` (``members``: a count)."""
        return self._run(group_calls.list_consumer_groups())

    def describe_consumer_groups(self, group_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Each group's state, protocol, members with assignments and offsets (committed, log end, lag), in
        order; a group that does not exist is described as ``"state": "Dead"`` with no members (Kafka's answer)."""
        return [self._run(group_calls.describe_consumer_group(g)) for g in group_calls.group_ids(group_ids)]

    def delete_consumer_groups(self, group_ids: Sequence[str]) -> list[tuple[str, BrokerError | None]]:
        """Delete each empty group with its committed offsets: ``[(group_id, None or the error)]``, in order
        (``NON_EMPTY_GROUP``, ``GROUP_ID_NOT_FOUND``, ...), like kafka-python's ``delete_consumer_groups``."""
        out: list[tuple[str, BrokerError | None]] = []
        for g in group_calls.group_ids(group_ids):
            try:
                self._run(group_calls.delete_consumer_group(g))
                out.append((g, None))
            except BrokerError as exc:
                out.append((g, exc))
        return out

    def reset_consumer_group_offsets(
        self,
        group_id: str,
        topic: str,
        to: str | dict[str, int],
        partitions: Sequence[int] | None = None,
        execute: bool = False,
    ) -> dict[str, Any]:
        """The new offsets of ``topic`` (every partition, or ``partitions``) for a group without members:
        ``to`` is ``"earliest"``, ``"latest"``, ``{"offset": N}`` or ``{"timestamp": ms}``. A dry run unless
        ``execute`` (then written as one commit). ``{"group_id", "dry_run", "offsets": [{"topic", "partition",
        "current_offset", "new_offset"}]}``; ``NON_EMPTY_GROUP`` while the group has members."""
        return self._run(group_calls.reset_consumer_group_offsets(group_id, topic, to, partitions, execute))

    # ---- security (API.md "Security") ------------------------------------------------------------

    def create_acls(self, acls: Sequence[AclBinding | dict[str, Any]]) -> None:
        """Add ACLs (``AclBinding`` values or their JSON objects as dicts), all in one request."""
        self._run(calls.create_acls(acls))

    def describe_acls(self, **acl_filter: str | None) -> list[dict[str, Any]]:
        """ACLs matching every given field (``principal``, ``host``, ``resource_type``, ``resource_name``,
        ``pattern_type``, ``operation``, ``permission``; a field left out or None matches anything)."""
        return self._run(calls.describe_acls(acl_filter))

    def delete_acls(self, filters: calls.AclFilters) -> list[dict[str, Any]]:
        """Delete the ACLs matching each filter (one request per filter); returns every ACL deleted."""
        deleted: list[dict[str, Any]] = []
        for flt in calls.as_filters(filters):
            part = self._run(calls.delete_acls(flt))
            deleted += part
        return deleted

    def upsert_user(
        self, name: str, password: str, mechanism: str = "SCRAM-SHA-256", iterations: int | None = None
    ) -> None:
        """Create the user or change its password (the broker keeps only the salted SCRAM credential)."""
        self._run(calls.upsert_user(name, password, mechanism, iterations))

    def delete_user(self, name: str) -> None:
        self._run(calls.delete_user(name))

    def list_users(self) -> list[dict[str, Any]]:
        """``[{"name", "mechanisms"}]``, never a secret."""
        return self._run(calls.list_users())

    def whoami(self) -> str:
        """The principal the cluster knows this client as, e.g. ``"User:alice"``."""
        return self._run(calls.whoami())

    # ---- operating a cluster (API.md "Operating a cluster") ----

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every registered node: id, url, alive, state (active|decommissioning|decommissioned), ..."""
        return self._run(cluster_calls.list_nodes())

    def describe_node(self, node_id: int) -> dict[str, Any]:
        return self._run(cluster_calls.describe_node(node_id))

    def register_node(
        self, host: str, http_port: int, raft_port: int, node_id: int | None = None, kafka_port: int | None = None
    ) -> dict[str, Any]:
        """Register a node with the controller (what ``txbroker cluster add-node`` does); its record.
        ``kafka_port``: the node's Kafka listener (None: it serves no Kafka clients)."""
        return self._run(cluster_calls.register_node(host, http_port, raft_port, node_id, kafka_port))

    def decommission_node(self, node_id: int) -> dict[str, Any]:
        """Start moving every replica off ``node_id``; ``describe_node`` shows when it is decommissioned."""
        return self._run(cluster_calls.decommission_node(node_id))

    def reassign_partition(self, topic: str, partition: int, replicas: Sequence[int]) -> dict[str, Any]:
        """Start moving a partition to ``replicas`` (Kafka's alterPartitionReassignments)."""
        return self._run(cluster_calls.reassign_partition(topic, partition, replicas))

    def cancel_reassignment(self, topic: str, partition: int) -> dict[str, Any]:
        return self._run(cluster_calls.cancel_reassignment(topic, partition))

    def list_reassignments(self) -> list[dict[str, Any]]:
        """The moves in progress, with their progress (Kafka's listPartitionReassignments)."""
        return self._run(cluster_calls.list_reassignments())

    def close(self) -> None:
        """Nothing to release (one connection per call); here for kafka-python parity."""

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
