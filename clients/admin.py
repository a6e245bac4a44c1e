"""Admin client: topics and cluster metadata (kafka-python's ``KafkaAdminClient``, over HTTP).

Blocking and thread-free (stdlib HTTP, one connection per call), so it is
cheap to create for a single command. ``clients.aio.AsyncAdmin`` is the
asyncio twin; both send the requests defined in ``clients._admin_calls``.
Every failure raises ``BrokerError`` carrying the broker's ``ErrorCode``
(``TOPIC_ALREADY_EXISTS``, ``UNKNOWN_TOPIC_OR_PARTITION``,
``INVALID_REPLICATION_FACTOR``, ...).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TypeVar

from . import _admin_calls as calls
from ._http import request_json
from .aio._metadata import parse_bootstrap
from .protocol import BrokerError

T = TypeVar("T")


class Admin:
    def __init__(self, bootstrap: str | Sequence[str], *, request_timeout_ms: int = 30000) -> None:
        self._urls = parse_bootstrap(bootstrap)
        self._timeout = request_timeout_ms / 1000

    def _run(self, call: calls.AdminCall[T]) -> T:
        last: BrokerError | None = None
        for url in self._urls:
            try:
                return call.parse(request_json(call.method, url + call.path, call.body, timeout=self._timeout))
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

    def close(self) -> None:
        """Nothing to release (one connection per call); here for kafka-python parity."""

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
