"""``AsyncAdmin``: the asyncio twin of ``clients.Admin`` (same methods, same requests and errors)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar, Unpack

from .. import _admin_calls as calls
from .. import _cluster_calls as cluster_calls
from .. import _group_calls as group_calls
from ..protocol import BrokerError
from ..security import AclBinding, ClientSecurity, SecurityOptions
from ._metadata import parse_bootstrap
from ._session import HttpSession

__all__ = ["AsyncAdmin"]

T = TypeVar("T")


class AsyncAdmin:
    def __init__(
        self, bootstrap: str | Sequence[str], *, request_timeout_ms: int = 30000, **security: Unpack[SecurityOptions]
    ) -> None:
        self._urls = parse_bootstrap(bootstrap)
        sec = ClientSecurity.from_options(self._urls, **security)
        self._session = HttpSession(request_timeout_ms=request_timeout_ms, max_connections=8, security=sec)

    async def _run(self, call: calls.AdminCall[T]) -> T:
        last: BrokerError | None = None
        for url in self._urls:
            try:
                return call.parse(await self._session.request_json(call.method, url + call.path, call.body))
            except BrokerError as exc:
                if not calls.should_try_next_node(exc):
                    raise
                last = exc
        assert last is not None
        raise last

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 3,
        config: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return await self._run(calls.create_topic(name, partitions, replication_factor, config))

    async def delete_topic(self, name: str) -> None:
        await self._run(calls.delete_topic(name))

    async def list_topics(self) -> list[dict[str, Any]]:
        return await self._run(calls.list_topics())

    async def describe_topic(self, name: str) -> dict[str, Any]:
        return await self._run(calls.describe_topic(name))

    async def create_partitions(
        self, name: str, count: int, assignments: Sequence[Sequence[int]] | None = None
    ) -> dict[str, Any]:
        """Grow ``name`` to ``count`` partitions in total (only up); see ``clients.Admin.create_partitions``."""
        return await self._run(calls.create_partitions(name, count, assignments))

    async def alter_topic_config(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Set config overrides (None deletes one); see ``clients.Admin.alter_topic_config``."""
        return await self._run(calls.alter_topic_config(name, changes))

    async def describe_topic_config(self, name: str) -> dict[str, Any]:
        return await self._run(calls.describe_topic_config(name))

    async def describe_cluster(self) -> dict[str, Any]:
        return await self._run(calls.describe_cluster())

    async def metadata(self, topics: Sequence[str] | None = None) -> dict[str, Any]:
        return await self._run(calls.metadata(topics))

    async def wait_for_leaders(self, name: str, timeout_s: float = 30.0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                desc = await self.describe_topic(name)
            except BrokerError as exc:
                if not calls.topic_may_be_propagating(exc):
                    raise
                desc = {}
            if calls.leaders_elected(desc):
                return desc
            if loop.time() >= deadline:
                raise calls.leaders_timeout_error(name, timeout_s)
            await asyncio.sleep(0.05)

    # ---- transactions ----------------------------------------------------------------------

    async def list_transactions(self, states: Sequence[str] | None = None, prefix: str = "") -> list[dict[str, Any]]:
        return await self._run(calls.list_transactions(states, prefix))

    async def describe_transaction(self, transactional_id: str) -> dict[str, Any]:
        return await self._run(calls.describe_transaction(transactional_id))

    async def abort_transaction(self, transactional_id: str) -> dict[str, Any]:
        return await self._run(calls.abort_transaction(transactional_id))

    async def abort_transactions_with_prefix(self, prefix: str) -> list[str]:
        return await self._run(calls.abort_transactions_with_prefix(prefix))

    async def complete_prepared(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> dict[str, Any]:
        return await self._run(calls.complete_prepared(transactional_id, producer_id, producer_epoch, commit))

    async def commit_prepared_group(
        self, group_id: str, members: Sequence[tuple[str, int, int]], commit: bool = True
    ) -> dict[str, Any]:
        return await self._run(calls.commit_prepared_group(group_id, members, commit))

    async def describe_producers(self, topic: str, partition: int) -> list[dict[str, Any]]:
        return await self._run(calls.describe_producers(topic, partition))

    # ---- consumer groups (kafka-consumer-groups.sh; ``Admin`` documents each) -----------------------

    async def list_consumer_groups(self) -> list[dict[str, Any]]:
        return await self._run(group_calls.list_consumer_groups())

    async def describe_consumer_groups(self, group_ids: Sequence[str]) -> list[dict[str, Any]]:
        ids = group_calls.group_ids(group_ids)
        return list(await asyncio.gather(*(self._run(group_calls.describe_consumer_group(g)) for g in ids)))

    async def delete_consumer_groups(self, group_ids: Sequence[str]) -> list[tuple[str, BrokerError | None]]:
        out: list[tuple[str, BrokerError | None]] = []
        for g in group_calls.group_ids(group_ids):
            try:
                await self._run(group_calls.delete_consumer_group(g))
                out.append((g, None))
            except BrokerError as exc:
                out.append((g, exc))
        return out

    async def reset_consumer_group_offsets(
        self,
        group_id: str,
        topic: str,
        to: str | dict[str, int],
        partitions: Sequence[int] | None = None,
        execute: bool = False,
    ) -> dict[str, Any]:
        return await self._run(group_calls.reset_consumer_group_offsets(group_id, topic, to, partitions, execute))

    # ---- security (API.md "Security") ------------------------------------------------------------

    async def create_acls(self, acls: Sequence[AclBinding | dict[str, Any]]) -> None:
        """Add ACLs (``AclBinding`` values or their JSON objects as dicts), all in one request."""
        await self._run(calls.create_acls(acls))

    async def describe_acls(self, **acl_filter: str | None) -> list[dict[str, Any]]:
        """ACLs matching every given field (``principal``, ``host``, ``resource_type``, ``resource_name``,
        ``pattern_type``, ``operation``, ``permission``; a field left out or None matches anything)."""
        return await self._run(calls.describe_acls(acl_filter))

    async def delete_acls(self, filters: calls.AclFilters) -> list[dict[str, Any]]:
        """Delete the ACLs matching each filter (one request per filter); returns every ACL deleted."""
        deleted: list[dict[str, Any]] = []
        for flt in calls.as_filters(filters):
            part = await self._run(calls.delete_acls(flt))
            deleted += part
        return deleted

    async def upsert_user(
        self, name: str, password: str, mechanism: str = "SCRAM-SHA-256", iterations: int | None = None
    ) -> None:
        """Create the user or change its password (the broker keeps only the salted SCRAM credential)."""
        await self._run(calls.upsert_user(name, password, mechanism, iterations))

    async def delete_user(self, name: str) -> None:
        await self._run(calls.delete_user(name))

    async def list_users(self) -> list[dict[str, Any]]:
        """``[{"name", "mechanisms"}]``, never a secret."""
        return await self._run(calls.list_users())

    async def whoami(self) -> str:
        """The principal the cluster knows this client as, e.g. ``"User:alice"``."""
        return await self._run(calls.whoami())

    # ---- operating a cluster (API.md "Operating a cluster") ----

    async def list_nodes(self) -> list[dict[str, Any]]:
        return await self._run(cluster_calls.list_nodes())

    async def describe_node(self, node_id: int) -> dict[str, Any]:
        return await self._run(cluster_calls.describe_node(node_id))

    async def register_node(
        self, host: str, http_port: int, raft_port: int, node_id: int | None = None, kafka_port: int | None = None
    ) -> dict[str, Any]:
        return await self._run(cluster_calls.register_node(host, http_port, raft_port, node_id, kafka_port))

    async def decommission_node(self, node_id: int) -> dict[str, Any]:
        return await self._run(cluster_calls.decommission_node(node_id))

    async def reassign_partition(self, topic: str, partition: int, replicas: Sequence[int]) -> dict[str, Any]:
        return await self._run(cluster_calls.reassign_partition(topic, partition, replicas))

    async def cancel_reassignment(self, topic: str, partition: int) -> dict[str, Any]:
        return await self._run(cluster_calls.cancel_reassignment(topic, partition))

    async def list_reassignments(self) -> list[dict[str, Any]]:
        return await self._run(cluster_calls.list_reassignments())

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
