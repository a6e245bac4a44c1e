"""Topics and cluster metadata: create, list, describe, delete; ``/v1/cluster`` and ``/v1/metadata``.

Admin requests reaching a node that does not lead the controller are proxied
once to the controller leader.
"""

from __future__ import annotations

from aiohttp import web

from clients.protocol import BrokerError, ErrorCode

from ..security.acl import CLUSTER_NAME, Operation, ResourceType
from . import parsing
from .access import Access, Need, RouteTable, guard
from .forwarding import Forwarder
from .services import Services

__all__ = ["TopicRoutes"]

TOPIC = ResourceType.TOPIC


class TopicRoutes:
    def __init__(self, services: Services, forwarder: Forwarder) -> None:
        self.s = services
        self.controller = services.controller
        self.forwarder = forwarder

    def register(self, app: web.Application) -> None:
        r = RouteTable(app)
        r.get("/v1/cluster", self.cluster, Access.user())
        r.get("/v1/metadata", self.metadata, Access.user(body="DESCRIBE on each topic shown (a named one: required)"))
        r.post("/v1/topics", self.create_topic, Access.user(body="CREATE on CLUSTER or on the topic"))
        r.get("/v1/topics", self.list_topics, Access.user(body="DESCRIBE on each topic listed"))
        r.get("/v1/topics/{topic}", self.describe_topic, Access.user(Need(Operation.DESCRIBE, TOPIC, "topic")))
        r.delete("/v1/topics/{topic}", self.delete_topic, Access.user(Need(Operation.DELETE, TOPIC, "topic")))

    def _controller_url(self) -> str | None:
        return self.s.nodes.node_url(self.controller.leader_id())

    async def cluster(self, _request: web.Request) -> web.Response:
        return web.json_response(self.controller.cluster_json())

    async def metadata(self, request: web.Request) -> web.Response:
        topics = request.query.get("topics")
        names = [t for t in topics.split(",") if t] if topics else None
        g = guard(request)
        if names is not None:
            g.require_topics(Operation.DESCRIBE, names)
        elif g.authorizer is not None:  # the topics the caller may see
            names = [n for n in self.controller.view.topics if g.may_describe(TOPIC, n)]
        return web.json_response(self.controller.metadata_json(names))

    async def create_topic(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = parsing.parse_json_object(raw)
        name = body.get("name")
        g = guard(request)
        if isinstance(name, str):
            g.require_any([(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME), (Operation.CREATE, TOPIC, name)])
        else:
            g.require(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
        cfg = self.s.config
        partitions = body.get("partitions", cfg.default_partitions)
        rf = body.get("replication_factor", min(cfg.default_replication_factor, len(self.s.nodes.node_ids())))
        try:
            meta = await self.controller.create_topic(body.get("name"), partitions, rf, body.get("config"))
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NOT_CONTROLLER:
                return await self.forwarder.to_controller(request, exc, raw, self._controller_url)
            raise
        return web.json_response(self.controller.topic_json(meta), status=201)

    async def list_topics(self, request: web.Request) -> web.Response:
        g = guard(request)
        return web.json_response(
            {"topics": [t for t in self.controller.topics_json() if g.may_describe(TOPIC, t["name"])]}
        )

    async def describe_topic(self, request: web.Request) -> web.Response:
        meta = self.controller.topic(request.match_info["topic"])
        return web.json_response(self.controller.topic_json(meta))

    async def delete_topic(self, request: web.Request) -> web.Response:
        try:
            meta = await self.controller.delete_topic(request.match_info["topic"])
        except BrokerError as exc:
            if exc.error_code is ErrorCode.NOT_CONTROLLER:
                return await self.forwarder.to_controller(request, exc, b"", self._controller_url)
            raise
        return web.json_response({"name": meta.name, "deleted": True})
