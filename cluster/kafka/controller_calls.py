"""Controller commands a Kafka request brings to a node that does not lead the controller.

Kafka clients send CreateTopics, DeleteTopics and CreatePartitions to the
controller Metadata names, but ACL and config changes to any node. A node
that does not lead the controller sends such a change once to the leader's
HTTP route (the one the HTTP API serves: ``POST /v1/topics``, ``POST
/v1/acls``, ...), as a node call acting for the connection's principal
(``cluster.http.forwarding``: KIP-590's envelope), so the leader checks the
principal's rights again and nothing is trusted from the client. The call is
bounded by the node's request timeout and follows the controller when it
moves.
"""

from __future__ import annotations

import json
from typing import Any

from clients.protocol import BrokerError, ErrorCode

from ..http.forwarding import Forwarder
from ..http.services import Services
from ..security.node_calls import NodeCallSigner
from .api import RequestContext

__all__ = ["ControllerCalls", "create_at_controller", "forward"]


class ControllerCalls:
    """Sends one controller command's HTTP request to the controller leader, acting for a principal."""

    def __init__(self, services: Services) -> None:
        config = services.config
        self._services = services
        self._forwarder = Forwarder(
            services.nodes,
            services.peers,
            config.request_timeout_ms / 1000,
            signer=NodeCallSigner(config.cluster_secret, config.node_id),
            ssl_context=services.client_ssl,
        )

    async def start(self) -> None:
        await self._forwarder.start()

    async def close(self) -> None:
        await self._forwarder.close()

    def _leader_url(self) -> str | None:
        controller = self._services.controller
        leader = controller.leader_id()
        if leader is None or leader == self._services.config.node_id:
            return None
        return self._services.nodes.node_url(leader)

    async def call(self, refused: BrokerError, method: str, path: str, body: Any, principal: str, host: str) -> Any:
        """The leader's JSON answer to ``method path`` with ``body``; its error as a ``BrokerError``.

        ``refused``: this node's NOT_CONTROLLER (its ``leader_url`` says where to go); raised again when
        no leader is known."""
        url = refused.extra.get("leader_url")
        url = url if isinstance(url, str) and url else self._leader_url()
        if url is None:
            raise refused
        raw = b"" if body is None else json.dumps(body).encode()
        status, answer = await self._forwarder.call_as(
            method, path, raw, principal, host, url, ErrorCode.NOT_CONTROLLER, self._leader_url
        )
        try:
            data = json.loads(answer) if answer else {}
        except ValueError:
            raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, f"the controller answered {status}, not JSON") from None
        if status >= 400:
            name = data.get("error_code") if isinstance(data, dict) else None
            code = ErrorCode.from_name(name) if isinstance(name, str) else ErrorCode.UNKNOWN_SERVER_ERROR
            raise BrokerError(code, str(data.get("message") or "") if isinstance(data, dict) else "")
        return data


async def forward(ctx: RequestContext, refused: BrokerError, method: str, path: str, body: Any = None) -> Any:
    """``refused`` (this node's NOT_CONTROLLER) answered by the controller leader's HTTP route, acting for the
    connection's principal; ``refused`` itself when the listener has no way to the leader."""
    calls = ctx.controller_calls
    if calls is None or refused.error_code is not ErrorCode.NOT_CONTROLLER:
        raise refused
    return await calls.call(refused, method, path, body, ctx.guard.principal, ctx.guard.host)


async def create_at_controller(
    ctx: RequestContext, name: str, partitions: int, rf: int, config: dict[str, str]
) -> tuple[int, int, int, dict[str, Any]]:
    """Create ``name`` on the controller (here, or at its leader for the connection's principal):
    its topic id, partition count, replication factor and config."""
    s = ctx.services
    try:
        meta = await s.controller.create_topic(name, partitions, rf, config)
    except BrokerError as exc:
        body = {"name": name, "partitions": partitions, "replication_factor": rf, "config": config}
        answer = await forward(ctx, exc, "POST", "/v1/topics", body)
        return (int(answer["topic_id"]), len(answer["partitions"]), int(answer["replication_factor"]),
                dict(answer.get("config") or {}))  # fmt: skip
    return meta.topic_id, len(meta.partitions), rf, dict(meta.config)
