"""Growing a topic and changing its config: ``/v1/topics/{topic}/partitions`` and ``/v1/topics/{topic}/config``.

Kafka's CreatePartitions (ALTER on the topic) and IncrementalAlterConfigs
(ALTER on the topic; DESCRIBE to read the config, kafka-configs.sh
--describe). The checks live in ``cluster.topic_admin``; a change reaching a
node that does not lead the controller is proxied once to the leader, and is
answered once every live node applied it.
"""

from __future__ import annotations

from aiohttp import web

from clients.protocol import BrokerError, ErrorCode

from ..security.acl import Operation, ResourceType
from ..topic_admin import config_json
from . import parsing
from .access import Access, Need, RouteTable
from .forwarding import Forwarder
from .services import Services

__all__ = ["TopicAdminRoutes"]

TOPIC = ResourceType.TOPIC
_PARTITIONS_FIELDS = frozenset({"count", "assignments"})


class TopicAdminRoutes:
    def __init__(self, services: Services, forwarder: Forwarder) -> None:
        self.s = services
        self.controller = services.controller
        self.forwarder = forwarder

    def register(self, app: web.Application) -> None:
        r = RouteTable(app)
        alter = Access.user(Need(Operation.ALTER, TOPIC, "topic"))
        r.post("/v1/topics/{topic}/partitions", self.add_partitions, alter)
        r.get("/v1/topics/{topic}/config", self.describe_config, Access.user(Need(Operation.DESCRIBE, TOPIC, "topic")))
        r.patch("/v1/topics/{topic}/config", self.alter_config, alter)

    def _controller_url(self) -> str | None:
        return self.s.nodes.node_url(self.controller.leader_id())

    async def add_partitions(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = parsing.parse_json_object(raw)
        unknown = sorted(set(body) - _PARTITIONS_FIELDS)
        if unknown:
            raise BrokerError(ErrorCode.INVALID_REQUEST, f"unknown fields {unknown}; known: count, assignments")
        try:
            meta = await self.controller.add_partitions(
                request.match_info["topic"], body.get("count"), body.get("assignments")
            )
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NOT_CONTROLLER:
                return await self.forwarder.to_controller(request, exc, raw, self._controller_url)
            raise
        return web.json_response(self.controller.topic_json(meta))

    async def describe_config(self, request: web.Request) -> web.Response:
        return web.json_response(config_json(self.controller.topic(request.match_info["topic"])))

    async def alter_config(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = parsing.parse_json_object(raw)
        try:
            meta = await self.controller.alter_topic_config(request.match_info["topic"], body)
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NOT_CONTROLLER:
                return await self.forwarder.to_controller(request, exc, raw, self._controller_url)
            raise
        return web.json_response(config_json(meta))
